"""scripts/book_web.py: the {explorer} role and the lighter-pages pass, on a tiny Sphinx project
(a second or two; the full book is checked by tests/browser)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")


def _build(tmp_path: Path, chapter_md: str):
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    (src / "chapters").mkdir(parents=True)
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "extensions = ['myst_parser', 'book_web_role']\n")
    shim = src / "book_web_role.py"  # the role and its resolver only (no MathJax download)
    shim.write_text("import book_web\n\ndef setup(app):\n"
                    "    app.add_role('explorer', book_web.explorer_role)\n"
                    "    app.connect('doctree-resolved', book_web._resolve_explorer)\n")
    sys.path.insert(0, str(src))
    (src / "index.md").write_text("# Book\n\n```{toctree}\nchapters/a\nexplorer\n```\n")
    (src / "explorer.md").write_text("# Explorer\n")
    (src / "chapters" / "a.md").write_text(chapter_md)
    out = tmp_path / "html"
    warnings = tmp_path / "warnings.txt"
    with warnings.open("w") as w:
        app = Sphinx(str(src), str(src), str(out), str(tmp_path / "doctrees"), "html",
                     status=None, warning=w, freshenv=True)
        app.build()
    sys.path.remove(str(src))
    sys.modules.pop("book_web_role", None)
    return out, warnings.read_text()


def test_explorer_role_links_the_method_relative_to_the_page(tmp_path):
    out, warnings = _build(tmp_path, "# A\n\nSee {explorer}`sapo`.\n")
    html = (out / "chapters" / "a.html").read_text()
    assert 'href="../explorer.html#sapo"' in html
    assert "open SAPO in the gate explorer</a>" in html
    assert "ERROR" not in warnings


def test_explorer_role_rejects_a_method_the_explorer_lacks(tmp_path):
    _out, warnings = _build(tmp_path, "# A\n\nSee {explorer}`no_such_method`.\n")
    assert "explorer role: 'no_such_method' is not in the gate explorer" in warnings


def test_lighter_pages_drop_unused_scripts_and_icon_rules(tmp_path):
    import types

    sys.path.insert(0, str(ROOT / "scripts"))
    import book_web

    out = tmp_path / "html"
    (out / "_static" / "scripts").mkdir(parents=True)
    (out / "_static" / "styles").mkdir(parents=True)
    head = ('<script defer src="_static/scripts/fontawesome.js?digest=1"></script>\n'
            '<script src="_static/searchtools.js"></script>\n'
            '<script src="searchindex.js"></script>\n')
    (out / "index.html").write_text(head + '<i class="fa-solid fa-bars"></i>')
    (out / "search.html").write_text(head)
    (out / "_static" / "scripts" / "fontawesome.js").write_text("x")
    (out / "_static" / "scripts" / "theme.js").write_text("el.classList.add('fa-moon')")
    css = (".fa-bars:before{content:\"a\"}.fa-moon:before{content:\"b\"}"
           ".fa-zzz:before,.fa-bars-x:before{content:\"c\"}.other{color:red}")
    (out / "_static" / "styles" / "pydata-sphinx-theme.css").write_text(css)
    app = types.SimpleNamespace(outdir=str(out), builder=types.SimpleNamespace(format="html"))
    book_web._lighter_pages(app, None)
    index = (out / "index.html").read_text()
    assert "fontawesome" not in index and "searchindex" not in index and "fa-bars" in index
    search = (out / "search.html").read_text()
    assert "searchindex.js" in search and "fontawesome" not in search
    assert not (out / "_static" / "scripts" / "fontawesome.js").exists()
    new_css = (out / "_static" / "styles" / "pydata-sphinx-theme.css").read_text()
    # the icons some page or script uses; `.other` goes too, as no page has that class
    # (scripts/lighter_assets.py, tests/test_lighter_assets.py)
    assert new_css == '.fa-bars:before{content:"a"}.fa-moon:before{content:"b"}'
