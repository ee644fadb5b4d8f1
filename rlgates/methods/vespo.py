"""A smooth weight on the whole response's ratio, with no edge: VESPO.

    w = Π_t ρ_t  (the product of the response's token ratios, not GSPO's geometric mean)
    φ(w) = e^λ·w^k·e^{−λw},  (k, λ) = (k₊, λ₊) if A ≥ 0 else (k₋, λ₋);  φ(1) = 1
    gradient = sg(φ(w))·A·∇log π_t,  so  f' = φ(w)/w  and  f = 1 + ∫₁^w φ(u)/u du

φ peaks at w = k/λ, where it is e^λ·(k/λ)^k·e^{−k}.
"""

from __future__ import annotations

import math

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register

#: The bounds of log w, as the authors' code and TRL 1.16 clamp it: below log(1e-8) φ is ~0
#: anyway, and above 20 it would overflow.
LOG_W_MIN, LOG_W_MAX = math.log(1e-8), 20.0


def _shape(adv, h):
    """(k, λ) as tensors of adv's dtype, chosen by the sign of A (A = 0 takes A > 0's)."""
    pos = adv >= 0
    k = torch.where(pos, adv.new_tensor(h["k_pos"]), adv.new_tensor(h["k_neg"]))
    lam = torch.where(pos, adv.new_tensor(h["lambda_pos"]), adv.new_tensor(h["lambda_neg"]))
    return k, lam


def _phi_log(log_w, k, lam):
    """φ(w) = exp(λ + k·log w − λ·w), from log w: the one place the Gamma weight is written."""
    return torch.exp(lam + k * log_w - lam * log_w.exp())


@register
class VESPO(Method):
    """VESPO: a detached Gamma-shaped weight φ(w) on the whole response's importance ratio.

    w is the product of the response's token ratios (no length normalisation), and each token's
    loss is −sg(φ(w))·A·log π_t, so its gradient is φ(w)·A·∇log π_t. In our lens the gradient is
    f'(w)·w·A·∇log π with f' = φ(w)/w (the paper writes φ(W) = W·f'(W)), a smooth bump with no
    edge: φ(1) = 1, it peaks at w = k/λ and fades on both sides. The gate reads the sequence
    product w and the sign of A.

    Two objectives, one gradient (as for CISPO): `loss` uses the trainer's form above, whose
    value carries log π; `weight` is f = 1 + ∫₁^w φ(u)/u du = 1 + e^λ·λ^{−k}·Γ(k)·(P(k, λw) −
    P(k, λ)), P the regularised lower incomplete gamma function, and `objective` = f·A is what
    the plane draws.

    Defaults: k₊ = 2, λ₊ = 3, k₋ = 3, λ₋ = 2, from the authors' training scripts; TRL 1.16's
    `vespo_*` defaults are the same. With them φ peaks at w = 2/3 for A ≥ 0 (e·4/9 ≈ 1.21) and
    at w = 3/2 for A < 0 (3.375/e ≈ 1.24). As the authors' code and TRL do, log w is the sum of
    the token log-ratios, each clamped to ±20, then clamped to [log 1e-8, 20]. TRL clamps λ to
    at least 1e-4; we require λ > 0 and k > 0.

    The sampler. VESPO's w is the ratio to the policy that sampled the response. When the
    sampler is not π_old (vLLM's log-probs differ from the trainer's), TRL folds its own
    per-token correction c_t = π_old/π_sampler (`importance_sampling_ratio`, truncated or
    masked by `vllm_importance_sampling_mode`, which must be a token mode) into log w, and does
    not multiply it into the loss again. VESPO reads `logp_old` only through w, so no extra
    input is needed: pass the sampler's log-probs as `logp_old` (w = π/π_sampler), or
    `logp_old − log c` for TRL's truncated fold exactly (tests/test_conformance_trl.py). A
    token that TRL's token_mask mode zeroes (c = 0) makes w ≈ 0 in both, though the clamps that
    get there differ (TRL: log c ≥ log 1e-8; here: each token's log-ratio ≥ −20).
    """

    name, title, date, order = "vespo", "VESPO", "February 2026", 21
    chapter = 18
    level = "sequence-product"
    paper = ("Shen et al. 2026, VESPO: Variational Sequence-Level Soft Policy Optimization for "
             "Stable Off-Policy LLM Training, arXiv:2602.10693")
    defaults = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}
    agg = "token-mean"
    agg_source = ("The authors' verl recipe keeps verl's default loss_agg_mode, token-mean; "
                  "TRL's vespo divides by the global token count, as its dapo does.")
    trainer_flags = {
        "verl": None,  # verl 0.9.1 registers no vespo loss
        "trl": {"loss_type": "vespo", "vespo_k_pos": "k_pos", "vespo_lambda_pos": "lambda_pos",
                "vespo_k_neg": "k_neg", "vespo_lambda_neg": "lambda_neg",
                "importance_sampling_level": "token"},  # TRL warns at "sequence"
    }
    color = "#e7298a"
    log_ratio_lim = 2.5
    slider_ranges = {"k_pos": (0.1, 8.0, 0.1), "lambda_pos": (0.1, 8.0, 0.1),
                     "k_neg": (0.1, 8.0, 0.1), "lambda_neg": (0.1, 8.0, 0.1)}
    param_labels = {**Method.param_labels, "k_pos": "k<sub>+</sub>", "lambda_pos": "λ<sub>+</sub>",
                    "k_neg": "k<sub>−</sub>", "lambda_neg": "λ<sub>−</sub>"}
    explorer = {  # r is the response's ratio w
        "gate": ("a >= 0 ? Math.exp(p.lambda_pos + (p.k_pos - 1) * Math.log(r) - p.lambda_pos * r)"
                 " : Math.exp(p.lambda_neg + (p.k_neg - 1) * Math.log(r) - p.lambda_neg * r)"),
        "bounds": "[]",
    }
    f_latex = (r"1+\int_1^{w}\frac{\phi(u)}{u}\,du\quad\big(\text{loss: }"
               r"\operatorname{sg}[\phi(w)]\,A\log\pi_\theta\big),\quad w=\prod_t\rho_t")
    gate_latex = (r"\begin{gathered}\phi(w)/w=e^{\lambda}w^{k-1}e^{-\lambda w},\\ "
                  r"(k,\lambda)=(k_+,\lambda_+)\text{ if }A\ge 0\text{ else }(k_-,\lambda_-)"
                  r"\end{gathered}")
    gate_text = "e^λ·w^(k−1)·e^(−λw), w = Π_t ρ_t; (k, λ) by the sign of A"
    insight = (
        "A soft, lopsided bump on the whole response's ratio: no edge and no length "
        "normalisation, and a response far from the sampler fades out smoothly."
    )

    def _validate(self):
        h = self.hparams
        for key in self.defaults:
            h[key] = _hparam(self.name, key, h[key], low=0, low_open=True)

    def _weight(self, ratio, adv, side=None):
        k, lam = _shape(adv, self.hparams)
        scale = torch.exp(lam - k * torch.log(lam) + torch.lgamma(k))  # e^λ·λ^−k·Γ(k)
        return 1 + scale * (torch.special.gammainc(k, lam * ratio) - torch.special.gammainc(k, lam))

    def _gate(self, ratio, adv, side=None):
        return _phi_log(torch.log(ratio), *_shape(adv, self.hparams)) / ratio

    def phi(self, ratio, adv):
        """φ(w; A) = e^λ·w^k·e^{−λw}: the detached weight on A·∇log π (the signal over A)."""
        ratio, adv, _ = self._lift(ratio, adv)
        return _phi_log(torch.log(ratio), *_shape(adv, self.hparams))

    def peak(self, positive=True):
        """(w*, φ(w*)): where φ peaks, w* = k/λ, for A ≥ 0 (positive) or A < 0."""
        h = self.hparams
        k, lam = (h["k_pos"], h["lambda_pos"]) if positive else (h["k_neg"], h["lambda_neg"])
        w = k / lam
        return w, math.exp(lam + k * math.log(w) - lam * w)

    @staticmethod
    def log_w(logp, logp_old, mask):
        """[B, 1] log w = Σ_t clamp(log ρ_t, ±20), clamped to [log 1e-8, 20]; no gradient."""
        token = nx.token_log_ratio(logp.detach(), logp_old, mask)
        token = token.clamp(-nx.LOG_RATIO_CLAMP, nx.LOG_RATIO_CLAMP)
        return token.sum(-1, keepdim=True).clamp(LOG_W_MIN, LOG_W_MAX)

    def _phi_seq(self, logp, logp_old, adv, mask):
        return _phi_log(self.log_w(logp, logp_old, mask), *_shape(adv, self.hparams))

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """VESPO's own J_t = sg(φ(w))·A·log π_t (the value differs from f·A; the gradient not).
        Padding's log-ratio is masked to 0, so w stays finite; `aggregate` drops padding."""
        return self._phi_seq(logp, logp_old, adv, mask) * adv * logp

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """φ(w)·A: the gradient flows through log π directly, so no clamp zeroes it."""
        return self._phi_seq(logp, logp_old, adv, mask) * adv * torch.ones_like(logp)
