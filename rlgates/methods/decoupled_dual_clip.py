"""DAPO's decoupled window with dual-clip's ceiling: verl's `vanilla` loss with
clip_ratio_low ≠ clip_ratio_high and a finite clip_ratio_c.

    f  = min(ρ, 1+ε_h) if A > 0, else min(max(ρ, 1−ε_l), c)
    f' = 1[A>0, ρ<1+ε_h] + 1[A<0, 1−ε_l<ρ<c]
"""

from __future__ import annotations

from ._base import _hparam, _window, register
from .clip import DualClip


@register
class DecoupledDualClip(DualClip):
    """Dual-clip PPO on DAPO's window (1−ε_l, 1+ε_h): what verl's default policy loss computes
    once clip_ratio_low and clip_ratio_high differ (verl keeps clip_ratio_c = 3 unless told
    otherwise). For A < 0 the loss is capped at −c·A, so the gate shuts again once ρ ≥ c.

    Defaults: DAPO's ε_l = 0.2, ε_h = 0.28 and verl's c = 3 (its actor default). Neither paper
    states this pair; it is what a verl user gets by setting DAPO's clip ratios alone.
    """

    name, title, date, order = "dapo_dual_clip", "DAPO + dual-clip", "March 2025", 25
    chapter = 18
    article_row = None
    paper = ("Yu et al. 2025, DAPO, arXiv:2503.14476; with Ye et al. 2020's dual clip, "
             "arXiv:1912.09729")
    defaults = {"eps_low": 0.2, "eps_high": 0.28, "c": 3.0}
    agg = "token-mean"
    agg_source = ("DAPO's token mean, which is also verl's default loss_agg_mode.")
    trainer_flags = {
        "verl": {"loss_mode": "vanilla", "clip_ratio_low": "eps_low",
                 "clip_ratio_high": "eps_high", "clip_ratio_c": "c",
                 "loss_agg_mode": "token-mean"},
        # TRL's delta caps ρ for both signs of A: dual-clip only while c > 1 + ε_h
        "trl": lambda h: None if h["c"] <= 1 + h["eps_high"] else {
            "loss_type": "dapo", "epsilon": h["eps_low"], "epsilon_high": h["eps_high"],
            "delta": h["c"], "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        # both assert c > 1 (PolicyLoss.__init__, ppo_actor_loss_fn)
        "openrlhf": lambda h: None if h["c"] <= 1 else {
            "actor.policy_loss_type": "ppo",
            "actor.eps_clip_low_high": (h["eps_low"], h["eps_high"]),
            "actor.dual_clip": h["c"], "actor.loss_agg_mode": "token-mean"},
        "areal": lambda h: None if h["c"] <= 1 else {
            "actor.eps_clip": h["eps_low"], "actor.eps_clip_higher": h["eps_high"],
            "actor.c_clip": h["c"], "actor.importance_sampling_level": "token"},
    }
    color = "#7f7f7f"
    slider_ranges = {"eps_low": (0.0, 0.95, 0.005), "eps_high": (0.0, 1.0, 0.005),
                     "c": (1.05, 10.0, 0.05)}
    explorer = {
        "gate": ("(a > 0 && r < 1 + p.eps_high) || (a < 0 && r > 1 - p.eps_low && r < p.c)"
                 " ? 1 : 0"),
        "bounds": "[[1 + p.eps_high, 1], [1 - p.eps_low, -1], [p.c, -1]]",
    }
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon_h) & A_t>0\\"
               r"\min\!\big(\max(\rho_t,\,1-\epsilon_l),\,c\big) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathrm{1}[A_t>0,\ \rho_t<1+\epsilon_h]"
                  r"\\+\,\mathrm{1}[A_t<0,\ 1-\epsilon_l<\rho_t<c]\end{gathered}")
    gate_text = "DAPO's, and 0 for A<0 once ρ ≥ c"
    insight = (
        "Clip-higher and a ceiling for bad tokens at once: what verl runs when DAPO's clip "
        "ratios meet its default clip_ratio_c."
    )

    def _validate(self):
        self.low, self.high = _window(self)
        self.hparams["c"] = _hparam(self.name, "c", self.hparams["c"], low=1, low_open=True)
        self.c = self.hparams["c"]
