"""Per-step numbers of a loaded capture (`capture.Run`): every atlas diagnostic under the
trainer's names, and the few numbers the detectors read that no trainer logs.

The tokens of one step are put back into rows (one row per captured response: rank, micro-batch,
row) and handed to `rlgates.diagnostics.step_stats` with the gate of the run's own settings
(`method_for`). A capture keeps a uniform sample of each step's tokens (`tokens_per_step`): every
token share, mean and KL below is then an estimate from that sample, and a sequence-level ratio
(GSPO) is the mean over the response's sampled tokens. Two checks read exact sums instead, which
a capture (schema 2) records per micro-batch over every token: the micro-batch normaliser's fit
(`micro_fit`) and the sampler mismatch (`mismatch_kl`, `mismatch_absmax`); on an older capture
they fall back to the tokens (the fit then needs every token of a step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .. import diagnostics, get, names
from ..trainers import TRL_CLIP_LOSS_TYPES, VERL_FIXED_AGG, VERL_PREFIX, conformance
from ..trainers.conformance_trl import TRL_AGG
from ..trainers.conformance_verl import POLICY_LOSS_KEYS

#: TRL loss types whose token loss is the clip family's min(ρA, clip(ρ)A)
CLIP_LOSS_TYPES = TRL_CLIP_LOSS_TYPES

#: The atlas diagnostics the report shows per step, in this order (rlgates.diagnostics keys)
ATLAS_KEYS = ("clipfrac_pos", "clipfrac_neg", "clip_ratio/low_mean", "clip_ratio/high_mean",
              "clip_ratio/region_mean", "ppo_kl", "approx_kl", "log_ratio_absmax",
              "signal_lost", "gate_zero", "gate_mean", "entropy")


def method_for(settings: dict):
    """(rlgates method, aggregation, note) for a capture's trainer settings: the row of the
    conformance matrix (`rlgates.trainers.conformance.find`) whose settings they are, with the
    method's hyperparameters read back from them. note says what was assumed ("" when nothing).

    method None: no rlgates method computes this trainer's loss (note says which setting);
    the gate diagnostics are then NaN and the report says so. A run whose loss is an rlgates
    method records it (settings["method"]: the drop-in TRL trainer, a verl loss registered by
    rlgates): that method, at its recorded hyperparameters and aggregation, is the answer. An
    older capture of a verl loss_mode of the adapter (rlgates_<name>) is read as that method at
    its defaults."""
    trainer = settings.get("trainer") or "trl"
    given = _row_settings(trainer, settings)
    agg, what = _trainer_loss(trainer, given)
    record = settings.get("method")
    if isinstance(record, dict) and record.get("name"):
        method, note = recorded_method(record)
        return method, record.get("agg") or agg, note
    mode = given.get("policy_loss.loss_mode") or ""
    if trainer == "verl" and mode.startswith(VERL_PREFIX):
        name = mode[len(VERL_PREFIX):]
        if name in names():
            return (get(name), agg, f"{mode}: rlgates' {name} at its default hyperparameters "
                    "(verl's config does not hold them)")
        return None, agg, f"{what} is no registered rlgates method: no gate is computed"
    found = conformance.find(trainer, given)
    if found is None:
        return None, agg, (f"{what} with these settings is no row of rlgates' conformance "
                           "matrix: no rlgates method, no gate is computed")
    row, hparams, assumed, same_agg = found
    if row.method is None:
        return None, agg, f"{what}: no rlgates method ({row.note})"
    note = "" if not assumed else ("not in the capture, taken at the conformance row's value: "
                                   + ", ".join(f"{k} = {row.settings[k]}" for k in assumed))
    return get(row.method, **hparams), row.agg if same_agg else agg, note


def _trainer_loss(trainer, given):
    """(aggregation, the loss's name for a note) of a capture's settings, as rows write them."""
    if trainer == "verl":
        mode = given["policy_loss.loss_mode"]
        return (VERL_FIXED_AGG.get(mode) or given.get("loss_agg_mode") or "token-mean",
                f"verl loss_mode {mode!r}")
    lt = given.get("loss_type")
    return given.get("aggregation") or TRL_AGG.get(lt) or "token-mean", f"TRL loss_type {lt!r}"


def recorded_method(record: dict):
    """(method, note) of a method a capture records (`capture.method_record`); method None where
    this process cannot build it, and note says why."""
    name = record["name"]
    hparams = dict(record.get("hparams") or {})
    if name not in names():
        return None, (f"the run's loss is rlgates' {name!r}, which is not registered in this "
                      "process (import the module that registers it): no gate is computed")
    try:
        return get(name, **hparams), ""
    except ValueError as e:
        return None, (f"the run's loss is rlgates' {name!r} at {hparams}, which this rlgates "
                      f"refuses ({e}): no gate is computed")


def same_method(record, method) -> bool:
    """Whether a recorded method (`capture.method_record`, or None) is `method`: the same name
    and hyperparameters."""
    if not isinstance(record, dict) or method is None or record.get("name") != method.name:
        return False
    got = record.get("hparams") or {}
    return set(got) == set(method.hparams) and all(_close(got[k], v)
                                                   for k, v in method.hparams.items())


def _close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return bool(a == b or np.isclose(a, b, rtol=1e-9, atol=0))
    return a == b


def _row_settings(trainer, settings):
    """A capture's settings as the conformance rows write them: verl's loss_mode and policy-loss
    fields under "policy_loss.", and clip_ratio_low/high falling back to clip_ratio as in verl."""
    out = dict(settings)
    if trainer != "verl":
        return out
    for k in POLICY_LOSS_KEYS:
        if out.get(f"policy_loss.{k}") is None and out.get(k) is not None:
            out[f"policy_loss.{k}"] = out[k]
    out["policy_loss.loss_mode"] = out.get("policy_loss.loss_mode") or "vanilla"
    for k in ("clip_ratio_low", "clip_ratio_high"):
        if out.get(k) is None:
            out[k] = out.get("clip_ratio")
    return out


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
    if method is None:  # no gate: no open-gate signal either
        out["neg_signal_max"] = out["neg_signal_ratio"] = float("nan")
    else:
        gate, glr = diagnostics.token_gates(method, s.logp[None], s.logp_old[None],
                                            s.adv[None], m[None])
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


def recorded_sums(run, method, step):
    """The step's micro-batches' Σ_t ℓ_t and Σ_t |ℓ_t| as the capture recorded them over every
    token (schema 2, `token_loss_sum` and `token_loss_abs_sum`), or None where it has none under
    `method`'s gate (an older capture, or the sums taken under another gate)."""
    mi = run.micro
    if "token_loss_sum" not in mi or not same_method(run.settings.get("token_loss_method"),
                                                     method):
        return None
    at = mi["step"] == step
    sums = mi["token_loss_sum"][at].astype(float)
    scale = mi["token_loss_abs_sum"][at].astype(float)
    return (sums, scale) if np.isfinite(sums).all() and np.isfinite(scale).all() else None


def micro_fit(run, method, step) -> dict | None:
    """How each micro-batch's captured loss was normalised, from the captured counts: the loss
    of micro-batch k rebuilt from its tokens, Σ_t ℓ_t (ℓ = −J, the token objective of the run's
    gate), is divided by a per-step constant (the step's token count, or any constant) or by k's
    own token count n_k. The sums are the capture's own over every token (`recorded_sums`) where
    it has them, else rebuilt from the captured tokens. Returns each hypothesis' residual (fitted
    per step, relative to the losses' scale) and "recorded" (1.0: from the recorded sums), or
    None when the step cannot tell them apart: no recorded sums and a token not captured (the
    step was sampled), fewer than two micro-batches, or equal counts."""
    if method is None:
        return None  # no method: the captured losses cannot be rebuilt
    mi = run.micro
    at = mi["step"] == step
    counts, losses = mi["tokens"][at].astype(float), mi["loss"][at].astype(float)
    if len(counts) < 2 or np.ptp(counts) == 0:
        return None
    recorded = recorded_sums(run, method, step)
    out = {"recorded": float(recorded is not None)}
    if recorded is None:
        if int((run.tokens["step"] == step).sum()) != int(counts.sum()):
            return None  # sampled: the sums would be estimates
        recorded = _token_sums(run, method, step)
    sums, scale = recorded
    for name, div in (("step", np.ones_like(counts)), ("micro-batch", counts)):
        p, q = sums / div, scale / div
        c = float(p @ losses / (p @ p)) if p @ p > 0 else 0.0
        out[name] = float(np.abs(losses - c * p).max() / max(abs(c) * q.max(), 1e-30))
    return out


def _token_sums(run, method, step):
    """Each micro-batch's Σ_t ℓ_t and Σ_t |ℓ_t| rebuilt from the captured tokens (all of them)."""
    mi = run.micro
    micro_ids = np.flatnonzero(mi["step"] == step)
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
    return np.array(sums), np.array(scale)


def recorded_mismatch(run, step) -> dict:
    """{"mismatch_kl", "mismatch_absmax"} of the step from the sums the capture recorded over
    every token with a sampler log-prob (schema 2); {} where it recorded none (an older capture,
    no sampler log-probs, or ones written into the tokens afterwards)."""
    mi = run.micro
    if "sampler_tokens" not in mi:
        return {}
    at = mi["step"] == step
    n = int(mi["sampler_tokens"][at].sum())
    if n <= 0:
        return {}
    return {"mismatch_kl": float(mi["mismatch_kl_sum"][at].sum() / n),
            "mismatch_absmax": float(np.nanmax(mi["mismatch_absmax"][at]))}


def run_numbers(run, progress: Callable[[int, int], None] | None = None) -> dict:
    """{key: np.ndarray over the run's steps} for every per-step number above, plus "step"."""
    method, agg, _ = method_for(run.settings)
    steps = [int(x) for x in run.steps]
    rows = []
    for i, step in enumerate(steps):
        with torch.no_grad():
            row = step_numbers(method, agg, step_rows(run, step))
        row.update(sequence_numbers(run, step))
        row.update(recorded_mismatch(run, step))
        fit = micro_fit(run, method, step)
        row["fit_step"] = np.nan if fit is None else fit["step"]
        row["fit_micro"] = np.nan if fit is None else fit["micro-batch"]
        row["fit_recorded"] = np.nan if fit is None else fit["recorded"]
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
