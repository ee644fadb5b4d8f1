"""A gate that differs by the sign of A: TOPR (ROLL's `pg_variant="topr"`).

    A > 0:  gradient A·∇log π               f' = 1/ρ,           f = 1 + log ρ
    A ≤ 0:  gradient sg(clip(ρ, 0, 1))·A·∇log π   f' = min(1, 1/ρ),   f = ρ up to 1, then 1 + log ρ

The positive side is supervised fine-tuning (no importance weight, GPG's gate 1/ρ); the
negative side is truncated importance sampling with the weight capped at 1.
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register


@register
class TOPR(Method):
    """TOPR, Tapered Off-Policy REINFORCE: no importance weight on good samples, a truncated one
    on bad samples.

    Source read: alibaba/ROLL v0.3.0 (commit 8eb27cc, 2026-08-19),
    roll/pipeline/rlvr/actor_pg_worker.py `ActorPGWorker._compute_topr_loss` (the same code is in
    roll/pipeline/agentic/agentic_actor_pg_worker.py), selected by `pg_variant: topr`:

        positive_loss = -advantages * log_probs * positive_token_mask
        clipped_ratio = torch.clamp(ratio, min=0.0, max=1.0).detach()
        negative_loss = -clipped_ratio * advantages * log_probs * negative_token_mask
        topr_loss = topr_positive_weight * positive_loss + topr_negative_weight * negative_loss

    with ratio = exp(log π − log π_old) per token. So the gradient is w_±·A·∇log π with
    w_+ = 1 and w_− = min(ρ, 1): the gate is f' = w_+/ρ for A > 0 (GPG's 1/ρ: the ratio does not
    scale a good sample's push) and w_−·min(1, 1/ρ) for A ≤ 0 (REINFORCE's 1 up to ρ = 1, then
    1/ρ: a bad sample's push never exceeds its on-policy size). `weight` is the antiderivative
    with f(1) = w_±: (1 + log ρ) above, ρ up to 1 then 1 + log ρ below. The loss's value is
    ROLL's (it carries log π); its gradient is eq. 5's.

    One difference we do not model: ROLL splits the two branches by the response's **score**
    (`data.batch['scores'] > 0`, its reward), not by the sign of A, and multiplies by A. Here
    the split is by the sign of A (A > 0 positive, A ≤ 0 negative, as ROLL's `scores <= 0`).
    The two agree when every response's advantage has its reward's sign, as in the paper's
    formula (its eq. 8 weighs R(τ) itself); with a baseline (GRPO's group mean, ROLL's
    whitening) a response with a positive reward and A < 0 takes ROLL's positive branch and our
    negative one. `rlgates.reference.topr_loss(..., scores=...)` computes ROLL's split.
    The paper's ratio is the whole trajectory's; ROLL's (and ours) is per token.

    Defaults: `topr_positive_weight` = `topr_negative_weight` = 1.0 (roll/configs/
    worker_config.py). Aggregation: ROLL's `loss_agg_mode` default, seq-mean-token-mean
    (roll/configs/base_config.py).
    """

    name, title, date, order = "topr", "TOPR", "March 2025", 40
    chapter = 13
    paper = "Le Roux et al. 2025, Tapered Off-Policy REINFORCE (TOPR), arXiv:2503.14286"
    #: where the formula was read: repository, release (commit), path
    source = ("alibaba/ROLL v0.3.0 (8eb27cc, 2026-08-19): "
              "roll/pipeline/rlvr/actor_pg_worker.py, ActorPGWorker._compute_topr_loss "
              "(pg_variant='topr'); defaults in roll/configs/worker_config.py")
    defaults = {"pos_weight": 1.0, "neg_weight": 1.0}
    agg = "seq-mean-token-mean"
    agg_source = ("ROLL's loss_agg_mode defaults to seq-mean-token-mean "
                  "(roll/configs/base_config.py); the TOPR docs example sets it too.")
    trainer_flags = {"verl": None, "trl": None}  # ROLL only: use rlgates.trainers
    color = "#17becf"
    log_ratio_lim = 1.5
    slider_ranges = {"pos_weight": (0.0, 2.0, 0.05), "neg_weight": (0.0, 2.0, 0.05)}
    param_labels = {**Method.param_labels, "pos_weight": "w<sub>+</sub>",
                    "neg_weight": "w<sub>−</sub>"}
    explorer = {
        "gate": "a > 0 ? p.pos_weight / r : p.neg_weight * Math.min(1, 1 / r)",
        "bounds": "[[1, -1]]",
    }
    f_latex = (r"\begin{cases} w_+(1+\log\rho_t) & A_t>0\\ w_-\,G(\rho_t) & A_t\le 0"
               r"\end{cases},\ G=\rho\ (\rho\le 1),\ 1+\log\rho\ (\rho>1)\quad"
               r"\big(\text{loss: }w\,A_t\log\pi_\theta,\ w_-\!\cdot\!"
               r"\operatorname{sg}[\operatorname{clip}(\rho_t,0,1)]\big)")
    gate_latex = (r"\begin{cases} w_+/\rho_t & A_t>0\\ w_-\min(1,\,1/\rho_t) & A_t\le 0"
                  r"\end{cases}")
    gate_text = "1/ρ for A>0 (no IS); min(1, 1/ρ) for A≤0 (weight clip(ρ, 0, 1))"
    insight = (
        "Trust good samples whatever their ratio (SFT on them) and cap the weight of bad ones "
        "at 1: pushing down a response the policy has already left can never grow."
    )

    def _validate(self):
        h = self.hparams
        h["pos_weight"] = _hparam(self.name, "pos_weight", h["pos_weight"], low=0)
        h["neg_weight"] = _hparam(self.name, "neg_weight", h["neg_weight"], low=0)
        self.pos, self.neg = h["pos_weight"], h["neg_weight"]

    def _weight(self, ratio, adv, side=None):
        log_ratio = torch.log(ratio)
        above = 1 + log_ratio
        negative = torch.where(ratio > 1, above, ratio)
        return torch.where(adv > 0, self.pos * above, self.neg * negative)

    def _gate(self, ratio, adv, side=None):
        return torch.where(adv > 0, self.pos / ratio,
                           self.neg * torch.clamp(1 / ratio, max=1.0))

    def _token_weight(self, logp, logp_old, adv, mask):
        """ROLL's stop-gradient weight: w_+ for A > 0, w_−·clip(ρ, 0, 1) for A ≤ 0."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp.detach(), logp_old, mask))
        return torch.where(adv > 0, torch.full_like(ratio, self.pos),
                           self.neg * torch.clamp(ratio, 0.0, 1.0))

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """ROLL's J_t = w·A·log π (its value differs from f·A; its gradient not)."""
        return self._token_weight(logp, logp_old, adv, mask) * adv * logp

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """w·A: the gradient flows through log π, so the ±20 clamp only bounds the weight."""
        return self._token_weight(logp, logp_old, adv, mask) * adv

    def bounds(self):
        return [(1.0, -1)]
