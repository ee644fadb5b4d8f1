"""The geometric mean of the clipped token ratios: GMPO (verl's `geo_mean`).

    J_i = A_i · exp( (1/|o_i|) Σ_t log f(ρ_t; A) ),  f = PPO's clip on the window (e^−ε_l, e^ε_h)
    token t's gradient: 1[A>0, ρ_t<e^ε_h] + 1[A<0, ρ_t>e^−ε_l], times ρ̄_i·A·∇log π_t

GRPO averages f·A over a response's tokens; GMPO takes the geometric mean of the f's. The gate
that opens or shuts token t reads its own ratio ρ_t; the ratio in its signal is the response's
ρ̄_i = exp(mean_t log f(ρ_t; A)), shared by every token of the response.
"""

from __future__ import annotations

import math

import torch

from .. import _numerics as nx
from ._base import _hparam, register
from .clip import SignClip


@register
class GMPO(SignClip):
    """GMPO: the geometric mean of the tokens' sign-aware clipped ratios, times A.

    Per response, J = A·exp(mean_t log f(ρ_t; A)) with f PPO's clip in log space: log ρ_t is
    capped at ε_h for A > 0 and floored at −ε_l for A < 0. Token t's gradient is its own gate
    f'(ρ_t; A) (PPO's, on the window (e^−ε_l, e^ε_h)) times ρ̄·A·∇log π_t, ρ̄ the response's
    geometric mean of f. On the plane, where every token of a response shares one ratio, ρ̄ = f
    and the gate is PPO's on the wider window.

    The loss writes J per token in GSPO-token's form: value ρ̄·A_t, gradient ρ̄·A_t·f'(ρ_t)
    through token t's own log π. With one advantage per response (as GMPO, and verl's geo_mean,
    assume) that is GMPO exactly; with per-token advantages verl's geo_mean multiplies every
    token's gradient by the response's mean advantage instead.

    Defaults: ε = 0.4 on both sides, in log space (the paper's, and TRL's experimental
    GMPOTrainer's); verl's geo_mean reads clip_ratio_low/high as these log-space ε, so its
    defaults (clip_ratio 0.2) give the narrower window (e^−0.2, e^0.2).
    """

    name, title, date, order, level = "gmpo", "GMPO", "July 2025", 22, "sequence"
    chapter = 18
    paper = "Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv:2507.20673"
    defaults = {"eps_low": 0.4, "eps_high": 0.4}
    agg = "seq-mean-token-mean"
    agg_source = ("GMPO's objective is the mean over the G responses of A·(geometric mean of "
                  "the clipped ratios): each response weighs once. verl's geo_mean ignores "
                  "loss_agg_mode and its global batch sizes: a plain mean over the micro-batch's "
                  "rows, an empty row counted.")
    trainer_flags = {
        # verl's geo_mean reads the log-space ε from clip_ratio_low/high; no loss_agg_mode
        "verl": {"loss_mode": "geo_mean", "clip_ratio_low": "eps_low",
                 "clip_ratio_high": "eps_high"},
        "trl": None,  # not a GRPOTrainer loss_type (trl.experimental.gmpo is its own trainer)
    }
    color = "#8c564b"
    log_ratio_lim = 0.8
    slider_ranges = {"eps_low": (0.0, 1.5, 0.01), "eps_high": (0.0, 1.5, 0.01)}
    explorer = {
        "gate": ("(a > 0 && r < Math.exp(p.eps_high)) || (a < 0 && r > Math.exp(-p.eps_low))"
                 " ? 1 : 0"),
        "bounds": "[[Math.exp(p.eps_high), 1], [Math.exp(-p.eps_low), -1]]",
    }
    f_latex = (r"\exp\!\Big(\tfrac{1}{|o|}\textstyle\sum_t \log f_{\rm clip}(\rho_t;A)\Big),\ "
               r"f_{\rm clip}=\begin{cases}\min(\rho_t,\,e^{\epsilon_h}) & A>0\\"
               r"\max(\rho_t,\,e^{-\epsilon_l}) & A\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathrm{1}[A>0,\ \rho_t<e^{\epsilon_h}]"
                  r"\\+\,\mathrm{1}[A<0,\ \rho_t>e^{-\epsilon_l}]\end{gathered}")
    gate_text = "PPO's on (e^−ε_l, e^ε_h) at ρ_t; the signal carries the response's ρ̄"
    insight = (
        "A geometric mean instead of an arithmetic one: one outlier token moves the response's "
        "weight far less, so the clip window can be much wider."
    )

    def _validate(self):
        h = self.hparams
        for k in ("eps_low", "eps_high"):  # log space: any ε ≥ 0 is a window around 1
            h[k] = _hparam(self.name, k, h[k], low=0)
        self.low, self.high = math.exp(-h["eps_low"]), math.exp(h["eps_high"])

    def _log_weights(self, logp, logp_old, adv, mask):
        """([B, T] log f(ρ_t; A), [B] the response's mean of it, log ρ̄), f the sign-aware clip."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)  # 0 on padding: log f = 0 there
        log_f = torch.log(self._weight(nx.ratio_from_log(log_ratio), adv))
        return log_f, log_f.sum(-1) / mask.sum(-1).clamp(min=1)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        log_f, log_mean = self._log_weights(logp, logp_old, adv, mask)
        # value ρ̄·A_t; gradient ρ̄·A_t·∂log f_t, through token t's own log π only
        return torch.exp(log_mean.detach()[:, None] + log_f - log_f.detach()) * adv

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """f'(ρ_t; A)·ρ̄·A: token t's own gate, the response's geometric mean ρ̄ (zero where the
        log-ratio clamp is active, as for every method)."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        _, log_mean = self._log_weights(logp, logp_old, adv, mask)
        gate = self._gate(nx.ratio_from_log(log_ratio), adv)
        return gate * log_mean.exp()[:, None] * adv * inside

    def token_gate(self, logp, logp_old, adv, mask=None, side=None):
        """[B, T] each token's own gate f'(ρ_t; A): GMPO opens or shuts a token by its own
        ratio (the response's ρ̄ only scales the signal), so diagnostics count those."""
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask,
                                                         self.agg)
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp, logp_old, mask))
        return self._gate(ratio, adv).expand(logp.shape)
