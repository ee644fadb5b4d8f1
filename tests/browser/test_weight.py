"""What a page weighs: no page of the built book makes a reader's browser load more than 1.3 MB
(HTML, style sheets, scripts, fonts, images, MathJax's components and fonts, as served, without
compression), measured in the session's visit of each page at 1280 px (crawl.py), as
benchmarks/page_weight.py measures it: each page in a fresh browser context, MathJax done,
solutions open, every image and web font loaded, the network idle. And the icon fonts, cut to
the icons the book shows (scripts/lighter_assets.py), still hold every icon a style sheet draws.

Run: `python -m pytest tests/browser -m browser` after `python3 tasks.py book` (or set BOOK_HTML).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from page_weight import LIMIT, breakdown  # noqa: E402

pytestmark = pytest.mark.browser
#: the reader-experience review's R9: every page at most 1.3 MB cold, room under the benchmark's
#: 1.5 MB limit (math typeset at build time took MathJax's scripts off every page but one)
TARGET = min(LIMIT, 1_300_000)

FONT_FACE = re.compile(r"@font-face\s*\{([^}]*)\}")
#: an icon as a style sheet names it: a private-use code point in a CSS string ("\f09b")
ICON = re.compile(r'"\\([ef][0-9a-fA-F]{3}) ?"')


@pytest.fixture(scope="module")
def weights(site):
    """{page: its weight at 1280 px}, from the session's one visit of each page (crawl.py)."""
    return {rel: m["weight"] for (width, rel), m in site["pages"].items() if width == "desktop"}


def test_no_page_heavier_than_the_limit(weights):
    assert len(weights) >= 20, sorted(weights)
    math_pages = [rel for rel, w in weights.items() if breakdown(w["files"])["mathjax"]]
    assert len(math_pages) >= 17, f"MathJax loaded on only {math_pages}: did it run?"
    missing = {rel: w["missing"] for rel, w in weights.items() if w["missing"]}
    assert not missing, f"requests the book cannot answer: {missing}"
    heavy = {rel: w["total"] for rel, w in weights.items() if w["total"] > TARGET}
    rel, top = max(weights.items(), key=lambda kv: kv[1]["total"])
    worst = "\n".join(f"  {size / 1000:7.1f} kB  {path}" for path, size in
                      sorted(top["files"].items(), key=lambda kv: -kv[1])[:12])
    assert not heavy, (f"pages over {TARGET / 1e6} MB: {heavy}\nheaviest, {rel}:\n{worst}")


def test_a_math_page_loads_mathjax_fonts_and_the_explorer_mathjax(weights):
    """The measurement sees what a page loads on demand (negative control for the limit). A
    chapter's formulas are typeset at build time (scripts/lighter_assets.py: typeset_math): it
    loads MathJax's fonts, not its scripts. The explorer typesets as the reader moves: it loads
    MathJax, with TeX's base package and the AMS extension (_config.yml), not the full 180 kB
    input/tex.js."""
    files = weights["chapters/08_gspo.html"]["files"]
    assert any(p.endswith(".woff") and "mathjax" in p for p in files), sorted(files)
    assert not any(p.endswith(".js") and "mathjax" in p for p in files), sorted(files)
    assert breakdown(files)["image"] > 0
    files = weights["explorer.html"]["files"]
    assert any(p.endswith("mathjax/output/chtml.js") for p in files), sorted(files)
    assert any(p.endswith("mathjax/input/tex-base.js") for p in files), sorted(files)
    assert any(p.endswith("mathjax/input/tex/extensions/ams.js") for p in files), sorted(files)
    assert not any(p.endswith("mathjax/input/tex.js") for p in files), sorted(files)
    assert any(p.endswith(".woff") and "mathjax" in p for p in files), sorted(files)


def _icon_fonts(book_dir: Path) -> dict[Path, set[int]]:
    """{font file: its code points} for every Font Awesome @font-face the theme declares."""
    from fontTools.ttLib import TTFont

    css = book_dir / "_static" / "styles" / "pydata-sphinx-theme.css"
    out = {}
    for body in FONT_FACE.findall(css.read_text(encoding="utf-8")):
        if "Font Awesome" in body:
            for url in re.findall(r"url\(([^)]*)\)", body):
                font = (css.parent / url.strip("\"'")).resolve()
                out[font] = set(TTFont(font).getBestCmap())
    return out


def test_icon_fonts_hold_every_icon_drawn(book_dir):
    from fontTools.ttLib import TTFont

    fonts = _icon_fonts(book_dir)
    assert len(fonts) >= 2, f"Font Awesome @font-face rules: {sorted(fonts)}"
    css = "".join(p.read_text(encoding="utf-8") for p in (book_dir / "_static").rglob("*.css"))
    icons = {int(h, 16) for h in ICON.findall(css)}
    assert len(icons) >= 10, f"only {len(icons)} icons named: is the theme's CSS there?"
    held = set().union(*fonts.values())
    assert not icons - held, f"icons drawn but in no icon font: {sorted(map(hex, icons - held))}"
    # negative control: the served fonts were cut from the full ones, which hold far more
    for font, points in fonts.items():
        full = font.with_name(font.name.split(".")[0] + ".ttf")
        if full != font and full.is_file():
            assert len(points) < len(set(TTFont(full).getBestCmap())) / 5, font.name
