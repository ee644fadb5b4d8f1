"""A hard band on the ratio to the sampler, in CISPO's form: GLM-5's agentic loss (SkyRL's
`rollout_is`).

    gradient = sg(ρ_μ·1[1−ε_l < ρ_μ < 1+ε_h])·A·∇log π,   ρ_μ = π_θ/μ (μ: the rollout engine)
    f' = 1[1−ε_l < ρ_μ < 1+ε_h]   (SAO's top-hat, whatever the sign of A)
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from ._base import register
from .window import SAO


@register
class GLM5RolloutIS(SAO):
    """GLM-5's agentic loss as SkyRL registers it (`policy_loss_type="rollout_is"`): CISPO's
    stop-gradient form, anchored on the sampler, with a hard zero outside the band.

    Source read: NovaSky-AI/SkyRL, commit a956457 (2026-08-21, after skyrl_train-v0.4.0),
    skyrl/backends/skyrl_train/utils/ppo_utils.py `rollout_is_policy_loss`:

        ratio = safe_exp_delta(log_probs - rollout_logprobs, clip=20.0, ...)
        in_range = (ratio > 1 - config.eps_clip_low) & (ratio < 1 + config.eps_clip_high)
        calibrated_ratio = torch.where(in_range, ratio, torch.zeros_like(ratio))
        loss = -(calibrated_ratio.detach() * advantages * log_probs)

    The gradient is ρ_μ·A·∇log π inside the open band and 0 outside, so the gate is SAO's
    top-hat 1[1−ε_l < ρ < 1+ε_h] whatever the sign of A: GLM-5's rule and SAO's are one gate
    (`weight` is SAO's clip(ρ)). What differs is the loss's value (it carries log π, as CISPO's
    does) and the anchor: ρ is taken against the rollout engine's log-probs, never a recomputed
    π_old, so pass the engine's log-probs as `logp_old`. Unlike CISPO (which clamps) a token
    outside the band is dropped; unlike IcePop (a correction, chapter 15) the band is the whole
    gate, with no PPO clip inside it.

    Defaults: SkyRL's `eps_clip_low` = `eps_clip_high` = 0.2 (skyrl/train/config/config.py;
    the same ε as its PPO loss), so the band is (0.8, 1.2); we did not find the values GLM-5's
    report uses. SkyRL's default `loss_reduction` is token_mean. SkyRL's off-policy corrections
    (`off_policy_correction`) are off by default and would multiply this loss from outside.
    """

    name, title, date, order = "glm5_rollout_is", "GLM-5 rollout IS", "February 2026", 41
    chapter = 13
    article_row = None
    paper = ("GLM-5 Team 2026, GLM-5 technical report, arXiv:2602.15763, §4.1.2 (as SkyRL's "
             "config cites it)")
    #: where the formula was read: repository, release (commit), path
    source = ("NovaSky-AI/SkyRL a956457 (2026-08-21, after skyrl_train-v0.4.0): "
              "skyrl/backends/skyrl_train/utils/ppo_utils.py, rollout_is_policy_loss "
              "(policy_loss_type='rollout_is'); defaults in skyrl/train/config/config.py")
    defaults = {"eps_low": 0.2, "eps_high": 0.2}
    agg_source = "SkyRL's loss_reduction defaults to token_mean (skyrl/train/config/config.py)."
    trainer_flags = {"verl": None, "trl": None}  # SkyRL only: use rlgates.trainers
    color = "#9edae5"
    log_ratio_lim = 0.6
    slider_ranges = {"eps_low": (0.0, 0.95, 0.01), "eps_high": (0.0, 2.0, 0.01)}
    f_latex = (r"\operatorname{clip}(\rho_t,\,1-\epsilon_l,\,1+\epsilon_h)\quad\big(\text{loss: }"
               r"\operatorname{sg}[\rho_t\mathbf{1}[1-\epsilon_l<\rho_t<1+\epsilon_h]]"
               r"\,A_t\log\pi_\theta,\ \rho_t=\pi_\theta/\mu\big)")
    gate_latex = r"\mathbf{1}[1-\epsilon_l<\rho_t<1+\epsilon_h],\ \rho_t=\pi_\theta/\mu"
    gate_text = "1[1−ε_l < π/μ < 1+ε_h], whatever the sign of A (ratio to the sampler)"
    insight = (
        "Measure the ratio against the engine that sampled, not a recomputed π_old, and drop "
        "the tokens outside a band: an asynchronous run's correction and trust region in one."
    )

    def _kept(self, logp, logp_old, mask):
        """sg(ρ·1[band]): SkyRL's calibrated ratio, no gradient."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp.detach(), logp_old, mask))
        return torch.where((ratio > self.low) & (ratio < self.high), ratio, 0.0)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """SkyRL's J_t = sg(ρ·1[band])·A·log π (its value differs from f·A; its gradient
        not)."""
        return self._kept(logp, logp_old, mask) * adv * logp

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        return self._kept(logp, logp_old, mask) * adv
