"""What the book's static gate explorer (explorer.md) needs from rlgates, as JSON.

The explorer draws the gate and the learning signal in the browser, from formulas written in
JavaScript (scripts/explorer/explorer.js). Everything else comes from here at build time: which
methods exist, their defaults, slider ranges, axis limits, clip bounds, LaTeX, and the colour map.
The browser test (tests/browser) checks the JavaScript gate and signal against `Method.gate` and
`Method.signal` at sampled points, so that the page shows rlgates' numbers.
"""

from __future__ import annotations

import json

import numpy as np

from ..figures import CMAP, axis_symbols, default_lim
from ..methods import REGISTRY, get, names


def explorer_methods() -> list[str]:
    """The registered methods the explorer offers (those whose class has `explorer` JS), in
    rlgates' order."""
    return [n for n in names() if REGISTRY[n].explorer is not None]


def _range(method, param: str, default: float) -> list[float]:
    """The method's slider range (the notebooks' sliders), widened to hold the default."""
    lo, hi, step = method.slider_range(param)
    return [float(min(lo, default)), float(max(hi, default)), float(step)]


def colormap(n: int = 256) -> list[str]:
    """rlgates.figures.CMAP sampled at n levels, as #rrggbb strings (index 0 = most negative)."""
    import matplotlib

    cmap = matplotlib.colormaps[CMAP].resampled(n)
    rgb = (np.asarray(cmap(np.arange(n)))[:, :3] * 255).round().astype(int)
    return ["#" + "".join(f"{int(v):02x}" for v in c) for c in rgb]


def method_entry(name: str) -> dict:
    m = get(name)
    adv, ratio = axis_symbols(m)
    return {
        "name": m.name,
        "title": m.title,
        "date": m.date,
        "paper": m.paper,
        "level": m.level,
        "insight": m.insight,
        "gate_latex": m.gate_latex,
        "f_latex": m.f_latex,
        "adv_symbol": adv,
        "ratio_symbol": ratio,
        "log_ratio_lim": float(default_lim(m)),
        "js": dict(m.explorer) if m.explorer is not None else None,
        "params": [
            {"key": k, "label": m.param_labels.get(k, k), "default": float(v),
             "range": _range(m, k, float(v))}
            for k, v in m.hparams.items()
        ],
    }


def explorer_data() -> dict:
    return {
        "methods": [method_entry(n) for n in explorer_methods()],
        "cmap": colormap(),
        "n": 201,  # grid points per axis, as rlgates.plane's default
        "adv_lim": 1.0,
    }


def explorer_json() -> str:
    return json.dumps(explorer_data(), ensure_ascii=False, separators=(",", ":"))
