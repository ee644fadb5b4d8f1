"""The offline report of `rlgates inspect`: one HTML file (figures inline as data: PNGs, each with
alt text; no script, no stylesheet or font fetched, nothing off the page) and a JSON summary.

    summary = report.summarise(run, numbers, findings)   # a dict, json.dumps-able
    html = report.html(run, numbers, findings, steps=[...])
"""

from __future__ import annotations

import base64
import html as _html
import io
import json

import numpy as np
import torch

from .. import diagnostics, figures
from .detectors import HEALTHY
from .stats import ATLAS_KEYS, method_for, step_rows

#: The per-step numbers the summary's table carries beside the atlas keys
EXTRA_KEYS = ("frac_reward_zero_std", "length", "clipped_ratio", "mismatch_kl",
              "neg_signal_ratio", "tokens")
#: The most tokens drawn in one plane figure (a uniform subsample beyond it)
MAX_POINTS = 4000


def _f(v):
    v = float(v)
    return v if np.isfinite(v) else None


def names(key):
    """(verl's name, TRL's name) of a diagnostic key (None where the trainer has none)."""
    d = diagnostics.REGISTRY.get(key)
    return (d.verl, d.trl) if d else (None, None)


def default_steps(numbers, most=3):
    """The steps a report draws: the first step where ρ ≠ 1, the step with the largest
    max abs(log ρ), and the last step (first and last when ρ ≡ 1 throughout)."""
    steps = list(numbers["step"])
    if not steps:
        return []
    moved = [s for s, one in zip(steps, numbers["rho_is_one"], strict=True) if not one]
    pick = [moved[0]] if moved else [steps[0]]
    pick.append(steps[int(np.nanargmax(numbers["log_ratio_absmax"]))])
    pick.append(steps[-1])
    return sorted(dict.fromkeys(int(s) for s in pick))[:most]


def summarise(run, numbers, findings) -> dict:
    """The JSON summary: status, settings, the gate used, each finding, and per diagnostic its
    trainer names, the atlas's healthy range, and its value at every step."""
    method, agg, note = method_for(run.settings)
    fired = [f.name for f in findings if f.fired]
    diag = {}
    for k in (*ATLAS_KEYS, *EXTRA_KEYS):
        if k not in numbers:
            continue
        verl, trl = names(k)
        diag[k] = {"verl": verl, "trl": trl, "healthy": HEALTHY.get(k),
                   "per_step": [_f(v) for v in numbers[k]]}
    return {"format": "rlgates.inspect", "version": 1,
            "status": "findings" if fired else "healthy", "fired": fired,
            "steps": [int(s) for s in numbers["step"]],
            "tokens": int(np.nansum(numbers["tokens"])) if "tokens" in numbers else 0,
            "gate": {"method": None if method is None else method.name,
                     "hparams": {} if method is None else {k: float(v) for k, v in
                                                           method.hparams.items()},
                     "aggregation": agg, "note": note},
            "settings": run.settings, "findings": [f.as_dict() for f in findings],
            "diagnostics": diag}


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plane_figure(run, step, seed=0):
    """(PNG bytes, alt text) of one step's tokens on the (A, log ρ) plane under the run's gate."""
    import matplotlib.pyplot as plt

    method, _, _ = method_for(run.settings)
    s = step_rows(run, step)
    gate, glr = diagnostics.token_gates(method, s.logp[None], s.logp_old[None], s.adv[None],
                                        s.mask[None])
    m = s.mask
    adv, lr, g = s.adv[m], glr[0][m], gate[0][m]
    n = len(adv)
    if n > MAX_POINTS:
        keep = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:MAX_POINTS]
        adv, lr, g = adv[keep], lr[keep], g[keep]
    fig, ax = plt.subplots(figsize=(6, 4))
    lim = max(float(lr.abs().max()) * 1.1 if len(lr) else 0.0, figures.default_lim(method))
    figures.scatter_tokens(ax, adv, lr, method=method, gate=g, lim=lim)
    # a token with A = 0 carries no signal: it is drawn hollow on the A = 0 line, and the share
    # of shut gates counts the others (as gate_zero does)
    live = adv != 0
    shut = float((g[live] == 0).float().mean()) if live.any() else 0.0
    no_signal = int((~live).sum())
    drawn = f"{len(adv)} of {n}" if n > len(adv) else f"{n}"
    ax.set_title(f"step {step}: {drawn} tokens under {method.name}'s gate", fontsize=10)
    alt = (f"Scatter of {drawn} captured tokens of step {step} on the plane of advantage A "
           f"(horizontal) and log ratio (vertical), under {method.name}'s gate with its clip "
           "edges dashed; "
           + (f"{100 * shut:.1f}% of the drawn tokens with A ≠ 0 have a shut gate (hollow "
              "grey)" if live.any() else "no drawn token has A ≠ 0")
           + (f", and {no_signal} have A = 0 (hollow, on the vertical axis)" if no_signal
              else "")
           + f"; largest abs(log ratio) {float(lr.abs().max()) if len(lr) else 0:.3f}.")
    return _png(fig), alt


#: The series figure's panels: (key, y label); the first four are gate diagnostics
SERIES = (("clipfrac_pos", "clip fraction, A > 0"), ("clipfrac_neg", "clip fraction, A < 0"),
          ("approx_kl", "k3 KL estimate"), ("log_ratio_absmax", "largest abs(log ρ)"),
          ("entropy", "mean entropy (nats)"), ("length", "mean length (tokens)"))


def series_figure(numbers):
    """(PNG bytes, alt text): the diagnostics with a healthy range over the steps, the range
    shaded, beside entropy and mean length. The gate diagnostics are drawn on the steps where
    ρ ≠ 1 only: on a first pass over a batch they are 0 by construction."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(10, 5.2), constrained_layout=True)
    steps = np.asarray(numbers["step"])
    moved = np.asarray(numbers["rho_is_one"]) == 0
    for ax, (k, label) in zip(axes.flat, SERIES, strict=True):
        gated = k in HEALTHY
        at = moved if gated and moved.any() else np.ones_like(moved)
        legend = ("every step" if not gated else "steps with ρ ≠ 1" if moved.any() else
                  "every step (ρ ≡ 1: 0 by construction)")
        ax.plot(steps[at], np.asarray(numbers[k])[at], marker="o", ms=3, color="C0",
                label=legend)
        if k in HEALTHY:
            lo, hi = HEALTHY[k]
            ax.axhspan(lo, hi, color="C2", alpha=0.15, lw=0, label="atlas's healthy range")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="best")
    alt = ("Six line charts over the training steps: clip fraction of A > 0 tokens, clip "
           "fraction of A < 0 tokens, k3 KL estimate and largest abs(log ratio), drawn on the "
           "steps where the ratio is not 1, each with the atlas's healthy range shaded green, "
           "then mean entropy and mean response length on every step.")
    return _png(fig), alt


_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem;
color:#222}table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}
.fired,.out{background:#fde0dc}.quiet{background:#e6f4ea}.unchecked{background:#eee}
img{max-width:100%;height:auto}code{background:#f3f3f3}.wide{overflow-x:auto}
figure{margin:1rem 0}h1{overflow-wrap:anywhere}
@media (max-width:600px){.findings tr:first-child{display:none}
.findings td{display:block;border:0;padding:.1rem .5rem}
.findings tr{display:block;border:1px solid #ccc;margin:.4rem 0}}"""


def _img(png, alt):
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_html.escape(alt)}">'


def html(run, numbers, findings, steps=None, source="") -> str:
    """The report as one HTML page (see the module docstring)."""
    e = _html.escape
    summary = summarise(run, numbers, findings)
    gate = summary["gate"]
    steps = default_steps(numbers) if steps is None else steps
    fired = summary["fired"]
    head = (f"<h1>rlgates inspect: {e(source)}</h1><p><strong>"
            + (f"{len(fired)} finding(s): {e(', '.join(fired))}" if fired else
               "No detector fired.") + "</strong></p>")
    st = run.settings
    shown = ("loss_type", "epsilon", "epsilon_high", "importance_sampling_level",
             "num_iterations", "gradient_accumulation_steps", "steps_per_generation",
             "temperature", "learning_rate", "num_processes", "injected")
    settings = "".join(f"<tr><th>{e(k)}</th><td>{e(str(st.get(k)))}</td></tr>" for k in shown
                       if k in st)
    rows = []
    for f in findings:
        cls = "fired" if f.fired else ("quiet" if f.checked else "unchecked")
        word = "FIRED" if f.fired else ("quiet" if f.checked else "not checked")
        rows.append(f'<tr class="{cls}"><td>{e(f.name)}</td><td>{word}</td>'
                    f"<td>{e(f.message)}</td><td>{e(f.atlas)}</td></tr>")
    diag = []
    moved = numbers["rho_is_one"] == 0
    for k, d in summary["diagnostics"].items():
        vals = np.array([np.nan if v is None else v for v in d["per_step"]], dtype=float)
        gated = k in ATLAS_KEYS and k != "entropy"  # the entropy means something at ρ = 1
        pick = vals[moved] if moved.any() and gated else vals
        mean = np.nanmean(pick) if np.isfinite(pick).any() else np.nan
        last = pick[-1] if len(pick) else np.nan
        rng, out = "", False
        if d["healthy"] is not None:
            lo, hi = d["healthy"]
            rng = f"{lo} to {hi}"
            out = bool(np.isfinite(mean) and not lo <= mean <= hi)
        mark = ' class="out"' if out else ""
        diag.append(f"<tr><td><code>{e(k)}</code></td><td>{e(d['verl'] or '—')}</td>"
                    f"<td>{e(d['trl'] or '—')}</td><td>{rng}</td>"
                    f"<td{mark}>{'—' if not np.isfinite(mean) else f'{mean:.4g}'}"
                    f"{' (outside)' if out else ''}</td>"
                    f"<td>{'—' if not np.isfinite(last) else f'{last:.4g}'}</td></tr>")
    figs = [_img(*series_figure(numbers))]
    if gate["method"] is not None:  # the plane figures draw the run's gate
        figs += [_img(*plane_figure(run, s)) for s in steps]
    note = f"<p>{e(gate['note'])}</p>" if gate["note"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlgates inspect: {e(source)}</title><style>{_CSS}</style></head><body>
{head}
<p>{len(summary['steps'])} steps, {summary['tokens']} captured tokens; gate
<code>{e(gate['method'] or 'no method')}</code> {e(json.dumps(gate['hparams']))}, aggregation
<code>{e(gate['aggregation'])}</code>.</p>{note}
<h2>Findings</h2>
<p>FIRED: the detector found its fault. quiet: it checked and found none. not checked: the
capture lacks what it needs (the line says what). The last column names the book's section
that explains the fault and how to tell it from its look-alikes.</p>
<div class="wide"><table class="findings"><tr><th>detector</th><th>verdict</th><th>what it saw</th>
<th>read</th></tr>
{''.join(rows)}</table></div>
<h2>Diagnostics</h2>
<p>The gate diagnostics (the clip fractions, KL estimates, largest abs(log ρ) and gate
shares) are read on the steps where ρ ≠ 1: on the first pass over a batch ρ = 1 and they are 0
by construction. The mean is over
those steps (the others: over all steps), as the detectors read them; the last column is the
last of those steps. The healthy range is the one chapter 17 measures on its healthy run; a
mean outside it is marked.</p>
<div class="wide"><table><tr><th>rlgates key</th><th>verl</th><th>TRL</th><th>healthy</th>
<th>mean</th><th>last</th></tr>{''.join(diag)}</table></div>
<h2>Figures</h2>
{''.join(f'<figure>{x}</figure>' for x in figs)}
<h2>Settings</h2><div class="wide"><table>{settings}</table></div>
</body></html>
"""
