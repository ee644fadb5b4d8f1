"""The built book in a real browser, offline: every page, the math, the links, search, the gate
explorer (against rlgates), and screenshots at desktop and phone widths in both themes.

Run: `python -m pytest tests/browser -m browser` after `python3 tasks.py book` (or set BOOK_HTML).
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch
from bookserver import LOCAL_HOSTS, SCREENSHOTS, Offline
from crawl import DESKTOP, WIDTHS, open_page

import rlgates
from rlgates._book.explorer_data import colormap, explorer_methods

pytestmark = pytest.mark.browser

# ---- static --------------------------------------------------------------------------------
EXTERNAL_ASSET = re.compile(
    r"<(?:script|img|iframe|source|video|audio|embed)\b[^>]*\bsrc=[\"'](?:https?:)?//"
    r"|<link\b(?=[^>]*\brel=[\"'](?:stylesheet|preload|modulepreload|icon|prefetch|manifest)[\"'])"
    r"[^>]*\bhref=[\"'](?:https?:)?//"
    r"|@import\s+url\([\"']?(?:https?:)?//|url\([\"']?https?://", re.I)


def test_no_page_references_an_external_asset(book_dir):
    """No script, style, font or image in the HTML or the book's CSS comes from another host."""
    bad = []
    for p in [*book_dir.rglob("*.html"), *(book_dir / "_static").rglob("*.css")]:
        for m in EXTERNAL_ASSET.finditer(p.read_text(errors="replace")):
            bad.append(f"{p.relative_to(book_dir)}: {m.group(0)[:120]}")
    assert not bad, "\n".join(bad)


def test_mathjax_is_served_by_the_book(book_dir):
    for part in ("startup.js", "core.js", "input/tex.js", "output/chtml.js",
                 "output/chtml/fonts/tex.js", "a11y/assistive-mml.js"):
        assert (book_dir / "_static" / "mathjax" / part).is_file(), part
    assert list((book_dir / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2")
                .glob("MathJax_Main-Regular.woff"))


# ---- every page ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def crawl(site):
    """What INSPECT read on every page at 1280 and at 390 px, in the session's one visit of each
    page per width (crawl.py): {"pages": {(width, page): ...}, "problems", "blocked"}."""
    return {"pages": {key: m["inspect"] for key, m in site["pages"].items()},
            "problems": site["problems"], "blocked": site["blocked"]}


def _desktop(crawl) -> dict:
    return {rel: info for (width, rel), info in crawl["pages"].items() if width == "desktop"}


def test_every_page_offline(book_dir, base_url, crawl):
    """At 1280 and at 390 px each page loads with no console error, nothing off localhost, every
    image loaded with alt text, the math typeset (no raw TeX left in visible text); every
    internal link resolves."""
    problems = list(crawl["problems"])
    assert {width for width, _ in crawl["pages"]} == {"desktop", "phone"}
    for (width, page), info in crawl["pages"].items():
        rel = f"{page} ({width})"
        for img in info["imgs"]:
            if not img["ok"]:
                problems.append(f"{rel}: image did not load: {img['src']}")
            if not img["alt"]:
                problems.append(f"{rel}: image without alt text: {img['src']}")
        if info["nmath"] and not info["mathjax"]:
            problems.append(f"{rel}: {info['nmath']} math elements but no MathJax")
        for t in info["untypeset"]:
            problems.append(f"{rel}: math not typeset: {t!r}")
        for e in info["merror"]:
            problems.append(f"{rel}: MathJax error: {e!r}")
        for r in info["raw"]:
            problems.append(f"{rel}: raw TeX in visible text: {r!r}")
        if info["code"] and not info["copy"]:
            problems.append(f"{rel}: {info['code']} code blocks but no copy button")
    problems += [f"blocked request off localhost: {u}" for u in crawl["blocked"]]
    problems += broken_links(book_dir, base_url, _desktop(crawl))
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:80])


def broken_links(book_dir: Path, base_url: str, seen: dict) -> list[str]:
    bad = []
    base = urlsplit(base_url)
    for rel, info in seen.items():
        for href in info["links"]:
            u = urlsplit(href)
            if u.scheme not in ("http", "https") or u.hostname not in LOCAL_HOSTS:
                continue
            if u.port != base.port:
                bad.append(f"{rel}: link to another local server: {href}")
                continue
            path = unquote(u.path).lstrip("/") or "index.html"
            if path.endswith("/"):
                path += "index.html"
            target = book_dir / path
            if not target.is_file():
                bad.append(f"{rel}: broken link {href} (no {path})")
                continue
            if path == "explorer.html" and unquote(u.fragment) in explorer_methods():
                continue  # explorer.html#sapo opens the explorer at SAPO (the {explorer} role)
            if u.fragment and path.endswith(".html"):
                ids = seen[path]["ids"] if path in seen else re.findall(
                    r'\bid="([^"]+)"', target.read_text(errors="replace"))
                if unquote(u.fragment) not in ids:
                    bad.append(f"{rel}: link {href}: no #{u.fragment} in {path}")
    return bad


def test_search_works_offline(searched):
    assert searched["hits"] > 0
    assert not searched["problems"] and not searched["blocked"], searched


def test_chapters_offer_ipynb_download_and_launch_buttons(crawl):
    chapters = {rel: info for rel, info in _desktop(crawl).items() if rel.startswith("chapters/")}
    assert chapters, "no chapter pages were built"
    problems = []
    for rel, info in chapters.items():
        stem = Path(rel).stem
        if not any(urlsplit(u).path.endswith(f"_sources/chapters/{stem}.ipynb")
                   for u in info["links"]):
            problems.append(f"{rel}: no .ipynb download link")
        for host in ("colab.research.google.com", "mybinder.org"):
            if not any(urlsplit(u).hostname == host and u.endswith(f"{stem}.ipynb")
                       for u in info["links"]):
                problems.append(f"{rel}: no launch link to {host}")
    assert not problems, "\n".join(problems)


# ---- the gate explorer ---------------------------------------------------------------------
def _points(name: str, rng: random.Random, n_params: int = 12, n_points: int = 40):
    """Random hyperparameters in the sliders' ranges, and (ρ, A) points that include each clip
    bound exactly and its floating-point neighbours, with rlgates' gate and signal there."""
    from rlgates._book.explorer_data import method_entry

    entry = method_entry(name)
    cases = [{p["key"]: p["default"] for p in entry["params"]}]
    for _ in range(n_params):
        params = {}
        for p in entry["params"]:
            lo, hi, _step = p["range"]
            params[p["key"]] = rng.uniform(max(lo, 1e-6), hi)
        try:
            rlgates.get(name, **params)
        except ValueError:
            continue
        cases.append(params)
    out = []
    for params in cases:
        m = rlgates.get(name, **params)
        lim = entry["log_ratio_lim"]
        ratios = [math.exp(rng.uniform(-2.5 * lim, 2.5 * lim)) for _ in range(n_points)]
        for r, _side in m.bounds():
            ratios += [r, math.nextafter(r, 0), math.nextafter(r, math.inf)]
        ratios += [1.0]
        advs = [rng.uniform(-1, 1) for _ in range(len(ratios))]
        advs[: 3] = [0.0, 1e-300, -1e-300]
        pairs = [(r, a) for r in ratios for a in (advs[ratios.index(r) % len(advs)], 0.5, -0.5)]
        rr = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
        aa = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
        out.append({
            "params": params,
            "ratio": rr.tolist(), "adv": aa.tolist(),
            "gate": m.gate(rr, aa).tolist(), "signal": m.signal(rr, aa).tolist(),
            "bounds": sorted([list(b) for b in m.bounds()]),
        })
    return out


COMPARE_JS = """([name, cases]) => {
  const E = window.RLGatesExplorer, bad = [];
  let worst = 0;
  for (const c of cases) {
    for (let k = 0; k < c.ratio.length; k++) {
      const g = E.gate(name, c.params, c.ratio[k], c.adv[k]);
      const s = E.signal(name, c.params, c.ratio[k], c.adv[k]);
      const dg = Math.abs(g - c.gate[k]) / Math.max(1, Math.abs(c.gate[k]));
      const ds = Math.abs(s - c.signal[k]) / Math.max(1, Math.abs(c.signal[k]));
      worst = Math.max(worst, dg, ds);
      if (!(dg <= 1e-9 && ds <= 1e-9) && bad.length < 5)
        bad.push({params: c.params, ratio: c.ratio[k], adv: c.adv[k], js: [g, s],
                  py: [c.gate[k], c.signal[k]]});
    }
    const jb = E.bounds(name, c.params).map(b => [b[0], b[1]])
      .sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    if (JSON.stringify(jb) !== JSON.stringify(c.bounds) && bad.length < 5)
      bad.push({params: c.params, bounds_js: jb, bounds_py: c.bounds});
  }
  return {worst, bad, n: cases.reduce((t, c) => t + c.ratio.length, 0)};
}"""


@pytest.fixture(scope="module")
def explorer_page(base_url, browser):
    ctx = Offline(browser, route=True, viewport=DESKTOP)
    problems: list[str] = []
    page = open_page(ctx, base_url + "explorer.html", problems, "explorer")
    page.wait_for_selector("#gx-method option", state="attached")
    page.wait_for_selector(".gx-formula mjx-container")
    yield page, problems, ctx.blocked
    page.close()
    ctx.close()


@pytest.fixture
def explorer(explorer_page):
    page, problems, blocked = explorer_page
    yield page
    assert not problems and not blocked, problems + blocked


def test_explorer_offers_every_method(explorer):
    # the page's own text and math survive the widget (it fills #rlgates-explorer only)
    assert explorer.locator("article h1").count() == 1
    assert explorer.locator("article mjx-container").count() > 5
    offered = explorer.eval_on_selector_all("#gx-method option", "os => os.map(o => o.value)")
    assert offered == explorer_methods()
    # every registered gate of (ρ, A) alone, DRO's included, none listed here (a method whose
    # gate reads side inputs cannot be drawn on the (A, log ρ) plane), and the article's methods
    assert {n for n in rlgates.names() if not rlgates.REGISTRY[n].side_inputs} <= set(offered)
    assert {n for n in rlgates.names() if rlgates.REGISTRY[n].article_row} <= set(offered)
    # the line under the widget names each method left out, from the registry
    note = explorer.text_content(".rlg-explorer-omitted")
    left = [rlgates.REGISTRY[n] for n in rlgates.names() if n not in offered]
    assert f"offers {len(offered)} of the {len(rlgates.names())} methods" in note, note
    assert all(m.title in note and m.side_inputs for m in left), note
    assert "DRO" not in note, note


def test_explorer_gate_matches_rlgates(explorer):
    """The JavaScript gate and signal agree with Method.gate / Method.signal to 1e-9, and its
    clip bounds with Method.bounds(), at sampled (method, hyperparameters, ρ, A) points."""
    rng = random.Random(0)
    report = {}
    for name in explorer_methods():
        got = explorer.evaluate(COMPARE_JS, [name, _points(name, rng)])
        report[name] = got
        assert not got["bad"] and got["worst"] <= 1e-9, (name, got)
    assert all(r["n"] > 100 for r in report.values())


GRID_JS = """(stride) => {
  const X = window.RLGatesExplorer.explorer, n = X.signal.length ** 0.5, g = [], s = [];
  for (let i = 0; i < n; i += stride) for (let j = 0; j < n; j += stride) {
    g.push(X.signedGate[i * n + j]); s.push(X.signal[i * n + j]);
  }
  return {g, s, lim: X.lim, n, smax: X.signalMax};
}"""


def test_explorer_panels_show_rlgates_plane(explorer):
    """At each method's defaults the drawn grids equal rlgates.plane on the same axes, and the
    canvas pixels carry rlgates.plane.CMAP's colour for rlgates' value there."""
    cmap = colormap()

    def near(values, a, lr, lim, vmax):
        """The colours of rlgates' values in the grid cell nearest (a, lr) and its neighbours
        (a pixel on a cell's edge may show the next one; DRO's gate changes steeply from cell
        to cell near A = 0), each ±1 colour index."""
        n = values.shape[0]
        i, j = round((lr + lim) / (2 * lim) * (n - 1)), round((a + 1) / 2 * (n - 1))
        out = set()
        for v in values[max(0, i - 1): i + 2, max(0, j - 1): j + 2].flatten().tolist():
            idx = min(255, max(0, math.floor((v + vmax) / (2 * vmax) * 256)))
            out |= {cmap[k] for k in range(max(0, idx - 1), min(256, idx + 2))}
        return out

    for name in explorer_methods():
        explorer.select_option("#gx-method", name)
        grid = explorer.evaluate(GRID_JS, 8)
        m = rlgates.get(name)
        p = rlgates.plane(m, 1.0, grid["lim"], int(grid["n"]))
        signed = (torch.sign(torch.from_numpy(p.adv))[None, :] * torch.from_numpy(p.gate))
        signal = torch.from_numpy(p.signal)
        want_g = signed[::8, ::8].flatten().tolist()
        want_s = p.signal[::8, ::8].flatten().tolist()
        assert max(abs(a - b) for a, b in zip(grid["g"], want_g, strict=True)) <= 1e-9, name
        assert max(abs(a - b) / max(1, abs(b))
                   for a, b in zip(grid["s"], want_s, strict=True)) <= 1e-9, name
        # pixels: cell centres away from the axes and the clip bounds
        checks = []
        for a, lr in [(0.55, 0.37), (-0.55, 0.37), (0.55, -0.43), (-0.55, -0.43), (0.8, 0.05)]:
            lr *= grid["lim"]
            if any(abs(math.log(b) - lr) < 0.05 * grid["lim"] for b, _ in m.bounds()):
                continue
            r, av = torch.tensor(math.exp(lr), dtype=torch.float64), torch.tensor(a).double()
            gate = float(m.gate(r, av)) * (1 if a > 0 else -1)
            sig = float(m.signal(r, av))
            checks.append((a, lr, gate, sig))
        px = explorer.evaluate("""(pts) => {
          const X = window.RLGatesExplorer.explorer;
          return pts.map(([a, l]) => X.panels.map(p => {
            const d = p.dpr, c = p.canvas.getContext('2d');
            return [...c.getImageData(Math.round(p.X(a) * d), Math.round(p.Y(l) * d), 1, 1).data]
              .slice(0, 3);
          }));
        }""", [[c[0], c[1]] for c in checks])
        for (a, lr, gate, sig), (pg, ps) in zip(checks, px, strict=True):
            for value, values, vmax, pixel in ((gate, signed, 1.0, pg),
                                               (sig, signal, grid["smax"], ps)):
                got = "#" + "".join(f"{v:02x}" for v in pixel)
                assert got in near(values, a, lr, grid["lim"], vmax), (name, a, lr, value, got)


def _canvases(page):
    return page.evaluate("() => [...document.querySelectorAll('.gx-canvas')].map(c => c.toDataURL())")


def test_explorer_slider_redraws(explorer):
    """Moving a slider (with the keyboard, as a reader would) changes both panels."""
    explorer.select_option("#gx-method", "dapo")
    before = _canvases(explorer)
    code_before = explorer.text_content(".gx-code")
    slider = explorer.locator("#gx-eps_high")
    slider.focus()
    for _ in range(15):
        slider.press("ArrowRight")
    explorer.wait_for_function("() => !window.RLGatesExplorer.explorer.pending")
    explorer.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    after = _canvases(explorer)
    assert before[0] != after[0] and before[1] != after[1]
    step = _param("dapo", "eps_high")["range"][2]
    assert explorer.evaluate("() => window.RLGatesExplorer.explorer.values.eps_high") == \
        pytest.approx(0.28 + 15 * step)
    assert explorer.text_content(".gx-code") != code_before
    # every method draws something non-blank, and its sliders exist
    for name in explorer_methods():
        explorer.select_option("#gx-method", name)
        n_sliders = explorer.locator(".gx-slider input").count()
        assert n_sliders == len(rlgates.get(name).hparams), name
        colours = explorer.evaluate("""() => {
          const c = document.querySelector('#gx-signal'), d = c.getContext('2d')
            .getImageData(0, 0, c.width, c.height).data, seen = new Set();
          for (let k = 0; k < d.length; k += 4 * 97) seen.add(d[k] + ',' + d[k+1] + ',' + d[k+2]);
          return seen.size;
        }""")
        assert colours > 10, (name, colours)


# ---- screenshots, phone width, dark theme --------------------------------------------------
def test_screenshots_phone_and_dark(themed):
    """Screenshots of the explorer and a chapter with figures, at desktop and phone widths, in the
    light and dark themes (saved to screenshots/; conftest.py: themed). Each page shows the theme
    asked for; at a phone's width no page scrolls sideways; in the dark theme figures sit on
    white."""
    assert not themed["book"], "\n".join(themed["book"])


# ---- the explorer's readout, ticks, half-gate line, fine slider ------------------------------
def _param(name: str, key: str) -> dict:
    from rlgates._book.explorer_data import method_entry

    return next(p for p in method_entry(name)["params"] if p["key"] == key)


def _hover(page, panel: str, a: float, log_ratio: float):
    """Move the mouse to (A, log ρ) on a panel ("gate" or "signal"); returns the readout text."""
    x, y = page.evaluate("""([k, a, l]) => {
      const X = window.RLGatesExplorer.explorer, p = X.panels[k];
      p.canvas.scrollIntoView({block: "center"});
      const r = p.canvas.getBoundingClientRect();
      return [r.left + p.X(a), r.top + p.Y(l)];
    }""", [0 if panel == "gate" else 1, a, log_ratio])
    page.mouse.move(x, y)
    return page.text_content(".gx-readout")


def _settle(page):
    page.wait_for_function("() => !window.RLGatesExplorer.explorer.pending")
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")


def _readout_matches_rlgates(page):
    """The readout names the current method and shows rlgates' gate and signal at its point."""
    state = page.evaluate("""() => { const X = window.RLGatesExplorer.explorer;
      return {name: X.method.name, title: X.method.title, values: X.values, at: X.readoutAt,
              text: X.readout.textContent}; }""")
    a, lr = state["at"]
    m = rlgates.get(state["name"], **state["values"])
    r, av = torch.tensor(math.exp(lr), dtype=torch.float64), torch.tensor(a, dtype=torch.float64)
    gate, sig = float(m.gate(r, av)), float(m.signal(r, av))
    text = state["text"].replace("−", "-")
    got = dict(re.findall(r"(gate f′|signal f′·ρ·A) = (-?[0-9.e+-]+)", text))
    assert state["text"].startswith(state["title"] + " at "), state
    for key, want in (("gate f′", gate), ("signal f′·ρ·A", sig)):
        # shown to 3 significant digits (2 in exponent form, below 1e-4)
        rel = 5e-3 if abs(want) >= 1e-4 else 5e-2
        assert float(got[key]) == pytest.approx(want, rel=rel, abs=1e-12), (state, key, want)
    assert ("no gradient" in text) == (gate == 0 and a != 0), state
    return gate


def test_explorer_readout_follows_method_and_sliders(explorer):
    """Hover, then change the method and a slider without moving the mouse: the readout is
    recomputed each time (it used to keep the previous method's numbers)."""
    explorer.select_option("#gx-method", "sao")
    text = _hover(explorer, "gate", 0.5, -1.5)  # below SAO's window: shut
    assert "SAO at" in text and _readout_matches_rlgates(explorer) == 0
    # the same pixel on SAPO's axes (log ρ ±3, not ±2): its gate is about 0.8 there
    explorer.select_option("#gx-method", "sapo")
    _settle(explorer)
    assert _readout_matches_rlgates(explorer) > 0.05
    before = explorer.text_content(".gx-readout")
    slider = explorer.locator("#gx-tau_pos")
    slider.focus()
    for _ in range(6):
        slider.press("ArrowRight")
    _settle(explorer)
    assert explorer.text_content(".gx-readout") != before
    _readout_matches_rlgates(explorer)
    # and the signal panel reads the same point
    _hover(explorer, "signal", -0.4, -0.3)
    _readout_matches_rlgates(explorer)


def test_explorer_ticks_and_half_gate_line(explorer):
    """Both end ticks of the log ρ axis are labelled; a smooth gate (SAPO) gets its dashed line
    where the gate is 1/2, per side of A = 0, at rlgates' ρ; hard gates get none."""
    explorer.select_option("#gx-method", "ppo")
    _settle(explorer)
    ticks = explorer.evaluate("() => window.RLGatesExplorer.explorer.panels[0].yticks")
    assert ticks[0] == "−0.6" and ticks[-1] == "0.6", ticks
    assert explorer.evaluate("() => window.RLGatesExplorer.explorer.panels[0].halfLines.length") == 0
    explorer.select_option("#gx-method", "sapo")
    _settle(explorer)
    lines = explorer.evaluate("() => window.RLGatesExplorer.explorer.panels[0].halfLines")
    m = rlgates.get("sapo")
    # sech²(x/2) = 1/2 at |x| = 2·acosh(√2); x = τ(ρ − 1), τ by the sign of A
    want = {+1: [math.log1p(s * 2 * math.acosh(math.sqrt(2)) / m.hparams["tau_pos"]) for s in (-1, 1)
                 if 1 + s * 2 * math.acosh(math.sqrt(2)) / m.hparams["tau_pos"] > 0],
            -1: [math.log1p(s * 2 * math.acosh(math.sqrt(2)) / m.hparams["tau_neg"]) for s in (-1, 1)
                 if 1 + s * 2 * math.acosh(math.sqrt(2)) / m.hparams["tau_neg"] > 0]}
    lim = explorer.evaluate("() => window.RLGatesExplorer.explorer.lim")
    got = {+1: [], -1: []}
    for line in lines:
        side = 1 if line[0][0] > 0 else -1
        assert all((pt[0] > 0) == (side > 0) for pt in line), "a line crosses A = 0"
        got[side].append(sum(pt[1] for pt in line) / len(line))
    for side in (1, -1):
        expected = sorted(v for v in want[side] if abs(v) < lim)
        assert expected, side
        assert sorted(got[side]) == pytest.approx(expected, abs=2 * lim / 200), (side, got, want)


def test_explorer_eps_high_has_fine_control(explorer):
    """DAPO's ε_h: its default sits well inside the slider's track, a few pixels of drag near
    the default move it by about one step, and the arrow keys by exactly one step."""
    step = _param("dapo", "eps_high")["range"][2]
    explorer.select_option("#gx-method", "dapo")
    _settle(explorer)
    got = explorer.evaluate("""() => {
      const s = document.querySelector('#gx-eps_high'), X = window.RLGatesExplorer.explorer;
      const out = {frac: (+s.value - +s.min) / (+s.max - +s.min), px: s.getBoundingClientRect().width};
      const start = +s.value;
      s.value = String(start + (+s.max - +s.min) * 3 / out.px);  // three pixels to the right
      s.dispatchEvent(new Event('input'));
      out.moved = X.values.eps_high;
      return out;
    }""")
    assert 0.2 < got["frac"] < 0.6, got
    assert 0.28 < got["moved"] <= 0.28 + 3 * max(step, 0.01) + 1e-9, got
    slider = explorer.locator("#gx-eps_high")
    slider.focus()
    slider.press("ArrowLeft")
    _settle(explorer)
    assert explorer.evaluate("() => window.RLGatesExplorer.explorer.values.eps_high") == \
        pytest.approx(got["moved"] - step)


# ---- the explorer at 1280 and 390 px: DRO, touch targets, where the readout sits (R11) -------
@pytest.fixture(scope="module", params=["desktop", "phone"])
def explorer_at(request, base_url, browser):
    """The explorer opened at DRO (explorer.html#dro) at 1280 px with a mouse and at 390 px with
    touch: (width label, page, problems, requests that left localhost)."""
    viewport, kwargs = WIDTHS[request.param]
    ctx = Offline(browser, route=True, viewport=viewport, **kwargs)
    problems: list[str] = []
    page = open_page(ctx, base_url + "explorer.html#dro", problems, f"explorer {request.param}")
    page.wait_for_selector("#gx-method option", state="attached")
    page.wait_for_selector(".gx-formula mjx-container")
    yield request.param, page, problems, ctx.blocked
    page.close()
    ctx.close()


def _touch(page, label: str, panel: str, a: float, log_ratio: float) -> tuple[float, float]:
    """Centre a panel ("gate" or "signal") in the window, then point at (A, log ρ) on it: a tap
    at 390 px, the mouse at 1280 px. Returns the point in window coordinates."""
    x, y = page.evaluate("""([k, a, l]) => {
      const p = window.RLGatesExplorer.explorer.panels[k];
      p.canvas.scrollIntoView({block: "center"});
      const r = p.canvas.getBoundingClientRect();
      return [r.left + p.X(a), r.top + p.Y(l)];
    }""", [0 if panel == "gate" else 1, a, log_ratio])
    if label == "phone":
        page.touchscreen.tap(x, y)
    else:
        page.mouse.move(x, y)
    _settle(page)
    return x, y


def test_explorer_dro_reads_rlgates_where_tapped(explorer_at):
    """DRO (a gate of (ρ, A) whose edge moves with |A|) opens from its link, has its β slider,
    and the readout at a tapped (pointed-at) point shows rlgates' DRO gate and signal there,
    also after β moves."""
    label, page, problems, blocked = explorer_at
    offered = page.eval_on_selector_all("#gx-method option", "os => os.map(o => o.value)")
    assert "dro" in offered, offered
    page.click(".gx-reset")  # DRO at its defaults
    assert page.evaluate("() => window.RLGatesExplorer.explorer.method.name") == "dro"
    assert page.locator("#gx-beta").count() == 1
    lim = page.evaluate("() => window.RLGatesExplorer.explorer.lim")
    for panel, a, lr in (("gate", 0.5, 0.3), ("gate", -0.05, -1.0), ("signal", 0.8, 1.2),
                         ("signal", -0.7, 0.6)):
        _touch(page, label, panel, a, lr)
        at = page.evaluate("() => window.RLGatesExplorer.explorer.readoutAt")
        assert at[0] == pytest.approx(a, abs=0.02) and at[1] == pytest.approx(lr, abs=0.02 * lim)
        gate = _readout_matches_rlgates(page)
        assert gate != 0 and page.text_content(".gx-readout").startswith("DRO at "), (a, lr)
    slider = page.locator("#gx-beta")
    slider.focus()
    for _ in range(10):
        slider.press("ArrowRight")
    _settle(page)
    assert page.evaluate("() => window.RLGatesExplorer.explorer.values.beta") == pytest.approx(1.5)
    _readout_matches_rlgates(page)
    assert 'rlgates.get("dro", beta=1.5)' in page.text_content(".gx-code")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)  # for a person to look at
    page.locator("#rlgates-explorer").screenshot(path=str(SCREENSHOTS / f"explorer-dro-{label}.png"))
    assert not problems and not blocked, problems + blocked


THUMB_RED = (0xB2, 0x18, 0x2B)


def test_explorer_touch_targets(explorer_at):
    """Sliders 24 px tall at least (WCAG 2.2's target size; the CSS asks 32) with a thumb about
    20 px across, and 16 px text in the menu, the button and the inputs (iOS Safari zooms the
    page when a control with smaller text is focused), at 1280 and at 390 px."""
    from io import BytesIO

    from PIL import Image

    label, page, problems, blocked = explorer_at
    controls = page.evaluate("""() => [...document.querySelectorAll(
        '#rlgates-explorer select, #rlgates-explorer button, #rlgates-explorer input')]
      .map(e => ({what: e.tagName + '#' + e.id, type: e.type,
                  height: e.getBoundingClientRect().height,
                  font: parseFloat(getComputedStyle(e).fontSize)}))""")
    assert any(c["type"] == "range" for c in controls), controls
    small = [c for c in controls if c["font"] < 16 or c["height"] < 24]
    assert not small, (label, small)
    # the thumb: the rows of the slider's picture that hold its red (the filled track is 6 px)
    slider = page.locator("#rlgates-explorer input[type=range]").first
    slider.evaluate("e => e.scrollIntoView({block: 'center'})")
    img = Image.open(BytesIO(slider.screenshot(scale="css"))).convert("RGB")
    px = img.load()
    rows = [y for y in range(img.height)
            if any(max(abs(c - t) for c, t in zip(px[x, y], THUMB_RED, strict=True)) <= 40
                   for x in range(img.width))]
    assert rows and rows[-1] - rows[0] + 1 >= 18, (label, rows)
    assert not problems and not blocked, problems + blocked


READOUT_OVERLAP_JS = """() => {
  const box = s => { const b = document.querySelector(s).getBoundingClientRect();
                     return [b.left, b.top, b.right, b.bottom]; };
  const r = box('.gx-readout'), hit = [];
  for (const s of ['.gx-sliders', '.gx-formula', '#gx-gate', '#gx-signal']) {
    const b = box(s);
    if (r[0] < b[2] && b[0] < r[2] && r[1] < b[3] && b[1] < r[3]) hit.push(s);
  }
  return hit;
}"""


def test_explorer_readout_covers_no_panel(explorer_at):
    """Wherever the page is scrolled, the readout covers neither the formula, the sliders nor a
    panel (it was sticky, over the formula at 1280 px and the second panel at 390 px); after a
    tap on either panel, centred in the window, it is on screen; and a long readout does not
    move the panel under it."""
    label, page, problems, blocked = explorer_at
    top, bottom, height = page.evaluate("""() => {
      const b = document.querySelector('#rlgates-explorer').getBoundingClientRect();
      return [b.top + scrollY, b.bottom + scrollY, innerHeight]; }""")
    covered = []
    for y in range(max(0, int(top - height)), int(bottom), 40):
        page.evaluate("y => window.scrollTo(0, y)", y)
        if hit := page.evaluate(READOUT_OVERLAP_JS):
            covered.append((y, hit))
    assert not covered, (label, covered)
    page.select_option("#gx-method", "dapo_dual_clip")  # a long title
    _settle(page)
    where = "() => document.querySelector('#gx-signal').getBoundingClientRect().top + scrollY"
    for panel in ("gate", "signal"):
        _touch(page, label, panel, 0.3, 0.1)  # open: a short readout
        shown = page.evaluate("""() => { const b = document.querySelector('.gx-readout')
          .getBoundingClientRect(); return [b.top, b.bottom, innerHeight]; }""")
        assert 0 <= shown[0] and shown[1] <= shown[2], (label, panel, shown)
        assert not page.evaluate(READOUT_OVERLAP_JS), (label, panel)
    before = page.evaluate(where)
    _touch(page, label, "gate", -0.5551, -0.4123)  # shut: the longest readout
    assert "no gradient" in page.text_content(".gx-readout")
    assert page.evaluate(where) == pytest.approx(before, abs=0.5), label
    assert not page.evaluate(READOUT_OVERLAP_JS), label
    assert not problems and not blocked, problems + blocked
