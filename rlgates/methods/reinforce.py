"""No gate at all: the importance-weighted policy gradient, f = ρ, f' = 1."""

from __future__ import annotations

import torch

from ._base import Method, register


@register
class Reinforce(Method):
    """f = ρ, f' = 1: the unclipped importance-weighted policy gradient ρ·A·∇log π.

    On-policy (ρ = 1) this is REINFORCE with the advantage as its baseline-corrected return.
    """

    name, title, date, order = "reinforce", "REINFORCE", "1992", 9
    paper = ("Williams 1992, Simple statistical gradient-following algorithms for connectionist "
             "reinforcement learning, Machine Learning 8:229-256 (no arXiv id)")
    defaults: dict = {}
    agg_source = "The token mean, as for PPO."
    trainer_flags = {"verl": None, "trl": None}  # no built-in loss: use rlgates.trainers
    color = "#17becf"
    explorer = {"gate": "1", "bounds": "[]"}
    f_latex = r"\rho_t"
    gate_latex = r"1"
    gate_text = "1"
    insight = (
        "No gate at all: every token passes, however far its ratio has moved. The baseline the "
        "other gates are measured against."
    )

    def _weight(self, ratio, adv, side=None):
        return ratio

    def _gate(self, ratio, adv, side=None):
        return torch.ones_like(ratio)
