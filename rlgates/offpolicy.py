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
* ``mis``: masked importance sampling, w ← w·1[w ≤ C] (TRL's ``token_mask``/``sequence_mask``
  modes, its default under vLLM ``sequence_mask`` with C = 3; AReaL's ``behav_imp_weight_cap``,
  which drops tokens whose weight exceeds the cap). verl has no exact equivalent: its rejection
  sampling, ``rollout_rs`` with ``rollout_rs_threshold``, needs both bounds for its ratio
  options, removes a rejected token from the mask (and so from the token mean's denominator,
  where MIS's weight 0 keeps it), and weighs a kept token 1 unless ``rollout_is`` is set too;
* ``icepop``: two-sided masking, w ← w·1[α ≤ w ≤ β] (IcePop, Ring-1T, arXiv:2510.18855; verl's
  IcePop setting ``rollout_is_threshold="0.5_5.0"``, its ``decoupled_token_icepop()`` preset).

tests/test_trainer_facts.py checks these flags against the installed trainers.

Two more rules, from trainers outside verl and TRL, decide a token's weight from more than its
own w:

* ``seq_mask_tis``: OpenRLHF's sequence-masked TIS, w ← w_t·1[α ≤ exp(mean_t log w_t) ≤ β]:
  a response is kept when the geometric mean of its token weights lies in the band, and each kept
  token then carries its own, untruncated weight (OpenRLHF 0.11.2, openrlhf/models/loss.py
  ``PolicyLoss.forward`` with ``--algo.advantage.is_correction_level seq``,
  ``is_correction_mode mask``, ``is_correction_gating ratio``; band [0.5, 5.0] by default);
* ``m2po``: AReaL's second-moment mask (M2PO, Zheng et al. 2025, arXiv:2510.01161),
  w ← 1[token kept]: over the batch's real tokens, drop those with the largest (log w)² until the
  mean of the rest is below τ (AReaL 1.0.4, areal/trainer/ppo/actor.py ``_apply_m2po_masking``,
  ``actor.m2_threshold``; τ = 0.04 in examples/math/gsm8k_m2po.yaml). It weighs a kept token 1:
  AReaL's example multiplies in decoupled PPO's weight as well, which here is one more
  correction's weight multiplied in.

Each of the first three works at token level (one w_t per token) or at sequence level
(w = Π_t w_t, the product over the response, as verl and TRL compute it, broadcast to every token
of the response); ``seq_mask_tis`` reads its response's geometric mean (level "sequence" only) and
``m2po`` the whole batch (level "token" only).

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
            "source": "TRL token_mask / sequence_mask (default sequence_mask, clip_max=3.0); "
                      "AReaL behav_imp_weight_cap; verl: no exact equivalent (rollout_rs drops "
                      "rejected tokens from the mask and the normaliser)"},
    "icepop": {"mode": "mask", "level": "token", "low": 0.5, "high": 5.0,
               "source": "IcePop (Ring-1T, arXiv:2510.18855); verl rollout_is_threshold="
                         "'0.5_5.0' (decoupled_token_icepop)"},
    # the sequence's geometric mean gates, each kept token keeps its own weight
    "seq_mask_tis": {"mode": "sequence-mask", "level": "sequence", "low": 0.5, "high": 5.0,
                     "source": "OpenRLHF 0.11.2 openrlhf/models/loss.py PolicyLoss.forward, "
                               "is_correction_level='seq', is_correction_mode='mask', "
                               "is_correction_gating='ratio', is_correction_threshold "
                               "[0.5, 5.0] (openrlhf/cli/train_ppo_ray.py: 'seq-mask-tis')"},
    # `high` is the second-moment threshold τ, not a bound on w
    "m2po": {"mode": "second-moment", "level": "token", "low": None, "high": 0.04,
             "source": "M2PO (arXiv:2510.01161); AReaL 1.0.4 areal/trainer/ppo/actor.py "
                       "_apply_m2po_masking / _get_m2po_loss_mask, actor.m2_threshold (0.04 in "
                       "examples/math/gsm8k_m2po.yaml)"},
}
LEVELS = ("token", "sequence")
#: the kinds whose rule fixes the level: kind -> the only level it takes
FIXED_LEVEL = {"seq_mask_tis": "sequence", "m2po": "token"}


def _threshold(kind, name, value):
    if value is None:
        return None
    return nx.positive_number(value, f"{kind}: {name}")


@dataclass(frozen=True)
class Correction:
    """One importance-weight rule: `kind` (tis, mis, icepop, seq_mask_tis, m2po), `level`, and
    the band [low, high] (for m2po, `high` is the threshold τ on the mean of (log w)²).

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
        if self.kind in FIXED_LEVEL and level != FIXED_LEVEL[self.kind]:
            raise ValueError(f"{self.kind} works at level {FIXED_LEVEL[self.kind]!r} only, got "
                             f"{level!r}")
        if self.kind == "m2po" and self.low is not None:
            raise ValueError("m2po takes one threshold, high (τ); low must be None")
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

    def apply(self, log_w, mask=None):
        """The corrected weight from log w: truncated, or zero outside the band (elementwise).
        `seq_mask_tis` reads each row of `log_w` as one response (its mean over the row's real
        tokens gates it) and `m2po` the real tokens of the whole tensor as one batch; `mask`
        (default: every entry real) says which entries are real tokens."""
        log_w = nx.as_float(log_w, "log_w").detach()
        w = nx.ratio_from_log(log_w)  # log w clamped to ±20, as for ρ
        if self.mode in ("sequence-mask", "second-moment"):
            real = torch.ones_like(log_w, dtype=torch.bool) if mask is None else mask.bool()
            if self.mode == "second-moment":
                return m2po_keep(log_w, real, self.high).to(w.dtype)
            log_w = torch.where(real, log_w, 0.0)
            mean = log_w.sum(-1, keepdim=True) / real.sum(-1, keepdim=True).clamp(min=1)
            return torch.where(self._in_band(nx.ratio_from_log(mean)), w, 0.0)
        if self.mode == "truncate":
            return w.clamp(self.low, self.high)
        return torch.where(self._in_band(w), w, 0.0)

    def _in_band(self, w):
        keep = torch.ones_like(w, dtype=torch.bool)
        if self.low is not None:
            keep &= w >= self.low
        if self.high is not None:
            keep &= w <= self.high
        return keep

    def weight(self, logp_target, logp_behaviour, mask=None):
        """[B, T] stop-gradient weight for w = π_target/μ (zero on padding)."""
        return importance_weight(logp_target, logp_behaviour, mask, self)

    def __repr__(self):
        if self.mode == "second-moment":
            return (f"Correction({self.kind!r}, level={self.level!r}, drop the largest (log w)² "
                    f"until their mean < {self.high:g})")
        band = f"[{self.low if self.low is not None else 0:g}, " \
               f"{self.high if self.high is not None else math.inf:g}]"
        return f"Correction({self.kind!r}, level={self.level!r}, {self.mode} outside {band})"


def m2po_keep(log_w, real, threshold):
    """M2PO's pick, as AReaL 1.0.4 computes it (areal/trainer/ppo/actor.py,
    `_apply_m2po_masking` and `_get_m2po_loss_mask`): the second moments M2 = (log w)² of the
    real tokens, sorted in decreasing order; the largest are dropped until the mean of the rest
    is below `threshold`, and at least one token is kept. A bool tensor, False on padding."""
    m2 = log_w * log_w
    flat = real.reshape(-1)
    selected = m2.reshape(-1)[flat]
    keep = torch.zeros_like(flat)
    if selected.numel() == 0:
        return keep.view_as(real)
    ordered, indices = torch.sort(selected, descending=True)
    suffix = ordered.flip(0).cumsum(0).flip(0)
    counts = torch.arange(ordered.numel(), 0, -1, dtype=ordered.dtype)
    below = torch.where(suffix / counts < threshold)[0]
    n_drop = int(below[0]) if below.numel() else ordered.numel() - 1
    kept_sorted = torch.ones_like(ordered, dtype=torch.bool)
    kept_sorted[:n_drop] = False
    keep[flat] = kept_sorted[torch.argsort(indices)]
    return keep.view_as(real)


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
    if correction.mode in ("sequence-mask", "second-moment"):  # token weights, a wider rule
        lw, mask = log_weight(logp_target, logp_behaviour, mask, "token")
        return torch.where(mask, correction.apply(lw, mask), 0.0)
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


__all__ = ["CORRECTIONS", "FIXED_LEVEL", "LEVELS", "Correction", "Unweighted",
           "importance_weight", "log_weight", "m2po_keep"]
