"""Chapter 14 on Colab or Binder, where TRL and verl are not installed: its reader notebook runs
top to bottom ("Run All"), the cells that need only rlgates give their outputs, and each cell that
needs a trainer prints the install command in one line (rlgates.trainers.guard_notebook)."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from rlgates import trainers
from rlgates.trainers import _guard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import reader_notebooks as rn  # noqa: E402

DOC = "chapters/14_real_trainers"
# Binder's environment lacks these (binder/requirements.txt); Colab lacks trl and verl
ABSENT = ("trl", "verl", "transformers", "datasets", "tokenizers", "accelerate", "peft", "ray",
          "yaml")
LINE = "This cell " + _guard.install_line(trainers.TESTED_VERSIONS)


def test_defined_names():
    code = ("import a.b\nfrom c import d as e\nx, (y, *z) = 1, (2, 3)\nfor i in []: pass\n"
            "def f(q):\n    w = 1\nclass K: pass\nwith open('p') as fh: pass\n"
            "[v for v in ()]\nif True:\n    t = 1")
    assert _guard.defined_names(code) == {"a", "e", "x", "y", "z", "i", "f", "K", "fh", "t"}
    assert _guard.defined_names("x = (") == set()


def _text(outputs) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   + "".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)


def test_chapter_14_runs_without_the_trainers(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    # the kernel sees no trainer: a module set to None in sys.modules cannot be imported, and
    # importlib.util.find_spec (rlgates._book.facts.installed) returns None for it
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-no-trainers.py").write_text(
        f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None\n")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "Agg")

    book, notebooks = rn.load_book(ROOT, ROOT / "_build" / "no-build")  # no glue: not needed
    nb = rn.reader_notebook(DOC, notebooks[DOC], book)
    typo = nbformat.v4.new_code_cell("a_name_nobody_defined")  # a real error still shows
    typo.metadata["tags"] = ["raises-exception"]
    nb.cells.append(typo)
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [o["ename"] for o in typo.outputs if o["output_type"] == "error"] == ["NameError"]
    code = code[:-1]
    errors = [c.source[:60] for c in code if any(o["output_type"] == "error" for o in c.outputs)]
    assert errors == []  # Run All went through: no cell failed
    guarded = [c for c in code if LINE in _text(c.outputs)]
    ran = [c for c in code if c not in guarded]
    # the trainer cells: one line each, no traceback
    assert len(guarded) >= 20
    for c in guarded:
        assert _text(c.outputs).strip().splitlines()[-1] == LINE, c.source[:60]
    imports = next(c for c in code if c.source.startswith("import trl"))
    assert imports in guarded and _text(imports.outputs).strip() == LINE
    # the cells that need only rlgates ran and gave their outputs
    flag_table = next(c for c in ran if "trainers.flag_table(" in c.source)
    assert "loss_type" in _text(flag_table.outputs)
    engine = [c for c in ran if "trainers.engine_runs()" in c.source]
    assert len(engine) >= 2 and all(_text(c.outputs).strip() for c in engine)
    assert any("trainers.flags(" in c.source and "dapo" in _text(c.outputs) for c in ran)
