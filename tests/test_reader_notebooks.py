"""The reader notebooks (scripts/reader_notebooks.py): every MyST role and directive converted,
solutions folded, the set-up cell, the launch URLs; then the notebooks the book build wrote.

The conversion tests need nothing built. The tests of the built notebooks read _build/reader
(written when the book build finishes): they skip when no book is built, unless
RLGATES_REQUIRE_BOOK=1 (set by `python3 tasks.py check`), where a missing book fails them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.kernels import TRAINER_MODULES, hide_from_kernels, unreachable_repository

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import chapter_sources  # noqa: E402
import reader_notebooks as rn  # noqa: E402

URL = "https://github.com/rlgates/rlgates-book"
GLUE = {
    "chapters/07_x": {
        "half": {"output_type": "display_data", "data": {
            "application/papermill.record/text/plain": "2.7566"}},
        "share": {"output_type": "display_data", "data": {
            "application/papermill.record/text/plain": "0.125"}},
        "word": {"output_type": "display_data", "data": {
            "application/papermill.record/text/plain": "'higher'"}},
        "table": {"output_type": "display_data", "data": {
            "application/papermill.record/text/markdown": "| a |\n| - |\n| 1 |",
            "application/papermill.record/text/plain": "<table>"}},
    },
    "chapters/06_y": {"other": {"output_type": "display_data", "data": {
        "application/papermill.record/text/plain": "42"}}},
}


def make_book() -> rn.Book:
    book = rn.Book(URL, "notebooks", glue=GLUE)
    book.titles = {"chapters/07_x": "7. X", "chapters/06_y": "6. Y"}
    book.labels = {
        "sec-y": rn.Label("section", "chapters/06_y", "A section of Y"),
        "sec-x": rn.Label("section", "chapters/07_x", "Key equations"),
        "fig-x": rn.Label("figure", "chapters/07_x", "The gate.", "2"),
        "eq-gate": rn.Label("equation", "chapters/07_x", "", "7.2"),
        "ex-07_x-1": rn.Label("exercise", "chapters/07_x", "Exercise 7.1", "7.1"),
        "eq-06_y-1": rn.Label("section", "chapters/06_y", "Key equations"),
        "ex-06_y-2": rn.Label("exercise", "chapters/06_y", "Exercise 6.2", "6.2"),
    }
    return book


def convert(md: str) -> tuple[str, rn.Book]:
    book = make_book()
    return rn.Page("chapters/07_x", book).markdown(md), book


# ------------------------------------------------------------------------ one test per role
@pytest.mark.parametrize("md, expected", [
    ("{glue:text}`half:.2f`", "2.76"),
    ("{glue:text}`share:.1%`", "12.5%"),
    ("{glue:text}`word`", "higher"),
    ("{glue}`half`", "2.7566"),
    ("{glue:text}`../chapters/06_y.ipynb::other`", "42"),
    ("{eq}`eq-gate`", "[(7.2)](#eq-gate)"),
    ("{numref}`fig-x`", "[Fig. 2](#fig-x)"),
    ("{numref}`Figure %s <fig-x>`", "[Figure 2](#fig-x)"),
    ("{ref}`sec-x`", "[Key equations](#sec-x)"),
    ("{ref}`see here <sec-y>`",
     "[see here](https://rlgates.github.io/rlgates-book/chapters/06_y.html#sec-y)"),
    ("{doc}`06_y`", "[6. Y](https://rlgates.github.io/rlgates-book/chapters/06_y.html)"),
    ("{doc}`the other <../chapters/06_y>`",
     "[the other](https://rlgates.github.io/rlgates-book/chapters/06_y.html)"),
    ("{cite}`schulman2017ppo`", "[schulman2017ppo]"),
    ("{cite:p}`a, b`", "[a; b]"),
    ("{math}`\\rho_t`", "$\\rho_t$"),
    ("{explorer}`sapo`",
     "[the gate explorer (sapo)](https://rlgates.github.io/rlgates-book/explorer.html#sapo)"),
    ("{explorer}`try it <dapo>`",
     "[try it](https://rlgates.github.io/rlgates-book/explorer.html#dapo)"),
    ("{ref}`ex-07_x-1`", "[Exercise 7.1](#ex-07_x-1)"),
    ("{ref}`eq. (7.2) <eq-gate>`", "[eq. (7.2)](#eq-gate)"),
    # on another page: the web page's id (docutils's, for a target; the label, for an exercise)
    ("{ref}`eq. (1) <eq-06_y-1>`",
     "[eq. (1)](https://rlgates.github.io/rlgates-book/chapters/06_y.html#eq-06-y-1)"),
    ("{ref}`ex-06_y-2`",
     "[Exercise 6.2](https://rlgates.github.io/rlgates-book/chapters/06_y.html#ex-06_y-2)"),
    ("{term}`gate`", "[gate](https://rlgates.github.io/rlgates-book/glossary.html#term-gate)"),
    ("{term}`gates <gate>`",
     "[gates](https://rlgates.github.io/rlgates-book/glossary.html#term-gate)"),
    ("{term}`Holm's correction`", "[Holm's correction](https://rlgates.github.io/rlgates-book/"
                                  "glossary.html#term-Holm-s-correction)"),
    ("{term}`MoE <MoE routing>`",
     "[MoE](https://rlgates.github.io/rlgates-book/glossary.html#term-MoE-routing)"),
    ("{repo}`tests/test_glossary.py`",
     f"[`tests/test_glossary.py`]({URL}/blob/main/tests/test_glossary.py)"),
    ("{repo}`the glossary's test <tests/test_glossary.py>`",
     f"[the glossary's test]({URL}/blob/main/tests/test_glossary.py)"),
])
def test_role(md, expected):
    out, book = convert(f"The value is {md} here.")
    assert out == f"The value is {expected} here."
    assert not book.problems
    assert rn.myst_leftovers(out) == []
    assert rn.myst_leftovers(f"The value is {md} here.") == ["role"]


def test_two_roles_and_code_spans_on_one_line():
    out, _ = convert("at {glue:text}`half:.1f` near `x = {y}` and {glue:text}`share:.2f`.")
    assert out == "at 2.8 near `x = {y}` and 0.12."


def test_term_not_in_the_glossary_is_a_problem():
    book = make_book()
    book.terms = {"gate", "moe routing"}
    out = rn.Page("chapters/07_x", book).markdown("a {term}`Gate` and a {term}`frob`.")
    assert out.startswith("a [Gate](https://rlgates.github.io/rlgates-book/glossary.html#term-Gate)")
    assert book.problems == ["chapters/07_x: {term} 'frob' is not in the glossary"]


def test_the_glossary_terms_are_read_from_the_glossary():
    terms = rn.glossary_terms(ROOT)
    assert {"gate", "tis", "holm's correction", "k1", "k3", "ga"} <= terms
    assert not any(t.startswith(("{", "`", "$")) for t in terms)


def test_repo_role_links_an_existing_file_and_refuses_a_missing_one():
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.utils import Reporter

    reporter = Reporter("x", Reporter.WARNING_LEVEL, Reporter.SEVERE_LEVEL + 1)
    env = SimpleNamespace(srcdir=str(ROOT))
    inliner = SimpleNamespace(document=SimpleNamespace(settings=SimpleNamespace(env=env)),
                              reporter=reporter, problematic=lambda raw, text, msg: nodes.Text(raw))
    (node,), messages = rn.repo_role("repo", "", "tests/test_glossary.py", 1, inliner)
    assert not messages and node["refuri"] == f"{URL}/blob/main/tests/test_glossary.py"
    assert node.astext() == "tests/test_glossary.py"
    (node,), messages = rn.repo_role("repo", "", "its test <tests/test_glossary.py>", 1, inliner)
    assert node.astext() == "its test" and not messages
    _, messages = rn.repo_role("repo", "{repo}`tests/nope.py`", "tests/nope.py", 1, inliner)
    assert messages and "not a file of the repository" in messages[0].astext()


def test_unknown_role_or_glue_name_is_a_problem():
    _, book = convert("{frobnicate}`x` and {glue:text}`missing:.2f`")
    assert any("unknown role" in p for p in book.problems)
    assert any("'missing' not found" in p for p in book.problems)


# ------------------------------------------------------------------- one test per directive
def test_admonition_with_title():
    out, _ = convert("```{admonition} In short\n- one {glue:text}`half:.1f`\n- two\n```")
    assert out.splitlines() == ["> **In short**", ">", "> - one 2.8", "> - two"]


@pytest.mark.parametrize("fence", ["```", ":::", "::::"])
def test_dropdown_admonition_is_folded(fence):
    out, _ = convert(f"{fence}{{admonition}} Solution\n:class: dropdown\nThe answer is "
                     f"$x$.\n{fence}\n\nAfter.")
    assert out.startswith("<details>\n<summary><b>Solution</b></summary>\n\nThe answer is $x$.")
    # set apart from the text after it (JupyterLab gives a <details> no margin)
    assert out.rstrip().endswith("</details>\n<br>\n\nAfter.")
    assert rn.myst_leftovers(out) == []


@pytest.mark.parametrize("name, title", [("note", "Note"), ("tip", "Tip"),
                                         ("warning", "Warning"), ("seealso", "See also")])
def test_named_admonitions(name, title):
    out, _ = convert(f":::{{{name}}}\nBody.\n:::")
    assert out.splitlines() == [f"> **{title}**", ">", "> Body."]


def test_nested_directives():
    out, book = convert("::::{admonition} Outer\n:::{note}\nInner {glue:text}`half:.0f`.\n:::\n"
                        "::::")
    assert not book.problems
    assert "> > Inner 3." in out and rn.myst_leftovers(out) == []


def test_exercise_and_gated_solution():
    book = make_book()
    page = rn.Page("chapters/07_x", book)
    ex = page.markdown(":::{exercise}\n:label: ex-07_x-1\nPredict first.\n:::")
    assert ex.splitlines() == ['<a id="ex-07_x-1"></a>', "**Exercise 7.1**", "", "Predict first."]
    start = page.markdown(":::{solution-start} ex-07_x-1\n:class: dropdown\n:::\nThe prose.")
    assert page.in_solution == "Solution to Exercise 7.1"
    assert start.splitlines() == [
        "*Solution to Exercise 7.1: folded below (click to open).*",
        "<details>", "<summary><b>Solution to Exercise 7.1</b></summary>", "", "The prose.", "",
        "</details>"]
    # one cell: the end of solution 1's prose, solution-end, exercise 2, solution-start
    book.labels["ex-07_x-2"] = rn.Label("exercise", "chapters/07_x", "Exercise 7.2", "7.2")
    mixed = page.markdown("More of it.\n\n:::{solution-end}\n:::\n\n:::{exercise}\n"
                          ":label: ex-07_x-2\nNext question.\n:::\n\n"
                          ":::{solution-start} ex-07_x-2\n:::")
    assert mixed.index("More of it.") < mixed.index("</details>") < mixed.index("Next question")
    # the next exercise is set apart from the folded solution above it, in the same cell (R15)
    assert "</details>\n<br>\n\n<a id=\"ex-07_x-2\"></a>\n**Exercise 7.2**" in mixed
    assert "**Exercise 7.2**" in mixed and "<details>\n<summary><b>Solution to Exercise 7.1" in mixed
    assert page.in_solution == "Solution to Exercise 7.2"
    end = page.markdown(":::{solution-end}\n:::")
    assert page.in_solution is None and end.strip() == ""
    assert not book.problems
    for text in (ex, start, mixed, end):
        assert rn.myst_leftovers(text) == []


def test_solution_directive_is_folded():
    out, _ = convert("```{solution} ex-07_x-1\n:class: dropdown\nBecause.\n```")
    assert out.startswith("<details>\n<summary><b>Solution to Exercise 7.1</b></summary>")


def test_math_directive_and_labelled_dollars():
    out, _ = convert("```{math}\n:label: eq-gate\nf = 1\n```")
    assert out.splitlines() == ['<a id="eq-gate"></a>', "$$", "f = 1", r"\tag{7.2}", "$$"]
    out2, _ = convert("$$\nf = 1\n$$ (eq-gate)")
    assert out2.splitlines() == ["$$", "f = 1", r"\tag{7.2}", "$$"]
    assert rn.myst_leftovers(out) == rn.myst_leftovers(out2) == []


def test_target_glue_md_figure_and_code_block():
    out, _ = convert("(sec-x)=\n## Key equations\n\n```{glue:md} table\n:format: myst\n```\n\n"
                     "```{figure} img.png\n:alt: a plot\nThe caption.\n```\n\n"
                     "```{code-block} python\nx = 1\n```")
    assert '<a id="sec-x"></a>' in out and "| a |" in out
    assert "![a plot](img.png)" in out and "*The caption.*" in out
    assert "```python\nx = 1\n```" in out
    assert rn.myst_leftovers(out) == []


def test_code_blocks_and_math_are_copied_verbatim():
    md = "```python\nglue('{x}')  # {glue:text}`x`\n```\n\n$$\n\\frac{a}{b}\n$$"
    out, book = convert(md)
    assert out == md and not book.problems


def test_leftovers_detector_sees_each_kind():
    assert rn.myst_leftovers(":::{note}\nx\n:::") == ["directive", "colon fence"]
    assert "option" in rn.myst_leftovers("```\n:class: dropdown\n```x") or \
        rn.myst_leftovers("> :class: dropdown") == []
    assert rn.myst_leftovers("(my-label)=\n# T") == ["target"]
    assert rn.myst_leftovers("$$\nx\n$$ (eq-a)") == ["labelled math"]
    assert rn.myst_leftovers("plain $x$ and `code {glue:text}`") == []


# --------------------------------------------------------------------------- whole notebook
def chapter(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    return nb


def test_reader_notebook_cells():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    fig = code("plt.show()")
    fig.metadata["mystnb"] = {"figure": {"caption": "The gate, {glue:text}`half:.1f`.",
                                         "name": "fig-x"}}
    hidden, removed = code("h = 1"), code("assert h")
    hidden.metadata["tags"], removed.metadata["tags"] = ["hide-input"], ["remove-cell"]
    sol_code, sol_check = code("print(2)"), code("assert 2 == 2")
    sol_code.metadata["tags"], sol_check.metadata["tags"] = ["hide-input"], ["remove-cell"]
    src = chapter([md("# 7. X"), code("from myst_nb import glue"), fig, hidden, removed,
                   md(":::{exercise}\n:label: ex-07_x-1\nQ?\n:::"),
                   md(":::{solution-start} ex-07_x-1\n:class: dropdown\n:::"),
                   sol_code, sol_check, md("More prose."), md(":::{solution-end}\n:::")])
    executed = copy.deepcopy(src)  # the build's run: the solution printed its answer
    executed.cells[7].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                        text="the answer is 2\n")]
    book = make_book()
    nb = rn.reader_notebook("chapters/07_x", src, book, executed)
    nbformat.validate(nb)
    assert not book.problems
    setup = nb.cells[1]
    assert setup.metadata["tags"] == [rn.INSTALL_TAG]
    assert f"git+{URL}@notebooks" in setup.source
    # folded, JupyterLab shows its first line: plain words, no Colab form markup (R15)
    assert setup.source.splitlines()[0] == (
        "# Set-up for Colab and Binder: installs rlgates where it is missing")
    assert "@title" not in setup.source and "@param" not in setup.source
    # the header reads the same before and after the branch is published (R14)
    assert "install fails" not in nb.cells[0].source
    assert "published" not in nb.cells[0].source
    by_source = {c.source: c for c in nb.cells}
    caption = nb.cells[nb.cells.index(by_source["plt.show()"]) + 1]
    assert caption.cell_type == "markdown" and "> The gate, 2.8." in caption.source
    assert by_source["h = 1"].metadata["jupyter"] == {"source_hidden": True}
    # a folded check's first line (all JupyterLab shows of it) says what it is
    check = by_source[rn.FOLD_SIGNPOST + "assert h"]
    assert check.metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert rn.signposted("# own comment\nassert h") == "# own comment\nassert h"
    # the solution's code is folded text, with its output from the build: Run All runs none
    solution = next(c for c in nb.cells if "print(2)" in c.source)
    assert solution.cell_type == "markdown" and solution.metadata["tags"] == [rn.SOLUTION_TAG]
    assert solution.source.splitlines() == [
        "<details>", "<summary><b>Solution to Exercise 7.1: its code (copy it into a cell to run "
        "it) and its output</b></summary>", "", "```python", "print(2)", "```", "",
        "**Output:**", "", "```text", "the answer is 2", "```", "", "</details>"]
    assert not any("assert 2 == 2" in c.source for c in nb.cells)  # the book's check
    prose = next(c for c in nb.cells if "More prose." in c.source)
    assert prose.source.startswith("<details>")
    for c in nb.cells:
        if c.cell_type == "markdown":
            assert rn.myst_leftovers(c.source) == [], c.source
    assert [rn.unsignposted(c.source) for c in nb.cells if c.cell_type == "code"][1:] == \
        [c.source for c in src.cells[:5] if c.cell_type == "code"]
    # without the build's run (or with a stale one), the code alone
    alone = rn.reader_notebook("chapters/07_x", src, make_book(), None)
    assert "its code (copy it into a cell to run it)</b>" in next(
        c.source for c in alone.cells if "print(2)" in c.source)


def test_trainer_cells_show_their_recorded_output_and_are_counted():
    """Chapter 14's trainer cells only say what to install where TRL and verl are missing: the
    header counts them, and each one's output in the build (which had the trainers) is folded
    under it, labelled with the trainers' versions (R13)."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    src = chapter([md("# 7. X"), code("import trl"), code("print(trl.x)"), code("assert trl"),
                   code("y = 2")])
    src.cells[3].metadata["tags"] = ["remove-cell"]
    executed = copy.deepcopy(src)
    executed.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="0.5\n")]
    executed.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hidden\n")]
    trainer_cells = {src.cells[i].id for i in (1, 2, 3)}
    book = make_book()
    book.trainers = {"trl": "9.9.1", "verl": "8.8.2"}
    nb = rn.reader_notebook("chapters/07_x", src, book, executed, trainer_cells)
    nbformat.validate(nb)
    assert "*3 of its 4 code cells (1 of them folded checks) need TRL and verl" in \
        nb.cells[0].source
    assert "when the book was built, with TRL 9.9.1 and verl 8.8.2, that output is folded" in \
        nb.cells[0].source
    recorded = [i for i, c in enumerate(nb.cells) if rn.RECORDED_TAG in c.metadata.get("tags", [])]
    assert len(recorded) == 1  # import trl printed nothing; the folded check's output stays hidden
    (i,) = recorded
    assert nb.cells[i - 1].source == "print(trl.x)"
    assert nb.cells[i].source.splitlines() == [
        "<details>", "<summary><b>Output recorded when the book was built, with TRL 9.9.1 and "
        "verl 8.8.2</b></summary>", "", "```text", "0.5", "```", "", "</details>"]
    # the code cells are the chapter's, as before (the recorded outputs are Markdown)
    assert [c.source for c in nb.cells if c.cell_type == "code"][1:] == \
        ["import trl", "print(trl.x)", rn.FOLD_SIGNPOST + "assert trl", "y = 2"]
    # built without the trainers: the count, but nothing recorded to show
    book.trainers = {}
    bare = rn.reader_notebook("chapters/07_x", src, book, executed, trainer_cells)
    assert "3 of its 4 code cells" in bare.cells[0].source
    assert "recorded" not in bare.cells[0].source
    assert not any(rn.RECORDED_TAG in c.metadata.get("tags", []) for c in bare.cells)
    # a chapter without trainer cells says nothing about them
    assert "TRL" not in rn.reader_notebook("chapters/07_x", src, make_book(), executed).cells[
        0].source


def test_output_markdown_kinds():
    out = nbformat.v4.new_output
    lines = rn.output_markdown([
        out("stream", name="stdout", text="\x1b[31mred\x1b[0m\n"),
        out("display_data", data={"text/markdown": "| a |\n| - |", "text/plain": "x"}),
        out("display_data", data={"image/png": "iVBO\nRw==", "text/plain": "<Figure>"}),
        out("execute_result", data={"text/plain": "6"}, execution_count=1),
        out("display_data", data={"application/papermill.record/text/plain": "1"}),
    ])
    assert lines == ["", "```text", "red", "```", "", "| a |", "| - |", "",
                     '<img src="data:image/png;base64,iVBORw==" alt="output"/>', "",
                     "```text", "6", "```"]


def run_setup_cell(source: str, hide: tuple[str, ...], colab: bool = False) -> dict:
    """Run the set-up cell in a fresh interpreter, with some modules made to look missing, pip
    replaced by a recorder (that succeeds) and, with `colab`, a stand-in google.colab that
    records its widget-manager call; returns what it did and printed."""
    probe = f"""
import importlib.util, json, subprocess, sys, types
calls, manager = [], []
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name in {hide!r} else real(name, *a)
subprocess.run = lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")
for name in {hide!r}:
    sys.modules.pop(name, None)
if {colab!r}:
    output = types.SimpleNamespace(enable_custom_widget_manager=lambda: manager.append(1))
    sys.modules["google"] = types.ModuleType("google")
    sys.modules["google.colab"] = types.SimpleNamespace(output=output)
exec(compile({source!r}, "setup-cell", "exec"))
from myst_nb import glue
glue("x", 1.5, display=False)
print(json.dumps({{"calls": calls, "glue": type(sys.modules["myst_nb"]).__name__,
                  "manager": len(manager)}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=True)
    *printed, result = out.stdout.strip().splitlines()
    return {**json.loads(result), "printed": printed}


def test_setup_cell_installs_only_when_missing():
    import rlgates

    url, branch = rn.repository(rn.read_config())
    source = rn.install_cell_source(url, branch, rlgates.__version__)
    local = run_setup_cell(source, hide=())
    assert local["calls"] == [] and local["glue"] == "module"  # locally: nothing happens
    assert local["printed"] == [] and local["manager"] == 0
    colab = run_setup_cell(source, hide=("rlgates", "myst_nb"), colab=True)
    assert colab["calls"] == [[sys.executable, "-m", "pip", "install", "-q",
                               f"rlgates[widgets] @ git+{url}@{branch}"]]  # the sliders
    assert colab["glue"] == "SimpleNamespace"  # the stand-in glue
    # it says what it installs before pip runs (pip -q prints nothing while git clones)
    assert colab["printed"] == [f"installing rlgates from git+{url}@{branch} (a minute or two)"]
    assert colab["manager"] == 1  # Colab's widget manager on, for ipywidgets 8
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("ipywidgets") for r in extras["widgets"])


def test_setup_cell_warns_when_the_installed_rlgates_is_another_version():
    import rlgates

    url, branch = rn.repository(rn.read_config())
    older = run_setup_cell(rn.install_cell_source(url, branch, "0.0.1"), hide=())
    assert older["calls"] == []  # it installs nothing over the reader's rlgates ...
    assert older["printed"] == [  # ... but says it is not the one the notebook was made with
        f"warning: rlgates {rlgates.__version__} is installed, this notebook was made with "
        f"0.0.1: pip install --force-reinstall 'rlgates[widgets] @ git+{url}@{branch}'"]
    assert rn.load_book(ROOT, ROOT / "_build" / "no-build")[0].version == rlgates.__version__


def _kernel_without_rlgates(tmp_path, monkeypatch) -> None:
    """Kernels started from here on find no rlgates (as on Colab) and reach no repository."""
    hide_from_kernels(tmp_path, monkeypatch, ["rlgates"])
    unreachable_repository(tmp_path, monkeypatch)
    monkeypatch.setenv("MPLBACKEND", "Agg")


def test_setup_cell_stops_run_all_with_one_line_when_the_branch_cannot_be_reached(
        tmp_path, monkeypatch):
    """Offline, or before the workflow has published the branch: the set-up cell (its real
    code, in a real kernel) says what it installs, then fails with one line that gives the local
    alternative, no traceback; Run All stops there (nbclient, like JupyterLab and Colab, stops at
    a failing cell), so no later cell fails on the missing rlgates."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    _kernel_without_rlgates(tmp_path, monkeypatch)
    url, branch = rn.repository(rn.read_config())
    code = nbformat.v4.new_code_cell
    nb = chapter([code(rn.install_cell_source(url, branch, "0.2.0")), code("import rlgates"),
                  code("print('ran')")])
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    with client.setup_kernel():
        with pytest.raises(CellExecutionError):
            for i, cell in enumerate(nb.cells):  # Run All
                client.execute_cell(cell, i)
        # pip failed on the clone (the branch cannot be reached), and its message is kept
        probe = code("print('git clone' in pip.stderr, pip.returncode)")
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
        assert probe.outputs[0]["text"] == "True 1\n"
    setup = nb.cells[0]
    streams = "".join(o.get("text", "") for o in setup.outputs if o["output_type"] == "stream")
    assert streams == f"installing rlgates from git+{url}@{branch} (a minute or two)\n"
    (error,) = [o for o in setup.outputs if o["output_type"] == "error"]
    assert error["ename"] == "SetupFailed"
    assert error["traceback"] == [error["evalue"]]  # one line: no traceback, no pip message
    assert error["evalue"].startswith("rlgates could not be installed")
    assert error["evalue"].endswith(f"git clone {url} && cd {url.rsplit('/', 1)[-1]} && "
                                    "python3 tasks.py lab")
    assert "\n" not in error["evalue"]
    assert [c.outputs for c in nb.cells[1:3]] == [[], []]  # Run All stopped: no follow-on error
    assert [c.execution_count for c in nb.cells[1:3]] == [None, None]


def test_repository_url_is_set_once():
    """_config.yml names the repository; no other file of the project spells it out."""
    url, branch = rn.repository(rn.read_config())
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url) and branch
    spelled = [p for p in ["README.md", "index.md", "tasks.py", "scripts/reader_notebooks.py"]
               if url in (ROOT / p).read_text()]
    assert spelled == []


# ------------------------------------------------------------------------ the built notebooks
BUILD = Path(os.environ.get("BOOK_BUILD", ROOT / "_build"))
READER = BUILD / "reader"


@pytest.fixture(scope="module")
def built() -> dict[str, nbformat.NotebookNode]:
    if os.environ.get("RLGATES_REQUIRE_BOOK") == "0":
        pytest.skip("the check tests the reader notebooks after it builds the book")
    if not (READER / "problems.json").is_file():
        if os.environ.get("RLGATES_REQUIRE_BOOK") == "1":
            pytest.fail(f"no reader notebooks in {READER}: build the book first")
        pytest.skip("no book built (python3 tasks.py book); RLGATES_REQUIRE_BOOK=1 to fail")
    docs = rn.chapters(ROOT)
    missing = [d for d in docs if not (READER / f"{d}.ipynb").is_file()]
    assert not missing, f"no reader notebook for {missing}"
    return {d: nbformat.read(str(READER / f"{d}.ipynb"), as_version=4) for d in docs}


def test_built_notebooks_parse_and_resolve_every_glue_name(built):
    assert json.loads((READER / "problems.json").read_text()) == []
    for doc, nb in built.items():
        nbformat.validate(nb)
        assert nb.cells[1].metadata.get("tags") == [rn.INSTALL_TAG], doc


def test_built_notebooks_have_no_myst_left(built):
    found = {}
    for doc, nb in built.items():
        for i, c in enumerate(nb.cells):
            if c.cell_type == "markdown" and rn.myst_leftovers(c.source):
                found[f"{doc} cell {i}"] = rn.myst_leftovers(c.source)
            if c.cell_type == "markdown":
                assert "[" not in c.source or not re.search(r"\[[\w.]+\?\]", c.source), doc
    assert found == {}


def solution_code(doc: str) -> list[tuple[str, set]]:
    """(source, tags) of each code cell inside a solution of the chapter."""
    page = rn.Page(doc, make_book())
    found = []
    for c in chapter_sources.read(ROOT / f"{doc}.md").cells:
        if c.cell_type == "markdown":
            page.markdown(c.source)
        elif c.cell_type == "code" and page.in_solution:
            found.append((c.source, set(c.metadata.get("tags", []))))
    return found


def test_built_code_is_the_executed_chapters_code(built):
    """The reader notebook runs the chapter's own code cells, which nbval executed (and the
    book build used), except the solutions' (shown as text); only the set-up cell is new."""
    with_output = 0
    for doc, nb in built.items():
        src = chapter_sources.read(ROOT / f"{doc}.md")
        solutions = solution_code(doc)
        in_solution = {s for s, _ in solutions}
        assert [rn.unsignposted(c.source) for c in nb.cells if c.cell_type == "code"][1:] == \
            [c.source for c in src.cells if c.cell_type == "code"
             and c.source not in in_solution], doc
        shown = [c.source for c in nb.cells if rn.SOLUTION_TAG in c.metadata.get("tags", [])]
        assert len(shown) == sum("remove-cell" not in t for _, t in solutions), doc
        with_output += sum("and its output</b>" in s for s in shown)
        assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code"), doc
        captions = sum(bool(c.metadata.get("mystnb", {}).get("figure", {}).get("caption"))
                       for c in src.cells)
        # a figure inside a solution has its caption folded in a <details> block
        anchors = sum(c.cell_type == "markdown" and '<a id="fig-' in c.source for c in nb.cells)
        assert anchors >= captions, doc
    assert with_output > 0  # the build's outputs of the solutions were found


def test_nbval_executed_the_chapter_text(built):
    """What nbval ran (the notebooks generated from chapters/*.md, kept with their outputs in
    _build/executed) is each chapter's text, cell for cell, metadata included."""
    if not (BUILD / "executed").is_dir() and os.environ.get("RLGATES_REQUIRE_BOOK") != "1":
        pytest.skip("no nbval run kept (python3 tasks.py check writes _build/executed)")
    for doc in built:
        ran = nbformat.read(str(BUILD / "executed" / f"{doc}.ipynb"), as_version=4)
        text = chapter_sources.read(ROOT / f"{doc}.md")
        assert [(c.cell_type, c.source, c.metadata) for c in ran.cells] == \
            [(c.cell_type, c.source, c.metadata) for c in text.cells], doc
        assert any(c.get("outputs") for c in ran.cells), doc  # it really ran


def test_built_set_up_cells(built):
    """Every notebook's set-up cell compares with the rlgates it was built with, shows a plain
    first line when folded, and no notebook says the install fails before publication (R14)."""
    import rlgates

    for doc, nb in built.items():
        setup = nb.cells[1].source
        assert f'BUILT_WITH = "{rlgates.__version__}"' in setup, doc
        assert setup.startswith("# Set-up for Colab and Binder: "), doc
        assert "#@" not in setup, doc
        prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert "until then the install fails" not in prose, doc


TRAINERS_DOC = "chapters/14_real_trainers"


def test_chapter_14_counts_its_trainer_cells_and_shows_what_they_gave(built, tmp_path,
                                                                      monkeypatch):
    """Chapter 14's reader notebook, run as on Binder (no TRL, no verl): the number of cells that
    print the install line is the number its header states, and under each visible one whose run
    in the book build gave an output (the output the web page shows), that output is folded,
    labelled with the trainer versions installed here (R13)."""
    import importlib.metadata

    from nbclient import NotebookClient

    nb = copy.deepcopy(built[TRAINERS_DOC])
    hide_from_kernels(tmp_path, monkeypatch, TRAINER_MODULES)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"][1:]  # the set-up cell is not counted
    guarded = [c for c in code if "This cell needs TRL and verl" in _text(c.outputs)]
    folded = [c for c in guarded if c.metadata.get("jupyter", {}).get("outputs_hidden")]
    header = nb.cells[0].source
    stated = re.search(r"(\d+) of its (\d+) code cells \((\d+) of them folded checks\) need "
                       r"TRL and verl", header)
    assert stated, header
    assert [int(x) for x in stated.groups()] == [len(guarded), len(code), len(folded)]
    print(f"{len(guarded)} of {len(code)} code cells need the trainers ({len(folded)} folded)")
    versions = {n: importlib.metadata.version(n) for n in ("trl", "verl")}
    label = f"with TRL {versions['trl']} and verl {versions['verl']}"
    assert label in header
    # the outputs the web page shows: the book's jupyter-cache, which nbval's run primed
    executed = rn.executed_notebook(BUILD, chapter_sources.read(ROOT / f"{TRAINERS_DOC}.md"))
    assert executed is not None, "no run of chapter 14 in the book's cache"
    ran = {c.source: c.outputs for c in executed.cells if c.cell_type == "code"}
    shown = 0
    for i, cell in enumerate(nb.cells):
        if cell not in guarded or cell in folded:
            continue
        after = nb.cells[i + 1]
        body = rn.output_markdown(ran[cell.source])
        if not body:
            assert rn.RECORDED_TAG not in after.metadata.get("tags", []), cell.source[:60]
            continue
        assert rn.RECORDED_TAG in after.metadata.get("tags", []), cell.source[:60]
        assert f"Output recorded when the book was built, {label}" in after.source
        assert "\n".join(rn._trim(body)) in after.source
        shown += 1
    assert shown >= 10
    recorded = [c for c in nb.cells if rn.RECORDED_TAG in c.metadata.get("tags", [])]
    assert len(recorded) == shown  # and none under a cell that runs here


def test_download_button_serves_the_reader_notebook(built):
    for doc in built:
        served = BUILD / "html" / "_sources" / f"{doc}.ipynb"
        assert served.read_bytes() == (READER / f"{doc}.ipynb").read_bytes(), doc


def test_launch_buttons_read_the_configured_repository(built):
    url, branch = rn.repository(rn.read_config())
    org_repo = url.removeprefix("https://github.com/")
    doc = next(iter(built))
    html = (BUILD / "html" / f"{doc}.html").read_text()
    colab = f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{doc}.ipynb"
    binder = f"https://mybinder.org/v2/gh/{org_repo}/{branch}?urlpath=lab/tree/{doc}.ipynb"
    assert colab in html and binder in html.replace("&amp;", "&")
    assert "/./" not in re.sub(r"https?://", "", " ".join(re.findall(r'href="([^"]+)"', html)))


# ------------------------------------------------------------------ Binder, CI, licence, citation
# what a chapter may import beyond Binder's light environment: the standard library, rlgates,
# IPython (Binder's Jupyter), myst_nb (the set-up cell's stand-in), and chapter 14's trainers,
# which Binder does not install (that chapter's trainer cells need a machine of your own)
NOT_IN_BINDER = {"rlgates", "IPython", "myst_nb", "trl", "verl", "transformers", "datasets",
                 "tokenizers", "accelerate", "peft", "vllm", "ray",
                 "yaml"}  # chapter 14 reads verl's own config with it (verl needs it)


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_binder_environment_is_light_and_covers_the_chapters():
    binder = _pins(ROOT / "binder" / "requirements.txt")
    main = _pins(ROOT / "requirements.txt")
    assert set(binder) == {"torch", "numpy", "matplotlib", "ipywidgets"}
    assert all(main[name] == version for name, version in binder.items())  # same versions
    imported = set()
    for doc in rn.chapters(ROOT):
        for c in chapter_sources.read(ROOT / f"{doc}.md").cells:
            if c.cell_type == "code":
                imported |= set(re.findall(r"^\s*(?:from|import)\s+(\w+)", c.source, re.M))
    third_party = {m for m in imported - NOT_IN_BINDER if m not in sys.stdlib_module_names}
    assert third_party <= set(binder), third_party - set(binder)
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install --no-deps" in post and os.access(ROOT / "binder" / "postBuild", os.X_OK)


def test_workflow_runs_the_test_command_in_debian_and_deploys_pages():
    import yaml

    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    check = wf["jobs"]["check"]
    assert re.fullmatch(r"python:3\.11-(bookworm|trixie)", check["container"]["image"])
    runs = [s.get("run", "") for s in check["steps"]]
    assert "python3 tasks.py check" in runs
    uploads = [s for s in check["steps"] if str(s.get("uses", "")).startswith(
        "actions/upload-pages-artifact")]
    assert uploads and uploads[0]["with"]["path"] == "_build/html"
    assert any(str(s.get("uses", "")).startswith("actions/deploy-pages")
               for s in wf["jobs"]["pages"]["steps"])
    assert "push --force" in wf["jobs"]["notebooks"]["steps"][-1]["run"]
    _, branch = rn.repository(rn.read_config())
    assert f"git init -q -b {branch}" in wf["jobs"]["notebooks"]["steps"][-1]["run"]


def test_licences_and_citation():
    import yaml

    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    content = (ROOT / "LICENSE-CONTENT").read_text()
    assert "Creative Commons Attribution 4.0 International" in content and len(content) > 15000
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["title"] and cff["authors"] and cff["message"]
    url, _ = rn.repository(rn.read_config())
    assert cff["repository-code"] == url and cff["url"] == rn.pages_url(url)
    assert set(cff["license"]) == {"MIT", "CC-BY-4.0"}


def test_notebooks_branch_tree(built, tmp_path):
    import notebooks_branch

    files = {str(p) for p in notebooks_branch.assemble(tmp_path / "tree", "abc123")}
    for doc in built:
        assert f"{doc}.ipynb" in files  # where the launch buttons point
    assert {"binder/requirements.txt", "binder/postBuild", "pyproject.toml", "LICENSE",
            "LICENSE-CONTENT", "CITATION.cff", "rlgates/__init__.py", "README.md"} <= files
    assert not any("__pycache__" in f for f in files)


# ----------------------------------------------------------- one execution: nbval -> the book
def test_nbval_record_and_prime_cache(tmp_path):
    """nbval's outputs (glue, results, streams) are written out and found by the book's cache
    lookup; a notebook with a failing cell is not written."""
    from jupyter_cache import get_cache
    from prime_cache import prime

    code = nbformat.v4.new_code_cell
    good = chapter([code("x = 2"), code("from myst_nb import glue\nglue('x', x, display=False)"),
                    code("x * 3"), code("print('hi')")])
    bad = chapter([code("y = 1"), code("assert y == 2")])
    (tmp_path / "nb").mkdir()
    for name, nb in (("good", good), ("bad", bad)):  # the text source, and what nbval reads
        (tmp_path / "nb" / f"{name}.md").write_text(chapter_sources.text(nb))
        nbformat.write(chapter_sources.read(tmp_path / "nb" / f"{name}.md"),
                       str(tmp_path / "nb" / f"{name}.ipynb"))
    out = tmp_path / "executed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:randomly", "-p",
         "nbval_record", "--nbval-record", str(out), "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "nb"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300)
    assert "1 failed" in run.stdout, run.stdout[-2000:]
    assert not (out / "nb" / "bad.ipynb").exists()
    nb = nbformat.read(str(out / "nb" / "good.ipynb"), as_version=4)
    outputs = [c.outputs for c in nb.cells]
    assert [c.execution_count for c in nb.cells] == [1, 2, 3, 4]
    # the kernel's language_info, as an executed notebook has it: the book highlights with it
    assert nb.metadata["language_info"]["pygments_lexer"] == "ipython3"
    assert outputs[1][0]["metadata"]["scrapbook"]["name"] == "x"
    assert outputs[2][0]["output_type"] == "execute_result"
    assert outputs[2][0]["data"]["text/plain"] == "6"
    assert outputs[3][0]["text"] == "hi\n"
    primed = prime(out, tmp_path / "cache", root=tmp_path)
    assert primed == [Path("nb/good.md")]
    cache = get_cache(str(tmp_path / "cache"))
    source = chapter_sources.read(tmp_path / "nb" / "good.md")  # as myst-nb reads the chapter
    _, merged = cache.merge_match_into_notebook(source)  # myst-nb's lookup in cache mode
    assert [c.outputs for c in merged.cells] == outputs


# ------------------------------------------------------------- Run All shows no answer
def _text(outputs) -> str:
    parts = []
    for o in outputs:
        parts.append("".join(o.get("text", "")))
        for mime in ("text/plain", "text/markdown", "text/html"):
            parts.append("".join(o.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def test_run_all_shows_no_answer():
    """Run All of a reader notebook (nbclient, as JupyterLab or Colab run every code cell in
    order) passes and shows no solution's output; each solution, run on request (its code in a
    new cell, as the reader would), gives an answer that Run All did not show."""
    from nbclient import NotebookClient

    doc = "chapters/07_sapo"
    book, notebooks = rn.load_book(ROOT, ROOT / "_build" / "no-build")  # no glue: not needed
    nb = rn.reader_notebook(doc, notebooks[doc], book)
    solutions = [c for c in nb.cells if rn.SOLUTION_TAG in c.metadata.get("tags", [])]
    assert solutions and all(c.cell_type == "markdown" for c in solutions)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "chapters")}})
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):  # Run All
            if cell.cell_type == "code":
                client.execute_cell(cell, i)
        shown = "\n".join(_text(c.outputs) for c in nb.cells if c.cell_type == "code")
        answers = []
        for sol in solutions:  # the reader runs each solution on request
            code = re.search(r"```python\n(.*?)\n```", sol.source, re.S).group(1)
            probe = nbformat.v4.new_code_cell(code)
            nb.cells.append(probe)
            client.execute_cell(probe, len(nb.cells) - 1)
            answers += [line for line in _text(probe.outputs).splitlines()
                        if len(line.strip()) > 12 and not line.startswith("<")]
    assert answers  # the solutions do answer (negative control)
    assert [a for a in answers if a in shown] == []


# ------------------------------------------------------------------- `python3 tasks.py lab`
def _tasks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tasks_under_test", ROOT / "tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    return tasks


def _run_lab(tmp_path, monkeypatch, capsys, build: bool):
    """`tasks.lab()` up to the point where it starts JupyterLab (its exec recorded instead),
    with everything already installed; `build`: whether the reader notebooks must be built."""
    tasks = _tasks()
    tmp_path = tmp_path / ("to-build" if build else "built")
    reader = tmp_path / "reader"
    if not build:
        (reader / "chapters").mkdir(parents=True)
    started = []
    monkeypatch.setattr(tasks, "READER", reader)
    monkeypatch.setattr(tasks, "WORKING_COPY", tmp_path / "notebooks")
    monkeypatch.setattr(tasks, "setup", lambda: None)
    monkeypatch.setattr(tasks, "ensure_jupyterlab", lambda: None)
    monkeypatch.setattr(tasks, "execute_chapters", lambda: tasks.TIMINGS.append(("nbval", 1, 0)))
    monkeypatch.setattr(tasks, "build_book", lambda: (reader / "chapters").mkdir(parents=True))
    monkeypatch.setattr(tasks.os, "execv", lambda path, cmd: started.append(cmd))
    tasks.lab(["--port", "8890"])
    return started[0], capsys.readouterr().out


def test_lab_prints_no_empty_timings_and_asks_no_news_question(tmp_path, monkeypatch, capsys):
    """`tasks.py lab` with nothing to install or build: no empty "step timings ... wall 0.0 s"
    table before JupyterLab starts; with a step that ran, its timing (R15). JupyterLab starts with
    news fetching off, so it asks no "notified about official Jupyter news?" question."""
    cmd, out = _run_lab(tmp_path, monkeypatch, capsys, build=False)
    assert "step timings" not in out and "wall" not in out
    assert "--LabApp.news_url=None" in cmd and "--port" in cmd
    _, out = _run_lab(tmp_path, monkeypatch, capsys, build=True)
    assert "step timings" in out and "nbval" in out
    # the option is JupyterLab's own (a misspelt one is only a warning in its log)
    labapp = pytest.importorskip("jupyterlab.labapp")
    app = labapp.LabApp()
    assert app.news_url is not None
    app.parse_command_line([a for a in cmd[1:] if a.startswith("--LabApp.")])
    assert app.news_url is None
