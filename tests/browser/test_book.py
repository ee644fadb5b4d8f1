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
from bookserver import LOCAL_HOSTS, Offline
from crawl import DESKTOP, open_page

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
    # every registered gate of (ρ, A) alone, none listed here (a side-input one has no JS;
    # DRO's class says why it has none), and at least the article's methods
    assert {n for n in rlgates.names() if not rlgates.REGISTRY[n].side_inputs
            and rlgates.REGISTRY[n].explorer is not None} <= set(offered)
    assert {n for n in rlgates.names() if rlgates.REGISTRY[n].article_row} <= set(offered)


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
    for name in explorer_methods():
        explorer.select_option("#gx-method", name)
        grid = explorer.evaluate(GRID_JS, 8)
        m = rlgates.get(name)
        p = rlgates.plane(m, 1.0, grid["lim"], int(grid["n"]))
        signed = (torch.sign(torch.from_numpy(p.adv))[None, :] * torch.from_numpy(p.gate))
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
            for value, vmax, pixel in ((gate, 1.0, pg), (sig, grid["smax"], ps)):
                # the neighbouring grid cell may be the one drawn: accept its colour too
                idx = min(255, max(0, math.floor((value + vmax) / (2 * vmax) * 256)))
                ok = {cmap[i] for i in range(max(0, idx - 3), min(256, idx + 4))}
                got = "#" + "".join(f"{v:02x}" for v in pixel)
                assert got in ok, (name, a, lr, value, got, cmap[idx])


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
