"""Per-step training diagnostics, named as the trainers name them.

    >>> from rlgates import diagnostics
    >>> stats = diagnostics.step_stats(m, logp, logp_old, adv, mask, entropy=ent)
    >>> stats["clip_ratio/high_mean"], stats["ppo_kl"], stats["signal_lost"]

Every statistic is read off the method's own gate f'(ρ; A), so it means the same thing for
every method: a token is *shut* when its gate is exactly zero (it sends no gradient). For the
clip family (ppo, grpo, dapo, gspo, dual_clip) the shut tokens are exactly the tokens the
trainers count as clipped, so the trainers' names apply; for other gates (sao, a window on both
sides; sapo, a smooth gate with no exact zero) the same formula still says how many tokens sent
no gradient. ρ is the ratio the gate sees: the token's own, or the sequence's ρ_s at sequence
level (GSPO), as TRL computes it with `importance_sampling_level="sequence"`.

Which trainer logs which number (verl prefixes its names with ``actor/``):

- ``clip_ratio/low_mean`` (TRL's name): share of tokens with A < 0, ρ < 1 and gate 0.
- ``clip_ratio/high_mean`` (TRL's name): share of tokens with A > 0, ρ > 1 and gate 0.
- ``clip_ratio/region_mean`` (TRL's name): the sum of the two.
- ``pg_clipfrac`` (verl's ``actor/pg_clipfrac``): the same number as ``clip_ratio/region_mean``.
- ``pg_clipfrac_lower`` (verl's ``actor/pg_clipfrac_lower``): share of tokens with A < 0,
  ρ > 1 and gate 0, the region dual clip shuts.
- ``ppo_kl`` (verl's ``actor/ppo_kl``): mean of log π_old − log π, the k1 estimate of
  KL(π_old ‖ π).
- ``entropy``: mean per-token entropy of the policy passed in, nats, over the real tokens: TRL's
  ``entropy`` (its token mean over the batch). verl's ``actor/entropy`` is another quantity: the
  entropy of π_old, at the recompute of the old log-probs (``ray_trainer.py`` and the v1
  trainer's ``trainer_base.py``), aggregated with the actor's ``loss_agg_mode`` (token-mean by
  default, where the two agree at ρ ≡ 1).
- ``approx_kl`` (CleanRL's ``losses/approx_kl``): mean of (ρ − 1) − log ρ, the k3 estimate,
  never negative.
- ours: ``clipfrac_pos`` and ``clipfrac_neg`` (share of the A > 0, resp. A < 0, tokens that are
  shut), ``log_ratio_absmax`` (largest token abs(log ρ)), ``gate_mean`` (mean gate over tokens
  with A ≠ 0) and ``signal_lost`` (share of the aggregated abs(ρ·A) on shut tokens).
- ``frac_reward_zero_std`` (TRL's name), from ``group_stats(rewards, group)``: share of the
  groups whose rewards are all equal, split into ``solved_groups`` and ``stuck_groups``.

All shares of tokens are over the valid (unmasked) tokens of the batch, as both trainers do
(verl `masked_mean` per micro-batch, TRL `global_masked_mean` over all processes). TRL's `kl`
is a different number, the KL to a frozen reference model, logged only when its β ≠ 0; CleanRL
logs `approx_kl` as here. Names checked against verl's `compute_policy_loss_vanilla`
(verl/trainer/ppo/core_algos.py) and TRL's `GRPOTrainer._compute_loss`
(trl/trainer/grpo_trainer.py).

Every function accepts leading dimensions (a runs dimension [R, B, T] in the lab) and reduces
only over the last two, so `step_stats` returns one value per run.
"""

from __future__ import annotations

import torch

from . import _numerics as nx

#: The keys `step_stats` returns, in order.
KEYS = (
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
    "pg_clipfrac", "pg_clipfrac_lower", "clipfrac_pos", "clipfrac_neg",
    "ppo_kl", "approx_kl", "log_ratio_absmax", "entropy", "gate_mean", "signal_lost",
)

#: The trainer that logs each key under that name (keys absent here are ours).
TRAINER_NAMES = {
    "clip_ratio/low_mean": "TRL",
    "clip_ratio/high_mean": "TRL",
    "clip_ratio/region_mean": "TRL",
    "pg_clipfrac": "verl (actor/pg_clipfrac)",
    "pg_clipfrac_lower": "verl (actor/pg_clipfrac_lower)",
    "ppo_kl": "verl (actor/ppo_kl)",
    "entropy": "TRL (entropy); verl's actor/entropy is π_old's, under loss_agg_mode",
    "approx_kl": "CleanRL (losses/approx_kl)",
}


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the softmax over the last dimension (nats): [..., T]."""
    logp_all = torch.log_softmax(logits, -1)
    return -(logp_all.exp() * logp_all).sum(-1)


@torch.no_grad()
def token_gates(method, logp, logp_old, adv, mask):
    """(gate, log ρ) per token, [..., B, T]: the gate f'(ρ; A) each token saw and the log-ratio
    it saw (the token's own, or its sequence's at sequence level). adv: [..., B] or [..., B, T]."""
    logp = logp.detach()
    mask = nx.check_mask(mask, logp.shape, logp.device)
    if adv.dim() == logp.dim() - 1:
        adv = adv[..., None]
    adv = adv.detach().to(logp.dtype).expand_as(logp)
    T = logp.shape[-1]
    flat = (logp.reshape(-1, T), logp_old.reshape(-1, T).to(logp.dtype), mask.reshape(-1, T))
    level = getattr(method, "level", "token")
    gate_lr = nx.gate_log_ratio(*flat, level).reshape(logp.shape)
    gate = method.gate(nx.ratio_from_log(gate_lr), adv)
    return torch.as_tensor(gate).to(logp.dtype).expand_as(logp), gate_lr


def _share(flags, where):
    """Σ (flags & where) / Σ where over the last two dims; 0 where `where` is empty."""
    n = where.sum((-2, -1))
    hits = (flags & where).sum((-2, -1))
    return torch.where(n > 0, hits / n.clamp(min=1), 0.0)


def _masked_mean(x, mask):
    x = torch.where(mask, x, 0.0)
    return x.sum((-2, -1)) / mask.sum((-2, -1)).clamp(min=1)


@torch.no_grad()
def step_stats(method, logp, logp_old, adv, mask=None, entropy=None, agg=None) -> dict:
    """The diagnostics of one update (see the module's table): {key: tensor of shape [...]}.

    method: an rlgates Method (anything with `.gate(ratio, adv)`; `.level` "token" or
        "sequence"). logp, logp_old, mask: [..., B, T]; adv: [..., B] or [..., B, T].
    entropy: optional [..., B, T] per-token entropy (`token_entropy(logits)`); NaN without it.
    agg: the aggregation whose token weights `signal_lost` uses (default: the method's own
        `.agg`, else token-mean).
    """
    logp = logp.detach()
    mask = nx.check_mask(mask, logp.shape, logp.device)
    if adv.dim() == logp.dim() - 1:
        adv = adv[..., None]
    adv = adv.detach().to(logp.dtype).expand_as(logp)
    lead, T = logp.shape[:-1], logp.shape[-1]
    flat = (logp.reshape(-1, T), logp_old.reshape(-1, T).to(logp.dtype), mask.reshape(-1, T))
    gate, gate_lr = token_gates(method, logp, logp_old, adv, mask)
    ratio = nx.ratio_from_log(gate_lr)
    shut = gate == 0
    pos, neg = mask & (adv > 0), mask & (adv < 0)
    up, down = gate_lr > 0, gate_lr < 0

    low = _share(shut & neg & down, mask)
    high = _share(shut & pos & up, mask)
    token_lr = nx.token_log_ratio(*flat).reshape(logp.shape)
    agg = agg or getattr(method, "agg", None) or "token-mean"
    w = nx.aggregation_weight(flat[2], agg).reshape(logp.shape).to(logp.dtype)
    size = (ratio * adv).abs() * w
    total = torch.where(mask, size, 0.0).sum((-2, -1))
    lost = torch.where(mask & shut, size, 0.0).sum((-2, -1))
    live = mask & (adv != 0)
    tiny = torch.finfo(logp.dtype).tiny
    stats = {
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low + high,
        "pg_clipfrac": low + high,
        "pg_clipfrac_lower": _share(shut & neg & up, mask),
        "clipfrac_pos": _share(shut, pos),
        "clipfrac_neg": _share(shut, neg),
        "ppo_kl": _masked_mean(-token_lr, mask),
        "approx_kl": _masked_mean(token_lr.exp() - 1 - token_lr, mask),
        "log_ratio_absmax": torch.where(mask, token_lr.abs(), 0.0).amax((-2, -1)),
        "entropy": (_masked_mean(entropy.detach().to(logp.dtype), mask) if entropy is not None
                    else torch.full(lead[:-1], float("nan"), dtype=logp.dtype)),
        "gate_mean": torch.where(live.sum((-2, -1)) > 0, _masked_mean(gate, live),
                                 _masked_mean(gate, mask)),
        "signal_lost": torch.where(total > 0, lost / total.clamp(min=tiny), 0.0),
    }
    return {k: stats[k] for k in KEYS}


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


__all__ = [
    "KEYS", "TRAINER_NAMES", "as_floats", "group_stats", "step_stats", "token_entropy",
    "token_gates",
]
