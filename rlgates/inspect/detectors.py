"""One detector per failure mode the atlas names, each reading a capture's per-step numbers
(`stats.run_numbers`) and returning a `Finding` with the book's entry that explains it.

Every threshold is a named constant here. The atlas's healthy ranges (chapter 17, "The names,
and what a healthy run shows": the healthy lab run's clip fractions and signal lost below 5 %,
its KL estimates below 0.01 and its largest abs(log ρ) below 1) are `HEALTHY`; the rest were
set on tiny TRL runs with one fault each (tests/engines/inspect_runs.py), on seeds 1 to 3, and
the tests check them on seed 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The atlas's healthy range of each diagnostic (chapter 17 asserts its healthy run inside them)
HEALTHY = {"clipfrac_pos": (0.0, 0.05), "clipfrac_neg": (0.0, 0.05),
           "signal_lost": (0.0, 0.05), "ppo_kl": (-0.01, 0.01), "approx_kl": (0.0, 0.01),
           "log_ratio_absmax": (0.0, 1.0)}

#: A step size is too large when the k3 KL estimate, averaged over the steps where ρ ≠ 1, is
#: above twice the atlas's healthy bound (the atlas: "the KL estimates average below 0.01").
#: The clip fractions and max abs(log ρ) outside their ranges are reported beside it, but do
#: not decide: on a batch of a few dozen tokens a clip fraction is noisy.
STEP_SIZE_KL = 2 * HEALTHY["approx_kl"][1]
STEP_SIZE_KEYS = ("clipfrac_pos", "clipfrac_neg", "approx_kl", "log_ratio_absmax",
                  "signal_lost")
#: entropy collapse: the last quarter's mean entropy below this (nats), or below
#: COLLAPSE_FALL × the first step's
ENTROPY_FLOOR = 0.3
COLLAPSE_FALL = 0.5
#: stuck groups: the mean share of groups with zero spread over the steps, at least this
STUCK_SHARE = 0.9
#: mismatch: mean k3 estimate of KL(sampler ‖ trainer's π_old) on a step, above this
MISMATCH_KL = 0.01
#: negative-advantage blow-up: an A < 0 token whose open-gate signal ρ·abs(A) is this many
#: times the step's median ρ·abs(A)
BLOWUP_RATIO = 10.0
#: length drift: the least-squares line of response length against the step grows by this
#: factor from the first step to the last, with a slope this many standard errors above 0
LENGTH_GROWTH = 1.25
LENGTH_T = 2.5
#: micro-batch normaliser: the losses fit each micro-batch's own token count to this relative
#: residual, and the step's constant fits 10× worse and above FIT_BAD
FIT_GOOD, FIT_BAD = 1e-4, 1e-3

#: The book's sections that explain each failure: (chapter file, heading) pairs, the atlas's
#: (or the chapter that treats it) first, then the Troubleshooting page's entry. Each heading is
#: a heading of that chapter, word for word (tests/test_inspect.py checks it).
READ = {
    "rho_one": (("14_real_trainers", "Background"),
                ("21_troubleshooting", "1. The clip ratio is always 0")),
    "micro_normaliser": (("17_diagnostics_atlas",
                          "6. Micro-batch token mean against the global token mean"),
                         ("21_troubleshooting", "3. Gradient accumulation changes the results")),
    "mismatch": (("15_off_policy", "Sampler and trainer disagree on the same weights"),
                 ("21_troubleshooting",
                  "6. The importance ratio explodes under engine mismatch")),
    "entropy_collapse": (("17_diagnostics_atlas", "1. Entropy collapse"),
                         ("21_troubleshooting", "8. Entropy collapse, or a step that is too "
                          "large?")),
    "step_size": (("17_diagnostics_atlas", "A healthy run"),
                  ("21_troubleshooting", "8. Entropy collapse, or a step that is too large?")),
    "stuck_groups": (("17_diagnostics_atlas", "4. Zero-advantage groups"),
                     ("21_troubleshooting", "2. The loss is 0, yet the model trains")),
    "negative_blowup": (("17_diagnostics_atlas", "3. Negative-advantage blow-up"),),
    "length_drift": (("17_diagnostics_atlas", "2. Length blow-up"),
                     ("21_troubleshooting", "9. Length bias")),
}


def reference(chapter: str, heading: str) -> str:
    """'chapter 17, entry 1: Entropy collapse' for a numbered entry, else 'chapter 14,
    Background'."""
    number = chapter.split("_")[0]
    entry, _, title = heading.partition(". ")
    if entry.isdigit() and title:
        return f"chapter {int(number)}, entry {entry}: {title}"
    return f"chapter {int(number)}, {heading}"


#: What each finding points the reader to, as one line ('; ' between the sections)
ATLAS = {name: "; ".join(reference(*r) for r in refs) for name, refs in READ.items()}


@dataclass
class Finding:
    """What one detector concluded: `fired` (the fault is there), `checked` (False: the capture
    lacks what it needs, `message` says what), the numbers it read, and the book's entry."""

    name: str
    fired: bool
    message: str
    atlas: str
    checked: bool = True
    evidence: dict = field(default_factory=dict)

    def as_dict(self):
        return {"name": self.name, "fired": self.fired, "checked": self.checked,
                "message": self.message, "atlas": self.atlas,
                "evidence": {k: _plain(v) for k, v in self.evidence.items()}}


def _plain(v):
    if isinstance(v, (np.floating, float)):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def _finding(name, fired, message, checked=True, **evidence):
    return Finding(name, bool(fired), message, ATLAS[name], checked, evidence)


def _moved(x):
    """The steps where some token's ρ ≠ 1 (a reused batch)."""
    return x["rho_is_one"] == 0


def rho_one(x, settings):
    every = bool(len(x["step"]) and (x["rho_is_one"] == 1).all())
    # with every A = 0 before the last step the policy had no gradient: it could not move
    moved = bool((x["live_tokens"][:-1] > 0).any())
    n = settings.get("num_iterations")
    if every and not moved:
        msg = ("ρ = 1 exactly on every token, but every A before the last step was 0: the "
               "policy had no gradient, so this says nothing about reuse (stuck_groups)")
        return _finding("rho_one", False, msg, steps_rho_one=len(x["step"]))
    if every:
        msg = (f"ρ = 1 exactly on every captured token of all {len(x['step'])} steps: one "
               f"optimiser step per batch (num_iterations = {n}), so every gate is open and "
               "the clip fraction is 0 by construction. Not a fault in itself (it is TRL's "
               "default), but the clip never acts and this capture cannot show how far a step "
               "moves the policy (step_size is not checked). Reuse each batch "
               "(num_iterations ≥ 2) if you want the clip to act.")
    else:
        msg = f"ρ ≠ 1 on {int(_moved(x).sum())} of {len(x['step'])} steps"
    return _finding("rho_one", every, msg, steps_rho_one=int((x["rho_is_one"] == 1).sum()))


def micro_normaliser(x, settings):
    ok = np.isfinite(x["fit_micro"])
    if not ok.any():
        return _finding("micro_normaliser", False, "not checked: no step keeps every token "
                        "and has micro-batches of different token counts", checked=False)
    micro, step = x["fit_micro"][ok], x["fit_step"][ok]
    fits = (micro < FIT_GOOD) & (step > max(FIT_BAD, 0)) & (step > 10 * micro)
    fired = fits.mean() > 0.5
    if fired:
        msg = (f"on {int(fits.sum())} of {int(ok.sum())} steps each micro-batch's loss is its "
               "own token mean: a token weighs 1/(K·n_k), not 1/N, and short micro-batches "
               "count more. Divide every micro-batch by the step's token count.")
    else:
        msg = (f"the micro-batch losses share one normaliser per step "
               f"({int(ok.sum())} steps checked)")
    return _finding("micro_normaliser", fired, msg, steps_checked=int(ok.sum()),
                    steps_local=int(fits.sum()), fit_micro_median=float(np.median(micro)),
                    fit_step_median=float(np.median(step)))


def mismatch(x, settings):
    kl = x["mismatch_kl"]
    if not np.isfinite(kl).any():
        return _finding("mismatch", False, "not checked: the capture has no sampler "
                        "log-probs (TRL records them with vLLM only)", checked=False)
    worst = float(np.nanmax(kl))
    fired = worst > MISMATCH_KL
    msg = (f"the sampler and the trainer disagree on the same weights: KL(sampler ‖ π_old) "
           f"up to {worst:.3f} per token (above {MISMATCH_KL}), largest abs(log ratio) "
           f"{float(np.nanmax(x['mismatch_absmax'])):.2f}. Correct with an importance weight "
           "or fix the engines' precision." if fired else
           f"sampler and trainer agree (KL at most {worst:.4f})")
    return _finding("mismatch", fired, msg, mismatch_kl_max=worst)


def _step_means(x):
    """{key: mean over the steps where ρ ≠ 1} of STEP_SIZE_KEYS ({} when ρ ≡ 1)."""
    moved = _moved(x)
    return {k: float(np.mean(x[k][moved])) for k in STEP_SIZE_KEYS} if moved.any() else {}


def _too_big(x):
    return _step_means(x).get("approx_kl", 0.0) > STEP_SIZE_KL


def step_size(x, settings):
    means = _step_means(x)
    if not means:
        return _finding("step_size", False, "not checked: ρ ≡ 1, the capture cannot show how "
                        "far one step moves the policy", checked=False)
    out = {k: v for k, v in means.items() if not HEALTHY[k][0] <= v <= HEALTHY[k][1]}
    low = _entropy_low(x)
    sharp = bool(low and low[3])
    big = means["approx_kl"] > STEP_SIZE_KL
    fired = big and not sharp
    lr = settings.get("learning_rate")
    listed = ", ".join(f"{k} {v:.3g} (healthy ≤ {HEALTHY[k][1]})" for k, v in out.items())
    if fired:
        msg = (f"the policy moves too far per step: mean over the reused steps {listed}. "
               f"Lower the learning rate ({lr}) or reuse each batch fewer times.")
    elif big:
        msg = (f"large ratios ({listed}) under a policy whose entropy was already low at the "
               "first step: the few unlikely tokens swing; see entropy_collapse")
    else:
        msg = (f"mean k3 KL {means['approx_kl']:.4f} per step, within twice the atlas's "
               f"bound" + (f"; outside their ranges: {listed}" if out else ""))
    return _finding("step_size", fired, msg, **{f"mean_{k}": v for k, v in means.items()})


def _entropy_low(x):
    h = x["entropy"]
    if not np.isfinite(h).all() or not len(h):
        return None
    last, first = float(h[-max(1, len(h) // 4):].mean()), float(h[0])
    from_start = first < ENTROPY_FLOOR
    return last, first, last < ENTROPY_FLOOR or last < COLLAPSE_FALL * first, from_start


def entropy_collapse(x, settings):
    low = _entropy_low(x)
    if low is None:
        return _finding("entropy_collapse", False, "not checked: no entropies in the capture",
                        checked=False)
    last, first, is_low, from_start = low
    fired = is_low and (from_start or not _too_big(x))
    if fired:
        seen = (f"entropy {last:.3f} nats at the end and {first:.3f} at the first step, low "
                "before any update (its large per-step ratios come from its few unlikely "
                "tokens; see step_size)" if _too_big(x) else
                f"entropy {last:.3f} nats at the end (first step {first:.3f}) while the step "
                "size is healthy")
        msg = (f"{seen}: the policy samples (nearly) one answer. Check the sampling temperature "
               f"({settings.get('temperature')}) and top_p; clip-higher or an entropy bonus "
               "keep it up.")
    elif is_low:
        msg = (f"entropy fell to {last:.3f} nats, but the steps are too large too: read it "
               "as a step-size problem first (step_size)")
    else:
        msg = f"entropy {last:.3f} nats at the end (first step {first:.3f})"
    return _finding("entropy_collapse", fired, msg, entropy_last=last, entropy_first=first)


def stuck_groups(x, settings):
    share = x["frac_reward_zero_std"]
    mean = float(np.nanmean(share)) if np.isfinite(share).any() else float("nan")
    low = _entropy_low(x)
    collapsed = bool(low and low[2])
    fired = mean >= STUCK_SHARE and not collapsed
    if fired:
        msg = (f"{100 * mean:.0f}% of the groups have zero reward spread (every A = 0) while "
               "the policy still varies: the reward cannot tell the responses apart. Check "
               "the reward, or drop such groups (dynamic sampling).")
    elif mean >= STUCK_SHARE:
        msg = (f"{100 * mean:.0f}% of the groups have zero spread, explained by the entropy "
               "collapse (entropy_collapse)")
    else:
        msg = f"{100 * mean:.0f}% of the groups have zero spread on average"
    return _finding("stuck_groups", fired, msg, frac_reward_zero_std_mean=mean)


def negative_blowup(x, settings):
    worst = float(np.max(x["neg_signal_ratio"])) if len(x["step"]) else 0.0
    big = worst > BLOWUP_RATIO
    fired = big and not _too_big(x)
    at = int(x["step"][int(np.argmax(x["neg_signal_ratio"]))]) if len(x["step"]) else -1
    if fired:
        msg = (f"at step {at} an A < 0 token's open-gate signal ρ·abs(A) is {worst:.0f}× the "
               "step's median: one token can dominate the update. Dual-clip (verl's default, "
               "c = 3) shuts it; check the advantages' scale.")
    elif big:
        msg = (f"an A < 0 token's signal reaches {worst:.0f}× the median, with steps too "
               "large: read it as a step-size problem first (step_size)")
    else:
        msg = f"largest A < 0 signal {worst:.1f}× the median"
    return _finding("negative_blowup", fired, msg, signal_ratio_max=worst, step=at)


def length_drift(x, settings):
    n = len(x["step"])
    if n < 3:
        return _finding("length_drift", False, "not checked: fewer than 3 steps",
                        checked=False)
    third = max(1, n // 3)
    t, y = x["response_step"], x["response_length"]
    dt = t - t.mean()
    slope = float(dt @ (y - y.mean()) / (dt @ dt))
    start = float(y.mean() - slope * t.mean()) + slope * float(t.min())
    end = start + slope * float(t.max() - t.min())
    resid = y - y.mean() - slope * dt
    se = float(np.sqrt(resid @ resid / max(len(y) - 2, 1) / (dt @ dt)))
    t_stat = slope / se if se > 0 else (np.inf if slope > 0 else 0.0)
    growth = end / start if start > 0 else float("inf")
    first, last = start, end
    fired = growth > LENGTH_GROWTH and t_stat > LENGTH_T
    msg = (f"responses grow from {first:.1f} to {last:.1f} tokens (fitted line, ×{growth:.2f}, "
           f"slope {t_stat:.1f} standard errors), "
           f"{100 * float(x['clipped_ratio'][-third:].mean()):.0f}% cut at the limit at the "
           "end. Check the reward for a length term and the aggregation (seq-mean-token-mean "
           "favours long wrong answers)." if fired else
           f"mean length {first:.1f} → {last:.1f} tokens (fitted line, slope "
           f"{t_stat:.1f} standard errors)")
    return _finding("length_drift", fired, msg, length_first=first, length_last=last,
                    growth=growth, slope_t=float(t_stat))


#: Every detector, in the report's order
DETECTORS = {f.__name__: f for f in (rho_one, micro_normaliser, mismatch, step_size,
                                      entropy_collapse, stuck_groups, negative_blowup,
                                      length_drift)}


def detect(numbers: dict, settings: dict) -> list[Finding]:
    """Run every detector on a capture's per-step numbers."""
    return [f(numbers, settings) for f in DETECTORS.values()]
