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
from .detectors import HEALTHY, sampling_overrides, step_label
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


def reading(key, per_step, moved):
    """(mean, last) of a diagnostic as the report reads it: a gate diagnostic (the clip
    fractions, KL estimates, largest abs(log ρ), gate shares) over the steps where ρ ≠ 1 (on a
    first pass it is 0 by construction), the others over every step."""
    vals = np.array([np.nan if v is None else v for v in per_step], dtype=float)
    gated = key in ATLAS_KEYS and key != "entropy"  # the entropy means something at ρ = 1
    pick = vals[moved] if moved.any() and gated else vals
    mean = float(np.nanmean(pick)) if np.isfinite(pick).any() else float("nan")
    return mean, float(pick[-1]) if len(pick) else float("nan")


def _diagnostics(numbers) -> dict:
    """Per diagnostic: its trainer names, the atlas's healthy range, its value at every step,
    its mean and last (`reading`), and whether the mean is outside the healthy range."""
    moved = np.asarray(numbers["rho_is_one"]) == 0
    diag = {}
    for k in (*ATLAS_KEYS, *EXTRA_KEYS):
        if k not in numbers:
            continue
        verl, trl = names(k)
        per_step = [_f(v) for v in numbers[k]]
        mean, last = reading(k, per_step, moved)
        lo, hi = HEALTHY.get(k, (-np.inf, np.inf))
        diag[k] = {"verl": verl, "trl": trl, "healthy": HEALTHY.get(k), "per_step": per_step,
                   "mean": _f(mean), "last": _f(last),
                   "outside": bool(np.isfinite(mean) and not lo <= mean <= hi)}
    return diag


def headline(findings, outside=()) -> str:
    """One line: the faults found (or healthy), the detectors not checked, the information
    (rho_one) and the diagnostics whose mean is outside the atlas's healthy range."""
    faults = [f.name for f in findings if f.fault]
    unchecked = [f.name for f in findings if not f.checked]
    info = [f.name for f in findings if f.fired and not f.fault]
    line = (f"{len(faults)} finding{'s' * (len(faults) > 1)}: {', '.join(faults)}" if faults
            else "healthy")
    line += f" (not checked: {', '.join(unchecked)})" if unchecked else ""
    line += "" if faults else ": no detector found its fault"
    line += f"; information: {', '.join(info)}" if info else ""
    if outside:
        line += (f"; {len(outside)} diagnostic{'s' * (len(outside) > 1)} outside the atlas's "
                 f"healthy range ({', '.join(outside)})")
    return line


def _verdicts(findings, outside) -> dict:
    """The summary's status fields: status (a fault found or not), the headline, the detectors
    that fired (faults and information), the information alone, and what was not checked."""
    return {"status": "findings" if any(f.fault for f in findings) else "healthy",
            "headline": headline(findings, outside),
            "fired": [f.name for f in findings if f.fired],
            "info": [f.name for f in findings if f.fired and not f.fault],
            "not_checked": {f.name: f.reason for f in findings if not f.checked},
            "outside": list(outside)}


def _gate(settings) -> dict:
    method, agg, note = method_for(settings)
    if method is None:
        return {"method": None, "hparams": {}, "aggregation": agg, "note": note}
    return {"method": method.name, "hparams": {k: float(v) for k, v in method.hparams.items()},
            "aggregation": agg, "note": note}


def summarise(run, numbers, findings) -> dict:
    """The JSON summary: status, settings, the gate used, each finding, what was not checked,
    and per diagnostic its trainer names, the atlas's healthy range, and its value at every
    step."""
    diag = _diagnostics(numbers)
    trl = (run.settings.get("trainer") or "trl") == "trl"
    return {"format": "rlgates.inspect", "version": 1,
            **_verdicts(findings, [k for k, d in diag.items() if d["outside"]]),
            "steps": [int(s) for s in numbers["step"]],
            "step_numbering": ("capture step k is the optimiser step TRL logs as step k + 1"
                               if trl else "capture steps count the captured optimiser steps "
                               "from 0"),
            "sampling_overrides": {k: list(v) for k, v in
                                   sampling_overrides(run.settings).items()},
            "tokens": int(np.nansum(numbers["tokens"])) if "tokens" in numbers else 0,
            "gate": _gate(run.settings), "settings": run.settings,
            "findings": [f.as_dict() for f in findings], "diagnostics": diag}


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
    ax.set_title(f"{step_label(step, run.settings)}: {drawn} tokens under {method.name}'s "
                 "gate", fontsize=10)
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


def series_figure(numbers, settings=None):
    """(PNG bytes, alt text): the diagnostics with a healthy range over the steps, the range
    shaded, beside entropy and mean length. The gate diagnostics are drawn on the steps where
    ρ ≠ 1 only: on a first pass over a batch they are 0 by construction. Steps are the
    capture's (from 0), on integer ticks."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    trl = ((settings or {}).get("trainer") or "trl") == "trl"

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
        ax.set_xlabel("capture step (TRL's step − 1)" if trl else "capture step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
.info{background:#e8f0fe}
img{max-width:100%;height:auto}code{background:#f3f3f3}.wide{overflow-x:auto}
figure{margin:1rem 0}h1{overflow-wrap:anywhere}
@media (max-width:600px){.findings tr:first-child{display:none}
.findings td{display:block;border:0;padding:.1rem .5rem}
.findings tr{display:block;border:1px solid #ccc;margin:.4rem 0}}"""


def _img(png, alt):
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_html.escape(alt)}">'


#: The settings the report shows, when the capture has them
SHOWN = ("trainer", "loss_type", "loss_mode", "epsilon", "epsilon_high",
         "importance_sampling_level", "num_iterations", "gradient_accumulation_steps",
         "steps_per_generation", "ppo_epochs", "ppo_mini_batch_size", "temperature", "top_p",
         "top_k", "generation_kwargs", "learning_rate", "num_processes", "injected")


def _settings_rows(st) -> str:
    """The settings table's rows; a sampling setting that TRL's generation_kwargs overrides is
    marked with the value TRL samples with."""
    e = _html.escape
    over = sampling_overrides(st)
    rows = []
    for k in SHOWN:
        if k not in st and k not in over:
            continue
        value = e(str(st.get(k)))
        if k in over:
            value = (f'<span class="out">{value}; generation_kwargs overrides it: TRL samples '
                     f"with {e(str(over[k][1]))}</span>")
        rows.append(f"<tr><th>{e(k)}</th><td>{value}</td></tr>")
    return "".join(rows)


def _finding_rows(findings) -> str:
    e = _html.escape
    cls = {"FIRED": "fired", "INFO": "info", "quiet": "quiet", "not checked": "unchecked"}
    return "".join(f'<tr class="{cls[f.verdict]}"><td>{e(f.name)}</td><td>{f.verdict}</td>'
                   f"<td>{e(f.message)}</td><td>{e(f.atlas)}</td></tr>" for f in findings)


def _number(v) -> str:
    return "—" if v is None else f"{v:.4g}"


def _diagnostic_rows(diagnostics) -> str:
    e = _html.escape
    rows = []
    for k, d in diagnostics.items():
        rng = "" if d["healthy"] is None else f"{d['healthy'][0]} to {d['healthy'][1]}"
        mark = ' class="out"' if d["outside"] else ""
        rows.append(f"<tr><td><code>{e(k)}</code></td><td>{e(d['verl'] or '—')}</td>"
                    f"<td>{e(d['trl'] or '—')}</td><td>{rng}</td>"
                    f"<td{mark}>{_number(d['mean'])}{' (outside)' if d['outside'] else ''}"
                    f"</td><td>{_number(d['last'])}</td></tr>")
    return "".join(rows)


def _figures(run, numbers, gate, steps) -> str:
    figs = [_img(*series_figure(numbers, run.settings))]
    if gate["method"] is not None:  # the plane figures draw the run's gate
        figs += [_img(*plane_figure(run, s)) for s in steps]
    return "".join(f"<figure>{x}</figure>" for x in figs)


def html(run, numbers, findings, steps=None, source="") -> str:
    """The report as one HTML page (see the module docstring)."""
    e = _html.escape
    summary = summarise(run, numbers, findings)
    gate = summary["gate"]
    steps = default_steps(numbers) if steps is None else steps
    note = f"<p>{e(gate['note'])}</p>" if gate["note"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlgates inspect: {e(source)}</title><style>{_CSS}</style></head><body>
<h1>rlgates inspect: {e(source)}</h1><p><strong>{e(summary['headline'])}.</strong></p>
<p>{len(summary['steps'])} steps, {summary['tokens']} captured tokens; gate
<code>{e(gate['method'] or 'no method')}</code> {e(json.dumps(gate['hparams']))}, aggregation
<code>{e(gate['aggregation'])}</code>. Steps count from 0: {e(summary['step_numbering'])}.</p>
{note}
<h2>Findings</h2>
<p>FIRED: the detector found its fault. INFO: a fact about the run that is no fault. quiet: it
checked and found none. not checked: the capture lacks what it needs (the line says what). The
last column names the book's section that explains the fault and how to tell it from its
look-alikes.</p>
<div class="wide"><table class="findings"><tr><th>detector</th><th>verdict</th><th>what it saw</th>
<th>read</th></tr>
{_finding_rows(findings)}</table></div>
<h2>Diagnostics</h2>
<p>The gate diagnostics (the clip fractions, KL estimates, largest abs(log ρ) and gate
shares) are read on the steps where ρ ≠ 1: on the first pass over a batch ρ = 1 and they are 0
by construction. The mean is over
those steps (the others: over all steps), as the detectors read them; the last column is the
last of those steps. The healthy range is the one chapter 17 measures on its healthy run; a
mean outside it is marked. A mean outside its range is no finding by itself: the detectors
decide (a clip fraction over a few dozen tokens is noisy).</p>
<div class="wide"><table><tr><th>rlgates key</th><th>verl</th><th>TRL</th><th>healthy</th>
<th>mean</th><th>last</th></tr>{_diagnostic_rows(summary['diagnostics'])}</table></div>
<h2>Figures</h2>
{_figures(run, numbers, gate, steps)}
<h2>Settings</h2><div class="wide"><table>{_settings_rows(run.settings)}</table></div>
</body></html>
"""
