"""Clip the importance weight, not the update: CISPO. No token is ever dropped.

    gradient = sg(clip(ρ, 1−ε_l, 1+ε_h))·A·∇log π,  so  f' = clip(ρ)/ρ  (never 0)
"""

from __future__ import annotations

import math
from decimal import Decimal

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register


@register
class CISPO(Method):
    """CISPO: clip the importance weight, not the update, so that no token is ever dropped.

    The paper's objective is J = sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π. Its gradient is
    clip(ρ)·A·∇log π = (clip(ρ)/ρ)·ρ·A·∇log π, so in our lens the gate is f' = clip(ρ)/ρ: 1 inside
    the window, (1+ε_h)/ρ above it, (1−ε_l)/ρ below it, and never 0.

    Two objectives, one gradient:

    - `loss` (and so training) uses CISPO's own form above, as trainers write it. Its *value* is
      not f·A (it carries log π, not a function of ρ alone); its *gradient* is eq. 5's.
    - `weight` is a genuine antiderivative of the gate, continuous, with f(1) = 1 for every
      window: f = 1 + ∫₁^ρ clip(u)/u du. With 1 in the window (ε_h ≥ 0): f = ρ inside,
      (1+ε_h)·(1 + log(ρ/(1+ε_h))) above, (1−ε_l)·(1 + log(ρ/(1−ε_l))) below. With the cap
      below 1 (ε_h < 0, H = 1+ε_h) ρ = 1 lies above the window: f = 1 + H·log ρ above the cap
      (f(1) = 1, f'(1) = H), and the window's and lower branches are the ones above shifted by
      the constant 1 − H + H·log H that keeps f continuous. `objective` = f·A is what the plane
      figures and a PPO-style loss would use.

    Defaults: MiniMax-M1 sets no lower bound in practice (ε_l large) and tunes only ε_h; we found
    no value of ε_h printed in the report. We take ε_l = 1 (lower bound 0: no lower clip, since
    ρ > 0) and ε_h = 4 (upper bound 5), the default of public trainers that cite the ScaleRL
    recipe (Khatri et al. 2025, arXiv:2510.13786). ε_l ≥ 0; any ε_l ≥ 1 means no lower bound
    (1 − ε_l ≤ 0 < ρ), as verl computes it with clip_ratio_low above 1. ε_h > −1: the cap
    1 + ε_h may lie below 1, since TRL's `epsilon_high` is the cap itself and GRPOConfig's
    default leaves it at `epsilon` = 0.2 (TRL's default CISPO is `eps_high=-0.8`: on policy
    every token's gradient is 0.2·A·∇log π). The window must not be empty: ε_h ≥ −ε_l.
    """

    name, title, date, order = "cispo", "CISPO", "June 2025", 8
    paper = "MiniMax 2025, MiniMax-M1, arXiv:2506.13585"
    defaults = {"eps_low": 1.0, "eps_high": 4.0}
    agg_source = "MiniMax-M1 normalises CISPO's loss by the total token count of the batch."
    trainer_flags = {
        "verl": {"loss_mode": "cispo", "clip_ratio_low": "eps_low", "clip_ratio_high": "eps_high",
                 "loss_agg_mode": "token-mean"},
        # TRL caps the ratio at epsilon_high itself (an absolute cap; unset, it is epsilon's
        # 0.2: eps_high=-0.8) and has no lower clip
        "trl": lambda h: None if h["eps_low"] < 1 else {
            "loss_type": "cispo", "epsilon_high": _one_plus(h["eps_high"]),
            "importance_sampling_level": "token"},
    }
    color = "#e6ab02"
    log_ratio_lim = 2.0
    slider_ranges = {"eps_low": (0.0, 1.0, 0.01), "eps_high": (-0.95, 10.0, 0.05)}
    explorer = {
        # ε_l ≥ 1 means no lower bound: none is drawn. The sliders can also set an empty window
        # (1 − ε_l > 1 + ε_h), which rlgates refuses: it is drawn as torch.clamp (and verl)
        # compute it, every weight at the cap, with the cap's edge alone
        "gate": "Math.min(Math.max(r, 1 - p.eps_low), 1 + p.eps_high) / r",
        "bounds": ("1 - p.eps_low > 0 && 1 - p.eps_low <= 1 + p.eps_high"
                   " ? [[1 + p.eps_high, 0], [1 - p.eps_low, 0]] : [[1 + p.eps_high, 0]]"),
    }
    f_latex = (r"\int_1^{\rho_t}\frac{\operatorname{clip}(u,\,1-\epsilon_l,\,1+\epsilon_h)}{u}\,du"
               r"+1\quad\big(\text{loss: }\operatorname{sg}[\operatorname{clip}(\rho_t)]"
               r"\,A_t\log\pi_\theta\big)")
    gate_latex = r"\operatorname{clip}(\rho_t,\,1-\epsilon_l,\,1+\epsilon_h)\,/\,\rho_t"
    gate_text = "clip(ρ, 1−ε_l, 1+ε_h)/ρ (never 0)"
    insight = (
        "Clip the weight, not the token: a token far outside the window still gets a bounded "
        "gradient, so rare tokens keep learning."
    )

    def _validate(self):
        h = self.hparams
        h["eps_low"] = _hparam(self.name, "eps_low", h["eps_low"], low=0)  # ≥ 1: no lower bound
        # a cap 1 + ε_h > 0, below 1 too (TRL's default CISPO caps at 0.2)
        h["eps_high"] = _hparam(self.name, "eps_high", h["eps_high"], low=-1, low_open=True)
        self.low, self.high = 1 - h["eps_low"], 1 + h["eps_high"]
        if self.low > self.high:
            raise ValueError(
                f"{self.name}: the window (1 − eps_low, 1 + eps_high) = ({self.low:g}, "
                f"{self.high:g}) is empty: eps_high must be ≥ -eps_low = {-h['eps_low']:g}, got "
                f"{h['eps_high']!r}")

    def clipped(self, ratio):
        """clip(ρ, 1−ε_l, 1+ε_h): the (stop-gradient) importance weight of CISPO's loss."""
        return torch.clamp(ratio, self.low, self.high)

    def _weight(self, ratio, adv, side=None):
        """f = 1 + ∫₁^ρ clip(u)/u du, branch by branch (see the class docstring)."""
        lo, hi = self.low, self.high
        if hi >= 1:  # 1 in the window: f = ρ there, so f(1) = 1
            high, shift = hi * (1 + torch.log(ratio / hi)), 0.0
        else:  # the cap below 1: ρ = 1 is above the window, where f = 1 + H·log ρ
            high, shift = 1 + hi * torch.log(ratio), 1 - hi + hi * math.log(hi)
        f = torch.where(ratio > hi, high, ratio + shift)
        if lo > 0:  # with no lower bound the middle branch reaches down to ρ = 0
            safe = torch.where(ratio < lo, ratio, lo)  # no log(0) in a dead branch
            low = lo * (1 + torch.log(safe / lo)) + shift
            f = torch.where(ratio < lo, low, f)
        return f

    def _gate(self, ratio, adv, side=None):
        return self.clipped(ratio) / ratio

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """CISPO's own J_t = sg(clip(ρ))·A·log π, as trainers write it (the value differs from
        f·A; the gradient not). Padding's log-ratio is masked to 0, so its weight is a finite 1,
        and `aggregate` drops its value."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp.detach(), logp_old, mask))
        return self.clipped(ratio) * adv * logp

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """clip(ρ)·A. Unlike the clipped losses, the ±20 log-ratio clamp does not zero the
        gradient here: it flows through log π directly, and the clamp only affects the weight."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp, logp_old, mask))
        return self.clipped(ratio) * adv

    def bounds(self):
        edges = [(self.high, 0)]
        if self.low > 0:
            edges.append((self.low, 0))
        return edges


def _one_plus(x: float) -> float:
    """1 + x as decimals add (1 + −0.8 is 0.2, where floats give 0.19999999999999996), so that
    TRL's `epsilon_high` reads as the cap one would type, and maps back to the same ε_h."""
    return float(Decimal(1) + Decimal(repr(float(x))))
