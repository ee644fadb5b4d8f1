"""Part II methods, through the same lens: dual-clip PPO, CISPO and plain REINFORCE.

Each is a `Method` with the Part I contract (f, f', signal, loss, expected_grad, LaTeX, insight)
and is registered into `rlgates.methods.REGISTRY` when this module is imported (rlgates does so).

    dual_clip  f = PPO's f for A > 0; min(max(ρ, 1−ε), c) for A ≤ 0
               f' = 1[A>0, ρ<1+ε] + 1[A<0, 1−ε<ρ<c]
    cispo      gradient sg(clip(ρ, 1−ε_l, 1+ε_h))·A·∇log π, so f' = clip(ρ)/ρ (never zero)
    reinforce  f = ρ, f' = 1: the plain importance-weighted policy gradient
"""

from __future__ import annotations

import torch

from . import _numerics as nx
from .methods import PPO, REGISTRY, Method, _hparam


class DualClip(PPO):
    """Dual-clip PPO: PPO's clip, plus a cap c on the loss of negative-advantage tokens.

    For A < 0 PPO's loss −A·max(ρ, 1−ε) = |A|·max(ρ, 1−ε) grows without bound in ρ; dual-clip caps
    it at c·|A| (trainers write min(−c·A, PPO's loss)). So f = min(max(ρ, 1−ε), c) for A ≤ 0, and
    the gate closes again once ρ ≥ c. At the edges ρ = 1±ε and ρ = c the gate is 0, as in Part I.
    """

    name, title, date = "dual_clip", "Dual-clip PPO", "December 2019"
    paper = ("Ye et al. 2020, Mastering Complex Control in MOBA Games with Deep Reinforcement "
             "Learning, arXiv:1912.09729")
    defaults = {"eps": 0.2, "c": 3.0}
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon) & A_t>0\\"
               r"\min\!\big(\max(\rho_t,\,1-\epsilon),\,c\big) & A_t\le 0\end{cases}")
    gate_latex = (r"\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon]"
                  r"+\mathbf{1}[A_t<0,\ 1-\epsilon<\rho_t<c]")
    insight = (
        "PPO plus a ceiling for bad tokens: a negative-advantage token whose ratio has run past c "
        "stops pushing, so one stale token cannot dominate the batch."
    )

    def _validate(self):
        super()._validate()
        self.hparams["c"] = _hparam(self.name, "c", self.hparams["c"], low=1, low_open=True)
        self.c = self.hparams["c"]

    def _weight(self, ratio, adv):
        # torch.where with a constant branch, so that autograd's derivative at ρ = c is the gate's 0
        upper = torch.where(ratio < self.high, ratio, self.high)
        lower = torch.where(ratio > self.low, ratio, self.low)
        capped = torch.where(ratio < self.c, lower, self.c)
        return torch.where(adv > 0, upper, capped)

    def _gate(self, ratio, adv):
        open_pos = (adv > 0) & (ratio < self.high)
        open_neg = (adv < 0) & (ratio > self.low) & (ratio < self.c)
        return (open_pos | open_neg).to(ratio.dtype)

    def bounds(self):
        return [(self.high, +1), (self.low, -1), (self.c, -1)]


class CISPO(Method):
    """CISPO: clip the importance weight, not the update, so that no token is ever dropped.

    The paper's objective is J = sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π. Its gradient is
    clip(ρ)·A·∇log π = (clip(ρ)/ρ)·ρ·A·∇log π, so in our lens the gate is f' = clip(ρ)/ρ: 1 inside
    the window, (1+ε_h)/ρ above it, (1−ε_l)/ρ below it, and never 0.

    Two objectives, one gradient:
    - `loss` (and so training) uses CISPO's own form above, as trainers write it. Its *value* is
      not f·A (it carries log π, not a function of ρ alone); its *gradient* is eq. 5's.
    - `weight` is a genuine antiderivative of the gate, continuous, with f(1) = 1:
      f = ρ inside, (1+ε_h)·(1 + log(ρ/(1+ε_h))) above, (1−ε_l)·(1 + log(ρ/(1−ε_l))) below.
      `objective` = f·A is what the plane figures and a PPO-style loss would use.

    Defaults: MiniMax-M1 sets no lower bound in practice (ε_l large) and tunes only ε_h; we found
    no value of ε_h printed in the report. We take ε_l = 1 (lower bound 0: no lower clip, since
    ρ > 0) and ε_h = 4 (upper bound 5), the default of public trainers that cite the ScaleRL
    recipe (Khatri et al. 2025, arXiv:2510.13786). ε_l must lie in [0, 1] (use 1 for "no lower
    bound"); ε_h ≥ 0.
    """

    name, title, date = "cispo", "CISPO", "June 2025"
    paper = "MiniMax 2025, MiniMax-M1, arXiv:2506.13585"
    defaults = {"eps_low": 1.0, "eps_high": 4.0}
    f_latex = (r"\int_1^{\rho_t}\frac{\operatorname{clip}(u,\,1-\epsilon_l,\,1+\epsilon_h)}{u}\,du"
               r"+1\quad\big(\text{loss: }\operatorname{sg}[\operatorname{clip}(\rho_t)]"
               r"\,A_t\log\pi_\theta\big)")
    gate_latex = r"\operatorname{clip}(\rho_t,\,1-\epsilon_l,\,1+\epsilon_h)\,/\,\rho_t"
    insight = (
        "Clip the weight, not the token: a token far outside the window still gets a bounded "
        "gradient, so rare tokens keep learning."
    )

    def _validate(self):
        h = self.hparams
        h["eps_low"] = _hparam(self.name, "eps_low", h["eps_low"], low=0)
        if h["eps_low"] > 1:
            raise ValueError(f"cispo: eps_low must be ≤ 1 (1 means no lower bound), "
                             f"got {h['eps_low']!r}")
        h["eps_high"] = _hparam(self.name, "eps_high", h["eps_high"], low=0)
        self.low, self.high = 1 - h["eps_low"], 1 + h["eps_high"]

    def clipped(self, ratio):
        """clip(ρ, 1−ε_l, 1+ε_h): the (stop-gradient) importance weight of CISPO's loss."""
        return ratio.clamp(self.low, self.high)

    def _weight(self, ratio, adv):
        high = self.high * (1 + torch.log(ratio / self.high))
        f = torch.where(ratio > self.high, high, ratio)
        if self.low > 0:  # with no lower bound the middle branch reaches down to ρ = 0
            safe = torch.where(ratio < self.low, ratio, self.low)  # no log(0) in a dead branch
            low = self.low * (1 + torch.log(safe / self.low))
            f = torch.where(ratio < self.low, low, f)
        return f * torch.ones_like(adv)

    def _gate(self, ratio, adv):
        return (self.clipped(ratio) / ratio) * torch.ones_like(adv)

    def token_objective(self, logp, logp_old, adv, mask):
        """CISPO's own J_t = sg(clip(ρ))·A·log π (the value differs from f·A; the gradient not)."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp.detach(), logp_old, mask))
        return self.clipped(ratio) * adv * torch.where(mask, logp, 0.0)

    def expected_grad(self, logp, logp_old, adv, mask=None, agg="token-mean"):
        """−clip(ρ)·A·w_t. Unlike the Part I losses, the ±20 log-ratio clamp does not zero the
        gradient here: it flows through log π directly, and the clamp only affects the weight."""
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask, agg)
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp, logp_old, mask))
        w = nx.aggregation_weight(mask, agg).to(logp.dtype)
        return -self.clipped(ratio) * adv * w

    def bounds(self):
        edges = [(self.high, 0)]
        if self.low > 0:
            edges.append((self.low, 0))
        return edges


class Reinforce(Method):
    """f = ρ, f' = 1: the unclipped importance-weighted policy gradient ρ·A·∇log π.

    On-policy (ρ = 1) this is REINFORCE with the advantage as its baseline-corrected return.
    """

    name, title, date = "reinforce", "REINFORCE", "1992"
    paper = ("Williams 1992, Simple statistical gradient-following algorithms for connectionist "
             "reinforcement learning, Machine Learning 8:229-256 (no arXiv id)")
    defaults: dict = {}
    f_latex = r"\rho_t"
    gate_latex = r"1"
    insight = (
        "No gate at all: every token passes, however far its ratio has moved. The baseline the "
        "other gates are measured against."
    )

    def _weight(self, ratio, adv):
        return ratio * torch.ones_like(adv)

    def _gate(self, ratio, adv):
        return torch.ones(torch.broadcast_shapes(ratio.shape, adv.shape), dtype=ratio.dtype,
                          device=ratio.device)


PART_TWO = (DualClip, CISPO, Reinforce)
for _cls in PART_TWO:
    REGISTRY[_cls.name] = _cls

__all__ = ["CISPO", "PART_TWO", "DualClip", "Reinforce"]
