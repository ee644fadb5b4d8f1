"""Shared by conftest.py and test_book.py: where the book and Chromium are, the localhost-only
network, and the static file server. (Not named conftest: tests/ has its own conftest.py.)"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
BOOK = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "screenshots")).resolve()
CHROMIUM = os.environ.get("CHROMIUM", "")  # a browser binary to use instead of Debian's


def chromium() -> str | None:
    """The browser the tests drive: $CHROMIUM when set (None if it names no file), else Debian's
    /usr/bin/chromium, else a `chromium` on the PATH (None when there is none)."""
    if CHROMIUM:
        return CHROMIUM if Path(CHROMIUM).is_file() else None
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    return shutil.which("chromium")


LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               # the network is localhost only: other names do not resolve, and any other
               # address goes to a closed proxy port (loopback always bypasses the proxy)
               "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
               "--proxy-server=http://127.0.0.1:9"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
WAIT_LIMIT_MS = 120_000


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output readable
        pass

    def end_headers(self):
        # let Chromium cache MathJax & co. between pages, as a real web server would
        self.send_header("Cache-Control", "public, max-age=600")
        super().end_headers()


class Offline:
    """A browser context whose network is localhost only. It records every URL requested
    (`requested`) and, apart, each one off localhost (`blocked`).

    Requests off localhost are recorded from the `request` event and fail at the network layer
    (LAUNCH_ARGS). With `route=True` they are also aborted by a Playwright route; routing turns
    Chromium's HTTP cache off, so the page crawl (which loads MathJax on every page) does without.
    """

    def __init__(self, browser, route=False, **context_kwargs):
        self.blocked: list[str] = []
        self.requested: list[str] = []  # every URL asked for (the page weight reads them)
        self.context = browser.new_context(**context_kwargs)
        # waits end when their condition holds; the limit is only for a busy machine (the check
        # runs the engine tests beside these), where a long page can take over Playwright's 30 s
        self.context.set_default_timeout(WAIT_LIMIT_MS)
        self.context.on("request", self._record)
        if route:
            self.context.route("**/*", self._route)

    def _off_localhost(self, url: str) -> bool:
        u = urlsplit(url)
        return u.scheme in ("http", "https", "ws", "wss") and u.hostname not in LOCAL_HOSTS

    def _record(self, request):
        self.requested.append(request.url)
        if self._off_localhost(request.url):
            self.blocked.append(request.url)

    def _route(self, route):
        if self._off_localhost(route.request.url):
            route.abort()  # already recorded by _record
        else:
            route.continue_()

    def close(self):
        self.context.close()


@contextmanager
def serve(book_dir: Path):
    """The built book on a free localhost port: yields its base URL."""
    handler = functools.partial(QuietHandler, directory=str(book_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
