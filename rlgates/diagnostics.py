"""Per-step training diagnostics, named as the trainers name them: one registry, one place each.

    >>> from rlgates import diagnostics
    >>> stats = diagnostics.step_stats(m, logp, logp_old, adv, mask, entropy=ent)
    >>> stats["clip_ratio/high_mean"], stats["ppo_kl"], stats["signal_lost"]
    >>> print(diagnostics.table())   # every key: what it measures, verl's and TRL's names

Every diagnostic is registered here, once, with `@register(key, doc)`: a function of a `Batch`
(one update's tokens, with what they share computed once: the gate, the log-ratios, the
aggregation weights). `step_stats` returns every registered key, so a new key reaches the lab's
results (`rlgates.lab`), its tables and reports, and, unless registered with `log=False`, the
trainer adapters' logs (`rlgates/<key>` in TRL, `actor/rlgates_<key>` in verl) with no other edit.

Every statistic of the gate is read off the method's own gate f'(ρ; A), so it means the same
thing for every method: a token is *shut* when its gate is exactly zero (it sends no gradient).
For the clip family (ppo, grpo, dapo, gspo, dual_clip) the shut tokens are exactly the tokens the
trainers count as clipped, so the trainers' names apply; for other gates (sao, a window on both
sides; sapo, a smooth gate with no exact zero) the same formula still says how many tokens sent
no gradient. ρ is the ratio the gate sees: the token's own, or the sequence's ρ_s at sequence
level (GSPO), as TRL computes it with `importance_sampling_level="sequence"`. verl's own per-loss
definitions of its names are `rlgates.trainers.verl.VERL_METRICS`.

``entropy`` is the mean per-token entropy of the policy passed in, over the real tokens: TRL's
``entropy`` (its token mean over the batch). verl's ``actor/entropy`` is another quantity: the
entropy of π_old, at the recompute of the old log-probs (``ray_trainer.py`` and the v1 trainer's
``trainer_base.py``), aggregated with the actor's ``loss_agg_mode`` (token-mean by default, where
the two agree at ρ ≡ 1).

All shares of tokens are over the valid (unmasked) tokens of the batch, as both trainers do
(verl `masked_mean` per micro-batch, TRL `global_masked_mean` over all processes). TRL's `kl`
is a different number, the KL to a frozen reference model, logged only when its β ≠ 0; CleanRL
logs `approx_kl` as here. Names checked against verl's `compute_policy_loss_vanilla`
(verl/trainer/ppo/core_algos.py) and TRL's `GRPOTrainer._compute_loss`
(trl/trainer/grpo_trainer.py).

Every function accepts leading dimensions (a runs dimension [R, B, T] in the lab) and reduces
only over the last two, so `step_stats` returns one value per run. A diagnostic whose input was
not given (the entropy, the rewards, a gate for an object without `.gate`) is NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from . import _numerics as nx
from ._side import MissingSide, SideInfo


class Missing(LookupError):
    """An input a diagnostic needs was not given (it is then NaN, and the adapters skip it)."""


@dataclass(frozen=True)
class Diagnostic:
    key: str
    doc: str  # what it measures, in one line (the lab's metric table shows it)
    fn: Callable  # fn(batch: Batch) -> tensor over the leading dimensions
    verl: str | None = None  # the name under which verl logs the same number
    trl: str | None = None  # the name under which TRL logs it
    log: bool = True  # the trainer adapters log it (as rlgates/<key>)


#: key → Diagnostic, in registration order (the order of `step_stats` and the lab's metrics).
REGISTRY: dict[str, Diagnostic] = {}


def register(key: str, doc: str, *, verl=None, trl=None, log=True):
    """Decorator: register `fn(batch) -> tensor` as diagnostic `key` (see the module docstring).

    log=False keeps it out of the trainer adapters' logs: for the numbers a trainer already logs
    under its own name, and for those that need inputs only the lab has."""
    def add(fn):
        if key in REGISTRY:
            raise ValueError(f"diagnostic {key!r} is already registered")
        REGISTRY[key] = Diagnostic(key, doc, fn, verl, trl, log)
        return fn
    return add


def unregister(key: str) -> Diagnostic:
    """Remove a registered diagnostic (tests register and remove their own)."""
    return REGISTRY.pop(key)


def keys(logged=False) -> tuple[str, ...]:
    """The registered keys, in order (logged=True: only those the adapters log)."""
    return tuple(k for k, d in REGISTRY.items() if d.log or not logged)


class Batch:
    """One update's tokens, as every diagnostic reads them; what they share is computed once.

    logp, logp_old, mask: [..., B, T]; adv: [..., B] or [..., B, T]. Optional: the policy's
    per-token `entropy` [..., B, T], the behaviour weight `is_weight` [..., B, T] applied to the
    loss, and the rollout's `rewards` [..., N] with its `group` size (prompts × G, each prompt's G
    responses side by side; they need not be the rows of the tokens). `side`: an rlgates.SideInfo
    over [..., B, T] for a method with side inputs; its gate and loss are then computed run by
    run (each run's batch statistics its own), and Missing names a field nobody gave.
    """

    def __init__(self, method, logp, logp_old, adv, mask=None, *, agg=None, entropy=None,
                 is_weight=None, rewards=None, group=None, side=None):
        dtype = nx.compute_dtype(logp, logp_old)
        self.method, self.inputs = method, (logp.detach(), logp_old.detach(), adv.detach())
        self.logp, self.logp_old = logp.detach().to(dtype), logp_old.detach().to(dtype)
        self.mask = nx.check_mask(mask, logp.shape, logp.device)
        adv = adv.detach().to(dtype)
        self.adv = (adv[..., None] if adv.dim() == logp.dim() - 1 else adv).expand_as(self.logp)
        self.agg = agg or getattr(method, "agg", None) or "token-mean"
        self._given = {"entropy": entropy, "is_weight": is_weight, "rewards": rewards,
                       "side": side}
        self.group = group

    def optional(self, name):
        """An optional input (detached; a SideInfo's fields already are), or None."""
        x = self._given[name]
        return x if x is None or isinstance(x, SideInfo) else x.detach()

    def given(self, name):
        """An optional input a diagnostic cannot do without; Missing if it was not passed."""
        if self._given[name] is None:
            raise Missing(name)
        return self.optional(name)

    @property
    def lead(self):
        return self.logp.shape[:-2]

    def rows(self, x):
        """[..., B, T] → [N, B, T] (the leading dimensions flattened)."""
        return x.reshape(-1, *x.shape[-2:])

    @cached_property
    def gate_log_ratio(self):
        """The log-ratio each token's gate sees (its own, or its sequence's at sequence level)."""
        lr = nx.gate_log_ratio(self.rows(self.logp).flatten(0, 1),
                               self.rows(self.logp_old).flatten(0, 1),
                               self.rows(self.mask).flatten(0, 1),
                               getattr(self.method, "level", "token"))
        return lr.reshape(self.logp.shape)

    @cached_property
    def token_log_ratio(self):
        """log ρ_t of each token, 0 on padding."""
        return nx.token_log_ratio(self.logp, self.logp_old, self.mask)

    @cached_property
    def gate(self):
        """f'(ρ; A) of each token at the ratio its gate sees; Missing for an object with no gate."""
        if not callable(getattr(self.method, "gate", None)):
            raise Missing("gate")
        if getattr(self.method, "side_inputs", ()):
            return self._side_gate()
        g = self.method.gate(nx.ratio_from_log(self.gate_log_ratio), self.adv)
        return torch.as_tensor(g).to(self.logp.dtype).expand_as(self.logp)

    def _side_gate(self):
        """A side-input method's gate, run by run (its batch statistics are each run's own),
        with the fields the batch gives derived and the rest from the `side` input; Missing
        (the field's name) when a field it reads was not given."""
        side, rows = self.optional("side"), self.rows(self.logp)
        runs = zip(rows, self.rows(self.logp_old), self.rows(self.adv), self.rows(self.mask),
                   strict=True)
        try:
            gates = [self.method.token_gate(*run, side=_run(side, r, self.logp.shape))
                     for r, run in enumerate(runs)]
        except MissingSide as e:
            raise Missing(f"side.{e.field}") from None
        return torch.stack(gates).reshape(self.logp.shape).to(self.logp.dtype)

    @cached_property
    def weight(self):
        """Each run's own aggregation weight w_t (aggregate(v) = Σ_t w_t·v_t over its rows)."""
        rows = self.rows(self.mask)
        w = nx.aggregation_weight(rows.flatten(0, 1), self.agg).view(rows.shape)
        w = w * nx.run_scale(rows, self.agg)[:, None, None]
        return w.reshape(self.logp.shape).to(self.logp.dtype)

    @cached_property
    def shut(self):
        return self.gate == 0

    @cached_property
    def pos(self):
        return self.mask & (self.adv > 0)

    @cached_property
    def neg(self):
        return self.mask & (self.adv < 0)

    @cached_property
    def live(self):
        return self.mask & (self.adv != 0)

    @cached_property
    def groups(self):
        """`group_stats` of the rollout's rewards (Missing without rewards and a group size)."""
        if self.group is None:
            raise Missing("group")
        return group_stats(self.given("rewards"), self.group)


def share(flags, where):
    """Σ (flags & where) / Σ where over the last two dims; 0 where `where` is empty."""
    n = where.sum((-2, -1))
    hits = (flags & where).sum((-2, -1))
    return torch.where(n > 0, hits / n.clamp(min=1), 0.0)


def masked_mean(x, where):
    """Mean of x over `where`, over the last two dims; 0 where `where` is empty."""
    x = torch.where(where, x, 0.0)
    return x.sum((-2, -1)) / where.sum((-2, -1)).clamp(min=1)


# --- the rollout: rewards and responses ---------------------------------------------------------
@register("reward", "mean sequence reward of the rollout batch", verl="critic/score/mean",
          trl="reward", log=False)
def _reward(b):
    return b.given("rewards").mean(-1)


@register("solved", "share of rollout responses with reward 1", log=False)
def _solved(b):
    return (b.given("rewards") == 1).float().mean(-1)


@register("frac_reward_zero_std", "share of groups whose rewards are all equal (every A = 0)",
          trl="frac_reward_zero_std", log=False)
def _flat_groups(b):
    return b.groups["frac_reward_zero_std"]


@register("solved_groups", "share of groups where every response earned reward 1", log=False)
def _solved_groups(b):
    return b.groups["solved_groups"]


@register("stuck_groups", "share of groups with equal rewards below 1 (all equally wrong)",
          log=False)
def _stuck_groups(b):
    return b.groups["stuck_groups"]


@register("live", "share of responses with A ≠ 0 (groups whose rewards are not all equal)",
          log=False)
def _live(b):
    return b.live.any(-1).to(b.logp.dtype).mean(-1)


@register("length", "mean response length, in tokens (up to and including the end token)",
          trl="completions/mean_length", verl="response_length/mean", log=False)
def _length(b):
    return b.mask.sum(-1).to(b.logp.dtype).mean(-1)


# --- the policy ---------------------------------------------------------------------------------
@register("entropy", "mean per-token entropy of π on the updated tokens (nats)", trl="entropy",
          log=False)
def _entropy(b):
    return masked_mean(b.given("entropy").to(b.logp.dtype), b.mask)


# --- the gate: shut tokens and what they carried -----------------------------------------------
@register("clip_ratio/low_mean", "share of tokens with A < 0, ρ < 1 and gate 0",
          trl="clip_ratio/low_mean", log=False)
def _clip_low(b):
    return share(b.shut & b.neg & (b.gate_log_ratio < 0), b.mask)


@register("clip_ratio/high_mean", "share of tokens with A > 0, ρ > 1 and gate 0",
          trl="clip_ratio/high_mean", log=False)
def _clip_high(b):
    return share(b.shut & b.pos & (b.gate_log_ratio > 0), b.mask)


@register("clip_ratio/region_mean", "the sum of the two: tokens clipped toward the trust region",
          trl="clip_ratio/region_mean", log=False)
def _clip_region(b):
    return _clip_low(b) + _clip_high(b)


@register("pg_clipfrac", "share of tokens clipped (A > 0 above, A < 0 below): verl's name",
          verl="actor/pg_clipfrac", log=False)
def _pg_clipfrac(b):
    return _clip_region(b)


@register("pg_clipfrac_lower", "share of tokens with A < 0 shut above ρ = 1 (dual clip)",
          verl="actor/pg_clipfrac_lower", log=False)
def _pg_clipfrac_lower(b):
    return share(b.shut & b.neg & (b.gate_log_ratio > 0), b.mask)


@register("clipfrac_pos", "share of A > 0 tokens whose gate is exactly zero", log=False)
def _clipfrac_pos(b):
    return share(b.shut, b.pos)


@register("clipfrac_neg", "share of A < 0 tokens whose gate is exactly zero", log=False)
def _clipfrac_neg(b):
    return share(b.shut, b.neg)


@register("gate_zero", "share of A ≠ 0 tokens whose gate is exactly zero")
def _gate_zero(b):
    return share(b.shut, b.live)


@register("gate_mean", "mean gate f'(ρ; A) over tokens with A ≠ 0 (all tokens if none)")
def _gate_mean(b):
    some = b.live.sum((-2, -1)) > 0
    return torch.where(some, masked_mean(b.gate, b.live), masked_mean(b.gate, b.mask))


@register("signal_lost", "share of the aggregated abs(ρ·A) on tokens whose gate is zero",
          log=False)
def _signal_lost(b):
    size = (nx.ratio_from_log(b.gate_log_ratio) * b.adv).abs() * b.weight
    total = torch.where(b.mask, size, 0.0).sum((-2, -1))
    lost = torch.where(b.mask & b.shut, size, 0.0).sum((-2, -1))
    return torch.where(total > 0, lost / total.clamp(min=torch.finfo(size.dtype).tiny), 0.0)


# --- how far the policy moved -------------------------------------------------------------------
@register("ppo_kl", "mean log π_old − log π (k1 estimate of KL(π_old ‖ π)): verl's name",
          verl="actor/ppo_kl", log=False)
def _ppo_kl(b):
    return masked_mean(-b.token_log_ratio, b.mask)


@register("approx_kl", "mean (ρ − 1) − log ρ (k3 estimate, never negative): CleanRL's name",
          log=False)
def _approx_kl(b):
    lr = b.token_log_ratio
    return masked_mean(lr.exp() - 1 - lr, b.mask)


@register("log_ratio_absmax", "largest abs(log ρ) of any token", log=False)
def _log_ratio_absmax(b):
    return torch.where(b.mask, b.token_log_ratio.abs(), 0.0).amax((-2, -1))


# --- the loss -----------------------------------------------------------------------------------
@register("is_weight_mean", "mean behaviour weight applied to the loss (1 without one)",
          log=False)
def _is_weight_mean(b):
    w = b.optional("is_weight")
    return masked_mean(torch.ones_like(b.logp) if w is None else w.to(b.logp.dtype), b.mask)


@register("loss", "the method's loss on these tokens, as they were seen (each run's own)",
          log=False)
def _loss(b):
    if not callable(getattr(b.method, "loss", None)):
        raise Missing("loss")
    side_inputs = getattr(b.method, "side_inputs", ())
    logp, logp_old, adv = b.inputs
    n, w = b.rows(logp).shape[0], b.optional("is_weight")
    runs = zip(b.rows(logp), b.rows(logp_old), adv.reshape(n, *adv.shape[len(b.lead):]),
               b.rows(b.mask), strict=True)
    kws = [{}] * n if w is None else [{"is_weight": x} for x in b.rows(w)]
    if side_inputs:
        side = b.optional("side")
        kws = [{**kw, "side": _run(side, r, b.logp.shape)} for r, kw in enumerate(kws)]
    try:
        out = [b.method.loss(*run, b.agg, **kw) for run, kw in zip(runs, kws, strict=True)]
    except MissingSide as e:
        raise Missing(f"side.{e.field}") from None
    return torch.stack(out).reshape(b.lead).to(b.logp.dtype)


def _run(side, r, shape):
    """Run r's part of a SideInfo given over [..., B, T] (None stays None)."""
    return None if side is None else side.index(r, shape)


@torch.no_grad()
def step_stats(method, logp, logp_old, adv, mask=None, entropy=None, agg=None, *, keys=None,
               skip_missing=False, **inputs) -> dict:
    """Every registered diagnostic of one update (see `table()`): {key: tensor of shape [...]}.

    method: an rlgates Method (anything with `.gate(ratio, adv)`; `.level` "token" or
        "sequence"; `.loss` for the loss). logp, logp_old, mask: [..., B, T]; adv: [..., B] or
        [..., B, T]. entropy: optional [..., B, T] per-token entropy
        (`rlgates.regularisers.entropy(logits)`). agg: the aggregation the loss and
        `signal_lost` use (default: the method's own `.agg`, else token-mean).
    keys: the keys to compute (default: all). inputs: `is_weight`, `rewards`, `group`, `side`
        (`Batch`).
    A key whose input is missing is NaN (skip_missing=True: left out).
    """
    b = Batch(method, logp, logp_old, adv, mask, agg=agg, entropy=entropy, **inputs)
    out = {}
    for key in REGISTRY if keys is None else keys:
        try:
            out[key] = REGISTRY[key].fn(b)
        except Missing:
            if not skip_missing:
                out[key] = torch.full(b.lead, float("nan"), dtype=b.logp.dtype)
    return out


@torch.no_grad()
def token_gates(method, logp, logp_old, adv, mask):
    """(gate, log ρ) per token, [..., B, T]: the gate f'(ρ; A) each token saw and the log-ratio
    it saw (the token's own, or its sequence's at sequence level). adv: [..., B] or [..., B, T]."""
    b = Batch(method, logp, logp_old, adv, mask)
    return b.gate, b.gate_log_ratio


@torch.no_grad()
def group_stats(rewards, group: int, top: float = 1.0) -> dict:
    """Shares of the rollout's groups whose rewards are all equal (every A is then 0).

    rewards: [..., B], B = prompts × `group`, each prompt's `group` responses side by side (as
    `rlgates.group_advantages` takes them). Returns {key: tensor [...]}:
    - `frac_reward_zero_std`: share of groups with zero reward spread (TRL's name; its
      `torch.isclose(std, 0)` test);
    - `solved_groups`: share of groups where every response earned `top`;
    - `stuck_groups`: share of groups with zero spread below `top` (all equally wrong).
    """
    r = rewards.reshape(*rewards.shape[:-1], -1, group)
    std = r.std(-1) if group > 1 else torch.zeros_like(r[..., 0])
    flat = torch.isclose(std, torch.zeros_like(std))
    solved = flat & (r.min(-1).values >= top)
    return {"frac_reward_zero_std": flat.float().mean(-1),
            "solved_groups": solved.float().mean(-1),
            "stuck_groups": (flat & ~solved).float().mean(-1)}


def as_floats(stats: dict) -> dict:
    """{key: float} from `step_stats` without a leading dimension."""
    return {k: float(v) for k, v in stats.items()}


def table(keys=None) -> str:
    """A Markdown table of the registered diagnostics: key, what it measures, verl's and TRL's
    names for the same number ("—": the trainer does not log it under a name of its own)."""
    from .tables import markdown

    def name(n):
        return f"`{n}`" if n else "—"

    rows = [(f"`{k}`", REGISTRY[k].doc, name(REGISTRY[k].verl), name(REGISTRY[k].trl))
            for k in keys or REGISTRY]
    return markdown(rows, ("key", "what it measures", "verl", "TRL"))


__all__ = [
    "REGISTRY", "Batch", "Diagnostic", "Missing", "as_floats", "group_stats", "keys",
    "masked_mean", "register", "share", "step_stats", "table", "token_gates", "unregister",
]
