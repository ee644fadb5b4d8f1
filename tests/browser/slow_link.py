"""First paint and time to typeset of a page of the built book, cold, on an emulated slow mobile
link (the reader-experience review's R9 numbers). Not a test: run it by hand.

    .venv/bin/python tests/browser/slow_link.py [PAGE ...] [--runs 3] [--book _build/html]

Each run is a fresh browser context (nothing cached) at 390 px (a phone: touch, DPR 2) on
"slow 4G" (1.6 Mb/s down, 750 kb/s up, 150 ms round trip, Chrome DevTools' preset, applied with
CDP's Network.emulateNetworkConditions; the server is localhost, so the link is the only delay).
Reported per page: first contentful paint, and math done (MathJax's startup promise resolved, or
the first paint where the math was typeset at build time; and the MathJax fonts in), in ms from
navigation start; the median of the runs, and the bytes transferred.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bookserver import BOOK, LAUNCH_ARGS, chromium, serve  # noqa: E402
from crawl import PHONE  # noqa: E402

SLOW_4G = {"offline": False, "latency": 150, "downloadThroughput": 1.6e6 / 8,
           "uploadThroughput": 750e3 / 8}

TIMES = r"""async () => {
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  // typeset: when MathJax's startup promise resolves, or, for math typeset at build time, at the
  // first paint; the math reads once the MathJax fonts it uses are in too
  let typeset = fcp ? fcp.startTime : 0;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    typeset = performance.now();
  }
  await document.fonts.ready;
  const fonts = performance.getEntriesByType('resource')
    .filter(r => r.name.includes('/mathjax/') && /\.woff2?$/.test(r.name))
    .reduce((t, r) => Math.max(t, r.responseEnd), 0);
  typeset = Math.max(typeset, fonts);
  const bytes = performance.getEntriesByType('resource').reduce((s, r) => s + r.transferSize, 0)
    + (performance.getEntriesByType('navigation')[0] || {transferSize: 0}).transferSize;
  return {fcp: fcp ? fcp.startTime : null, typeset, bytes, mathjax: !!window.MathJax};
}"""


def measure(browser, url: str) -> dict:
    ctx = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True,
                              has_touch=True)
    try:
        page = ctx.new_page()
        page.set_default_timeout(180_000)
        cdp = ctx.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        cdp.send("Network.emulateNetworkConditions", SLOW_4G)
        page.goto(url, wait_until="load")
        return page.evaluate(TIMES)
    finally:
        ctx.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="*", default=["chapters/18_template_bends.html"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--book", type=Path, default=BOOK)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with serve(args.book.resolve()) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=LAUNCH_ARGS, headless=True)
        for rel in args.pages:
            runs = [measure(browser, base + rel) for _ in range(args.runs)]
            fcp = statistics.median(r["fcp"] for r in runs)
            typeset = statistics.median(r["typeset"] for r in runs)
            print(f"{rel}: slow 4G, 390 px, cold, median of {args.runs}: first contentful paint "
                  f"{fcp / 1000:.2f} s, math done {typeset / 1000:.2f} s, "
                  f"{runs[0]['bytes'] / 1e6:.2f} MB transferred "
                  f"(runs: {[round(r['fcp']) for r in runs]} / "
                  f"{[round(r['typeset']) for r in runs]} ms)")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
