"""Wide tables keep their key column in view (_static/book.css, "Wide tables on a phone").

A table wider than its box scrolls inside it (the theme's .pst-scrollable-table-container). Its
first column names each row (a method, a setting, a diagnostic): scrolled to the right end, a
reader must still see which row is which. At 390 px and 1280 px, on every page that has a table,
each table wider than its box is scrolled to its right end, and every cell of its first column must
lie inside the viewport and inside the box, and be what the browser shows at that point (not
covered by the scrolled cells). On a phone that is most tables (the reference pages' among them);
at 1280 px every table fits its column today, so only a table made wider later is checked there.
The negative control deletes the stylesheet's sticky rule in the same page and finds the check
failing on every table scrolled further than its first column is wide. Both are read in the
session's one visit of each page per width (crawl.py: read_tables).
"""

from __future__ import annotations

import pytest
from bookserver import SCREENSHOTS
from crawl import OPEN_FOLDS, WIDTHS

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def tables(site) -> dict:
    """What the key-column check read on every page with a table, at each width, in the
    session's one visit of each page per width (crawl.py: read_tables)."""
    return {key: m["tables"] for key, m in site["pages"].items() if "tables" in m}


@pytest.mark.parametrize("label", ["phone", "desktop"])
def test_wide_tables_keep_their_key_column_in_view(tables, base_url, offline, label):
    pages = {rel: got for (width, rel), got in tables.items() if width == label}
    for reference in ("conventions.html", "which_gate.html"):
        assert reference in pages, f"{reference} has no table any more: {sorted(pages)}"
    checked, problems, control = {}, [], []
    for rel, got in pages.items():
        checked[rel] = len(got["tables"])
        problems += [f"{rel} table {t['index']} ({t['head']!r}, {t['width']} px in a "
                     f"{t['box']} px box): {p}" for t in got["tables"] for p in t["problems"]]
        assert all(t["scrolled"] > 0 for t in got["tables"]), (rel, got["tables"])  # scrolled
        if not got["tables"]:
            continue
        # negative control: the same page without the sticky rule hides the key column
        assert got["dropped"] == 1, f"{rel}: the sticky rule is not in book.css"
        # a table scrolled further than its first column is wide loses that column
        control += [(rel, t["index"], bool(t["problems"])) for t in got["bare"]
                    if t["scrolled"] > t["firstWidth"] + 2]
    assert not problems, "\n".join(problems)
    ctx = offline(viewport=WIDTHS[label][0], **WIDTHS[label][1])
    screenshot_reference_table(ctx.context.new_page(), base_url, label)
    if label == "desktop":  # today every table fits the 1280-px column: nothing scrolls
        return
    # on a phone the reference pages' tables, and most chapters' printed ones, are wider
    assert checked["conventions.html"] >= 1 and checked["which_gate.html"] >= 1, checked
    assert sum(checked.values()) >= 10, checked
    assert control, "no table scrolled past its first column: the negative control is empty"
    assert all(failed for _rel, _i, failed in control), \
        f"without the sticky rule these tables still show their key column: " \
        f"{[c for c in control if not c[2]]}"


def screenshot_reference_table(page, base_url: str, label: str):
    """The conventions page's first wide table, scrolled to its right end, for a person to look at
    (screenshots/tables-conventions-<phone|desktop>.png)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(base_url + "conventions.html", wait_until="load")
    page.evaluate(OPEN_FOLDS)
    box = page.locator(".bd-article .pst-scrollable-table-container").first
    box.evaluate("b => b.scrollLeft = b.scrollWidth")
    box.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / f"tables-conventions-{label}.png"))
