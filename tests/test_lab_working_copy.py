"""`tasks.py lab` opens a working copy of the reader notebooks that no build deletes: a notebook
the reader changed survives a rebuild, one the reader left alone follows the build."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tasks", ROOT / "tasks.py")
tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tasks)


def build(reader: Path, version: str, names=("07_sapo", "11_training_lab")) -> None:
    """What a book build does to the reader notebooks: delete them all, write them again."""
    if reader.exists():
        for p in reader.iterdir():
            p.unlink()
        reader.rmdir()
    reader.mkdir(parents=True)
    for name in names:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}, build {version}"),
                    nbformat.v4.new_code_cell("x = 1")]
        nbformat.write(nb, str(reader / f"{name}.ipynb"))


def edit(path: Path, code: str) -> None:
    """What the reader does in JupyterLab: run a cell, add one, save."""
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(code))
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nbformat.write(nb, str(path))


def heading(path: Path) -> str:
    return nbformat.read(str(path), as_version=4).cells[0].source


def test_an_edit_survives_a_rebuild(tmp_path):
    reader, mine = tmp_path / "_build" / "reader" / "chapters", tmp_path / "notebooks"
    build(reader, "1")
    assert tasks.sync_working_copy(reader, mine) == []  # first open: a plain copy
    assert heading(mine / "07_sapo.ipynb") == "# 07_sapo, build 1"
    edit(mine / "07_sapo.ipynb", "my_answer = 42")

    assert tasks.sync_working_copy(reader, mine) == []  # no new build: nothing to say
    build(reader, "2")
    notes = tasks.sync_working_copy(reader, mine)

    mine_now = nbformat.read(str(mine / "07_sapo.ipynb"), as_version=4)
    assert mine_now.cells[-1].source == "my_answer = 42"  # the edit is there
    assert mine_now.cells[1].outputs  # and the outputs the reader saved
    assert heading(mine / "07_sapo.ipynb") == "# 07_sapo, build 1"
    # the new build's version is beside it, and lab says so
    assert heading(mine / "07_sapo.new-build.ipynb") == "# 07_sapo, build 2"
    assert notes == ["07_sapo.ipynb: kept your version; the new build's is "
                     "07_sapo.new-build.ipynb"]
    # the notebook the reader did not touch follows the build (negative control)
    assert heading(mine / "11_training_lab.ipynb") == "# 11_training_lab, build 2"
    assert not (mine / "11_training_lab.new-build.ipynb").exists()


def test_the_new_build_copy_is_replaced_only_while_untouched(tmp_path):
    reader, mine = tmp_path / "reader", tmp_path / "notebooks"
    build(reader, "1")
    tasks.sync_working_copy(reader, mine)
    edit(mine / "07_sapo.ipynb", "a = 1")
    build(reader, "2")
    tasks.sync_working_copy(reader, mine)
    build(reader, "3")
    tasks.sync_working_copy(reader, mine)
    assert heading(mine / "07_sapo.new-build.ipynb") == "# 07_sapo, build 3"
    edit(mine / "07_sapo.new-build.ipynb", "b = 2")  # the reader works in that one too
    build(reader, "4")
    notes = tasks.sync_working_copy(reader, mine)
    assert nbformat.read(str(mine / "07_sapo.new-build.ipynb"),
                         as_version=4).cells[-1].source == "b = 2"
    assert nbformat.read(str(mine / "07_sapo.ipynb"), as_version=4).cells[-1].source == "a = 1"
    assert notes == [f"07_sapo.ipynb: kept your version and your 07_sapo.new-build.ipynb; the "
                     f"new build's is in {reader}"]


def test_a_file_without_a_record_is_the_readers(tmp_path):
    """A notebook already in the folder that lab never copied (or a lost record) is kept."""
    reader, mine = tmp_path / "reader", tmp_path / "notebooks"
    build(reader, "1")
    mine.mkdir()
    (mine / "07_sapo.ipynb").write_text("{}")
    tasks.sync_working_copy(reader, mine)
    assert (mine / "07_sapo.ipynb").read_text() == "{}"
    assert heading(mine / "07_sapo.new-build.ipynb") == "# 07_sapo, build 1"


def test_the_working_copy_is_ignored_by_git_and_outside_the_build():
    assert tasks.BUILD not in tasks.WORKING_COPY.parents
    ignored = subprocess.run(["git", "check-ignore", "-q", "notebooks/07_sapo.ipynb"],
                             cwd=ROOT, check=False)
    assert ignored.returncode == 0


def test_lab_passes_its_options_to_jupyterlab(monkeypatch, tmp_path):
    """`python3 tasks.py lab -- --port 8890 --no-browser` reaches jupyter-lab's command line;
    an option to another command is refused."""
    ran = {}
    for step in ("setup", "ensure_jupyterlab", "summary"):
        monkeypatch.setattr(tasks, step, lambda: None)
    monkeypatch.setattr(tasks, "READER", tmp_path / "reader")
    monkeypatch.setattr(tasks, "WORKING_COPY", tmp_path / "notebooks")
    build(tmp_path / "reader" / "chapters", "1")
    monkeypatch.setattr(tasks.os, "execv", lambda exe, cmd: ran.update(cmd=cmd))
    tasks.lab(["--port", "8890", "--no-browser"])
    assert ran["cmd"][1:4] == [f"--ServerApp.root_dir={tmp_path / 'notebooks'}", "--port",
                               "8890"]
    assert "--no-browser" in ran["cmd"]
    assert (tmp_path / "notebooks" / "07_sapo.ipynb").is_file()
    usage = subprocess.run([sys.executable, str(ROOT / "tasks.py"), "book", "--port", "1"],
                           capture_output=True, text=True, check=False)
    assert usage.returncode == 1 and "usage:" in usage.stderr


def glance(path: Path) -> None:
    """What JupyterLab does to a notebook the reader only opens (then autosaves): it rewrites the
    metadata (kernelspec's display name, language_info, "collapsed" on folded cells) and, once
    the reader runs it, adds outputs and execution counts; the cells stay as they were."""
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.2"}
    nb.cells[1].metadata["collapsed"] = True
    nb.cells[1].execution_count = 1
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nbformat.write(nb, str(path), version=4)


def test_cells_digest_ignores_metadata_and_outputs_only(tmp_path):
    """The hashing rule: a notebook is the reader's only when its cells' types or sources
    changed."""
    reader = tmp_path / "reader"
    build(reader, "1", names=("07_sapo",))
    path = reader / "07_sapo.ipynb"
    before = tasks._cells_digest(path)
    raw = tasks._sha256(path)
    glance(path)
    assert tasks._sha256(path) != raw  # the file did change...
    assert tasks._cells_digest(path) == before  # ...but not its cells
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[1].source = "x = 2"  # an edited cell
    nbformat.write(nb, str(path))
    assert tasks._cells_digest(path) != before
    nb.cells[1].source = "x = 1"
    nb.cells[1].cell_type = "markdown"  # the same text, another kind of cell
    nb.cells[1].pop("outputs")
    nb.cells[1].pop("execution_count")
    nbformat.write(nb, str(path))
    assert tasks._cells_digest(path) != before
    (tmp_path / "junk.ipynb").write_text("not json")
    assert tasks._cells_digest(tmp_path / "junk.ipynb") == tasks._sha256(tmp_path / "junk.ipynb")


def test_a_notebook_only_opened_follows_the_build(tmp_path):
    """A notebook JupyterLab opened and autosaved (metadata rewritten), or that the reader ran,
    is not the reader's: the next build replaces it, with no note and no .new-build copy."""
    reader, mine = tmp_path / "reader", tmp_path / "notebooks"
    build(reader, "1")
    tasks.sync_working_copy(reader, mine)
    glance(mine / "07_sapo.ipynb")
    assert tasks.sync_working_copy(reader, mine) == []  # same build: kept as it is (outputs too)
    assert nbformat.read(str(mine / "07_sapo.ipynb"), as_version=4).cells[1].outputs
    build(reader, "2")
    assert tasks.sync_working_copy(reader, mine) == []
    assert heading(mine / "07_sapo.ipynb") == "# 07_sapo, build 2"
    assert not (mine / "07_sapo.new-build.ipynb").exists()


def test_a_record_from_before_cell_digests_still_counts(tmp_path):
    """A working copy made by an older `lab` records whole-file SHA-256s: an untouched notebook
    still follows the build, an edited one is still kept."""
    import json

    reader, mine = tmp_path / "reader", tmp_path / "notebooks"
    build(reader, "1")
    tasks.sync_working_copy(reader, mine)
    manifest = mine / tasks.COPIES_MANIFEST
    manifest.write_text(json.dumps({p.name: tasks._sha256(p) for p in mine.glob("*.ipynb")}))
    edit(mine / "07_sapo.ipynb", "mine = 1")
    build(reader, "2")
    notes = tasks.sync_working_copy(reader, mine)
    assert heading(mine / "11_training_lab.ipynb") == "# 11_training_lab, build 2"
    assert heading(mine / "07_sapo.ipynb") == "# 07_sapo, build 1"
    assert notes == ["07_sapo.ipynb: kept your version; the new build's is "
                     "07_sapo.new-build.ipynb"]


def test_a_step_beside_others_reports_its_own_time(tmp_path, monkeypatch):
    """The timings table gives a background step (the engine tests) the time it ran, not the
    time until the check waited for it (it showed 252 s for a 90 s run)."""
    import sys
    import time

    monkeypatch.setattr(tasks, "LOGS", tmp_path)
    monkeypatch.setattr(tasks, "TIMINGS", [])
    job = tasks.Background("short ‖", sys.executable, "-c", "pass")
    time.sleep(2.0)  # the steps in front of it
    assert job.finish() == 0
    (step, seconds, rc), = tasks.TIMINGS
    assert step == "short ‖" and rc == 0 and seconds < 1.5
