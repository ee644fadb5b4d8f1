"""A window on the ratio whatever the sign of A: SAO's top-hat trust region.

    f  = clip(ρ, 1−ε_l, 1+ε_h)
    f' = 1[1−ε_l < ρ < 1+ε_h]
"""

from __future__ import annotations

from .. import _numerics as nx
from ._base import Method, _window, register


@register
class SAO(Method):
    """A top-hat trust region: f = clip(ρ, 1−ε_l, 1+ε_h) whatever the sign of A.

    ρ is taken against the rollout engine's own log-probabilities (no separate π_old). The
    defaults ε_l = 0.3, ε_h = 5.0 are the window (0.7, 6) of the paper's reasoning experiments
    (its coding experiments use 0.8, 3.0), as secondary accounts of the paper report them;
    chapter 6 says what is checked. The paper writes the token term as sg(f̄(ρ))·A·log π with
    f̄(ρ) = ρ inside the window and 0 outside: the same gradient as clip(ρ)·A, another value
    outside the window.
    """

    name, title, date, order = "sao", "SAO", "July 2026", 4
    article_row = 5  # its row in the article's Table 1
    paper = "Hou et al. 2026, Single-rollout Asynchronous Optimization, arXiv:2607.07508"
    hard = True
    defaults = {"eps_low": 0.3, "eps_high": 5.0}
    agg_source = "No source states SAO's aggregation; we use the token mean, the common default."
    trainer_flags = {"verl": None, "trl": None}  # no built-in loss: use rlgates.trainers
    color = "#e7298a"
    log_ratio_lim = 2.0
    slider_ranges = {"eps_low": (0.0, 0.95, 0.01), "eps_high": (0.0, 6.0, 0.01)}
    explorer = {
        "gate": "r > 1 - p.eps_low && r < 1 + p.eps_high ? 1 : 0",
        "bounds": "[[1 + p.eps_high, 0], [1 - p.eps_low, 0]]",
    }
    f_latex = r"\operatorname{clip}(\rho_t,\,1-\epsilon_l,\,1+\epsilon_h)"
    gate_latex = r"\mathbf{1}[1-\epsilon_l<\rho_t<1+\epsilon_h]"
    gate_text = "1[1−ε_l < ρ < 1+ε_h], whatever the sign of A"
    insight = (
        "One window for every token, whatever its advantage: a ratio outside (1−ε_l, "
        "1+ε_h) is treated as stale data and passes nothing."
    )

    def _validate(self):
        self.low, self.high = _window(self)

    def _weight(self, ratio, adv, side=None):
        # not torch.clamp: its derivative is 1 at the edges, where the strict gate's is 0
        return nx.strict_clamp(ratio, self.low, self.high)

    def _gate(self, ratio, adv, side=None):
        return ((ratio > self.low) & (ratio < self.high)).to(ratio.dtype)

    def bounds(self):
        return [(self.high, 0)] + ([(self.low, 0)] if self.low > 0 else [])
