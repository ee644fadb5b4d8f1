"""Display equations keep MathJax's size: MathJax scales its fonts to the text's x-height (an
inline font-size such as 126 %), and book.js shrinks a display equation from that size only when
it is wider than the column, and then to no less than MIN_SCALE of it (beyond, it scrolls:
tests/browser/test_reader.py checks that no formula is cut).

MathJax's size is read from the inline formulas of the same page, which book.js leaves alone:
every formula in the text's font gets the same scale.

Run: `python -m pytest tests/browser -m browser` after `python3 tasks.py book` (or set BOOK_HTML).
"""

from __future__ import annotations

import statistics

import pytest
from crawl import WIDTHS

pytestmark = pytest.mark.browser

MIN_SCALE = 0.7  # _static/book.js
#: GSPO's numbered equations (eq. 8.2 is the widest in the book), and six unnumbered ones
PAGES = ["chapters/08_gspo.html", "chapters/13_more_gates.html"]

SIZES = r"""async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  document.querySelectorAll('details').forEach(d => { d.open = true; });  // solutions too
  if (window.RLGatesBook) window.RLGatesBook.layout();
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const px = el => parseFloat(getComputedStyle(el).fontSize);
  const art = document.querySelector('article.bd-article');
  const ratio = m => px(m) / px(m.parentElement);
  const shown = m => m.getClientRects().length > 0 && !m.closest('table');
  return {
    inline: [...art.querySelectorAll('p mjx-container:not([display="true"])')].filter(shown)
      .map(ratio),
    display: [...art.querySelectorAll('mjx-container[display="true"]')].filter(shown)
      .map(m => ({ratio: ratio(m), have: m.clientWidth, tex: m.textContent.slice(0, 50),
                  // the drawing's width; a numbered equation's spans the box (width="full")
                  drawn: m.getAttribute('width') === 'full' ? null
                    : m.querySelector('mjx-math').getBoundingClientRect().width})),
  };
}"""


@pytest.fixture(scope="module", params=[(w, p) for w in WIDTHS for p in PAGES],
                ids=lambda wp: f"{wp[0]}-{wp[1].split('/')[-1][:2]}")
def sizes(request, base_url, browser):
    width, rel = request.param
    viewport, mobile = WIDTHS[width]
    context = browser.new_context(viewport=viewport, **mobile)
    try:
        page = context.new_page()
        page.set_default_timeout(120_000)  # a busy machine
        page.goto(base_url + rel, wait_until="load")
        return f"{rel} at {width}", page.evaluate(SIZES)
    finally:
        context.close()


def test_display_equations_keep_mathjax_size(sizes):
    width, s = sizes
    assert len(s["inline"]) >= 20 and len(s["display"]) >= 3, {k: len(v) for k, v in s.items()}
    mathjax = statistics.median(s["inline"])
    assert max(s["inline"]) - min(s["inline"]) < 0.01 * mathjax, "inline formulas differ in size"
    bad = []
    for eq in s["display"]:
        scale = eq["ratio"] / mathjax
        if scale > 1.005:
            bad.append(f"{eq['tex']!r}: at {scale:.3f} of MathJax's size, above it")
        elif scale < MIN_SCALE - 0.005:
            bad.append(f"{eq['tex']!r}: at {scale:.3f} of MathJax's size, below {MIN_SCALE}")
        elif scale < 0.995 and eq["drawn"] is not None and eq["drawn"] < eq["have"] - 4:
            bad.append(f"{eq['tex']!r}: shrunk to {scale:.3f} but {eq['drawn']:.0f} px wide "
                       f"in a {eq['have']} px box: it would fit at full size")
    assert not bad, f"{width}:\n" + "\n".join(bad)
    if "desktop" in width:  # most equations fit a laptop's column at MathJax's size
        full = [eq for eq in s["display"] if eq["ratio"] / mathjax > 0.995]
        assert len(full) > 0.5 * len(s["display"]), f"{len(full)} of {len(s['display'])}"
