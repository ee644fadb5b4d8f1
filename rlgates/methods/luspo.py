"""GSPO's gate with each response's loss multiplied by its length: LUSPO.

    f, f' = GSPO's, at ρ_s (the geometric-mean ratio);  loss = mean over responses of |y|·(GSPO's)

The length factor is an aggregation: |y| times the per-response token mean is the per-response
token sum, `seq-mean-token-sum`.
"""

from __future__ import annotations

from ._base import register
from .clip import GSPO


@register
class LUSPO(GSPO):
    """LUSPO: GSPO's loss times each response's length, so that long responses are not
    under-weighted.

    GSPO averages each response's tokens, so a response's share of the gradient does not grow
    with its length; LUSPO multiplies that mean by the length |y|, which makes it the sum over
    the response's tokens. The gate is GSPO's, unchanged: DAPO's clip at the sequence ratio
    ρ_s = exp(mean_t log ρ_t), with the token form of the loss (each token's gradient carries its
    own ∇log π). With one advantage per response, the loss is GSPO's under `seq-mean-token-sum`.

    Defaults: the paper changes only the length factor, so we keep GSPO's clip ranges
    (ε_l = 3e-4, ε_h = 4e-4). TRL's `loss_type="luspo"` uses `epsilon` (default 0.2) and
    `epsilon_high` (default: `epsilon`): far wider windows, so set them (the flags below do).
    TRL only warns when `importance_sampling_level` is not "sequence"; at "token" its luspo is a
    token-level clip summed over each response, which is not LUSPO. verl 0.9.1 has no `luspo`
    loss_mode; its `gspo` under `loss_agg_mode=seq-mean-token-sum` computes the same loss.
    TRL's mean over responses counts empty ones too (rlgates' skips them), as for grpo;
    `rlgates.trainers.trl.trl_loss` applies TRL's count.
    """

    name, title, date, order = "luspo", "LUSPO", "February 2026", 20
    chapter = 18
    article_row = None  # not in the article (the attribute would be inherited from GSPO)
    paper = ("Liu et al. 2026, Length-Unbiased Sequence Policy Optimization: Revealing and "
             "Controlling Response Length Variation in RLVR, arXiv:2602.05261")
    agg = "seq-mean-token-sum"
    agg_source = ("LUSPO multiplies GSPO's per-response mean by the response's length: the sum "
                  "over its tokens, then the mean over responses. TRL's luspo sums each response "
                  "and averages over all rows; verl's gspo does it under seq-mean-token-sum.")
    trainer_flags = {
        "verl": {"loss_mode": "gspo", "clip_ratio_low": "eps_low", "clip_ratio_high": "eps_high",
                 "loss_agg_mode": "seq-mean-token-sum"},
        "trl": {"loss_type": "luspo", "epsilon": "eps_low", "epsilon_high": "eps_high",
                "importance_sampling_level": "sequence"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        # GSPO's settings: neither trainer sums a response's tokens (flags gives None)
        "openrlhf": {"actor.policy_loss_type": "gspo",
                     "actor.eps_clip_low_high": lambda h: (h["eps_low"], h["eps_high"])},
        "areal": {"actor.eps_clip": "eps_low", "actor.eps_clip_higher": "eps_high",
                  "actor.importance_sampling_level": "sequence"},
    }
    color = "#7570b3"
    gate_text = "GSPO's, at ρ_s; each response's loss × its length"
    insight = (
        "GSPO with the length put back: summing, not averaging, each response's tokens stops "
        "long responses from counting for less."
    )
