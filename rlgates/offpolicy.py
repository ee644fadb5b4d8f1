"""Off-policy corrections: importance weights as stop-gradient factors on the shared term.

Asynchronous and engine-sampled training involves three policies:

* the **behaviour** policy μ, which wrote the tokens (the rollout engine, possibly k updates old
  and computed by other kernels); its log-probabilities are recorded at sampling time;
* the **proximal** policy π_prox, the trainer's own policy at the start of the step, recomputed by
  the trainer on the rollout tokens (PPO's "old" policy in decoupled PPO, arXiv:2110.00641, and
  in AReaL, arXiv:2505.24298);
* the **current** policy π_θ, the one being differentiated.

The gate sees ρ = π_θ/π_prox. The gap from μ to π_prox is corrected by a weight
w = π_prox/μ computed without gradient, so the gradient of every method becomes

    ∇J_t = w_t · f'(ρ_t; A_t) · ρ_t · A_t · ∇log π_θ,

a factor outside the gate. The corrections differ only in what they do with w:

* ``tis``: truncated importance sampling, w ← min(w, C) (Yao et al.'s blog "Your efficient RL
  framework secretly brings you off-policy RL training", 2025; verl 0.9.1's ``rollout_is="token"``
  or ``"sequence"`` with ``rollout_is_threshold=2.0``; TRL 1.16's ``token_truncate`` and
  ``sequence_truncate`` modes with ``vllm_importance_sampling_clip_max``);
* ``mis``: masked importance sampling, w ← w·1[w ≤ C] (verl's rejection sampling,
  ``rollout_rs`` with ``rollout_rs_threshold``; TRL's ``token_mask``/``sequence_mask`` modes, its
  default under vLLM ``sequence_mask`` with C = 3; AReaL's ``behav_imp_weight_cap``, which drops
  tokens whose weight exceeds the cap);
* ``icepop``: two-sided masking, w ← w·1[α ≤ w ≤ β] (IcePop, Ring-1T, arXiv:2510.18855; verl's
  IcePop setting ``rollout_is_threshold="0.5_5.0"``, its ``decoupled_token_icepop()`` preset).

tests/test_trainer_facts.py checks these flags against the installed trainers.

Each works at token level (one w_t per token) or at sequence level (w = Π_t w_t, the product over
the response, as verl and TRL compute it, broadcast to every token of the response).

Every method takes the weight as ``m.loss(logp, logp_prox, adv, mask, is_weight=w)`` (and
``m.expected_grad(..., is_weight=w)`` for the closed form). The lab runs a gate with a correction
under lag k: ``lab.train("ppo", cfg.replace(anchor="proximal", correction=Correction("mis")),
seeds, lag=k)``; its own decoupled PPO (``anchor="proximal"``, ``is_cap=2``) is token-level TIS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _numerics as nx

#: kind -> (what it does outside the band, default level, default low, default high, source)
CORRECTIONS = {
    "tis": {"mode": "truncate", "level": "token", "low": None, "high": 2.0,
            "source": "Yao et al. 2025 (TIS blog); verl rollout_is with rollout_is_threshold=2.0; "
                      "TRL *_truncate modes with vllm_importance_sampling_clip_max"},
    "mis": {"mode": "mask", "level": "token", "low": None, "high": 2.0,
            "source": "verl rejection sampling (rollout_rs, rollout_rs_threshold); TRL token_mask "
                      "/ sequence_mask (default sequence_mask, clip_max=3.0); AReaL "
                      "behav_imp_weight_cap"},
    "icepop": {"mode": "mask", "level": "token", "low": 0.5, "high": 5.0,
               "source": "IcePop (Ring-1T, arXiv:2510.18855); verl rollout_is_threshold="
                         "'0.5_5.0' (decoupled_token_icepop)"},
}
LEVELS = ("token", "sequence")


def _threshold(kind, name, value):
    if value is None:
        return None
    return nx.positive_number(value, f"{kind}: {name}")


@dataclass(frozen=True)
class Correction:
    """One importance-weight rule: `kind` (tis, mis, icepop), `level`, and the band [low, high].

    >>> c = Correction("tis")                      # token level, C = 2
    >>> w = c.weight(logp_prox, logp_behaviour, mask)   # [B, T], no gradient
    """

    kind: str = "tis"
    level: str | None = None
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if self.kind not in CORRECTIONS:
            raise ValueError(f"kind must be one of {tuple(CORRECTIONS)}, got {self.kind!r}")
        spec = CORRECTIONS[self.kind]
        level = spec["level"] if self.level is None else self.level
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        low = spec["low"] if self.low is None else self.low
        high = spec["high"] if self.high is None else self.high
        low, high = _threshold(self.kind, "low", low), _threshold(self.kind, "high", high)
        if low is None and high is None:
            raise ValueError(f"{self.kind}: give at least one of low and high")
        if low is not None and high is not None and not low < high:
            raise ValueError(f"{self.kind}: low must be < high, got {low} and {high}")
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def mode(self) -> str:
        return CORRECTIONS[self.kind]["mode"]

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.level[:3]}"

    def apply(self, log_w):
        """The corrected weight from log w (elementwise): truncated, or zero outside the band."""
        log_w = nx.as_float(log_w, "log_w").detach()
        w = nx.ratio_from_log(log_w)  # log w clamped to ±20, as for ρ
        if self.mode == "truncate":
            return w.clamp(self.low, self.high)
        keep = torch.ones_like(w, dtype=torch.bool)
        if self.low is not None:
            keep &= w >= self.low
        if self.high is not None:
            keep &= w <= self.high
        return torch.where(keep, w, 0.0)

    def weight(self, logp_target, logp_behaviour, mask=None):
        """[B, T] stop-gradient weight for w = π_target/μ (zero on padding)."""
        return importance_weight(logp_target, logp_behaviour, mask, self)

    def __repr__(self):
        band = f"[{self.low if self.low is not None else 0:g}, " \
               f"{self.high if self.high is not None else math.inf:g}]"
        return f"Correction({self.kind!r}, level={self.level!r}, {self.mode} outside {band})"


def log_weight(logp_target, logp_behaviour, mask=None, level="token"):
    """[B, T] log w: per token log π_target − log μ, or at sequence level its sum over the
    response (log of the product of token weights), broadcast to every token. Zero on padding."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    logp_target = nx.as_float(logp_target, "logp_target").detach()
    logp_behaviour = nx.as_float(logp_behaviour, "logp_behaviour").detach()
    if logp_target.dim() != 2 or logp_target.shape != logp_behaviour.shape:
        raise ValueError("logp_target and logp_behaviour must both be [B, T], got "
                         f"{tuple(logp_target.shape)} and {tuple(logp_behaviour.shape)}")
    mask = nx.check_mask(mask, logp_target.shape, logp_target.device)
    dtype = nx.compute_dtype(logp_target, logp_behaviour)
    lw = nx.token_log_ratio(logp_target.to(dtype), logp_behaviour.to(dtype), mask)
    if level == "sequence":
        lw = lw.sum(-1, keepdim=True).expand_as(lw)
    return lw, mask


def importance_weight(logp_target, logp_behaviour, mask=None, correction="tis", **kw):
    """The stop-gradient weight w = π_target/μ after `correction` (a kind name or a Correction;
    keywords level/low/high override the kind's defaults). [B, T], zero on padding."""
    if not isinstance(correction, Correction):
        correction = Correction(correction, **kw)
    elif kw:
        raise ValueError("pass level/low/high either in the Correction or as keywords, not both")
    lw, mask = log_weight(logp_target, logp_behaviour, mask, correction.level)
    return torch.where(mask, correction.apply(lw), 0.0)


@dataclass(frozen=True)
class Unweighted:
    """No behaviour weight: w̄ = 1 on every real token (zero on padding).

    With the lab's proximal anchor, `LabConfig(anchor="proximal", correction=Unweighted())`
    keeps decoupled PPO's anchor and drops its weight, so a comparison with decoupled PPO
    changes the weight alone.
    """

    label = "none"

    def weight(self, logp_target, logp_behaviour, mask=None):
        lw, mask = log_weight(logp_target, logp_behaviour, mask)
        return mask.to(lw.dtype)


__all__ = ["CORRECTIONS", "LEVELS", "Correction", "Unweighted", "importance_weight",
           "log_weight"]
