"""The web book as a reader sees it at 1280 px (laptop) and 390 px (phone): figure text size,
code that fits, Table 1, wide equations, merged output streams, search excerpts, page weight.

What the layout controls (book.css, book.js, rlgates.setup) is asserted. What a chapter controls
(a figure drawn with small explicit font sizes, a code line over 80 columns) is reported as a
warning naming the chapter, so that the layout test does not fail on a chapter's content.

Run: `python -m pytest tests/browser -m browser` after `python3 tasks.py book` (or set BOOK_HTML).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from crawl import PHONE, pages
from PIL import Image

from rlgates.notebook import FONT_SIZE

pytestmark = pytest.mark.browser

MIN_TEXT_PX = 9.0  # figure text as displayed at 1280 px
PHONE_MIN_TEXT_PX = 8.0  # the smallest figure text as displayed at 390 px (review item R7)
TABLE1_ROW_MAX_PX = 230  # the review found Table 1 rows 230-490 px tall



def png_text(book_dir: Path, src: str) -> dict:
    """The text chunks of a built PNG (rlgates:px-per-inch, rlgates:min-font-pt)."""
    path = book_dir / unquote(urlsplit(src).path).lstrip("/")
    with Image.open(path) as im:
        return dict(getattr(im, "text", {}) or {})


@pytest.fixture(scope="module")
def measured(site):
    """What MEASURE read on every chapter page and the index at 1280 and at 390 px, in the
    session's one visit of each page per width (crawl.py)."""
    return {key: m["measure"] for key, m in site["pages"].items() if "measure" in m}


def _chapters(measured, label):
    return {rel: m for (lab, rel), m in measured.items() if lab == label}


def _figure_text(book_dir, measured, label):
    """(page, index, figure, shown text px at FONT_SIZE, smallest shown text px, its pt) for
    each figure at `label`'s width that carries rlgates' PNG metadata (the aspect ratio of every
    figure checked on the way)."""
    out = []
    for rel, m in _chapters(measured, label).items():
        for k, f in enumerate(m["figures"]):
            assert abs(f["ratio"] - 1) < 0.02, (rel, k, f)  # no squashed figure
            meta = png_text(book_dir, f["src"])
            if "rlgates:px-per-inch" not in meta:
                continue
            shown_ppi = f["shown"] * float(meta["rlgates:px-per-inch"]) / f["natural"]
            smallest_pt = float(meta.get("rlgates:min-font-pt", FONT_SIZE))
            out.append((rel, k, f, FONT_SIZE / 72 * shown_ppi, smallest_pt / 72 * shown_ppi,
                        smallest_pt))
    assert len(out) >= 10, f"only {len(out)} figures carry rlgates' PNG metadata: is " \
        "rlgates.setup in use?"
    return out


def test_figures_legible_on_desktop(book_dir, measured):
    """At 1280 px every figure keeps its aspect ratio, and all its text, at the book's default
    size (rlgates.setup: FONT_SIZE pt) or an explicit fontsize=..., is at least 9 px as
    displayed."""
    bad, small = [], []
    for rel, k, f, default_px, smallest, pt in _figure_text(book_dir, measured, "desktop"):
        if default_px < MIN_TEXT_PX:
            bad.append(f"{rel} figure {k} ({f['caption']}): {FONT_SIZE} pt text shows at "
                       f"{default_px:.1f} px (scale {f['shown'] / f['natural']:.2f})")
        if smallest < MIN_TEXT_PX:
            small.append(f"{rel} figure {k}: smallest text {pt} pt shows at {smallest:.1f} px "
                         "at 1280 px")
    assert not bad, "\n".join(bad)
    assert not small, "\n".join(small)


def test_figures_open_full_size_on_a_phone(measured):
    """At 390 px every figure fits the screen and is a link to its own full-size image, the
    laptop one (tap to zoom), even where the page shows its phone version; the page never
    scrolls sideways."""
    bad = []
    for rel, m in _chapters(measured, "phone").items():
        if m["overflow"] > 1:
            bad.append(f"{rel}: page is {m['overflow']} px wider than the phone")
        for k, f in enumerate(m["figures"]):
            if f["shown"] > PHONE["width"]:
                bad.append(f"{rel} figure {k}: {f['shown']:.0f} px wide")
            full, shown = urlsplit(f["full"]).path, urlsplit(f["src"]).path
            if not f["link"] or urlsplit(f["link"]).path != full:
                bad.append(f"{rel} figure {k}: not linked to its full-size image ({f['link']})")
            if shown not in (full, full.removesuffix(".png") + ".phone.png"):
                bad.append(f"{rel} figure {k}: shows {shown}, neither {full} nor its phone PNG")
    assert not bad, "\n".join(bad)


def test_figures_legible_on_a_phone(book_dir, measured):
    """At 390 px every figure keeps its aspect ratio, and its smallest text, as displayed in the
    column, is at least 8 px: read from the PNG actually shown (img.currentSrc), which for a
    figure too wide for the column is its phone version, panels stacked
    (scripts/phone_figures.py)."""
    figures = _figure_text(book_dir, measured, "phone")
    sizes = sorted(px for *_, px, _ in figures)
    small = [f"{rel} figure {k} ({f['caption']}): smallest text {pt} pt shows at {px:.1f} px "
             f"({Path(urlsplit(f['src']).path).name})"
             for rel, k, f, _, px, pt in figures if px < PHONE_MIN_TEXT_PX]
    assert not small, (f"{len(small)} of {len(figures)} figures (smallest text at 390 px: min "
                       f"{sizes[0]:.1f}, median {sizes[len(sizes) // 2]:.1f} px)\n"
                       + "\n".join(small))


def test_code_fits_on_desktop(measured):
    """At 1280 px a code block holds 80 columns, and no block scrolls sideways (chapters keep
    their code to 80 columns: tests/test_notebooks.py)."""
    bad = []
    for rel, m in _chapters(measured, "desktop").items():
        for k, c in enumerate(m["code"]):
            if c["cols80"] > c["inner"] + 1:
                bad.append(f"{rel} block {k}: 80 columns need {c['cols80']:.0f} px, "
                           f"the block has {c['inner']:.0f}")
            if c["scroll"] > c["client"] + 1:
                bad.append(f"{rel} block {k} ({c['first']!r}) scrolls: {c['scroll']} > "
                           f"{c['client']} px with lines of up to {c['longest']} columns")
    assert not bad, "\n".join(bad)


def test_table1_readable(measured):
    """Table 1 (rlgates.table(), chapters 3, 9 and 13): no formula or insight is cut, and at
    1280 px no method's entry (its formulas and its insight) is 230 px tall or more."""
    seen, bad = 0, []
    for (label, rel), m in measured.items():
        for t in m["tables"]:
            seen += 1
            if t["width"] > t["box"] + 1:
                bad.append(f"{rel} {label}: table {t['width']:.0f} px in a {t['box']} px box")
            for cell in t["overflow"]:
                bad.append(f"{rel} {label}: cell cut: {cell}")
            if label == "desktop":
                for row in t["rows"]:
                    if row["height"] >= TABLE1_ROW_MAX_PX:
                        bad.append(f"{rel}: {row['method']} is {row['height']:.0f} px tall")
    assert seen >= 2 * 3, f"Table 1 found {seen} times (3 chapters x 2 widths expected)"
    assert not bad, "\n".join(bad)


def test_display_equations_fit_on_desktop(measured):
    """At 1280 px no display equation is cut: book.js scales a wide one down to fit."""
    bad = [f"{rel}: {e['tex']!r} needs {e['scroll']} px of {e['client']} (at {e['scale']})"
           for rel, m in _chapters(measured, "desktop").items() for e in m["equations"]
           if e["scroll"] > e["client"] + 1]
    assert not bad, "\n".join(bad)


def test_printed_output_is_one_block_per_cell(measured):
    """nb_merge_streams: a cell's printed lines make one output block (one for stderr)."""
    bad = [f"{rel}: cell output {k} has {s[0]} stdout and {s[1]} stderr blocks"
           for rel, m in _chapters(measured, "desktop").items()
           for k, s in enumerate(m["streams"]) if s[0] > 1 or s[1] > 1]
    assert not bad, "\n".join(bad)


def test_search_excerpts_are_plain_text(searched):
    """Search results quote the article, with math as symbols: no TeX source, no sidebar."""
    excerpts = searched["excerpts"]
    assert excerpts and not searched["problems"], searched["problems"]
    raw = [e for e in excerpts if re.search(r"\\[A-Za-z]+|\\[()\[\]]", e)]
    assert not raw, raw[:5]
    assert any("ρ" in e or "gate" in e.lower() for e in excerpts)


def test_pages_load_no_unused_framework(book_dir):
    """No page loads fontawesome.js (1.4 MB; the theme's CSS draws the icons), and only the
    search page loads the search index."""
    bad = []
    for rel in pages(book_dir):
        html = (book_dir / rel).read_text(errors="replace")
        if "fontawesome.js" in html:
            bad.append(f"{rel}: loads fontawesome.js")
        if rel != "search.html" and "searchindex.js" in html:
            bad.append(f"{rel}: loads searchindex.js")
    assert "searchindex.js" in (book_dir / "search.html").read_text()
    assert not bad, "\n".join(bad)


def test_layout_screenshots(themed):
    """Screenshots for a person to look at (screenshots/; conftest.py: themed): Table 1 and a
    multi-panel figure at 1280 and 390 px, and the explorer at SAPO with a readout, in both
    themes. The explorer's deep link opens it at SAPO, and its formula fits its box at both
    widths."""
    assert not themed["layout"], "\n".join(themed["layout"])
