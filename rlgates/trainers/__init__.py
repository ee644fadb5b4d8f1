"""Any rlgates gate inside a real trainer: TRL's `GRPOTrainer` and verl's policy-loss registry.

The trainers stay the engines (sampling, batching, optimiser, logging, processes); an adapter only
swaps the per-token objective for an rlgates method's. Two thin modules do the plumbing and import
their trainer; this one imports neither, so it stays light:

    rlgates.trainers.trl    RlgatesGRPOTrainer (a GRPOTrainer subclass), trl_loss,
                            builtin_loss (TRL's own loss at given log-probs)
    rlgates.trainers.verl   policy_loss(method), register(method) -> "rlgates_<name>"

What lives here is shared by both (and `guard_notebook()`, for a notebook without the trainers):

- `flags(m, agg=None)`: the trainer settings that make a trainer's *built-in* loss compute `m`
  (the flag table of the book's chapter 14, from each method class's `trainer_flags`), under
  its own aggregation or another (TRL's bnpo and dr_grpo are aggregations of its clip), or None
  where a trainer has no built-in equivalent;
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

from .. import _numerics as nx
from .. import diagnostics

#: The trainer versions the adapters and the flag table were tested with (tests/test_trainers.py).
TESTED_VERSIONS = {"trl": "1.16.0", "verl": "0.9.1"}

_INF = math.inf


def guard_notebook() -> bool:
    """In a notebook without TRL and verl (Colab, Binder): from here on, a cell that needs them
    prints one line, what to install, instead of failing, and "Run All" goes on with the cells
    that need only rlgates (rlgates/trainers/_guard.py says how). Does nothing where both are
    installed, or outside IPython. Returns whether both are installed."""
    from .._book import facts

    if facts.installed():
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is not None:
        from . import _guard

        _guard.install(shell, TESTED_VERSIONS)
    return False


def engine_runs() -> dict:
    """What the real trainers did at TESTED_VERSIONS: the numbers of the engine tests
    (tests/engines), committed beside this module and checked against every engine run."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).with_name("engine_runs.json")).read_text())


def _resolve(spec, h):
    if spec is None:
        return None
    if callable(spec):
        return spec(dict(h))
    out = {}
    for k, v in spec.items():
        if callable(v):
            v = v(dict(h))
        elif isinstance(v, str) and v in h:
            v = h[v]
        out[k] = v
    return out


#: What a token mean divides by, for `flags`: "step", the whole optimiser step's token count
#: (over micro-batches and processes: `loss(norm=...)`, verl's batch_num_tokens, TRL's dapo); or
#: "micro-batch", each micro-batch's own (TRL's bnpo). The sequence means divide by responses,
#: and micro-batches hold as many each, so for them the two agree.
NORMALISERS = ("step", "micro-batch")
#: TRL 1.16's loss types that share one per-token loss (the clip of grpo, bnpo, dr_grpo, dapo and
#: luspo) and differ only in how they aggregate it: (rlgates aggregation, normaliser) -> loss_type.
TRL_LOSS_TYPE_FOR_AGG = {
    ("token-mean", "step"): "dapo", ("token-mean", "micro-batch"): "bnpo",
    ("seq-mean-token-mean", "step"): "grpo", ("seq-mean-token-sum", "step"): "luspo",
    ("seq-mean-token-sum-norm", "step"): "dr_grpo",
}
#: TRL's clip loss types (the keys above are the one place they are written)
TRL_CLIP_LOSS_TYPES = tuple(dict.fromkeys(TRL_LOSS_TYPE_FOR_AGG.values()))
#: The loss_mode names `rlgates.trainers.verl.register` gives: "rlgates_<method name>"
VERL_PREFIX = "rlgates_"
#: TRL loss types whose aggregation comes with the loss: (aggregation, normaliser).
TRL_FIXED_AGG = {"sapo": ("seq-mean-token-mean", "step"), "cispo": ("token-mean", "step"),
                 "vespo": ("token-mean", "step")}
#: verl losses that do not read loss_agg_mode: sapo forces seq-mean-token-mean; geo_mean takes a
#: plain mean over the rows. verl's other losses follow it, over the whole step.
VERL_FIXED_AGG = {"sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean"}


def flags(method, agg=None, *, normaliser="step") -> dict:
    """{"verl": settings or None, "trl": settings or None}: the settings that make each trainer's
    built-in loss compute `method` with its current hyperparameters, read from the method
    class's `trainer_flags`. None: no built-in equivalent (the adapters still run the method).

    agg: one of rlgates.AGG_MODES, to run the method under another aggregation than its own
    (`method.agg`); normaliser: "step" or "micro-batch" (`NORMALISERS`), what a token mean
    divides by. TRL's clipped losses then switch loss_type (`TRL_LOSS_TYPE_FOR_AGG`: dapo, bnpo,
    grpo, luspo, dr_grpo; dr_grpo divides by max_completion_length, so pad to it); verl sets
    loss_agg_mode. A loss that fixes its own aggregation (TRL's sapo, cispo, vespo; verl's sapo,
    geo_mean) gives None for any other, and verl has no micro-batch token mean.

        flags(rlgates.get("dapo"), agg="token-mean", normaliser="micro-batch")  # TRL's bnpo
        flags(rlgates.get("grpo"), agg="seq-mean-token-sum-norm")               # TRL's dr_grpo
    """
    spec = getattr(type(method), "trainer_flags", None) or {}
    out = {k: _resolve(spec.get(k), method.hparams) for k in ("verl", "trl")}
    if agg is None and normaliser == "step":
        return out
    agg = method.agg if agg is None else agg
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    if normaliser not in NORMALISERS:
        raise ValueError(f"normaliser must be one of {NORMALISERS}, got {normaliser!r}")
    if agg != "token-mean":
        normaliser = "step"  # a sequence mean divides by responses either way
    return {"verl": _verl_at(out["verl"], agg, normaliser),
            "trl": _trl_at(out["trl"], agg, normaliser)}


def _verl_at(f, agg, normaliser):
    if f is None or normaliser == "micro-batch":
        return None  # verl divides a token mean by the step's token count (batch_num_tokens)
    if f["loss_mode"] in VERL_FIXED_AGG:
        return f if agg == VERL_FIXED_AGG[f["loss_mode"]] else None
    return {**f, "loss_agg_mode": agg}


def _trl_at(f, agg, normaliser):
    if f is None:
        return None
    if f["loss_type"] in TRL_FIXED_AGG:
        return f if TRL_FIXED_AGG[f["loss_type"]] == (agg, normaliser) else None
    if f["loss_type"] not in TRL_LOSS_TYPE_FOR_AGG.values():
        return None  # a loss type this table does not know: no claim
    return {**f, "loss_type": TRL_LOSS_TYPE_FOR_AGG[agg, normaliser]}


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


def flag_table(names=None) -> str:
    """The flag table as Markdown: per method (at its defaults), the verl and TRL settings that
    make each trainer's built-in loss compute it, and the versions they were tested with."""
    from ..tables import markdown

    head = ("method", f"verl {TESTED_VERSIONS['verl']}", f"TRL {TESTED_VERSIONS['trl']}")
    return markdown(((f"`{n}`", v.replace(", ", "; "), t.replace(", ", "; "))
                     for n, v, t in flag_rows(names)), head)


def _local_count(mask, agg):
    if agg == "token-mean":
        return mask.sum()
    return (mask.sum(-1) > 0).sum()


def loss(method, logp, logp_old, adv, mask=None, agg=None, *, norm=None, length=None,
         is_weight=None, side=None):
    """`method.loss` with a trainer's denominators: value and gradient, exactly.

    norm: the count the outer mean divides by. token-mean: a number of tokens (the global token
        count of the optimiser step, over micro-batches and processes); the seq-mean modes: a
        number of sequences. None keeps rlgates' own (this batch's tokens, or its non-empty
        sequences).
    length: seq-mean-token-sum-norm's constant (Dr. GRPO's generation budget); None keeps T.

    is_weight: passed to `method.loss` (a constant per-token factor, such as verl's rollout
        correction weights). side: passed to `method.loss` (an rlgates.SideInfo, for a method
        with side inputs the batch does not give).

    Summing `loss(..., norm=N)` over micro-batches that together hold N tokens gives the
    full batch's token-mean, whatever the split (tests/test_trainers.py checks it).
    """
    agg = agg or method.agg
    m = nx.check_mask(mask, logp.shape, logp.device)  # checked once here: a bool mask from now
    kw = {"side": side} if side is not None else {}  # a hand-written loss need not take it
    out = method.loss(logp, logp_old, adv, m, agg=agg, is_weight=is_weight, **kw)
    if norm is None and length is None:
        return out
    scale = out.new_tensor(1.0)
    if norm is not None:
        scale = scale * _local_count(m, agg).to(out.dtype) / torch.as_tensor(norm).to(out)
    if length is not None:
        if agg != "seq-mean-token-sum-norm":
            raise ValueError(f"length only applies to seq-mean-token-sum-norm, not agg={agg!r}")
        scale = scale * max(m.shape[-1], 1) / float(length)
    return out * scale


def _detached_inputs(logp, logp_old, adv, mask):
    """(log π, log π_old, A as [B, T], bool mask), detached, in the library's compute dtype:
    what the adapters' metrics read."""
    m = nx.check_mask(mask, logp.shape, logp.device)
    dtype = nx.compute_dtype(logp, logp_old)
    lp, old = logp.detach().to(dtype), logp_old.detach().to(dtype)
    a = adv.detach().to(dtype)
    return lp, old, (a[:, None] if a.dim() == 1 else a).expand_as(lp), m


def gate_stats(method, logp, logp_old, adv, mask, side=None):
    """rlgates' own diagnostics of one micro-batch, for a trainer's logs: {key: float} for every
    key `rlgates.diagnostics` registers with log=True whose inputs a loss sees (`gate_mean`, the
    mean f' over the real tokens with A ≠ 0, and `gate_zero`, the share of them the gate shuts,
    at the ratio the gate sees). They are not verl's pg_clipfrac (see rlgates.trainers.verl).
    side: the SideInfo of a method with side inputs; a gate whose fields are missing is left
    out, as any diagnostic whose input is missing."""
    stats = diagnostics.step_stats(method, logp, logp_old, adv, mask, side=side,
                                   keys=diagnostics.keys(logged=True), skip_missing=True)
    return diagnostics.as_floats(stats)


__all__ = ["NORMALISERS", "TESTED_VERSIONS", "TRL_CLIP_LOSS_TYPES", "TRL_FIXED_AGG",
           "TRL_LOSS_TYPE_FOR_AGG", "VERL_FIXED_AGG", "VERL_PREFIX", "engine_runs", "flag_rows",
           "flag_table", "flags", "gate_stats", "loss"]
