"""A book that says what it is (the reader-experience review, R8): CITATION.cff carries the
package's version, and every built page's footer names the licences, how to cite the book, the
rlgates version and the build's date (scripts/book_web.py: footer_html).

The first test needs no book (it runs with the unit tests); the second reads the built pages.
"""

from __future__ import annotations

import re

import pytest
import yaml
from bookserver import ROOT
from crawl import pages

import rlgates


def test_citation_version_is_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert str(cff["version"]) == rlgates.__version__, (
        f"CITATION.cff says {cff['version']}, rlgates.__version__ is {rlgates.__version__}")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(rf'^version = "{re.escape(rlgates.__version__)}"', pyproject, re.M)


@pytest.mark.browser
def test_every_page_footer_names_licence_citation_version_and_date(book_dir):
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    bad = []
    for rel in pages(book_dir):
        html = (book_dir / rel).read_text(encoding="utf-8")
        footer = html.split('<div class="rlg-footer">', 1)[-1].split("</div>", 1)[0] \
            if '<div class="rlg-footer">' in html else ""
        missing = [what for what, ok in [
            ("footer", bool(footer)),
            ("CC BY 4.0 link", 'LICENSE-CONTENT" rel="license">CC BY 4.0</a>' in footer),
            ("MIT link", 'LICENSE" rel="license">MIT</a>' in footer),
            ("how to cite", "How to cite:" in footer and cff["title"] in footer
             and "CITATION.cff" in footer),
            (f"version {rlgates.__version__}",
             f'<span class="rlg-version-number">{rlgates.__version__}</span>' in footer),
            ("build date", bool(re.search(r'<time datetime="\d{4}-\d\d-\d\d">', footer))),
        ] if not ok]
        if missing:
            bad.append(f"{rel}: no {', '.join(missing)}")
    assert not bad, "\n".join(bad)
