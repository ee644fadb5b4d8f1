"""Per-step numbers of a loaded capture (`rlgates.capture.Run`): every atlas diagnostic under the
trainer's names, and the few numbers the detectors read that no trainer logs.

The tokens of one step are put back into rows (one row per captured response: rank, micro-batch,
row) and handed to `rlgates.diagnostics.step_stats` with the gate of the run's own settings
(`method_for`). A capture keeps a uniform sample of each step's tokens (`tokens_per_step`): every
token share, mean and KL below is then an estimate from that sample, and a sequence-level ratio
(GSPO) is the mean over the response's sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .. import diagnostics, get, names

#: TRL loss types whose token loss is the clip family's min(ρA, clip(ρ)A)
CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")

#: The atlas diagnostics the report shows per step, in this order (rlgates.diagnostics keys)
ATLAS_KEYS = ("clipfrac_pos", "clipfrac_neg", "clip_ratio/low_mean", "clip_ratio/high_mean",
              "clip_ratio/region_mean", "ppo_kl", "approx_kl", "log_ratio_absmax",
              "signal_lost", "gate_zero", "gate_mean", "entropy")


def method_for(settings: dict):
    """(rlgates method, aggregation, note) for a capture's trainer settings: the gate the
    trainer's own flags define. note says what was assumed ("" when nothing)."""
    if settings.get("trainer") == "verl":
        return _verl_method(settings)
    lt = settings.get("loss_type")
    eps = settings.get("epsilon")
    eps_high = settings.get("epsilon_high") or eps
    level = settings.get("importance_sampling_level") or "token"
    agg = settings.get("aggregation") or "token-mean"
    note = ""
    if lt in CLIP_LOSS_TYPES and eps is not None:
        if settings.get("delta") and eps_high == eps:
            m = get("dual_clip", eps=eps, c=settings["delta"])
        elif level == "sequence":
            m = get("gspo", eps_low=eps, eps_high=eps_high)
        else:
            m = get("dapo", eps_low=eps, eps_high=eps_high)
    elif lt == "cispo" and eps_high is not None:
        m = get("cispo", eps_high=eps_high - 1.0)
    elif lt == "sapo":
        m = get("sapo", tau_pos=settings.get("sapo_temperature_pos") or 1.0,
                tau_neg=settings.get("sapo_temperature_neg") or 1.05)
    else:
        m = get("dapo")
        note = (f"loss_type {lt!r} has no rlgates gate: drawn and measured under DAPO's "
                "clip (ε = 0.2, 0.28)")
    return m, agg, note


def _verl_method(settings):
    """The gate of a verl actor config (rlgates.capture_verl's settings)."""
    mode = settings.get("loss_mode") or "vanilla"
    eps = settings.get("clip_ratio")
    low = settings.get("clip_ratio_low") or eps or 0.2
    high = settings.get("clip_ratio_high") or eps or 0.2
    c = settings.get("clip_ratio_c")
    agg = settings.get("loss_agg_mode") or "token-mean"
    if mode == "vanilla":
        finite = c is not None and c != float("inf") and str(c) != "inf"
        if low == high:
            return (get("dual_clip", eps=low, c=float(c)) if finite else get("ppo", eps=low),
                    agg, "")
        return (get("dapo", eps_low=low, eps_high=high), agg,
                f"verl's dual clip at c = {c} is not drawn (ε_low ≠ ε_high)" if finite else "")
    if mode == "gspo":
        return get("gspo", eps_low=low, eps_high=high), agg, ""
    if mode.startswith("rlgates_") and mode[len("rlgates_"):] in names():
        return (get(mode[len("rlgates_"):]), agg,
                f"{mode}: rlgates' {mode[len('rlgates_'):]} at its default hyperparameters")
    return get("dapo"), agg, (f"verl loss_mode {mode!r} has no rlgates gate: drawn and "
                              "measured under DAPO's clip (ε = 0.2, 0.28)")


@dataclass
class StepRows:
    """One step's captured tokens as dense rows [R, T] (mask: where a token was captured)."""

    logp: torch.Tensor
    logp_old: torch.Tensor
    logp_sampler: torch.Tensor
    adv: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor
    rows: np.ndarray  # [R] the (rank, micro, row) key of each row

    @property
    def n(self) -> int:
        return int(self.mask.sum())


def _keys(t, at):
    return ((t["rank"][at] * 1_000_003 + t["micro"][at]) * 1_000_003 + t["row"][at])


def step_rows(run, step) -> StepRows:
    t = run.tokens
    at = np.flatnonzero(t["step"] == step)
    keys = _keys(t, at)
    rows, r = np.unique(keys, return_inverse=True)
    pos = t["position"][at]
    shape = (len(rows), int(pos.max()) + 1 if len(pos) else 1)

    def dense(name, fill=0.0):
        x = torch.full(shape, fill, dtype=torch.float64)
        x[r, pos] = torch.from_numpy(t[name][at].astype(np.float64))
        return x

    mask = torch.zeros(shape, dtype=torch.bool)
    mask[r, pos] = torch.from_numpy(t["mask"][at].astype(bool))
    return StepRows(dense("logp"), dense("logp_old"), dense("logp_sampler", np.nan),
                    dense("advantage"), dense("entropy", np.nan), mask, rows)


def _median_abs(x):
    return float(x.abs().median()) if x.numel() else float("nan")


def step_numbers(method, agg, s: StepRows) -> dict:
    """Every atlas diagnostic of one step, plus the detectors' own numbers."""
    entropy = s.entropy if torch.isfinite(s.entropy[s.mask]).all() and s.n else None
    st = diagnostics.step_stats(method, s.logp[None], s.logp_old[None], s.adv[None],
                                s.mask[None], entropy=None if entropy is None else entropy[None],
                                agg=agg, keys=ATLAS_KEYS)
    out = {k: float(v[0]) for k, v in st.items()}
    m = s.mask
    lr = (s.logp - s.logp_old)[m]
    out["tokens"] = s.n
    out["live_tokens"] = float((m & (s.adv != 0)).sum() / max(s.n, 1))
    out["rho_is_one"] = float(lr.numel() > 0 and bool((lr == 0).all()))
    samp = s.logp_sampler[m]
    if samp.numel() and torch.isfinite(samp).all():
        d = s.logp_old[m] - samp  # log π_old/π_sampler on tokens the sampler drew
        out["mismatch_kl"] = float((d.exp() - 1 - d).mean())
        out["mismatch_absmax"] = float(d.abs().max())
    else:
        out["mismatch_kl"] = out["mismatch_absmax"] = float("nan")
    # negative side: the largest open-gate signal ρ·|A| of an A < 0 token, against the median
    # ρ·|A| of the step's tokens with A ≠ 0
    gate, glr = diagnostics.token_gates(method, s.logp[None], s.logp_old[None], s.adv[None],
                                        m[None])
    size = (glr[0].exp() * s.adv).abs()
    live = m & (s.adv != 0)
    neg_open = m & (s.adv < 0) & (gate[0] != 0)
    med = _median_abs(size[live])
    out["neg_signal_max"] = float(size[neg_open].max()) if neg_open.any() else 0.0
    out["neg_signal_ratio"] = (out["neg_signal_max"] / med if med and med > 0 else 0.0)
    out["adv_absmax"] = float(s.adv[m].abs().max()) if s.n else float("nan")
    return out


def sequence_numbers(run, step) -> dict:
    """The step's responses: mean length, share cut at max_completion_length, and the share of
    groups (rows sharing a prompt) whose advantages are all zero (TRL: frac_reward_zero_std)."""
    s = run.sequences
    at = s["step"] == step
    length = s["length"][at]
    cap = run.settings.get("max_completion_length")
    adv, prompt = s["advantage"][at], s["prompt"][at]
    groups, inv = np.unique(prompt, return_inverse=True)
    flat = np.ones(len(groups), bool)
    np.logical_and.at(flat, inv, np.abs(adv) < 1e-6)
    return {"length": float(length.mean()) if len(length) else float("nan"),
            "clipped_ratio": float((length >= cap).mean()) if cap and len(length) else
            float("nan"),
            "frac_reward_zero_std": float(flat.mean()) if len(groups) else float("nan")}


def micro_fit(run, method, step) -> dict | None:
    """How each micro-batch's captured loss was normalised, from the captured counts: the loss
    of micro-batch k rebuilt from its tokens, Σ_t ℓ_t (ℓ = −J, the token objective of the run's
    gate), is divided by a per-step constant (the step's token count, or any constant) or by k's
    own token count n_k. Returns each hypothesis' residual (fitted per step, relative to the
    losses' scale), or None when the step cannot tell them apart: a token not captured (the step
    was sampled), fewer than two micro-batches, or equal counts."""
    mi = run.micro
    at = mi["step"] == step
    counts, losses = mi["tokens"][at].astype(float), mi["loss"][at].astype(float)
    micro_ids = np.flatnonzero(at)
    t = run.tokens
    if len(counts) < 2 or np.ptp(counts) == 0:
        return None
    if int((t["step"] == step).sum()) != int(counts.sum()):
        return None  # sampled: the sums would be estimates
    s = step_rows(run, step)
    j = method.token_objective(s.logp, s.logp_old, s.adv, s.mask)
    ell = torch.where(s.mask, -j, 0.0).sum(-1).numpy()
    size = torch.where(s.mask, j.abs(), 0.0).sum(-1).numpy()
    micro_of_row = (s.rows // 1_000_003) % 1_000_003
    rank_of_row = s.rows // (1_000_003 ** 2)
    sums, scale = [], []
    ranks = mi["rank"][micro_ids]
    for k, rank in enumerate(ranks):  # a step's micro-batches, in order, per rank
        row = (micro_of_row == k - int((ranks[:k] != rank).sum())) & (rank_of_row == rank)
        sums.append(ell[row].sum())
        scale.append(size[row].sum())
    sums, scale = np.array(sums), np.array(scale)
    out = {}
    for name, div in (("step", np.ones_like(counts)), ("micro-batch", counts)):
        p, q = sums / div, scale / div
        c = float(p @ losses / (p @ p)) if p @ p > 0 else 0.0
        out[name] = float(np.abs(losses - c * p).max() / max(abs(c) * q.max(), 1e-30))
    return out


def run_numbers(run, progress: Callable[[int, int], None] | None = None) -> dict:
    """{key: np.ndarray over the run's steps} for every per-step number above, plus "step"."""
    method, agg, _ = method_for(run.settings)
    steps = [int(x) for x in run.steps]
    rows = []
    for i, step in enumerate(steps):
        with torch.no_grad():
            row = step_numbers(method, agg, step_rows(run, step))
        row.update(sequence_numbers(run, step))
        fit = micro_fit(run, method, step)
        row["fit_step"] = np.nan if fit is None else fit["step"]
        row["fit_micro"] = np.nan if fit is None else fit["micro-batch"]
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(steps))
    keys = list(rows[0]) if rows else []
    out = {k: np.array([r[k] for r in rows], dtype=float) for k in keys}
    out["step"] = np.array(steps)
    # every captured response (as often as the trainer used it), for the length trend
    out["response_step"] = run.sequences["step"].astype(float)
    out["response_length"] = run.sequences["length"].astype(float)
    return out
