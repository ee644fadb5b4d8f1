"""Fixtures for the real-browser test: the built book served on localhost, headless Chromium.

The book is read from $BOOK_HTML (default: _build/html). Chromium is $CHROMIUM when set (a
Chromium or Chrome binary), else Debian's /usr/bin/chromium or a `chromium` on the PATH, driven
through Playwright's Python package. A plain `pytest` skips these tests,
with a one-line reason, when no book is built or no Chromium is installed; with
RLGATES_REQUIRE_BROWSER=1 (as `python3 tasks.py check` sets it, after building the book and
installing Chromium) a missing book or browser fails them instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bookserver import (
    BOOK,
    CHROMIUM,
    LAUNCH_ARGS,
    SCREENSHOTS,
    Offline,
    chromium,
    serve,
)
from crawl import DESKTOP, MEASURE, PHONE, Tab, Visit

REQUIRED = os.environ.get("RLGATES_REQUIRE_BROWSER") == "1"


def missing(reason: str):
    """Fail when the browser tests are required (tasks.py check), else skip with the reason."""
    (pytest.fail if REQUIRED else pytest.skip)(reason)


@pytest.fixture(scope="session")
def book_dir() -> Path:
    if not (BOOK / "index.html").is_file():
        missing(f"no built book at {BOOK}: run `python3 tasks.py book` first "
                "(or set BOOK_HTML to a built _build/html)")
    return BOOK


@pytest.fixture(scope="session")
def base_url(book_dir):
    with serve(book_dir) as url:
        yield url


def chromium_or_missing() -> str:
    exe = chromium()
    if exe is None:
        missing(f"Chromium not found at {CHROMIUM or '/usr/bin/chromium'}: "
                + ("$CHROMIUM names no file" if CHROMIUM else
                   "install Debian's package (`apt-get install -y chromium`; `python3 tasks.py "
                   "check` does it as root), or set CHROMIUM to a Chromium or Chrome binary"))
    return exe


@pytest.fixture(scope="session")
def browser():
    exe = chromium_or_missing()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:  # pragma: no cover - playwright is in requirements.txt
        pytest.fail(f"playwright is not installed: {err}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="session")
def visit(book_dir, base_url):
    """Every page visited once at each width (crawl.py), in the background from the moment a
    test first asks for it."""
    job = Visit(book_dir, base_url, chromium_or_missing())
    yield job
    job.close()


@pytest.fixture(scope="session")
def site(visit):
    """What the visit of every page read: waits for it to end."""
    return visit.result()


def _uses_site(item) -> bool:
    return "site" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session", autouse=True)
def _visit_early(request):
    """Start the visit of every page at the session's first browser test, so that it runs
    beside the tests that do not need it (which run first: see below)."""
    if any(map(_uses_site, request.session.items)) and (BOOK / "index.html").is_file() \
            and chromium():
        request.getfixturevalue("visit")


def pytest_collection_modifyitems(items):
    """The tests that read the visit of every page run last, the others meanwhile."""
    items.sort(key=_uses_site)  # stable: each group keeps its order


@pytest.fixture(scope="session")
def searched(base_url, browser) -> dict:
    """The search page, offline, once it has searched for "gate" (test_book and test_layout
    read it): its hits, their excerpts, what went wrong, the requests that left localhost."""
    ctx = Offline(browser, route=True, viewport=DESKTOP)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + "search.html?q=gate", "search")
    page.wait_for_selector("#search-results ul.search li p.context", timeout=60_000)
    page.wait_for_function("() => !document.querySelector('#search-progress') || "
                           "!document.querySelector('#search-progress').textContent",
                           timeout=60_000)
    got = {"hits": page.locator("#search-results ul.search li").count(),
           "excerpts": page.eval_on_selector_all("#search-results li p.context",
                                                 "ps => ps.map(p => p.textContent)"),
           "problems": problems, "blocked": ctx.blocked}
    ctx.close()
    return got


def _themed(browser, base_url: str, label: str, theme: str, book: list, layout: list) -> None:
    """One width and theme of `themed`: the explorer and chapter 13, each opened once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    viewport, scale = {"desktop": (DESKTOP, 1), "phone": (PHONE, 2)}[label]
    phone = label == "phone"
    ctx = Offline(browser, viewport=viewport, device_scale_factor=scale, color_scheme=theme,
                  is_mobile=phone, has_touch=phone)
    ctx.context.add_init_script(f"localStorage.setItem('mode', '{theme}');"
                                f"localStorage.setItem('theme', '{theme}');")
    problems: list[str] = []  # console errors, page errors, HTTP errors: both tests fail on them
    tab, shot = Tab(ctx, problems), f"{label}-{theme}.png"

    def look(page, rel: str) -> None:
        """What test_book checks on each page: the theme, no sideways scroll, figures on white."""
        got = page.evaluate("() => document.documentElement.dataset.theme")
        if got != theme:
            book.append(f"{rel} {label}: theme is {got}, not {theme}")
        overflow = page.evaluate("() => document.documentElement.scrollWidth - innerWidth")
        if overflow > 1:
            book.append(f"{rel} {label}: page is {overflow}px wider than the screen")
        if theme == "dark":
            bg = page.evaluate("() => { const i = document.querySelector('.bd-article img');"
                               " return i ? getComputedStyle(i).backgroundColor : null; }")
            if bg not in (None, "rgb(255, 255, 255)"):
                book.append(f"{rel}: figure background in dark theme is {bg}")

    # the explorer, opened by the deep link the {explorer} role writes
    page = tab.open(base_url + "explorer.html#sapo", f"explorer {label} {theme}")
    page.wait_for_selector(".gx-formula mjx-container")
    if (got := page.evaluate("() => window.RLGatesExplorer.explorer.method.name")) != "sapo":
        layout.append(f"explorer.html#sapo {label}: opens at {got}, not at SAPO")
    try:  # the formula shrinks to fit (book.js)
        page.wait_for_function("() => { const p = document.querySelector('.gx-formula');"
                               " return p.scrollWidth <= p.clientWidth + 1; }", timeout=10_000)
    except PlaywrightTimeout:
        layout.append(f"explorer {label} {theme}: the formula does not fit its box")
    look(page, "explorer.html")
    page.screenshot(path=str(SCREENSHOTS / f"explorer-{shot}"), full_page=True)
    box = page.locator("#gx-gate")
    box.scroll_into_view_if_needed()
    bb = box.bounding_box()
    page.mouse.move(bb["x"] + bb["width"] * 0.6, bb["y"] + bb["height"] * 0.3)
    page.locator("#rlgates-explorer").screenshot(path=str(SCREENSHOTS / f"explorer-sapo-{shot}"))
    # a chapter with Table 1 and multi-panel figures
    page = tab.open(base_url + "chapters/13_more_gates.html", f"ch13 {label} {theme}")
    page.evaluate(MEASURE)
    table = page.locator("table.rlg-table1").first
    table.scroll_into_view_if_needed()
    table.screenshot(path=str(SCREENSHOTS / f"table1-{shot}"))
    figure = page.locator(".cell_output img").last
    figure.scroll_into_view_if_needed()
    figure.screenshot(path=str(SCREENSHOTS / f"figure13-{shot}"))
    page.evaluate("() => document.querySelector('.bd-article img').scrollIntoView({block: 'center'})")
    look(page, "chapters/13_more_gates.html")
    page.screenshot(path=str(SCREENSHOTS / f"13_more_gates-{shot}"))
    tab.page.close()
    ctx.close()
    book += problems + [f"blocked: {u}" for u in ctx.blocked]
    layout += problems


@pytest.fixture(scope="session")
def themed(browser, base_url) -> dict[str, list[str]]:
    """Screenshots for a person to look at (screenshots/), at 1280 and 390 px (a phone, at 2x),
    in the light and the dark theme: the explorer at SAPO (the page, and the widget with a
    readout), Table 1, a multi-panel figure and the page around it (chapter 13).
    Each page is opened once per width and theme; what test_book and test_layout check on the
    way is returned, as problems, under "book" and "layout"."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    book: list[str] = []
    layout: list[str] = []
    for label in ("desktop", "phone"):
        for theme in ("light", "dark"):
            _themed(browser, base_url, label, theme, book, layout)
    return {"book": book, "layout": layout}


@pytest.fixture
def offline(browser):
    made = []

    def make(**kwargs):
        made.append(Offline(browser, **kwargs))
        return made[-1]

    yield make
    for o in made:
        o.close()
