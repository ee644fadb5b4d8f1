"""Wide tables keep their key column in view (_static/book.css, "Wide tables on a phone").

A table wider than its box scrolls inside it (the theme's .pst-scrollable-table-container). Its
first column names each row (a method, a setting, a diagnostic): scrolled to the right end, a
reader must still see which row is which. At 390 px and 1280 px, on every page that has a table,
each table wider than its box is scrolled to its right end, and every cell of its first column must
lie inside the viewport and inside the box, and be what the browser shows at that point (not
covered by the scrolled cells). On a phone that is most tables (the reference pages' among them);
at 1280 px every table fits its column today, so only a table made wider later is checked there.
The negative control deletes the stylesheet's sticky rule in the same page and finds the check
failing on every table scrolled further than its first column is wide.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bookserver import SCREENSHOTS

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SKIP_DIRS = {"_static", "_sources", "_images"}

# every fold open (a solution's table counts once the reader opens it), then wait for MathJax's
# typesetting and book.js's layout pass (which runs once MathJax is done)
SETTLE = """async () => {
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  if (document.fonts) await document.fonts.ready;
  for (let i = 0; i < 3; i++) await new Promise(r => requestAnimationFrame(r));
}"""

# Every table wider than its box, scrolled to its right end: where its first column's cells are.
KEY_COLUMN = r"""() => {
  const vw = document.documentElement.clientWidth, vh = window.innerHeight;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const tables = [...document.querySelectorAll('.bd-article table')];
  const out = [];
  tables.forEach((table, index) => {
    let box = table.parentElement;
    while (box && box !== document.body && !scrolls(box)) box = box.parentElement;
    if (!box || box === document.body) box = document.scrollingElement;  // the page itself
    if (table.scrollWidth <= box.clientWidth + 1) return;  // fits: nothing to scroll
    const cells = [...table.rows].map(r => r.cells[0]).filter(Boolean);
    box.scrollLeft = box.scrollWidth;
    const boxRect = box === document.scrollingElement
      ? {left: 0, right: vw} : box.getBoundingClientRect();
    const problems = [];
    cells.forEach((cell, row) => {
      // bring the cell's row into the window vertically (scrollBy leaves the box's scroll alone)
      let r = cell.getBoundingClientRect();
      window.scrollBy(0, r.top - vh / 3);
      r = cell.getBoundingClientRect();
      const left = Math.max(r.left, boxRect.left), right = Math.min(r.right, boxRect.right);
      const name = cell.innerText.trim().split('\n')[0].slice(0, 40);
      if (r.left < -0.5 || r.right > vw + 0.5 || r.left < boxRect.left - 0.5
          || r.right > boxRect.right + 0.5) {
        problems.push(`row ${row} (${name}): cell at ${Math.round(r.left)}..${Math.round(r.right)} px,`
          + ` box ${Math.round(boxRect.left)}..${Math.round(boxRect.right)}, viewport 0..${vw}`);
        return;
      }
      const x = (left + right) / 2, y = r.top + Math.min(r.height / 2, 12);
      const hit = document.elementFromPoint(x, y);
      if (!hit || !cell.contains(hit)) {
        problems.push(`row ${row} (${name}): covered at (${Math.round(x)}, ${Math.round(y)}) by `
          + (hit ? hit.tagName + '.' + hit.className : 'nothing'));
      }
    });
    const firstRight = cells.length ? cells[0].getBoundingClientRect().width : 0;
    out.push({index, width: Math.round(table.scrollWidth), box: box.clientWidth,
              scrolled: Math.round(box.scrollLeft), firstWidth: Math.round(firstRight),
              head: (cells[0] ? cells[0].innerText.trim() : '').slice(0, 40), problems});
    box.scrollLeft = 0;
  });
  window.scrollTo(0, 0);
  return out;
}"""

# The stylesheet rule under test, found by what it does; deleted for the negative control.
DROP_STICKY_RULE = r"""() => {
  let dropped = 0;
  for (const sheet of document.styleSheets) {
    if (!(sheet.href || '').includes('book.css')) continue;
    const rules = sheet.cssRules;
    for (let i = rules.length - 1; i >= 0; i--) {
      const rule = rules[i];
      if (rule.selectorText && rule.selectorText.includes('pst-scrollable-table-container')
          && rule.style.position === 'sticky') { sheet.deleteRule(i); dropped++; }
    }
  }
  return dropped;
}"""


def table_pages(book_dir: Path) -> list[str]:
    """Every built page that has a table (the others have nothing to check)."""
    out = []
    for p in sorted(book_dir.rglob("*.html")):
        rel = p.relative_to(book_dir)
        if not SKIP_DIRS.intersection(rel.parts[:-1]) and "<table" in p.read_text():
            out.append(rel.as_posix())
    return out


def check_tables(page, url: str) -> list[dict]:
    page.goto(url, wait_until="load")
    page.evaluate(SETTLE)
    return page.evaluate(KEY_COLUMN)


@pytest.mark.parametrize("label,viewport", [("phone", PHONE), ("desktop", DESKTOP)])
def test_wide_tables_keep_their_key_column_in_view(book_dir, base_url, offline, label, viewport):
    pages = table_pages(book_dir)
    for reference in ("conventions.html", "which_gate.html"):
        assert reference in pages, f"{reference} has no table any more: {pages}"
    ctx = offline(viewport=viewport)
    page = ctx.context.new_page()
    page.set_default_navigation_timeout(90_000)  # a loaded machine (the check runs steps beside)
    checked, problems, control = {}, [], []
    for rel in pages:
        tables = check_tables(page, base_url + rel)
        checked[rel] = len(tables)
        problems += [f"{rel} table {t['index']} ({t['head']!r}, {t['width']} px in a "
                     f"{t['box']} px box): {p}" for t in tables for p in t["problems"]]
        assert all(t["scrolled"] > 0 for t in tables), (rel, tables)  # the scroll happened
        if not tables:
            continue
        # negative control: the same page without the sticky rule hides the key column
        assert page.evaluate(DROP_STICKY_RULE) == 1, f"{rel}: the sticky rule is not in book.css"
        page.evaluate(SETTLE)
        bare = page.evaluate(KEY_COLUMN)
        # a table scrolled further than its first column is wide loses that column
        control += [(rel, t["index"], bool(t["problems"])) for t in bare
                    if t["scrolled"] > t["firstWidth"] + 2]
    assert not problems, "\n".join(problems)
    screenshot_reference_table(page, base_url, label)
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
    page.evaluate(SETTLE)
    box = page.locator(".bd-article .pst-scrollable-table-container").first
    box.evaluate("b => b.scrollLeft = b.scrollWidth")
    box.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / f"tables-conventions-{label}.png"))
