"""Any rlgates gate inside a real trainer: TRL's `GRPOTrainer` and verl's policy-loss registry.

The trainers stay the engines (sampling, batching, optimiser, logging, processes); an adapter only
swaps the per-token objective for an rlgates method's. Two thin modules do the plumbing and import
their trainer; this one imports neither, so it stays light:

    rlgates.trainers.trl    RlgatesGRPOTrainer (a GRPOTrainer subclass), trl_loss
    rlgates.trainers.verl   policy_loss(method), register(method) -> "rlgates_<name>"

What lives here is shared by both:

- `flags(m)`: the trainer settings that make a trainer's *built-in* loss compute `m` (the flag
  table of the book's chapter 14), or None where a trainer has no built-in equivalent;
- `loss(m, ..., norm=, length=)`: `m.loss` with a trainer's normaliser in place of the local one.

The normaliser. `rlgates.aggregate` divides by counts of the batch it is given: its tokens
(token-mean) or its non-empty sequences (the seq-mean modes), and T for seq-mean-token-sum-norm.
A trainer that splits a batch into micro-batches (and over processes) divides each micro-batch's
sum by a count of the *whole* batch instead, so that the accumulated gradient equals the
full-batch loss's. Every denominator is a constant (it does not depend on log π), so the
trainer's loss is the local one times local count / trainer count, exactly, value and gradient.
`loss` does that rescaling; the library's own `aggregate` keeps one meaning (the batch you pass).
"""

from __future__ import annotations

import math

import torch

#: The trainer versions the adapters and the flag table were tested with (tests/test_trainers.py).
TESTED_VERSIONS = {"trl": "1.16.0", "verl": "0.9.1"}

_INF = math.inf


def _clip(low, high, c=_INF, agg="token-mean", mode="vanilla"):
    return lambda h: {"loss_mode": mode, "clip_ratio_low": h[low], "clip_ratio_high": h[high],
                      "clip_ratio_c": h[c] if isinstance(c, str) else c, "loss_agg_mode": agg}


def _trl_clip(loss_type, low, high, level="token", delta=None):
    return lambda h: {"loss_type": loss_type, "epsilon": h[low], "epsilon_high": h[high],
                      "importance_sampling_level": level,
                      "delta": h[delta] if delta else None}


def _cispo_trl(h):
    # TRL's CISPO caps the ratio at epsilon_high itself and has no lower clip
    if h["eps_low"] != 1.0:
        return None
    return {"loss_type": "cispo", "epsilon_high": 1.0 + h["eps_high"],
            "importance_sampling_level": "token"}


#: Per method: {"verl": ..., "trl": ...}, each a function of the method's hyperparameters that
#: returns the trainer's settings (or None: no built-in equivalent, use the adapter). Kept here
#: until the method classes carry it as `trainer_flags`.
FLAGS = {
    "ppo": {"verl": _clip("eps", "eps"), "trl": _trl_clip("dapo", "eps", "eps")},
    "grpo": {"verl": _clip("eps", "eps", agg="seq-mean-token-mean"),
             "trl": _trl_clip("grpo", "eps", "eps")},
    "dapo": {"verl": _clip("eps_low", "eps_high"),
             "trl": _trl_clip("dapo", "eps_low", "eps_high")},
    "gspo": {"verl": lambda h: {"loss_mode": "gspo", "clip_ratio_low": h["eps_low"],
                                "clip_ratio_high": h["eps_high"],
                                "loss_agg_mode": "seq-mean-token-mean"},
             "trl": _trl_clip("grpo", "eps_low", "eps_high", level="sequence")},
    "sapo": {"verl": lambda h: {"loss_mode": "sapo", "tau_pos": h["tau_pos"],
                                "tau_neg": h["tau_neg"], "loss_agg_mode": "seq-mean-token-mean"},
             "trl": lambda h: {"loss_type": "sapo", "sapo_temperature_pos": h["tau_pos"],
                               "sapo_temperature_neg": h["tau_neg"],
                               "importance_sampling_level": "token"}},
    "dual_clip": {"verl": _clip("eps", "eps", c="c"),
                  "trl": _trl_clip("dapo", "eps", "eps", delta="c")},
    "cispo": {"verl": lambda h: {"loss_mode": "cispo", "clip_ratio_low": h["eps_low"],
                                 "clip_ratio_high": h["eps_high"], "loss_agg_mode": "token-mean"},
              "trl": _cispo_trl},
    "sao": {"verl": None, "trl": None},
    "reinforce": {"verl": None, "trl": None},
}


def flags(method) -> dict:
    """{"verl": settings or None, "trl": settings or None} that make each trainer's built-in loss
    compute `method` with its current hyperparameters. None: no built-in equivalent (the adapter
    still runs the method in that trainer)."""
    spec = getattr(type(method), "trainer_flags", None) or FLAGS.get(method.name)
    if not spec:
        return {"verl": None, "trl": None}
    return {k: (fn(dict(method.hparams)) if callable(fn) else fn) for k, fn in spec.items()}


def _fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float):
        return "inf (off)" if v == _INF else f"{v:g}"
    return str(v)


def flag_rows(names=None):
    """One row per method (at its defaults): [name, verl settings, TRL settings] as strings."""
    import rlgates

    rows = []
    for name in names or rlgates.names():
        f = flags(rlgates.get(name))
        cells = [", ".join(f"{k}={_fmt(v)}" for k, v in s.items() if v is not None)
                 if s else "— (adapter only)" for s in (f["verl"], f["trl"])]
        rows.append([name, *cells])
    return rows


def _local_count(mask, agg):
    if agg == "token-mean":
        return mask.sum()
    return (mask.sum(-1) > 0).sum()


def loss(method, logp, logp_old, adv, mask=None, agg=None, *, norm=None, length=None):
    """`method.loss` with a trainer's denominators: value and gradient, exactly.

    norm: the count the outer mean divides by. token-mean: a number of tokens (the global token
        count of the optimiser step, over micro-batches and processes); the seq-mean modes: a
        number of sequences. None keeps rlgates' own (this batch's tokens, or its non-empty
        sequences).
    length: seq-mean-token-sum-norm's constant (Dr. GRPO's generation budget); None keeps T.

    Summing `loss(..., norm=N)` over micro-batches that together hold N tokens gives the
    full batch's token-mean, whatever the split (tests/test_trainers.py checks it).
    """
    agg = agg or getattr(method, "agg", None) or "token-mean"
    out = method.loss(logp, logp_old, adv, mask, agg=agg)
    if norm is None and length is None:
        return out
    m = torch.ones(logp.shape, dtype=torch.bool, device=logp.device) if mask is None else mask != 0
    scale = out.new_tensor(1.0)
    if norm is not None:
        scale = scale * _local_count(m, agg).to(out.dtype) / torch.as_tensor(norm).to(out)
    if length is not None:
        if agg != "seq-mean-token-sum-norm":
            raise ValueError(f"length only applies to seq-mean-token-sum-norm, not agg={agg!r}")
        scale = scale * max(m.shape[-1], 1) / float(length)
    return out * scale


def gate_stats(method, logp, logp_old, adv, mask):
    """{"gate_mean": mean f', "gate_zero": share of tokens the gate shuts}, over the real tokens
    with A ≠ 0 (at A = 0 there is no signal to gate), at the ratio the gate sees (its sequence's
    for a sequence-level method). For a trainer's logs."""
    with torch.no_grad():
        m = mask != 0
        dtype = torch.float64 if logp.dtype == torch.float64 else torch.float32
        lr = torch.where(m, logp.to(dtype) - logp_old.to(dtype), 0.0)
        if getattr(method, "level", "token") == "sequence":
            lr = (lr.sum(-1) / m.sum(-1).clamp(min=1))[:, None].expand_as(lr)
        a = adv.to(dtype)
        a = a[:, None].expand_as(lr) if a.dim() == 1 else a
        g = method.gate(torch.exp(lr.clamp(-20, 20)), a)
        m = m & (a != 0)
        n = m.sum().clamp(min=1)
        return {"gate_mean": float((g * m).sum() / n), "gate_zero": float(((g == 0) & m).sum() / n)}


__all__ = ["FLAGS", "TESTED_VERSIONS", "flag_rows", "flags", "gate_stats", "loss"]
