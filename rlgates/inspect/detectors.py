"""One detector per failure mode the atlas names, each reading a capture's per-step numbers
(`stats.run_numbers`) and returning a `Finding` with the book's entry that explains it.

Every threshold is a named constant here. The atlas's healthy ranges (chapter 17, "The names,
and what a healthy run shows": the healthy lab run's clip fractions and signal lost below 5 %,
its KL estimates below 0.01 and its largest abs(log ρ) below 1) are `HEALTHY`; the rest were
set on tiny TRL runs with one fault each (tests/engines/inspect_runs.py), on seeds 1 to 3, and
the tests check them on seed 0.

A finding has a level: "fault" (exit status 1 of the command) or "info" (`rho_one`: a fact
about the configuration worth knowing, exit status 0). A detector that cannot run on a capture
says "not checked" and why (`Finding.reason`); the command lists those on every run.
"""

from __future__ import annotations

import ast
import json
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
#: stuck groups: the mean share of groups with zero spread over the steps, or over the last
#: quarter of the steps (a run that ends stuck), at least this
STUCK_SHARE = 0.9
#: a nondeterministic forward: on the updates where ρ must be exactly 1 (no optimiser step since
#: the trainer computed π_old), the largest abs(log ρ) above this. A deterministic forward gives
#: exactly 0, float32 rounding about 1e-6 and bfloat16's about 1e-2; this is a quarter of the
#: usual clip ε (0.2)
NOISE_ABSMAX = 0.05
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
    "noisy_forward": (("21_troubleshooting", "1. The clip ratio is always 0"),),
    "mismatch": (("15_off_policy", "Sampler and trainer disagree on the same weights"),
                 ("21_troubleshooting",
                  "6. The importance ratio explodes under engine mismatch"),
                 ("21_troubleshooting", "7. Top-p sampling biases the ratio")),
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

#: The detectors whose finding is information, not a fault (the command exits 0 on them)
INFO = ("rho_one",)
NOT_CHECKED = "not checked: "


@dataclass
class Finding:
    """What one detector concluded: `fired` (what it looks for is there), `checked` (False: the
    capture lacks what it needs, `message` says what), the numbers it read, the book's entry,
    and its `level`: "fault", or "info" for a fact that is no fault (`INFO`)."""

    name: str
    fired: bool
    message: str
    atlas: str
    checked: bool = True
    evidence: dict = field(default_factory=dict)
    level: str = "fault"

    @property
    def fault(self) -> bool:
        """Fired at the fault level: what makes the command exit 1."""
        return self.fired and self.level == "fault"

    @property
    def reason(self) -> str:
        """Why a detector did not run ("" when it did)."""
        return "" if self.checked else self.message.removeprefix(NOT_CHECKED)

    @property
    def verdict(self) -> str:
        """FIRED, INFO, quiet or not checked."""
        if self.fired:
            return "FIRED" if self.level == "fault" else "INFO"
        return "quiet" if self.checked else "not checked"

    def as_dict(self):
        return {"name": self.name, "fired": self.fired, "checked": self.checked,
                "level": self.level, "message": self.message, "atlas": self.atlas,
                "evidence": {k: _plain(v) for k, v in self.evidence.items()}}


def _plain(v):
    if isinstance(v, (np.floating, float)):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def _finding(name, fired, message, checked=True, **evidence):
    return Finding(name, bool(fired), message, ATLAS[name], checked, evidence,
                   "info" if name in INFO else "fault")


def _unchecked(name, reason):
    return _finding(name, False, NOT_CHECKED + reason, checked=False)


def step_label(step, settings) -> str:
    """A capture step as the trainer counts it: capture steps count from 0, TRL logs the same
    optimiser step as step k + 1."""
    if (settings.get("trainer") or "trl") == "trl":
        return f"step {int(step)} (TRL's step {int(step) + 1})"
    return f"step {int(step)} (optimiser step {int(step) + 1} of the capture)"


#: The sampling settings a TRL `generation_kwargs` can override
SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def _as_dict(v):
    if isinstance(v, dict) or v is None:
        return v or {}
    for parse in (json.loads, ast.literal_eval):  # a capture may hold its str()
        try:
            out = parse(v)
        except (ValueError, SyntaxError, TypeError):
            continue
        return out if isinstance(out, dict) else {}
    return {}


def sampling_overrides(settings) -> dict:
    """{key: (the config's value, the value generation_kwargs sets)} for temperature, top_p and
    top_k where a recorded TRL `generation_kwargs` sets another value: TRL samples with it."""
    given = _as_dict(settings.get("generation_kwargs"))
    return {k: (settings.get(k), given[k]) for k in SAMPLING_KEYS
            if k in given and given[k] != settings.get(k)}


def _sampling(settings, key):
    """The value TRL samples with: generation_kwargs' where it overrides the config's."""
    over = sampling_overrides(settings)
    return over[key][1] if key in over else settings.get(key)


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
               "the clip fraction is 0 by construction. Information, not a fault (it is TRL's "
               "default), but the clip never acts and this capture cannot show how far a step "
               "moves the policy (step_size is not checked). Reuse each batch "
               "(num_iterations ≥ 2) if you want the clip to act.")
    else:
        msg = f"ρ ≠ 1 on {int(_moved(x).sum())} of {len(x['step'])} steps"
    return _finding("rho_one", every, msg, steps_rho_one=int((x["rho_is_one"] == 1).sum()))


def micro_normaliser(x, settings):
    ok = np.isfinite(x["fit_micro"])
    if not ok.any():
        return _unchecked("micro_normaliser", "no step keeps every token (the capture sampled "
                          "them: tokens_per_step) and has micro-batches of different token "
                          "counts")
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


#: Where each trainer's sampler log-probs come from (the mismatch detector's "not checked")
SAMPLER_LOGPROBS = {
    "trl": "TRL hands its loss the sampler's log-probs when vLLM samples or a rollout_func "
           "returns them",
    "verl": "verl's batch has rollout_log_probs when the rollout returns them"}
#: The usual causes of a sampler/trainer gap, each a setting to compare on both sides
MISMATCH_CAUSES = ("a sampling temperature, top_p or top_k the trainer does not apply (TRL's "
                   "generation_kwargs override its temperature, top_p and top_k)",
                   "position ids or padding built differently (left padding under absolute "
                   "positions)", "dropout on in one forward", "stale sampler weights",
                   "the engines' precision")


def mismatch(x, settings):
    kl = x["mismatch_kl"]
    if not np.isfinite(kl).any():
        where = SAMPLER_LOGPROBS.get(settings.get("trainer") or "trl", "")
        return _unchecked("mismatch", "the capture has no sampler log-probs"
                          + (f" ({where})" if where else ""))
    worst = float(np.nanmax(kl))
    fired = worst > MISMATCH_KL
    over = sampling_overrides(settings)
    msg = (f"the sampler and the trainer disagree on the same weights: KL(sampler ‖ π_old) "
           f"up to {worst:.3f} per token (above {MISMATCH_KL}), largest abs(log ratio) "
           f"{float(np.nanmax(x['mismatch_absmax'])):.2f}. The usual causes: "
           + "; ".join(MISMATCH_CAUSES)
           + (". generation_kwargs here sets " + ", ".join(f"{k} {v[1]} (config {v[0]})"
                                                          for k, v in over.items())
              if over else "")
           + ". Find the cause, or correct with an importance weight." if fired else
           f"sampler and trainer agree (KL at most {worst:.4f})")
    return _finding("mismatch", fired, msg, mismatch_kl_max=worst)


def _first_updates(settings, steps):
    """(bool per step: an optimiser step whose every micro-batch must have ρ = 1 exactly, as no
    optimiser step came between the trainer's π_old and the loss; "" or why not known).

    TRL (GRPOTrainer._prepare_inputs): micro-batch i (i counts from 0 over training; step k
    holds i = k·GA … k·GA + GA − 1) takes a generation batch generated at micro-batch
    g = ⌊i / (SPG·μ)⌋·SPG·μ, with π_old computed then, under the weights of optimiser step
    ⌊g / GA⌋; TRL computes no π_old at all when GA is a multiple of SPG·μ (without vLLM's
    correction), as then ρ ≡ 1 by construction."""
    if (settings.get("trainer") or "trl") != "trl":
        return None, ("the verl capture does not record how many mini-batches make a batch, "
                      "so which updates are the first of theirs")
    try:
        ga = int(settings["gradient_accumulation_steps"])
        mu = int(settings["num_iterations"])
        every = int(settings.get("steps_per_generation") or ga) * mu
    except (KeyError, TypeError, ValueError):
        return None, ("the capture's settings lack num_iterations, steps_per_generation or "
                      "gradient_accumulation_steps")
    vllm_old = settings.get("use_vllm") and settings.get("vllm_importance_sampling_correction")
    if ga % every == 0 and not vllm_old:
        return None, ("TRL computes no π_old under these settings (ρ ≡ 1 by construction: "
                      "rho_one)")
    steps = np.asarray(steps, dtype=np.int64)
    micro = steps[:, None] * ga + np.arange(ga)[None]
    return ((micro // every * every) // ga == steps[:, None]).all(1), ""


def noisy_forward(x, settings):
    first, why = _first_updates(settings, x["step"])
    if first is None:
        return _unchecked("noisy_forward", why)
    if not first.any():
        return _unchecked("noisy_forward", "no captured step is the first update of its "
                          "generation batch")
    absmax, kl = x["log_ratio_absmax"][first], x["approx_kl"][first]
    worst = float(np.nanmax(absmax)) if np.isfinite(absmax).any() else 0.0
    at = int(x["step"][first][int(np.nanargmax(absmax))]) if worst > 0 else -1
    fired = worst > NOISE_ABSMAX
    n = int(first.sum())
    if fired:
        msg = (f"ρ ≠ 1 before any update: on the {n} steps that are the first update of their "
               "generation batch (no optimiser step since TRL computed π_old, so ρ must be 1 "
               f"exactly) abs(log ρ) reaches {worst:.3f} at {step_label(at, settings)}, mean "
               f"k3 KL {float(np.nanmean(kl)):.2g}. The forward that computed π_old and the "
               "loss's differ: dropout (TRL: disable_dropout=True) or a nondeterministic "
               "kernel? Every ratio, clip fraction and KL of this run carries that noise.")
    else:
        msg = (f"ρ = 1 where it must be: largest abs(log ρ) {worst:.2g} on the {n} steps that "
               "are the first update of their generation batch")
    return _finding("noisy_forward", fired, msg, steps_checked=n, log_ratio_absmax=worst,
                    step=at)


def _step_means(x):
    """{key: mean over the steps where ρ ≠ 1} of STEP_SIZE_KEYS ({} when ρ ≡ 1)."""
    moved = _moved(x)
    return {k: float(np.mean(x[k][moved])) for k in STEP_SIZE_KEYS} if moved.any() else {}


def _too_big(x):
    return _step_means(x).get("approx_kl", 0.0) > STEP_SIZE_KL


def step_size(x, settings):
    means = _step_means(x)
    if not means:
        return _unchecked("step_size", "ρ ≡ 1, the capture cannot show how far one step "
                          "moves the policy")
    out = {k: v for k, v in means.items() if not HEALTHY[k][0] <= v <= HEALTHY[k][1]}
    low = _entropy_low(x)
    sharp = bool(low and low[3])
    big = means["approx_kl"] > STEP_SIZE_KL
    noisy = noisy_forward(x, settings).fired
    fired = big and not sharp and not noisy
    lr = settings.get("learning_rate")
    listed = ", ".join(f"{k} {v:.3g} (healthy ≤ {HEALTHY[k][1]})" for k, v in out.items())
    if fired:
        msg = (f"the policy moves too far per step: mean over the reused steps {listed}. "
               f"Lower the learning rate ({lr}) or reuse each batch fewer times.")
    elif big and noisy:
        msg = (f"large ratios ({listed}), but ρ ≠ 1 already before any update: the forward's "
               "own noise is in them; read noisy_forward first")
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
        return _unchecked("entropy_collapse", "no entropies in the capture")
    last, first, is_low, from_start = low
    fired = is_low and (from_start or not _too_big(x))
    if fired:
        seen = (f"entropy {last:.3f} nats at the end and {first:.3f} at the first step, low "
                "before any update (its large per-step ratios come from its few unlikely "
                "tokens; see step_size)" if _too_big(x) else
                f"entropy {last:.3f} nats at the end (first step {first:.3f}) while the step "
                "size is healthy")
        msg = (f"{seen}: the policy samples (nearly) one answer. Check the sampling temperature "
               f"({_sampling(settings, 'temperature')}) and top_p; clip-higher or an entropy "
               "bonus keep it up.")
    elif is_low:
        msg = (f"entropy fell to {last:.3f} nats, but the steps are too large too: read it "
               "as a step-size problem first (step_size)")
    else:
        msg = f"entropy {last:.3f} nats at the end (first step {first:.3f})"
    return _finding("entropy_collapse", fired, msg, entropy_last=last, entropy_first=first)


def _nanmean(v):
    return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def stuck_groups(x, settings):
    share = x["frac_reward_zero_std"]
    if not np.isfinite(share).any():
        return _unchecked("stuck_groups", "no group's rewards in the capture")
    k = max(1, len(share) // 4)
    mean, tail = _nanmean(share), _nanmean(share[-k:])
    low = _entropy_low(x)
    collapsed = bool(low and low[2])
    stuck = max(mean, tail) >= STUCK_SHARE
    fired = stuck and not collapsed
    seen = (f"{100 * mean:.0f}% of the groups have zero reward spread (every A = 0)"
            if mean >= STUCK_SHARE else
            f"the run ends stuck: over its last {k} steps {100 * tail:.0f}% of the groups have "
            f"zero reward spread (every A = 0: loss and gradient 0), {100 * mean:.0f}% over "
            "the whole run")
    if fired:
        msg = (f"{seen}, while the policy still varies: the reward cannot tell the responses "
               "apart. Check the reward (a saturated one ends a run so), or drop such groups "
               "(dynamic sampling).")
    elif stuck:
        msg = f"{seen}, explained by the entropy collapse (entropy_collapse)"
    else:
        msg = (f"{100 * mean:.0f}% of the groups have zero spread on average, "
               f"{100 * tail:.0f}% over the last {k} steps")
    return _finding("stuck_groups", fired, msg, frac_reward_zero_std_mean=mean,
                    frac_reward_zero_std_last=tail)


def negative_blowup(x, settings):
    ratio = np.asarray(x["neg_signal_ratio"], dtype=float)
    if not np.isfinite(ratio).any():
        return _unchecked("negative_blowup", "no gate (no rlgates method for these settings), "
                          "so no open-gate signal")
    if not (np.nan_to_num(np.asarray(x.get("neg_signal_max", ratio), dtype=float)) > 0).any():
        return _unchecked("negative_blowup", "no captured token has A < 0 and an open gate")
    worst = float(np.nanmax(ratio))
    big = worst > BLOWUP_RATIO
    fired = big and not _too_big(x)
    at = int(x["step"][int(np.nanargmax(ratio))])
    if fired:
        msg = (f"at {step_label(at, settings)} an A < 0 token's open-gate signal ρ·abs(A) is "
               f"{worst:.0f}× the step's median: one token can dominate the update. Dual-clip "
               "(verl's default, c = 3) shuts it; check the advantages' scale.")
    elif big:
        msg = (f"an A < 0 token's signal reaches {worst:.0f}× the median, with steps too "
               "large: read it as a step-size problem first (step_size)")
    else:
        msg = f"largest A < 0 signal {worst:.1f}× the median"
    return _finding("negative_blowup", fired, msg, signal_ratio_max=worst, step=at)


def length_drift(x, settings):
    n = len(x["step"])
    if n < 3:
        return _unchecked("length_drift", "fewer than 3 steps")
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
DETECTORS = {f.__name__: f for f in (rho_one, noisy_forward, micro_normaliser, mismatch,
                                      step_size, entropy_collapse, stuck_groups,
                                      negative_blowup, length_drift)}


def detect(numbers: dict, settings: dict) -> list[Finding]:
    """Run every detector on a capture's per-step numbers."""
    return [f(numbers, settings) for f in DETECTORS.values()]
