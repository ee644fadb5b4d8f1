"""A gate that depends on the size of A: DRO (verl's `dro`).

    J = A·log π − ½β(log ρ)²,  gradient (A − β log ρ)·∇log π
    f' = (1 − β log ρ / A)/ρ   (A ≠ 0),  f = 1 + log ρ − β(log ρ)²/(2A)

The gate passes 1/ρ near ρ = 1, shuts at log ρ = A/β and turns negative beyond it: the token
is pulled back towards π_old. Its edge moves with |A|, so f is a function of (ρ, A), not of ρ
and the sign of A alone. At A = 0 the loss still pulls (−β log ρ); the template's f·A is 0
there, so that pull is a penalty outside the gate: β times the k2 estimate of KL to π_old.
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register


@register
class DRO(Method):
    """DRO: J = A·log π − ½β(log ρ)², whose gradient is (A − β log ρ)·∇log π.

    In the lens, f'(ρ; A)·ρ·A = A − β log ρ, so for A ≠ 0 the gate is (1 − β log ρ / A)/ρ and
    f = 1 + log ρ − β(log ρ)²/(2A) (f(1) = 1). The gate is 0 at ρ = e^{A/β} and negative past
    it, so a token that has moved too far in the direction its advantage asks for is pushed back.
    At A = 0 the gate is 0 by the library's convention (f·A is flat there), but DRO's loss still
    moves the token by −β log ρ: the loss is GPG's plus β·k2(π_θ‖π_old) =
    ½β(log ρ)² (tested against rlgates.regularisers.kl_loss). The loss's value is verl's,
    A·log π − ½β(log ρ)², with no ±20 clamp on log ρ (verl has none); `weight` gives f for the
    plane.

    DRO (Direct Reward Optimisation) fits a squared loss ½(r − V − τ log(π/π_ref))² on single
    responses; its gradient in log π is τ(A − τ log(π/π_ref))·∇log π with A = r − V. verl's dro
    is that gradient over τ, with β = τ and π_old in place of π_ref. Defaults: verl has none
    (policy_loss.dro_beta must be set > 0); we take β = 1, so that for |A| ≈ 1 the gate's zero
    at log ρ = A/β lies on the plane.
    """

    name, title, date, order = "dro", "DRO", "May 2024", 24
    chapter = 18
    paper = ("Richemond et al. 2024, Offline Regularised Reinforcement Learning for Large "
             "Language Models Alignment, arXiv:2405.19107")
    defaults = {"beta": 1.0}
    agg = "token-mean"
    agg_source = ("verl's dro loss follows the actor's loss_agg_mode, whose default is "
                  "token-mean; we keep that.")
    trainer_flags = {"verl": {"loss_mode": "dro", "dro_beta": "beta",
                              "loss_agg_mode": "token-mean"}, "trl": None}
    color = "#393b79"
    log_ratio_lim = 1.5
    slider_ranges = {"beta": (0.05, 5.0, 0.05)}
    param_labels = {**Method.param_labels, "beta": "β"}
    # near A = 0 the gate grows like 1/A and the colours saturate, as in the chapter's plane;
    # the divisor is _nonzero(A) as in `gate` below (gate 0 at A = 0)
    explorer = {
        "gate": ("a === 0 ? 0 : (1 - p.beta * Math.log(r) / (a < 0 ? Math.min(a, "
                 "-2.2250738585072014e-308) : Math.max(a, 2.2250738585072014e-308))) / r"),
        "bounds": "[]",
    }
    f_latex = (r"1+\log\rho_t-\frac{\beta(\log\rho_t)^2}{2A_t}\quad"
               r"\big(\text{loss: }A_t\log\pi_\theta-\tfrac{\beta}{2}(\log\rho_t)^2\big)")
    gate_latex = r"\Big(1-\frac{\beta\log\rho_t}{A_t}\Big)\Big/\rho_t\quad(A_t\neq 0)"
    gate_text = "(1 − β log ρ / A)/ρ: 0 at ρ = e^{A/β}, negative past it"
    insight = (
        "A soft trust region whose edge scales with the advantage: a token may move as far as "
        "log ρ = A/β, and is pulled back beyond it."
    )

    def _validate(self):
        self.hparams["beta"] = _hparam(self.name, "beta", self.hparams["beta"], low=0,
                                       low_open=True)
        self.beta = self.hparams["beta"]

    @staticmethod
    def _nonzero(adv):
        """A with 0 → 1 (a dead branch: no 0/0) and |A| at least the smallest normal float, so
        that β/A stays finite (at a subnormal A the gate is astronomically large either way)."""
        tiny = torch.finfo(adv.dtype).tiny
        safe = torch.where(adv < 0, torch.clamp(adv, max=-tiny), torch.clamp(adv, min=tiny))
        return torch.where(adv == 0, torch.ones_like(adv), safe)

    def _weight(self, ratio, adv, side=None):
        log_ratio = torch.log(ratio)
        f = 1 + log_ratio - self.beta * log_ratio.square() / (2 * self._nonzero(adv))
        return torch.where(adv == 0, 1 + log_ratio, f)  # f·A = 0 at A = 0, the convention

    def _gate(self, ratio, adv, side=None):
        g = (1 - self.beta * torch.log(ratio) / self._nonzero(adv)) / ratio
        return torch.where(adv == 0, torch.zeros_like(g), g)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """verl's J_t = A·log π − ½β(log ρ)² (its value differs from f·A by a constant)."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        return adv * logp - 0.5 * self.beta * log_ratio.square()

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """A − β log ρ: the penalty's pull is there at A = 0 too (no log-ratio clamp)."""
        return adv - self.beta * nx.token_log_ratio(logp, logp_old, mask)
