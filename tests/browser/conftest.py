"""Fixtures for the real-browser test: the built book served on localhost, headless Chromium.

The book is read from $BOOK_HTML (default: _build/html). Chromium is Debian's /usr/bin/chromium
(or $CHROMIUM), driven through Playwright's Python package. A plain `pytest` skips these tests,
with a one-line reason, when no book is built or no Chromium is installed; with
RLGATES_REQUIRE_BROWSER=1 (as `python3 tasks.py check` sets it, after building the book and
installing Chromium) a missing book or browser fails them instead.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest
from bookserver import BOOK, CHROMIUM, LAUNCH_ARGS, Offline, QuietHandler

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
    handler = functools.partial(QuietHandler, directory=str(book_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    exe = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    if not exe:
        missing(f"Chromium not found at {CHROMIUM}: install Debian's package "
                "(`apt-get install -y chromium`; `python3 tasks.py check` does it as root)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:  # pragma: no cover - playwright is in requirements.txt
        pytest.fail(f"playwright is not installed: {err}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def offline(browser):
    made = []

    def make(**kwargs):
        made.append(Offline(browser, **kwargs))
        return made[-1]

    yield make
    for o in made:
        o.close()
