"""The plain policy gradient on log π, with no importance weight: GPG (verl's `gpg`).

    J = A·log π,  gradient A·∇log π,  so  f' = 1/ρ  and  f = 1 + log ρ

REINFORCE's f = ρ weighs each token's gradient by ρ; GPG's gradient ignores ρ, so off-policy
its gate is 1/ρ: above 1 where the policy has lowered a token, below 1 where it has raised it.
"""

from __future__ import annotations

from ._base import register
from .weight_clip import CISPO


@register
class GPG(CISPO):
    """GPG: J = A·log π. The gradient A·∇log π = (1/ρ)·ρ·A·∇log π: the gate is 1/ρ, never 0.

    It is CISPO with a window of width 0 (the weight sg(clip(ρ, 1, 1)) = 1), and the two agree
    in value and gradient (tested). On policy (ρ = 1) it is REINFORCE; off policy it is not:
    REINFORCE's gradient carries ρ, GPG's does not. The loss's value is A·log π as verl writes
    it; `weight` is the antiderivative f = 1 + log ρ with f(1) = 1, for the plane.

    GPG's other changes (its advantage estimator, verl's adv_estimator=gpg) act on A, not on the
    gate. Defaults: none; the aggregation follows the actor's loss_agg_mode in verl (default
    token-mean).
    """

    name, title, date, order = "gpg", "GPG", "April 2025", 23
    chapter = 18
    paper = ("Chu et al. 2025, GPG: A Simple and Strong Reinforcement Learning Baseline for Model "
             "Reasoning, arXiv:2504.02546")
    defaults: dict = {}
    agg = "token-mean"
    agg_source = ("verl's gpg loss follows the actor's loss_agg_mode, whose default is "
                  "token-mean; we keep that.")
    trainer_flags = {"verl": {"loss_mode": "gpg", "loss_agg_mode": "token-mean"}, "trl": None}
    color = "#bcbd22"
    log_ratio_lim = 2.0
    slider_ranges: dict = {}
    explorer = {"gate": "1 / r", "bounds": "[]"}
    f_latex = r"1+\log\rho_t\quad\big(\text{loss: }A_t\log\pi_\theta\big)"
    gate_latex = r"1/\rho_t"
    gate_text = "1/ρ (never 0)"
    insight = (
        "The policy gradient with no importance weight: a token's push does not grow with its "
        "ratio, so off-policy tokens are neither boosted nor dropped."
    )

    def _validate(self):
        self.low = self.high = 1.0  # clip(ρ, 1, 1) = 1: the weight is always 1

    def bounds(self):
        return []

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """verl's J_t = A·log π: CISPO's weight sg(clip(ρ, 1, 1)) is 1, so ρ is never formed
        (verl's gpg does not read log π_old either)."""
        return adv * logp
