"""What each page of the built book weighs: every byte a reader's browser loads to show it.

    .venv/bin/python benchmarks/page_weight.py [--book _build/html] [--top 10] [--phone]

Each page is opened in headless Chromium (the browser tests' Chromium and localhost-only
network, tests/browser/bookserver.py) in a fresh context, so nothing comes from a cache. The page
is left to settle: MathJax has typeset it (its components and fonts are loaded on demand, so a
page loads only the ones it uses), the web fonts are in, and every image is loaded, the lazy ones
and those inside folded solutions too. A page's weight is the sum of the sizes of the files it
requested from the book (HTML, CSS, JavaScript, fonts, images, MathJax components), as served,
without compression. Reported: each page's total with a breakdown, and the heaviest page.
Target: no page over 1.5 MB (10^6 bytes to the MB).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from bookserver import BOOK, LAUNCH_ARGS, chromium, serve  # noqa: E402
from crawl import DESKTOP, PHONE, WEIGH_SETTLE, pages, weigh  # noqa: E402

LIMIT = 1_300_000  # bytes: the heaviest page may weigh this much


def kind(path: str) -> str:
    """The kind of a file, for the breakdown."""
    if "/mathjax/" in path:
        return "mathjax"
    suffix = path.rsplit(".", 1)[-1].lower()
    return {"html": "html", "css": "css", "js": "js", "woff": "font", "woff2": "font",
            "ttf": "font", "eot": "font", "otf": "font", "png": "image", "svg": "image",
            "jpg": "image", "jpeg": "image", "gif": "image", "webp": "image",
            "ico": "image"}.get(suffix, "other")


def page_weight(browser, base_url: str, book_dir: Path, rel: str, viewport=DESKTOP,
                **context_kwargs) -> dict:
    """The files one page loads: {"files": {path: bytes}, "total": bytes, "missing": [urls]}
    (the browser tests weigh each page in their visit of it at 1280 px the same way)."""
    context = browser.new_context(viewport=viewport, **context_kwargs)
    requested: list[str] = []
    context.on("request", lambda r: requested.append(r.url))
    try:
        page = context.new_page()
        page.set_default_timeout(120_000)  # a busy machine
        page.goto(base_url + rel, wait_until="load")
        page.evaluate(WEIGH_SETTLE)
        page.wait_for_load_state("networkidle")
    finally:
        context.close()
    return weigh(requested, base_url, book_dir)


def breakdown(files: dict[str, int]) -> Counter:
    out = Counter()
    for path, size in files.items():
        out[kind(path)] += size
    return out


def measure(book_dir: Path = BOOK, viewport=DESKTOP, only=None, **context_kwargs) -> dict:
    """{page: page_weight(...)} for every page of the book (or those in `only`)."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    if exe is None:
        sys.exit("no Chromium: install Debian's package, or set CHROMIUM to a browser binary")
    chosen = only or pages(book_dir)
    out = {}
    with serve(book_dir) as base_url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        try:
            for rel in chosen:
                out[rel] = page_weight(browser, base_url, book_dir, rel, viewport,
                                       **context_kwargs)
        finally:
            browser.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--book", type=Path, default=BOOK, help="the built book (_build/html)")
    ap.add_argument("--top", type=int, default=0, help="list only the N heaviest pages")
    ap.add_argument("--phone", action="store_true", help="at 390 px, as a phone (else 1280 px)")
    ap.add_argument("--files", action="store_true", help="list the heaviest page's files")
    ap.add_argument("pages", nargs="*", help="pages to measure (default: all)")
    args = ap.parse_args(argv)
    book_dir = args.book.resolve()
    kw = {"is_mobile": True, "has_touch": True} if args.phone else {}
    weights = measure(book_dir, PHONE if args.phone else DESKTOP, args.pages or None, **kw)
    ranked = sorted(weights.items(), key=lambda kv: -kv[1]["total"])
    kinds = ["html", "css", "js", "mathjax", "font", "image", "other"]
    print(f"{'page':<40} {'total kB':>9} " + " ".join(f"{k:>8}" for k in kinds))
    for rel, w in ranked[:args.top or None]:
        b = breakdown(w["files"])
        print(f"{rel:<40} {w['total'] / 1000:9.0f} "
              + " ".join(f"{b[k] / 1000:8.0f}" for k in kinds))
    rel, heaviest = ranked[0]
    print(f"\n{len(weights)} pages at {'390' if args.phone else '1280'} px; heaviest: {rel}, "
          f"{heaviest['total'] / 1e6:.2f} MB (target <= {LIMIT / 1e6:.1f} MB)")
    if args.files:
        for path, size in sorted(heaviest["files"].items(), key=lambda kv: -kv[1]):
            print(f"  {size / 1000:8.1f} kB  {path}")
    missing = sorted({u for w in weights.values() for u in w["missing"]})
    if missing:
        print("requested but not in the book:\n  " + "\n  ".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
