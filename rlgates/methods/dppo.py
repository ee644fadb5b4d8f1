"""A trust region on π − π_old, not on ρ: DPPO (verl's `dppo_tv` and `dppo_kl`).

    gradient = M·sg(min(ρ, c))·A·∇log π,  so  f' = min(1, c/ρ)·M

The mask M drops a token whose probability has moved too far from π_old in the direction A
pushes it: by total variation |π − π_old| (dppo_tv) or by the binary KL divergence between
Bernoulli(π_old) and Bernoulli(π) (dppo_kl). M reads π_old itself, not only ρ = π/π_old, so the
gate is a function of (ρ, A, π_old): a side input (`side_inputs = ("probs_old",)`).
"""

from __future__ import annotations

import math

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register

#: verl's guard inside the binary KL's second log (its dppo_kl writes 1 − π + 1e-8)
KL_GUARD = 1e-8


def _truncated(ratio, c):
    """G(ρ) = ∫_0^ρ min(1, c/u) du: ρ up to c, then c·(1 + log(ρ/c)); G' = min(1, c/ρ)."""
    above = c * (1 + torch.log(torch.where(ratio > c, ratio, c) / c))
    return torch.where(ratio > c, above, ratio)


class DPPO(Method):
    """DPPO: PPO's clip replaced by a mask on the divergence between π and π_old.

    verl writes the loss as −M·sg(min(ρ, c))·A·log π: the importance weight is detached and
    truncated at c (truncated importance sampling, in place of dual-clip), and M keeps a token
    unless A > 0 and π has risen past the trust region, or A ≤ 0 and π has fallen past it
    (`valid`). So the gradient is M·min(ρ, c)·A·∇log π and the gate is f' = min(1, c/ρ)·M,
    never above 1; at A = 0 the gate is A ≤ 0's, as in verl.

    On the plane π = ρ·π_old: the edges of M move with π_old (`side.probs_old`), which the
    figures hold fixed. `weight` is the antiderivative f = G(ρ clipped to M's interval), with
    G(ρ) = ρ up to c and c·(1 + log(ρ/c)) above, so f(1) = 1; the loss's value is verl's
    (it carries log π, as CISPO's does), its gradient eq. 5's.

    Defaults are verl 0.9.1's actor config: δ_l = clip_ratio_low = 0.2, δ_h = clip_ratio_high
    = 0.2, c = clip_ratio_c = 3.0. verl's code falls back to c = 20 only when the config has no
    clip_ratio_c, which its actor config always has (its comment recommends a large c, since
    truncation biases the gradient). The paper's thresholds are not restated here.
    """

    level = "token"
    chapter = 18
    side_inputs = ("probs_old",)
    defaults = {"delta_low": 0.2, "delta_high": 0.2, "c": 3.0}
    agg = "token-mean"
    agg_source = ("verl's dppo losses follow the actor's loss_agg_mode, whose default is "
                  "token-mean; the paper's code runs in verl.")
    log_ratio_lim = 1.5
    explorer = None  # the gate reads π_old: not a function of (ρ, A) alone
    param_labels = {**Method.param_labels, "delta_low": "δ<sub>l</sub>",
                    "delta_high": "δ<sub>h</sub>"}

    def _validate(self):
        h = self.hparams
        h["delta_low"] = _hparam(self.name, "delta_low", h["delta_low"], low=0)
        h["delta_high"] = _hparam(self.name, "delta_high", h["delta_high"], low=0)
        h["c"] = _hparam(self.name, "c", h["c"], low=1)
        self.c = h["c"]

    # --- the mask, from (π, π_old) as verl computes it -------------------------------------
    def valid(self, log_ratio, prob, prob_old, adv):
        """M, a bool tensor: True where the token may move (π within the trust region on the
        side A pushes)."""
        raise NotImplementedError

    def edges(self, prob_old):
        """(ρ_l, ρ_h): M's interval in ρ at π_old (A ≤ 0 keeps ρ ≥ ρ_l, A > 0 keeps ρ ≤ ρ_h)."""
        raise NotImplementedError

    # --- on the plane: π = ρ·π_old ----------------------------------------------------------
    def _gate(self, ratio, adv, side=None):
        keep = self.valid(ratio.log(), ratio * side.probs_old, side.probs_old, adv)
        return torch.clamp(self.c / ratio, max=1.0) * keep

    def _weight(self, ratio, adv, side=None):
        low, high = self.edges(side.probs_old)
        inside = torch.where(adv > 0, torch.minimum(ratio, high), torch.maximum(ratio, low))
        return _truncated(inside, self.c)

    # --- the loss, as verl writes it -----------------------------------------------------------
    def _keep(self, logp, logp_old, adv, mask, side):
        """M·sg(min(ρ, c)) per token, no gradient; padding gets a finite value."""
        log_ratio = nx.token_log_ratio(logp.detach(), logp_old, mask)
        prob = torch.where(mask, logp.detach(), 0.0).exp()
        keep = self.valid(log_ratio, prob, side.probs_old, adv)
        return nx.ratio_from_log(log_ratio).clamp(max=self.c) * keep

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """verl's J_t = M·sg(min(ρ, c))·A·log π (its value is not f·A; its gradient is)."""
        return self._keep(logp, logp_old, adv, mask, side) * adv * logp

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """M·min(ρ, c)·A: the gradient flows through log π, so the ±20 clamp of log ρ only
        bounds the weight (as in CISPO)."""
        return self._keep(logp, logp_old, adv, mask, side) * adv


@register
class DPPOTV(DPPO):
    """DPPO-Binary-TV: M keeps a token unless A > 0 and π − π_old > δ_h, or A ≤ 0 and
    π − π_old < −δ_l. In ρ: A > 0 keeps ρ ≤ 1 + δ_h/π_old, A ≤ 0 keeps ρ ≥ 1 − δ_l/π_old, a
    window in ρ as wide as 1/π_old: wide for a rare token, narrow for a likely one (PPO's window
    is the same for every π_old)."""

    name, title, date, order = "dppo_tv", "DPPO-TV", "February 2026", 30
    paper = ("Qi et al. 2026, Rethinking the Trust Region in LLM Reinforcement Learning, "
             "arXiv:2602.04879")
    trainer_flags = {
        "verl": {"loss_mode": "dppo_tv", "clip_ratio_low": "delta_low",
                 "clip_ratio_high": "delta_high", "clip_ratio_c": "c",
                 "loss_agg_mode": "token-mean"},
        "trl": None,
    }
    color = "#8c564b"
    slider_ranges = {"delta_low": (0.0, 1.0, 0.01), "delta_high": (0.0, 1.0, 0.01),
                     "c": (1.0, 20.0, 0.5)}
    f_latex = (r"G\big(\operatorname{clip}(\rho_t,\,\rho_l,\,\rho_h)\big),\ "
               r"\rho_{l,h}=1\mp\delta_{l,h}/\pi_{\text{old}}\quad\big(\text{loss: }"
               r"M_t\,\operatorname{sg}[\min(\rho_t,c)]\,A_t\log\pi_\theta\big)")
    gate_latex = (r"\min(1,\,c/\rho_t)\,\big(\mathrm{1}[A_t>0,\ \pi-\pi_{\text{old}}\le\delta_h]"
                  r"+\mathrm{1}[A_t\le 0,\ \pi-\pi_{\text{old}}\ge-\delta_l]\big)")
    gate_text = "min(1, c/ρ), or 0 where π − π_old > δ_h (A>0) or < −δ_l (A≤0)"
    insight = (
        "PPO's window measured in probability, not ratio: a rare token may multiply its "
        "probability many times before the gate shuts; a likely one barely moves."
    )

    def valid(self, log_ratio, prob, prob_old, adv):
        # A > 0 keeps π − π_old ≤ δ_h, A ≤ 0 keeps π − π_old ≥ −δ_l: as a window per token
        # whose other side is open (verl's torch.where of the two tests, without a [B, T] where)
        up, bound = adv > 0, prob.new_tensor  # the bounds in π's dtype, as verl compares them
        high = torch.where(up, bound(self.hparams["delta_high"]), bound(math.inf))
        low = torch.where(up, bound(-math.inf), bound(-self.hparams["delta_low"]))
        moved = prob - prob_old
        return (moved <= high) & (moved >= low)

    def edges(self, prob_old):
        return (1 - self.hparams["delta_low"] / prob_old,
                1 + self.hparams["delta_high"] / prob_old)


def binary_kl(log_ratio, prob, prob_old):
    """KL(Bernoulli(π_old) ‖ Bernoulli(π)) as verl's dppo_kl writes it:
    π_old·(−log ρ) + (1 − π_old)·log((1 − π_old + 1e-8)/(1 − π + 1e-8))."""
    return prob_old * -log_ratio + (1 - prob_old) * torch.log(
        (1 - prob_old + KL_GUARD) / (1 - prob + KL_GUARD))


@register
class DPPOKL(DPPO):
    """DPPO-Binary-KL: M keeps a token unless A > 0, π > π_old and the binary KL exceeds δ_h,
    or A ≤ 0, π < π_old and it exceeds δ_l. The binary KL grows from 0 at π = π_old on both
    sides, so M is again an interval of ρ around 1; its edges have no closed form, and `edges`
    finds them by bisection (the plane only: the loss reads M itself). Where π = ρ·π_old would
    exceed 1 (a ratio no token can reach), A > 0's test fails, as verl's NaN comparison does.
    """

    name, title, date, order = "dppo_kl", "DPPO-KL", "February 2026", 31
    paper = DPPOTV.paper
    trainer_flags = {
        "verl": {"loss_mode": "dppo_kl", "clip_ratio_low": "delta_low",
                 "clip_ratio_high": "delta_high", "clip_ratio_c": "c",
                 "loss_agg_mode": "token-mean"},
        "trl": None,
    }
    color = "#c49c94"
    slider_ranges = {"delta_low": (0.0, 0.5, 0.005), "delta_high": (0.0, 0.5, 0.005),
                     "c": (1.0, 20.0, 0.5)}
    f_latex = (r"G\big(\operatorname{clip}(\rho_t,\,\rho_l,\,\rho_h)\big),\ "
               r"\mathrm{kl}(\rho_{l,h}\pi_{\text{old}})=\delta_{l,h}\quad\big(\text{loss: }"
               r"M_t\,\operatorname{sg}[\min(\rho_t,c)]\,A_t\log\pi_\theta\big)")
    gate_latex = (r"\min(1,\,c/\rho_t)\,\big(\mathrm{1}[A_t>0,\ \pi\le\pi_{\text{old}}\lor"
                  r"\mathrm{kl}\le\delta_h]+\mathrm{1}[A_t\le 0,\ \pi\ge\pi_{\text{old}}\lor"
                  r"\mathrm{kl}\le\delta_l]\big)")
    gate_text = "min(1, c/ρ), or 0 where the binary KL(π_old‖π) > δ on the side A pushes π"
    insight = (
        "The trust region in KL between the two Bernoullis of the sampled token: like the TV "
        "mask, loose for rare tokens and tight for likely ones."
    )

    def valid(self, log_ratio, prob, prob_old, adv):
        kl = binary_kl(log_ratio, prob, prob_old)  # NaN where π > 1: every test below fails
        up = (kl <= self.hparams["delta_high"]) | (prob <= prob_old)
        down = (kl <= self.hparams["delta_low"]) | (prob >= prob_old)
        return torch.where(adv > 0, up, down)

    def edges(self, prob_old, steps=64):
        """Bisection on π ∈ [π_old, 1] (upper edge) and (0, π_old] (lower edge), where the
        binary KL is monotone; returned as ratios π/π_old."""
        one = torch.ones_like(prob_old)

        def kl_at(p):
            return binary_kl((p / prob_old).log(), p, prob_old)

        lo_in, lo_out = prob_old.clone(), torch.zeros_like(prob_old)  # kl ≤ δ_l at lo_in
        hi_in, hi_out = prob_old.clone(), one.clone()
        top_ok = kl_at(one) <= self.hparams["delta_high"]  # no edge below π = 1
        for _ in range(steps):
            mid = (lo_in + lo_out) / 2
            ok = kl_at(mid) <= self.hparams["delta_low"]
            lo_in, lo_out = torch.where(ok, mid, lo_in), torch.where(ok, lo_out, mid)
            mid = (hi_in + hi_out) / 2
            ok = kl_at(mid) <= self.hparams["delta_high"]
            hi_in, hi_out = torch.where(ok, mid, hi_in), torch.where(ok, hi_out, mid)
        high = torch.where(top_ok, one, hi_in) / prob_old
        return lo_in / prob_old, high
