"""Static checks of the chapters (no kernel): code a reader copies from the page runs.

A visible code cell (any cell not tagged remove-cell or remove-input) must not use a name that
only a hidden cell defines: on the web page the reader never sees that definition, so copied
code fails with a NameError. Chapters are stored as MyST Markdown text (scripts/chapter_sources.py),
which survives the round trip to a notebook and back, and no `.ipynb` of theirs is committed.
"""

from __future__ import annotations

import ast
import builtins
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import chapter_sources  # noqa: E402

CHAPTERS = chapter_sources.sources(ROOT)
HIDDEN = {"remove-cell", "remove-input"}
#: Names IPython provides in every kernel.
KERNEL = {"display", "get_ipython", "In", "Out", "exit", "quit"}


def _cells(path: Path) -> list[dict]:
    """A chapter's cells (from its .md source) or a test notebook's (from .ipynb JSON)."""
    if path.suffix == ".md":
        return chapter_sources.read(path).cells
    return json.loads(path.read_text())["cells"]


def _code(cell) -> str:
    lines = "".join(cell["source"]).splitlines()
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


class _Names(ast.NodeVisitor):
    """Names a cell binds at its top level (and anywhere, for simplicity) and names it loads."""

    def __init__(self):
        self.bound, self.used = set(), set()

    def visit_Name(self, node):
        (self.used if isinstance(node.ctx, ast.Load) else self.bound).add(node.id)

    def visit_FunctionDef(self, node):
        self.bound.add(node.name)
        inner = _Names()
        for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs,
                    *filter(None, [node.args.vararg, node.args.kwarg])]:
            inner.bound.add(arg.arg)
        for child in [*node.body, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                inner.visit(child)
        self.used |= inner.used - inner.bound  # free names of the function body
        for deco in node.decorator_list:
            self.visit(deco)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        inner = _Names()
        for arg in [*node.args.args, *node.args.kwonlyargs]:
            inner.bound.add(arg.arg)
        inner.visit(node.body)
        for d in node.args.defaults:
            self.visit(d)
        self.used |= inner.used - inner.bound

    def visit_ClassDef(self, node):
        self.bound.add(node.name)
        self.generic_visit(node)

    def _comprehension(self, node):
        inner = _Names()
        for gen in node.generators:
            inner.visit(gen.target)
            self.visit(gen.iter) if gen is node.generators[0] else inner.visit(gen.iter)
            for cond in gen.ifs:
                inner.visit(cond)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                inner.visit(getattr(node, part))
        self.used |= inner.used - inner.bound

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_Import(self, node):
        for alias in node.names:
            self.bound.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node):
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)


def hidden_dependencies(nb_path: Path) -> list[str]:
    """Visible cells' uses of names that only hidden cells (so far) have defined."""
    cells = _cells(nb_path)
    visible_defs, hidden_defs, problems = set(), set(), []
    known = set(dir(builtins)) | KERNEL
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        names = _Names()
        names.visit(ast.parse(_code(cell)))
        hidden = bool(HIDDEN & set(cell.get("metadata", {}).get("tags", [])))
        if not hidden:
            leaked = (names.used - names.bound - visible_defs - known) & hidden_defs
            problems += [f"{nb_path.name} cell {i}: uses {n!r}, defined only in a hidden cell"
                         for n in sorted(leaked)]
            visible_defs |= names.bound
        else:
            hidden_defs |= names.bound - visible_defs
    return problems


def test_every_chapter_is_text():
    """The chapters are the .md files; no chapter notebook is tracked by git."""
    assert len(CHAPTERS) >= 17
    tracked = subprocess.run(["git", "ls-files", "chapters"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert [t for t in tracked if t.endswith(".ipynb")] == []
    assert {f"chapters/{p.name}" for p in CHAPTERS} <= set(tracked)


@pytest.mark.parametrize("md_path", CHAPTERS, ids=lambda p: p.stem)
def test_round_trip_keeps_the_text(md_path):
    """md -> ipynb (as nbval reads it) -> md gives the same text, metadata (tags, captions, alt
    text) included; a negative control shows the comparison sees a change of metadata."""
    nb = chapter_sources.through_ipynb(md_path)
    assert chapter_sources.text(nb) == md_path.read_text()
    tagged = next(c for c in nb.cells if c.metadata.get("tags"))
    tagged.metadata["tags"] = [*tagged.metadata["tags"], "changed"]
    assert chapter_sources.text(nb) != md_path.read_text()


def test_generated_notebook_is_the_chapter(tmp_path):
    """The .ipynb written for nbval holds the chapter's cells, metadata and kernel."""
    (tmp_path / "chapters").mkdir()
    source = tmp_path / "chapters" / CHAPTERS[0].name
    source.write_text(CHAPTERS[0].read_text())
    [written] = chapter_sources.write_notebooks(tmp_path)
    assert written == source.with_suffix(".ipynb")
    nb, md = nbformat.read(str(written), as_version=4), chapter_sources.read(CHAPTERS[0])
    assert [(c.cell_type, c.source, c.metadata) for c in nb.cells] == \
        [(c.cell_type, c.source, c.metadata) for c in md.cells]
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.stem)
def test_visible_code_uses_no_name_from_a_hidden_cell(nb_path):
    assert hidden_dependencies(nb_path) == []


def test_the_check_finds_a_hidden_dependency(tmp_path):
    cells = [{"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "source": ["x = 1\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["def f(a):\n    return a + x\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["y = [x for _ in range(2)]"]},
             {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": ["z = 2"]},
             {"cell_type": "code", "metadata": {}, "source": ["print(z, f(1), y)"]}]
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": cells}))
    assert hidden_dependencies(nb) == ["nb.ipynb cell 1: uses 'x', defined only in a hidden cell",
                                       "nb.ipynb cell 2: uses 'x', defined only in a hidden cell"]


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.stem)
def test_code_fits_the_page(nb_path):
    """The web page shows 80 columns of code without scrolling; every cell a reader can see
    (hide-input cells too, behind their toggle) keeps to that."""
    long = []
    for i, cell in enumerate(_cells(nb_path)):
        if cell["cell_type"] != "code" or HIDDEN & set(cell["metadata"].get("tags", [])):
            continue
        long += [f"cell {i}: {len(line)} columns" for line in "".join(cell["source"]).splitlines()
                 if len(line) > 80]
    assert long == []


def test_references_list_the_troubleshooting_reports():
    """references.md names the same public reports as the Troubleshooting page, in the same
    order (repositories and numbers), so that a credit fixed on one page is fixed on both."""
    import re

    def reports(text, heading):
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        return re.findall(r"[\w.-]+/[\w.-]+|#\d+", section)

    page = reports((ROOT / "chapters" / "21_troubleshooting.md").read_text(), "## Reports")
    refs = reports((ROOT / "references.md").read_text(), "## Troubleshooting: public reports")
    assert len(page) > 30 and "verl-project/verl" in page
    assert [x for x in refs if x != "chapters/21_troubleshooting"] == page
