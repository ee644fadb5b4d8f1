"""A smooth gate with no edge: SAPO.

    f  = (4/τ)·σ(τ(ρ−1)),  τ = τ_pos if A > 0 else τ_neg
    f' = 4σ(τ(ρ−1))(1 − σ(τ(ρ−1))) = sech²(τ(ρ−1)/2)

In float32 (and bf16/fp16, computed in float32) the loss's backward uses the closed-form gate,
not autograd's derivative of the sigmoid: in float32 σ(x) rounds to 1 from x ≈ 17.3, so the
sigmoid's derivative σ(1 − σ) is exactly 0 from ρ ≈ 18.3 (τ = 1), while sech²(x/2) stays
positive out to ρ ≈ 91. With `_SmoothWeight` the trained gradient is the gate that `gate`
returns and the book draws (tested in float32). float64 keeps autograd through σ, bit for bit
as before and as the trainers' reference losses compute it.
"""

from __future__ import annotations

import torch

from ._base import Method, _hparam, register


def _sech2_half(x):
    """sech²(x/2) = 4σ(x)(1−σ(x)), SAPO's gate at x = τ(ρ−1): the one place it is written.

    The cosh form stays ≤ 1 and keeps its relative precision far out (it underflows to 0 only
    where cosh² overflows: |x| ≳ 89 in float32), where 4σ(1−σ) is 0 from |x| ≈ 17."""
    return torch.cosh(x / 2).pow(-2)


def _f(ratio, tau):
    """(f, x): SAPO's weight f = (4/τ)·σ(x) at x = τ(ρ−1), the one place it is written."""
    x = tau * (ratio - 1)
    return 4 / tau * torch.sigmoid(x), x


class _SmoothWeight(torch.autograd.Function):
    """f = (4/τ)·σ(τ(ρ−1)) whose derivative in ρ is the closed-form gate sech²(τ(ρ−1)/2)."""

    @staticmethod
    def forward(ctx, ratio, tau):
        f, x = _f(ratio, tau)
        ctx.save_for_backward(x)
        return f

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _sech2_half(x) * grad, None  # autograd sums it to ρ's shape if broadcast


@register
class SAPO(Method):
    """A smooth gate: f = (4/τ)·σ(τ(ρ−1)), τ = τ_pos if A > 0 else τ_neg; f' = sech²(τ(ρ−1)/2)."""

    name, title, date, order = "sapo", "SAPO", "November 2025", 5
    article_row = 4  # its row in the article's Table 1
    paper = "Gao et al. (Qwen team) 2025, Soft Adaptive Policy Optimization, arXiv:2511.20347"
    defaults = {"tau_pos": 1.0, "tau_neg": 1.05}
    agg = "seq-mean-token-mean"
    agg_source = ("SAPO's objective averages each response's tokens, then the G responses; "
                  "verl's and TRL's sapo losses use the same per-sequence mean.")
    trainer_flags = {
        "verl": {"loss_mode": "sapo", "tau_pos": "tau_pos", "tau_neg": "tau_neg",
                 "loss_agg_mode": "seq-mean-token-mean"},
        "trl": {"loss_type": "sapo", "sapo_temperature_pos": "tau_pos",
                "sapo_temperature_neg": "tau_neg", "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        # AReaL's sapo_loss_fn is a token mean (flags gives it at agg="token-mean" only)
        "areal": {"actor.use_sapo_loss": True, "actor.sapo_tau_pos": "tau_pos",
                  "actor.sapo_tau_neg": "tau_neg", "actor.importance_sampling_level": "token"},
    }
    color = "#66a61e"
    log_ratio_lim = 3.0
    slider_ranges = {"tau_pos": (0.1, 5.0, 0.05), "tau_neg": (0.1, 5.0, 0.05)}
    explorer = {
        "gate": "Math.pow(Math.cosh((a > 0 ? p.tau_pos : p.tau_neg) * (r - 1) / 2), -2)",
        "bounds": "[]",
    }
    f_latex = (r"\begin{gathered}\tfrac{4}{\tau_t}\,\sigma\!\big(\tau_t(\rho_t-1)\big),\\ "
               r"\tau_t=\tau_{\rm pos}\text{ if }A_t>0\text{ else }\tau_{\rm neg}\end{gathered}")
    gate_latex = (r"\begin{gathered}4\sigma\big(\tau_t(\rho_t-1)\big)"
                  r"\big(1-\sigma(\tau_t(\rho_t-1))\big)"
                  r"\\=\operatorname{sech}^2\!\big(\tfrac{\tau_t(\rho_t-1)}{2}\big)\end{gathered}")
    gate_text = "sech²(τ(ρ−1)/2), τ by the sign of A"
    insight = (
        "A bell-shaped gate with no edge; the negative side uses a slightly larger "
        "temperature, so tokens with a negative advantage lose trust sooner."
    )

    def _validate(self):
        h = self.hparams
        for k in ("tau_pos", "tau_neg"):
            h[k] = _hparam(self.name, k, h[k], low=0, low_open=True)

    def _tau(self, adv):
        h = self.hparams  # tensors of adv's dtype, so float64 stays exact
        return torch.where(adv > 0, adv.new_tensor(h["tau_pos"]), adv.new_tensor(h["tau_neg"]))

    def _weight(self, ratio, adv, side=None):
        tau = self._tau(adv)
        if ratio.dtype == torch.float64:
            # float64 as before: autograd through σ, as the trainers do (rlgates.reference); it
            # agrees with the closed form to ~1e-9 relative out to ρ ≈ 20 and underflows far later
            return _f(ratio, tau)[0]
        return _SmoothWeight.apply(ratio, tau)

    def _gate(self, ratio, adv, side=None):
        return _sech2_half(self._tau(adv) * (ratio - 1))
