"""The HTML report of `python -m rlgates inspect` in headless Chromium, at 1280 px and at 390 px
(a phone): no console or page error, every image loaded and with alt text, no request off
localhost, no page wider than the screen. Reports of two synthetic captures (a healthy one and
one with a per-micro-batch normaliser), served on localhost; a negative control shows that an
image off localhost and one without alt text are caught. Needs Chromium, not the built book.
Screenshots: screenshots/inspect-*.png.
"""

from __future__ import annotations

import pytest
from bookserver import SCREENSHOTS, Offline, serve
from crawl import DESKTOP, PHONE, Tab

from rlgates.inspect import synthetic
from rlgates.inspect.cli import main

pytestmark = pytest.mark.browser

IMAGES = """() => [...document.images].map(i => ({
  ok: i.complete && i.naturalWidth > 0, alt: (i.getAttribute('alt') || '').trim(),
  src: i.getAttribute('src').slice(0, 30)}))"""
WIDE = "() => document.documentElement.scrollWidth - innerWidth"
#: how far the findings table sticks out of its box (which would scroll it sideways)
FINDINGS = """() => { const t = document.querySelector('table.findings');
  return t.getBoundingClientRect().width - t.parentElement.clientWidth; }"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect_reports")
    for name, norm in (("healthy", "step"), ("faulty", "micro-batch")):
        cap = synthetic.write(root / f"{name}.capture", steps=8, rows=32, length=16,
                              normaliser=norm)
        assert main([str(cap), "--out", str(root / name), "-q"]) == (norm != "step")
    control = root / "control"
    control.mkdir()
    page = (root / "healthy" / "report.html").read_text()
    (control / "report.html").write_text(page.replace(
        "<h2>Findings</h2>", '<img src="http://example.com/x.png"><h2>Findings</h2>'))
    with serve(root) as url:
        yield url


def look(browser, url, width, shot=None):
    viewport, phone = {"desktop": (DESKTOP, False), "phone": (PHONE, True)}[width]
    ctx = Offline(browser, route=True, viewport=viewport, is_mobile=phone, has_touch=phone)
    problems: list[str] = []
    page = Tab(ctx, problems).open(url, url)
    got = {"images": page.evaluate(IMAGES), "wide": page.evaluate(WIDE),
           "findings": page.evaluate(FINDINGS),
           "problems": problems, "blocked": list(ctx.blocked)}
    if shot:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / shot), full_page=True)
    ctx.close()
    return got


@pytest.mark.parametrize("width", ["desktop", "phone"])
@pytest.mark.parametrize("name", ["healthy", "faulty"])
def test_report_offline_and_accessible(browser, reports, name, width):
    got = look(browser, f"{reports}{name}/report.html", width, f"inspect-{name}-{width}.png")
    assert not got["problems"] and not got["blocked"], got
    assert len(got["images"]) >= 3  # the series, and two or three steps on the plane
    for img in got["images"]:
        assert img["ok"] and len(img["alt"]) > 40 and img["src"].startswith("data:image/png")
    assert got["wide"] <= 1, f"{name} at {width}: {got['wide']}px wider than the screen"
    # the findings read without sideways scrolling: on a phone each row is a stacked card
    assert got["findings"] <= 1, f"{name} at {width}: findings {got['findings']}px too wide"
    assert (SCREENSHOTS / f"inspect-{name}-{width}.png").stat().st_size > 10_000


def test_negative_control_is_caught(browser, reports):
    got = look(browser, f"{reports}control/report.html", "desktop")
    assert any("example.com" in u for u in got["blocked"]), got
    assert any(not i["alt"] for i in got["images"]) and not all(i["ok"] for i in got["images"])

