"""scripts/api_docs.py: the API page shows a docstring's prose as plain text and its `>>>`
examples as Python, on a tiny Sphinx project (a few seconds; the book's api/*.md pages use the same
extension)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sphinx")
sys.path.insert(0, str(ROOT / "scripts"))
import api_docs  # noqa: E402

# Prose that Pygments' Python lexer colours (keywords, names, True, operators), as Sphinx's
# default highlighting did on the API page; then an example; then prose again.
DOCSTRING = '''The figure as PNG bytes. With live=True only the moving parts are redrawn (blitting).

    if A > 0: gate is 1 for ρ < 1 + ε, else 0

    >>> import math
    >>> png = figure_png(live=True)   # bytes
    >>> print("done")
    done

Returns None when nothing is drawn.
'''


def test_docstring_blocks_split_examples_from_prose():
    lines = DOCSTRING.splitlines()
    blocks = api_docs.docstring_blocks(lines)
    assert [language for language, _ in blocks] == ["text", "pycon", "text"]
    assert blocks[1][1][0].strip() == ">>> import math" and blocks[1][1][-1].strip() == "done"
    assert blocks[0][1][0].startswith("The figure") and blocks[0][1][-1].strip().startswith("if A")
    assert blocks[2][1] == ["Returns None when nothing is drawn."]
    # nothing lost, nothing added but the blank lines between runs
    assert [x for _, run in blocks for x in run if x.strip()] == [x for x in lines if x.strip()]
    assert api_docs.docstring_blocks(["", "  "]) == []


def _build(tmp_path: Path) -> str:
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "tinymod.py").write_text(f"def figure_png(live=False):\n    {DOCSTRING!r}\n")
    (src / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT / 'scripts')!r}, {str(src)!r}]\n"
        "extensions = ['api_docs']\n")
    (src / "index.rst").write_text("API\n===\n\n.. automodule:: tinymod\n   :members:\n")
    warnings = tmp_path / "warnings.txt"
    with warnings.open("w") as w:
        app = Sphinx(str(src), str(src), str(tmp_path / "html"), str(tmp_path / "doctrees"),
                     "html", status=None, warning=w, freshenv=True)
        app.build()
    sys.modules.pop("tinymod", None)
    assert warnings.read_text() == "", warnings.read_text()
    return (tmp_path / "html" / "index.html").read_text()


def _pre(html: str, language: str) -> list[str]:
    """The <pre> of every docstring block highlighted as `language`."""
    blocks = re.findall(r'<div class="([^"]*)"><div class="highlight"><pre>(.*?)</pre>', html, re.S)
    return [pre for classes, pre in blocks
            if {f"highlight-{language}", api_docs.DOCSTRING_CLASS} <= set(classes.split())]


def _token_classes(pre: str) -> set[str]:
    return set(re.findall(r'<span class="([^"]+)"', pre))


def test_api_page_shows_prose_plain_and_examples_as_python(tmp_path):
    from sphinx.highlighting import PygmentsBridge

    html = _build(tmp_path)
    prose, examples = _pre(html, "text"), _pre(html, "pycon")
    assert len(prose) == 2 and len(examples) == 1, html
    assert "With live=True only" in prose[0] and "Returns None" in prose[1]
    assert all(_token_classes(p) <= {"w"} for p in prose), [_token_classes(p) for p in prose]
    assert {"gp", "kn", "nn", "s2", "c1"} <= _token_classes(examples[0])  # >>>, import, "…", #
    assert 'class="highlight-default' not in html  # no block left to Sphinx's default
    assert 'class="sig-name descname"><span class="pre">figure_png' in html  # autodoc's signature
    # negative control: Sphinx's default highlighting, which a plain literal block gets, colours
    # this very prose as Python
    coloured = PygmentsBridge("html").highlight_block(DOCSTRING.split("\n\n")[0], "default")
    assert {"n", "k", "kc", "o"} <= _token_classes(coloured)


# ----------------------------------------------------------------------------- one page per module
# (R12: api.md was one 795 kB page). The built pages' sizes: tests/browser/test_head.py.
AUTOMODULE = re.compile(r"^\.\. automodule:: (\S+)", re.M)
DOC_LINK = re.compile(r"\{doc\}`[^`<]*<(api/[\w.]+)>`")


def _api_pages() -> dict[str, list[str]]:
    """docname (api/NAME) -> the modules its automodule directives document."""
    return {f"api/{p.stem}": AUTOMODULE.findall(p.read_text(encoding="utf-8"))
            for p in sorted((ROOT / "api").glob("*.md"))}


def test_api_index_links_one_page_per_module_in_the_toc():
    import yaml

    pages = _api_pages()
    assert len(pages) >= 10, pages
    index = (ROOT / "api.md").read_text(encoding="utf-8")
    assert "automodule" not in index  # the index is short: links only
    linked = DOC_LINK.findall(index)
    assert sorted(linked) == sorted(pages), (linked, list(pages))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [c for part in toc["parts"] for c in part["chapters"]]
    api = next(c for c in entries if c["file"] == "api")
    assert [s["file"] for s in api.get("sections", [])] == linked  # in the index's order


def test_every_module_is_documented_on_one_page():
    import importlib

    where: dict[str, str] = {}
    for page, modules in _api_pages().items():
        assert modules, f"{page} documents no module"
        for module in modules:
            assert module not in where, f"{module} on {where[module]} and {page}"
            where[module] = page
            importlib.import_module(module)  # autodoc would warn, and the strict build fail
    # the top level and each public subpackage of rlgates have a page of their own
    for name in ("rlgates", "rlgates.methods", "rlgates.lab", "rlgates.trainers",
                 "rlgates.inspect", "rlgates.reference"):
        assert name in where, name
    # chapter 21 points at 'the API reference's section "Capture a trainer's batches"'
    inspect = (ROOT / f"{where['rlgates.inspect.capture']}.md").read_text(encoding="utf-8")
    assert "\n## Capture a trainer's batches" in inspect
