"""What a reader meets on every page, at 390 px (phone) and 1280 px (laptop): no formula cut
off, no page wider than the phone, numbered exercises and solutions that name them, and no
Markdown table printed as text.

A formula is cut when part of it can be neither seen nor scrolled to: its drawing starts left of
its box (a centred formula wider than its box spills out to the left, where no scroll bar
reaches), ends right of what its box shows or scrolls to, or its box sticks out of a box that
clips it or out of the screen. Page width is read from the layout itself
(`documentElement.scrollWidth` against the 390 px the phone shows), not from `innerWidth`, which
mobile emulation widens to fit a too-wide page.

Run: `python -m pytest tests/browser -m browser` after `python3 tasks.py book` (or set BOOK_HTML).
"""

from __future__ import annotations

import html.parser
import re
from pathlib import Path

import pytest
from crawl import PHONE, Tab, pages

pytestmark = pytest.mark.browser

@pytest.fixture(scope="module")
def formulas(site):
    """What FORMULAS read on every page with an article at 1280 and at 390 px, in the session's
    one visit of each page per width (crawl.py)."""
    return {key: m["formulas"] for key, m in site["pages"].items() if "formulas" in m}


def test_every_formula_fits_or_scrolls(formulas):
    """At 1280 and 390 px no formula, display or inline, is cut: it fits its box, or its box
    scrolls to every part of it, and the box lies in what the box around it shows or scrolls to
    (the column, a scrolling table, the screen)."""
    for width in ("desktop", "phone"):
        seen = sum(m["n"] for (label, _), m in formulas.items() if label == width)
        assert seen >= 40, f"{width}: only {seen} display formulas: is MathJax typesetting?"
    bad = [f"{rel} {label}: {'display' if c['display'] else 'inline'} {c['tex']!r} ({c['width']} px in a {c['box']} px box): "
           + "; ".join(c["why"]) for (label, rel), m in formulas.items() for c in m["cut"]]
    assert not bad, f"{len(bad)} formulas cut:\n" + "\n".join(bad)


def test_a_formula_that_scrolls_says_so(formulas):
    """A formula wider than its box scrolls (test above), but a phone draws no scroll bar until
    one scrolls: a formula cut at the column's edge reads as a cut formula. Every formula whose
    box hides more than 2 px of it shows that it scrolls: an edge shadow (book.js rlg-scrolls,
    book.css), and under a display formula a line saying to swipe (R4)."""
    bad = [f"{rel} {label}: {'display' if f['display'] else 'inline'} {f['tex']!r} "
           f"({f['width']} px in a {f['box']} px box): "
           + ("no edge shadow" if not f["shadow"] else "no 'swipe' line under it")
           for (label, rel), m in formulas.items() for f in m.get("scrolling", [])
           if not f["shadow"] or (f["display"] and not f["words"])]
    seen = sum(len(m.get("scrolling", [])) for (label, _), m in formulas.items()
               if label == "phone")
    print(f"{seen} formulas scroll at 390 px")
    assert not bad, f"{len(bad)} formulas scroll with nothing to say so:\n" + "\n".join(bad)


def test_no_page_wider_than_a_phone(formulas):
    """At 390 px no page lays out wider than the screen (the page would pan sideways)."""
    bad = [f"{rel}: {m['scrollWidth']} px wide on a {PHONE['width']} px screen "
           f"(clientWidth {m['clientWidth']})"
           for (label, rel), m in formulas.items() if label == "phone"
           and max(m["scrollWidth"], m["clientWidth"]) > PHONE["width"]]
    assert not bad, "\n".join(bad)


class _Text(html.parser.HTMLParser):
    """A built page's text as a reader can see it (dropdowns opened), without scripts, styles
    and the code cells' source."""

    SKIP = {"script", "style", "template"}
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack: list[bool] = []  # per open element: inside something skipped
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        self.stack.append(bool(self.stack and self.stack[-1]) or tag in self.SKIP
                          or "cell_input" in classes)

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not (self.stack and self.stack[-1]):
            self.parts.append(data)


def page_text(path: Path) -> str:
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return "".join(parser.parts)


RAW_TABLE = re.compile(r"^.*\|\s*:?-{3,}.*$", re.MULTILINE)


def test_no_markdown_table_printed_as_text(book_dir):
    """No page shows a Markdown table as text (a delimiter row such as `| --- |`): tables are
    displayed as Markdown (rlgates.tables.markdown), never printed."""
    assert RAW_TABLE.findall("x\n| a | b |\n|---|:--|\n") and not RAW_TABLE.findall("a - b | c")
    bad = [f"{rel}: {line.strip()[:100]!r}" for rel in pages(book_dir)
           for line in RAW_TABLE.findall(page_text(book_dir / rel))]
    assert len(pages(book_dir)) >= 20
    assert not bad, "\n".join(bad)


EXERCISE = re.compile(r'<div class="exercise[^"]*" id="([^"]+)">\s*<p class="admonition-title">(.*?)</p>',
                      re.DOTALL)
SOLUTION = re.compile(r'class="solution[^"]*"[^>]*>\s*<p class="admonition-title">(.*?)</p>',
                      re.DOTALL)


def _plain(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment)).strip()


def test_exercises_numbered_and_solutions_name_them(book_dir):
    """Every exercise is titled "Exercise N.k" (N its chapter, k = 1, 2, ... in order), and
    every solution reads "Solution to Exercise N.k", linked to its exercise."""
    seen, bad = 0, []
    for path in sorted((book_dir / "chapters").glob("*.html")):
        page = path.read_text(encoding="utf-8")
        chapter = int(path.name[:2])
        numbers = {}
        for k, (ident, title) in enumerate(EXERCISE.findall(page), 1):
            seen += 1
            numbers[ident] = f"{chapter}.{k}"
            if not re.fullmatch(rf"Exercise {chapter}\.{k}\b.*", _plain(title)):
                bad.append(f"{path.name} #{ident}: title {_plain(title)!r}, "
                           f"not 'Exercise {chapter}.{k}'")
        for title in SOLUTION.findall(page):
            target = re.search(r'href="#([^"]+)"', title)
            want = f"Solution to Exercise {numbers.get(target.group(1) if target else '', '?')}"
            if not target or _plain(title) != want:
                bad.append(f"{path.name}: solution titled {_plain(title)!r}, not {want!r}")
    assert seen >= 40, f"only {seen} exercises found"
    assert not bad, "\n".join(bad)


def test_a_tap_enlarges_a_figure_on_a_phone(book_dir, base_url, offline):
    """At 390 px a tap on a figure opens it at its laptop size, where the book's figure text
    shows at 9 px or more, in a view that scrolls to all of it; a tap on the close button
    shuts it and the page stays where it was."""
    from test_layout import MIN_TEXT_PX, png_text

    from rlgates.notebook import FONT_SIZE

    ctx = offline(viewport=PHONE, is_mobile=True, has_touch=True)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + "chapters/13_more_gates.html", "ch13 phone")
    figure = page.locator(".bd-article a.image-reference img").last
    figure.scroll_into_view_if_needed()
    url = page.url
    figure.tap()
    view = page.locator(".rlg-zoom")
    view.wait_for()
    big = view.locator("img")
    page.wait_for_function("() => document.querySelector('.rlg-zoom img').complete")
    shown = big.evaluate("i => [i.getBoundingClientRect().width, i.naturalWidth, i.currentSrc]")
    meta = png_text(book_dir, shown[2])
    text_px = FONT_SIZE / 72 * shown[0] * float(meta["rlgates:px-per-inch"]) / shown[1]
    assert text_px >= MIN_TEXT_PX, f"{FONT_SIZE} pt figure text shows at {text_px:.1f} px"
    reach = view.evaluate("v => [v.scrollWidth, v.clientWidth]")
    assert reach[0] >= shown[0] > reach[1], reach  # wider than the phone, and scrolls to it
    view.locator(".rlg-zoom-close").tap()
    assert view.count() == 0 and page.url == url
    assert not problems, problems


def test_explorer_tap_on_a_phone(base_url, offline):
    """At 390 px a tap on the gate panel updates the readout, which is then on screen, and
    rings the tapped point on both panels (the ring's centre within 2 px of the tap)."""
    ctx = offline(viewport=PHONE, is_mobile=True, has_touch=True)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + "explorer.html#dapo", "explorer phone")
    page.wait_for_selector("#gx-gate")
    gate = page.locator("#gx-gate")
    gate.scroll_into_view_if_needed()
    before = page.locator(".gx-readout").text_content()
    box = gate.bounding_box()
    x, y = box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.4
    page.touchscreen.tap(x, y)
    page.wait_for_function("t => document.querySelector('.gx-readout').textContent !== t", arg=before)
    seen = page.evaluate("""() => {
      const r = document.querySelector('.gx-readout').getBoundingClientRect();
      const marks = [...document.querySelectorAll('.gx-marker')].filter(m => !m.hidden)
        .map(m => { const b = m.getBoundingClientRect(); return [b.left + b.width / 2, b.top + b.height / 2]; });
      return {top: r.top, bottom: r.bottom, height: document.documentElement.clientHeight, marks,
              text: document.querySelector('.gx-readout').textContent};
    }""")
    assert "DAPO at A = " in seen["text"], seen
    assert 0 <= seen["top"] and seen["bottom"] <= seen["height"], seen  # on screen
    assert len(seen["marks"]) == 2, seen
    assert abs(seen["marks"][0][0] - x) <= 2 and abs(seen["marks"][0][1] - y) <= 2, (seen, x, y)
    assert not problems, problems


def test_live_only_cells_say_where_their_output_is(book_dir, base_url, offline):
    """A cell whose output exists only in a live notebook (rlgates.explore's sliders) is tagged
    live-only, and the page shows, under it, a line saying where its output appears."""
    explore = re.compile(r"rlgates(?:<[^>]+>)*\.(?:<[^>]+>)*explore\b")
    cells = {rel: [chunk.split('"', 1)[0] for chunk in
                   (book_dir / rel).read_text(encoding="utf-8").split('<div class="cell ')[1:]
                   if explore.search(chunk.split("</pre>", 1)[0])]
             for rel in pages(book_dir) if rel.startswith("chapters/")}
    found = [(rel, c) for rel, cs in cells.items() for c in cs]
    assert len(found) >= 4, found
    assert all("tag_live-only" in c for _, c in found), found
    problems: list[str] = []
    page = Tab(offline(), problems).open(base_url + "chapters/07_sapo.html", "ch07")
    cell = page.locator(".cell.tag_live-only").first
    note = cell.evaluate("c => [getComputedStyle(c, '::after').content,"
                         " c.getBoundingClientRect().height,"
                         " c.querySelector('.cell_input').getBoundingClientRect().height]")
    assert "sliders" in note[0] and "live" in note[0], note
    assert note[1] > note[2] + 10, note  # the line takes room under the code
    assert not problems, problems
