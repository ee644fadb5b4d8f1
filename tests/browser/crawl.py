"""One visit of each page of the built book at each width, shared by the browser tests.

Every page is opened once at 1280 px (a laptop) and once at 390 px (a phone: touch, mobile
viewport), and everything the page checks need is read there, in order: INSPECT (test_book:
errors, images, math, links), MEASURE (test_layout, on the chapters and the index: figures, code,
equations, Table 1), FORMULAS (test_reader: every formula's box and the page's width; it
opens the solutions) and, on a page with a table, the key-column check of test_tables (last: it
deletes a style rule for its negative control). A page is read once it has settled: MathJax's first
typeset done, its fonts loaded, every image decoded.

At 1280 px each page is opened in a fresh browser context, so that the visit also weighs it
(test_weight, as benchmarks/page_weight.py does): after the reads, WEIGH_SETTLE opens the
solutions and waits for every image and font, then the network goes idle, and `weigh` sums the
files the page requested. (One crawl does both: a page load costs about two CPU seconds, most
of it Chromium's.) At 390 px one tab is reused from page to page.

The two widths are visited in two threads, each with a Chromium of its own (Playwright's sync API
is used by one thread only), while the session's other browser tests run (conftest.py starts the
visit at the first test and runs the tests that need it last).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bookserver import LAUNCH_ARGS, Offline

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
WIDTHS = {"desktop": (DESKTOP, {}), "phone": (PHONE, {"is_mobile": True, "has_touch": True})}
SKIP_DIRS = {"_static", "_sources", "_images", "reports"}
NO_ARTICLE = {"search.html", "genindex.html", "py-modindex.html"}

# Waits for MathJax's first typeset, for the fonts it asked for, and for every image (lazy
# ones too) to be decoded: the conditions themselves, no fixed delay.
SETTLE = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  await Promise.all([...document.images].map(i => {
    i.loading = 'eager'; return i.decode().catch(() => null); }));
  return true;
}"""

# Settled for weighing: MathJax typeset, solutions open, every image loaded, every web font in.
WEIGH_SETTLE = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  await Promise.all([...document.images].map(i => {
    i.loading = 'eager'; return i.decode().catch(() => null); }));
  await document.fonts.ready;
  await new Promise(r => setTimeout(r, 200));
  await document.fonts.ready;
  return true;
}"""


def weigh(requested: list[str], base_url: str, book_dir: Path) -> dict:
    """The files a page loaded, from the URLs it requested: {"files": {path: bytes}, "total":
    bytes, "missing": [URLs the book cannot answer, or off localhost]}."""
    files, missing = {}, []
    for url in requested:
        u = urlsplit(url)
        if u.scheme in ("data", "blob", "about"):
            continue  # inside a file already counted
        if not url.startswith(base_url):
            missing.append(url)
            continue
        path = unquote(u.path).lstrip("/") or "index.html"
        f = book_dir / path
        if f.is_dir():
            f, path = f / "index.html", f"{path.rstrip('/')}/index.html"
        if f.is_file():
            files[path] = f.stat().st_size
        else:
            missing.append(url)
    return {"files": files, "total": sum(files.values()), "missing": missing}


# Everything the per-page checks need, read in one go.
INSPECT = r"""() => {
  const shown = el => !!(el && (el.offsetWidth || el.offsetHeight || el.getClientRects().length));
  const imgs = [...document.images].map(i => ({
    src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0,
    alt: (i.getAttribute('alt') || '').trim()}));
  const math = [...document.querySelectorAll('.math')];
  const untypeset = math.filter(m => !m.querySelector('mjx-container'))
    .map(m => m.textContent.trim().slice(0, 80));
  const merror = [...document.querySelectorAll('mjx-merror')]
    .map(e => e.getAttribute('data-mjx-error') || e.textContent);
  const root = document.querySelector('main') || document.body;
  const skip = 'pre, code, script, style, textarea, noscript, mjx-container, .math';
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {acceptNode: n =>
    n.parentElement.closest(skip) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  let text = '';
  while (walker.nextNode()) {
    if (shown(walker.currentNode.parentElement)) text += walker.currentNode.nodeValue + ' ';
  }
  const raw = text.match(/\$[^$\n]{1,80}\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\\frac|\\rho/g) || [];
  return {
    title: document.title, imgs, nmath: math.length, untypeset, merror, raw,
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id)
      .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
    copy: document.querySelectorAll('button.copybtn').length,
    code: document.querySelectorAll('div.highlight pre').length,
    // typeset: by MathJax here, or at build time (scripts/lighter_assets.py: typeset_math)
    mathjax: !!window.MathJax || (math.length > 0 && untypeset.length === 0),
  };
}"""

# Everything measured on one page, after MathJax and book.js have laid it out.
MEASURE = r"""async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  if (window.RLGatesBook) window.RLGatesBook.layout();
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const art = document.querySelector('article.bd-article');
  const R = el => el.getBoundingClientRect();
  // src: the image shown (a <picture> may show its phone version); full: the <img>'s own
  const figures = [...art.querySelectorAll('.cell_output img')].map(i => ({
    src: i.currentSrc || i.src, full: i.src, natural: i.naturalWidth, shown: R(i).width,
    ratio: (R(i).height / R(i).width) / (i.naturalHeight / i.naturalWidth),
    link: i.closest('a') ? i.closest('a').href : null,
    caption: ((i.closest('figure') || {}).textContent || '').trim().slice(0, 60)}));
  const code = [...art.querySelectorAll('div.highlight pre')].filter(p => !p.closest('.cell_output'))
    .map(p => {
    const lines = p.textContent.replace(/\n$/, '').split('\n');
    const probe = document.createElement('span');
    probe.textContent = '0'.repeat(80);
    probe.style.cssText = 'position:absolute;visibility:hidden;white-space:pre';
    p.appendChild(probe);
    const cols80 = R(probe).width;
    probe.remove();
    const cs = getComputedStyle(p);
    return {scroll: p.scrollWidth, client: p.clientWidth, cols80,
            inner: p.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),
            longest: Math.max(...lines.map(l => l.length)),
            first: lines[0].slice(0, 60)};
  });
  const equations = [...art.querySelectorAll('mjx-container[display="true"]')]
    .filter(m => !m.closest('table'))
    .map(m => ({scroll: m.scrollWidth, client: m.clientWidth, scale: m.style.fontSize || '100%',
                tex: (m.parentElement.textContent || '').slice(0, 50)}));
  const tables = [...art.querySelectorAll('table.rlg-table1')].map(t => {
    const cells = [...t.querySelectorAll('tbody td')];
    const rows = [];
    for (let k = 0; k + 3 < cells.length; k += 4)
      rows.push({method: cells[k].textContent.trim(),
                 height: R(cells[k + 3]).bottom - Math.min(R(cells[k]).top, R(cells[k + 1]).top)});
    return {stacked: t.classList.contains('rlg-stacked'), width: R(t).width,
            box: t.parentElement.clientWidth, rows,
            overflow: cells.filter(c => c.scrollWidth > c.clientWidth + 1)
              .map(c => [c.textContent.trim().slice(0, 40), c.scrollWidth, c.clientWidth])};
  });
  const streams = [...art.querySelectorAll('.cell_output')].map(o =>
    [o.querySelectorAll(':scope > .output.stream').length,
     o.querySelectorAll(':scope > .output.stderr').length]);
  return {figures, code, equations, tables, streams,
          overflow: document.documentElement.scrollWidth - innerWidth};
}"""

# Every formula (and the page's width), measured after MathJax and book.js laid it out.
FORMULAS = r"""async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  document.querySelectorAll('details').forEach(d => { d.open = true; });  // solutions too
  if (window.RLGatesBook) window.RLGatesBook.layout();
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const doc = document.documentElement, screen = doc.clientWidth;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const cut = [];
  for (const m of document.querySelectorAll('mjx-container')) {
    if (!m.getClientRects().length) continue;  // not shown
    const box = m.getBoundingClientRect();
    let left = Infinity, right = -Infinity;
    for (const el of m.querySelectorAll('mjx-math, mjx-math *')) {  // not the hidden MathML
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) { left = Math.min(left, r.left); right = Math.max(right, r.right); }
    }
    if (left === Infinity) continue;
    const why = [];
    if (scrolls(m) || m.getAttribute('display') === 'true') {  // a box of its own
      const shows = box.left + (scrolls(m) ? m.scrollWidth : m.clientWidth) - m.scrollLeft;
      if (left < box.left - 1) why.push(`starts ${Math.round(box.left - left)} px left of its box`);
      if (right > shows + 1) why.push(`ends ${Math.round(right - shows)} px past what its box shows`);
    }
    // the nearest box that clips it: the formula's box lies in what that box shows or scrolls to
    let a = m.parentElement;
    while (a && a !== doc && getComputedStyle(a).overflowX === 'visible') a = a.parentElement;
    const r = a && a !== doc ? a.getBoundingClientRect() : {left: 0, right: screen};
    const from = a && a !== doc && scrolls(a) ? r.left - a.scrollLeft : r.left;
    const to = a && a !== doc && scrolls(a) ? from + a.scrollWidth : r.right;
    if (box.left < from - 1 || box.right > to + 1)
      why.push(`box [${Math.round(box.left)}, ${Math.round(box.right)}] out of ` +
               (a && a !== doc ? `<${a.tagName.toLowerCase()} class="${a.className}">` : 'the screen') +
               ` [${Math.round(from)}, ${Math.round(to)}]`);
    if (why.length) cut.push({tex: m.textContent.slice(0, 60), width: Math.round(right - left),
                              box: Math.round(box.width), why,
                              display: m.getAttribute('display') === 'true'});
  }
  // every formula whose box scrolls to show it (more than 2 px hidden): does it show that it
  // scrolls (R4)? A phone draws no scroll bar until one scrolls, so the box itself must.
  const scrolling = [...document.querySelectorAll('.bd-article mjx-container')]
    .filter(m => m.getClientRects().length && scrolls(m) && m.scrollWidth > m.clientWidth + 2)
    .map(m => {
      const cs = getComputedStyle(m);
      const shadow = m.classList.contains('rlg-scrolls') && /gradient/.test(cs.backgroundImage);
      // the line under a display formula: shown, under it, inside the column
      const block = m.parentElement.matches('div.math') ? m.parentElement : m;
      const hint = block.nextElementSibling, b = block.getBoundingClientRect();
      const h = hint && hint.classList.contains('rlg-swipe') ? hint.getBoundingClientRect() : null;
      const drawn = (m.querySelector('mjx-math') || m).getBoundingClientRect();
      const words = !!h && h.height > 0 && getComputedStyle(hint).visibility === 'visible'
        && h.top >= drawn.bottom - 1 && h.left >= b.left - 1 && h.right <= b.right + 1
        && /swipe|scroll/.test(hint.textContent);
      return {tex: m.textContent.slice(0, 60), width: m.scrollWidth, box: m.clientWidth,
              display: m.getAttribute('display') === 'true', shadow, words};
    });
  return {cut, scrolling, n: document.querySelectorAll('mjx-container[display="true"]').length,
          scrollWidth: doc.scrollWidth, clientWidth: screen};
}"""


# For the table check (test_tables.py), last on a page since it changes the page: every
# fold open (a solution's table counts once the reader opens it), then MathJax and
# book.js's layout pass.
OPEN_FOLDS = """async () => {
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


def pages(book_dir: Path) -> list[str]:
    out = [p.relative_to(book_dir).as_posix() for p in sorted(book_dir.rglob("*.html"))
           if not SKIP_DIRS.intersection(p.relative_to(book_dir).parts[:-1])]
    assert "index.html" in out and "explorer.html" in out, out
    return out


def layout_pages(book_dir: Path) -> list[str]:
    """The pages MEASURE reads: every chapter and the index."""
    return [p for p in pages(book_dir) if p.startswith("chapters/") or p == "index.html"]


class Tab:
    """One browser page reused across URLs; records console errors, page errors, HTTP errors."""

    def __init__(self, ctx, problems: list[str]):
        self.page, self.problems, self.label = ctx.context.new_page(), problems, ""
        self.page.on("console", lambda m: m.type == "error" and problems.append(
            f"{self.label}: console error: {m.text}"))
        self.page.on("pageerror", lambda e: problems.append(f"{self.label}: page error: {e}"))
        self.page.on("response", lambda r: r.status >= 400 and problems.append(
            f"{self.label}: HTTP {r.status} for {r.url}"))

    def open(self, url: str, label: str):
        self.label = label
        self.page.goto(url, wait_until="load")
        self.page.evaluate(SETTLE)
        return self.page


def open_page(ctx, url, problems, label):
    return Tab(ctx, problems).open(url, label)


def read_tables(page) -> dict:
    """KEY_COLUMN with the book's sticky rule, then (if a table scrolls) without it: the
    negative control of test_tables.py. Leaves the page changed: read it last."""
    page.evaluate(OPEN_FOLDS)
    tables = page.evaluate(KEY_COLUMN)
    if not tables:
        return {"tables": tables, "dropped": None, "bare": []}
    dropped = page.evaluate(DROP_STICKY_RULE)
    page.evaluate(OPEN_FOLDS)
    return {"tables": tables, "dropped": dropped, "bare": page.evaluate(KEY_COLUMN)}


def _visit(label: str, book_dir: Path, base_url: str, chromium: str,
           stop: threading.Event) -> dict:
    """Every page at one width, in a Chromium of this thread's own."""
    from playwright.sync_api import sync_playwright

    viewport, kwargs = WIDTHS[label]
    measured, problems, seen, blocked = set(layout_pages(book_dir)), [], {}, []
    weighed = label == "desktop"  # each page in a fresh context, so that it can be weighed
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS, headless=True)
        ctx = tab = None
        for rel in pages(book_dir):
            if stop.is_set():
                break
            if tab is None or weighed:
                ctx = Offline(browser, viewport=viewport, **kwargs)
                tab = Tab(ctx, problems)
            page = tab.open(base_url + rel, f"{rel} {label}")
            seen[rel] = {"inspect": page.evaluate(INSPECT)}
            if rel in measured:
                seen[rel]["measure"] = page.evaluate(MEASURE)
            if rel not in NO_ARTICLE:
                seen[rel]["formulas"] = page.evaluate(FORMULAS)
            if "<table" in (book_dir / rel).read_text(encoding="utf-8"):
                seen[rel]["tables"] = read_tables(page)
            if weighed:
                page.evaluate(WEIGH_SETTLE)
                page.wait_for_load_state("networkidle")
                seen[rel]["weight"] = weigh(ctx.requested, base_url, book_dir)
                blocked += ctx.blocked
                ctx.close()
        if ctx is not None and not weighed:
            blocked += ctx.blocked
            ctx.close()
        browser.close()
    return {"pages": seen, "problems": problems, "blocked": blocked}


class Visit:
    """The visit of every page at both widths, started at once in the background; `result()`
    waits for it: {"pages": {(width, page): {"inspect", "measure", "formulas"}}, "problems",
    "blocked"}."""

    def __init__(self, book_dir: Path, base_url: str, chromium: str):
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(len(WIDTHS), thread_name_prefix="visit")
        self.jobs = {label: self.pool.submit(_visit, label, book_dir, base_url, chromium,
                                             self.stop) for label in WIDTHS}
        self._result: dict | None = None

    def result(self) -> dict:
        if self._result is None:
            out = {"pages": {}, "problems": [], "blocked": []}
            for label, job in self.jobs.items():
                got = job.result()
                out["pages"].update({(label, rel): m for rel, m in got["pages"].items()})
                out["problems"] += got["problems"]
                out["blocked"] += got["blocked"]
            self._result = out
        return self._result

    def close(self) -> None:
        """Stop after the page in hand (a session that ends early), and wait for both threads."""
        self.stop.set()
        self.pool.shutdown(wait=True)
