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
from bookserver import SCREENSHOTS
from PIL import Image
from test_book import DESKTOP, MEASURE, PHONE, Tab, desktop_visit, layout_pages, pages

from rlgates.notebook import FONT_SIZE

pytestmark = pytest.mark.browser

MIN_TEXT_PX = 9.0  # figure text as displayed at 1280 px
TABLE1_ROW_MAX_PX = 230  # the review found Table 1 rows 230-490 px tall



def png_text(book_dir: Path, src: str) -> dict:
    """The text chunks of a built PNG (rlgates:px-per-inch, rlgates:min-font-pt)."""
    path = book_dir / unquote(urlsplit(src).path).lstrip("/")
    with Image.open(path) as im:
        return dict(getattr(im, "text", {}) or {})


@pytest.fixture(scope="module")
def measured(book_dir, base_url, browser):
    """Every chapter page and the index, measured at 1280 px (in test_book's one visit of every
    page at that width) and at 390 px."""
    from bookserver import Offline

    visit = desktop_visit(book_dir, base_url, browser)
    assert not visit["problems"], visit["problems"]
    out = {("desktop", rel): m for rel, m in visit["measured"].items()}
    problems = []
    ctx = Offline(browser, viewport=PHONE, is_mobile=True, has_touch=True)
    tab = Tab(ctx, problems)
    for rel in layout_pages(book_dir):
        out["phone", rel] = tab.open(base_url + rel, f"{rel} phone").evaluate(MEASURE)
    tab.page.close()
    ctx.close()
    assert not problems, problems
    return out


def _chapters(measured, label):
    return {rel: m for (lab, rel), m in measured.items() if lab == label}


def test_figures_legible_on_desktop(book_dir, measured):
    """At 1280 px every figure keeps its aspect ratio, and all its text, at the book's default
    size (rlgates.setup: FONT_SIZE pt) or an explicit fontsize=..., is at least 9 px as
    displayed."""
    bad, small, n = [], [], 0
    for rel, m in _chapters(measured, "desktop").items():
        for k, f in enumerate(m["figures"]):
            assert abs(f["ratio"] - 1) < 0.02, (rel, k, f)  # no squashed figure
            meta = png_text(book_dir, f["src"])
            if "rlgates:px-per-inch" not in meta:
                continue
            n += 1
            shown_ppi = f["shown"] * float(meta["rlgates:px-per-inch"]) / f["natural"]
            default_px = FONT_SIZE / 72 * shown_ppi
            if default_px < MIN_TEXT_PX:
                bad.append(f"{rel} figure {k} ({f['caption']}): {FONT_SIZE} pt text shows at "
                           f"{default_px:.1f} px (scale {f['shown'] / f['natural']:.2f})")
            smallest = float(meta.get("rlgates:min-font-pt", FONT_SIZE)) / 72 * shown_ppi
            if smallest < MIN_TEXT_PX:
                small.append(f"{rel} figure {k}: smallest text {meta['rlgates:min-font-pt']} pt "
                             f"shows at {smallest:.1f} px at 1280 px")
    assert n >= 10, f"only {n} figures carry rlgates' PNG metadata: is rlgates.setup in use?"
    assert not bad, "\n".join(bad)
    assert not small, "\n".join(small)


def test_figures_open_full_size_on_a_phone(measured):
    """At 390 px every figure fits the screen and is a link to its own full-size image (tap to
    zoom); the page never scrolls sideways."""
    bad = []
    for rel, m in _chapters(measured, "phone").items():
        if m["overflow"] > 1:
            bad.append(f"{rel}: page is {m['overflow']} px wider than the phone")
        for k, f in enumerate(m["figures"]):
            if f["shown"] > PHONE["width"]:
                bad.append(f"{rel} figure {k}: {f['shown']:.0f} px wide")
            if not f["link"] or urlsplit(f["link"]).path != urlsplit(f["src"]).path:
                bad.append(f"{rel} figure {k}: not linked to its full-size image ({f['link']})")
    assert not bad, "\n".join(bad)


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


def test_search_excerpts_are_plain_text(base_url, offline):
    """Search results quote the article, with math as symbols: no TeX source, no sidebar."""
    ctx = offline(route=True, viewport=DESKTOP)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + "search.html?q=gate", "search")
    page.wait_for_selector("#search-results ul.search li p.context", timeout=20_000)
    page.wait_for_function("() => !document.querySelector('#search-progress') || "
                           "!document.querySelector('#search-progress').textContent", timeout=20_000)
    excerpts = page.eval_on_selector_all("#search-results li p.context",
                                         "ps => ps.map(p => p.textContent)")
    page.close()
    assert excerpts and not problems, problems
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


def test_layout_screenshots(book_dir, base_url, offline):
    """Screenshots for a person to look at (screenshots/): Table 1 and a multi-panel figure at
    1280 and 390 px, and the explorer at SAPO with a readout, in both themes. The explorer's
    formula fits its box at both widths."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    for label, viewport, scale in (("desktop", DESKTOP, 1), ("phone", PHONE, 2)):
        for theme in ("light", "dark"):
            ctx = offline(viewport=viewport, device_scale_factor=scale, color_scheme=theme)
            ctx.context.add_init_script(f"localStorage.setItem('mode', '{theme}');"
                                        f"localStorage.setItem('theme', '{theme}');")
            tab = Tab(ctx, problems)
            page = tab.open(base_url + "chapters/03_generalized_objective.html", "ch03")
            page.evaluate(MEASURE)
            table = page.locator("table.rlg-table1").first
            table.scroll_into_view_if_needed()
            table.screenshot(path=str(SCREENSHOTS / f"table1-{label}-{theme}.png"))
            page = tab.open(base_url + "chapters/13_more_gates.html", "ch13")
            page.evaluate(MEASURE)
            figure = page.locator(".cell_output img").last
            figure.scroll_into_view_if_needed()
            figure.screenshot(path=str(SCREENSHOTS / f"figure13-{label}-{theme}.png"))
            page = tab.open(base_url + "explorer.html#sapo", "explorer")
            page.wait_for_selector(".gx-formula mjx-container")
            # the deep link the {explorer} role writes opens the explorer at that method
            assert page.evaluate("() => window.RLGatesExplorer.explorer.method.name") == "sapo"
            page.wait_for_function("() => { const p = document.querySelector('.gx-formula');"
                                   " return p.scrollWidth <= p.clientWidth + 1; }",
                                   timeout=5_000)  # the formula shrinks to fit (book.js)
            box = page.locator("#gx-gate")
            box.scroll_into_view_if_needed()
            bb = box.bounding_box()
            page.mouse.move(bb["x"] + bb["width"] * 0.6, bb["y"] + bb["height"] * 0.3)
            page.locator("#rlgates-explorer").screenshot(
                path=str(SCREENSHOTS / f"explorer-sapo-{label}-{theme}.png"))
            tab.page.close()
    assert not problems, problems
