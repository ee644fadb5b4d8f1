"""A 0/1 mask read from side information, times another loss's gate: opsm, top_entropy.

    f' = (the base loss's f') · keep,   keep ∈ {0, 1} per token, read from what the batch holds

Two of TRL's knobs act like this on any `loss_type`: they multiply each token's loss by a mask
and leave the normaliser alone (a dropped token still counts in the denominators).

- `off_policy_mask_threshold` (DeepSeek-V3.2's off-policy sequence mask): a response with A < 0
  is dropped when its mean KL to the sampler, mean_t(log π_sampler − log π), exceeds δ.
- `top_entropy_quantile` ("Beyond the 80/20 Rule"): only tokens whose entropy is at or above
  the batch's (1 − q) quantile learn.

How they are modelled: one mixin per knob (`OffPolicyMask`, `EntropyMask`), and one class per
loss it is put on. The registered classes put each on DAPO (TRL's default loss type); the same
knob on another loss is one more class, e.g. `class SAPOWithOPSM(OffPolicyMask, SAPO)` with its
own name and defaults (tests/test_conformance_trl.py checks one against TRL's sapo).

The mask is a batch-level rule (a sequence mean, a quantile), so `loss` derives it once per batch
into `SideInfo.picked` (the tokens kept); `gate`, `weight` and `signal` on the plane read
`picked` when it is given, and otherwise apply the rule to the side information they hold: OPSM
reads each point as a one-token response, the entropy mask takes the quantile over the entropies
it is given.
"""

from __future__ import annotations

import torch

from ._base import _hparam, register
from .clip import DAPO


class _SideMask:
    """What both knobs share: the base loss (the next class in the MRO) times `_mask`, a 0/1
    tensor the subclass reads from the side information. Without `side` (the base's own calls
    inside its loss) the base is returned unmasked; `loss` then multiplies in the batch's mask
    once, in `token_objective`."""

    def _mask(self, ratio, adv, side):
        raise NotImplementedError

    def _weight(self, ratio, adv, side=None):
        f = super()._weight(ratio, adv)
        return f if side is None else f * self._mask(ratio, adv, side)

    def _gate(self, ratio, adv, side=None):
        # two-argument super: the book shows this source and runs it outside the class
        g = super(_SideMask, self)._gate(ratio, adv)  # noqa: UP008
        return g if side is None else g * self._mask(ratio, adv, side)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        # the base loss's own form (CISPO's carries log π), then the batch's mask: constant in
        # logp, so the gradient is the base's times the mask
        objective = super().token_objective(logp, logp_old, adv, mask)
        return objective * side.picked

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        return super().grad_coefficient(logp, logp_old, adv, mask) * side.picked


class OffPolicyMask(_SideMask):
    """Mixin: the base loss's gate times DeepSeek-V3.2's off-policy sequence mask (OPSM).

    keep = 1[A ≥ 0] or 1[mean_t(log π_sampler − log π) ≤ δ], the mean over the response's real
    tokens, with log π taken without gradient (TRL detaches it): a response the sampler would
    now rarely produce, and which the update pushes down, is dropped whole. It reads
    `sampler_logp` (when not given, the sampler is π_old: TRL without vLLM uses its old
    log-probs) and `probs_old` (derived from the batch; on the plane, a point is a one-token
    response with π = ρ·π_old, so its KL is log π_sampler − log(ρ·π_old)). With the sampler at
    π_old the KL is −log ρ_s, so the mask is a gate of (ρ_s, A): drop A < 0 once ρ_s < e^−δ.
    """

    side_inputs = ("sampler_logp", "probs_old")

    def _validate(self):
        super()._validate()
        self.hparams["delta"] = _hparam(self.name, "delta", self.hparams["delta"], low=0)

    def _derive_side(self, logp, logp_old, adv, mask, side):
        side = super()._derive_side(logp, logp_old, adv, mask, side)
        if side.sampler_logp is None:  # no rollout engine of its own: the sampler is π_old
            side = side.replace(sampler_logp=torch.where(mask, logp_old.detach(), 0.0))
        if side.picked is not None:
            return side
        sampler = side.sampler_logp.to(logp.dtype).expand_as(logp)
        kl = torch.where(mask, sampler - logp.detach(), 0.0)
        mean_kl = kl.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        return side.replace(picked=mask & self._keep(adv, mean_kl))

    def _keep(self, adv, kl):
        return (adv >= 0) | (kl <= self.hparams["delta"])

    def _mask(self, ratio, adv, side):
        if side.picked is not None:
            return side.picked.to(ratio.dtype)
        one_token_kl = side.sampler_logp - torch.log(ratio * side.probs_old)
        return self._keep(adv, one_token_kl).to(ratio.dtype)


class EntropyMask(_SideMask):
    """Mixin: the base loss's gate times the top-entropy mask of "Beyond the 80/20 Rule".

    keep = 1[H_t ≥ the (1 − q) quantile of the batch's entropies], the quantile over the real
    tokens (torch.quantile's linear interpolation, as TRL), so about a share q of the tokens
    learn. It reads `entropy`: the policy's entropy at each token, which neither ρ nor A gives.
    q = 1 keeps every token; q = 0 keeps only the highest-entropy ones.
    """

    side_inputs = ("entropy",)

    def _validate(self):
        super()._validate()
        q = _hparam(self.name, "top", self.hparams["top"], low=0)
        if q > 1:
            raise ValueError(f"{self.name}: top must be ≤ 1 (the share of tokens kept), "
                             f"got {self.hparams['top']!r}")
        self.hparams["top"] = q

    def _picked(self, entropy, real):
        """Tokens whose entropy is at or above the (1 − q) quantile of the real tokens'."""
        if not real.any():
            return real
        threshold = torch.quantile(entropy[real], 1 - self.hparams["top"])
        return real & (entropy >= threshold)

    def _derive_side(self, logp, logp_old, adv, mask, side):
        side = super()._derive_side(logp, logp_old, adv, mask, side)
        if side.picked is not None or side.entropy is None:  # None: _require names the field
            return side
        entropy = side.entropy.to(logp.dtype).expand_as(logp)
        return side.replace(picked=self._picked(entropy, mask))

    def _mask(self, ratio, adv, side):
        if side.picked is not None:
            return side.picked.to(ratio.dtype)
        entropy = side.entropy.to(ratio.dtype)
        return self._picked(entropy, torch.ones_like(entropy, dtype=torch.bool)).to(ratio.dtype)


@register
class OPSM(OffPolicyMask, DAPO):
    """DAPO's clip times DeepSeek-V3.2's off-policy sequence mask (`OffPolicyMask`).

    Defaults: DAPO's ε (0.2, 0.28) and δ = 0.5, the value TRL's help suggests; we did not find
    the δ DeepSeek used. TRL has no default (None: off). In TRL,
    `off_policy_mask_threshold=δ` puts the mask on whatever `loss_type` is set; TRL's sampler is
    vLLM's log-probs when it has them, else the old log-probs.
    """

    name, title, date, order = "opsm", "OPSM (on DAPO)", "December 2025", 26
    chapter = 18
    article_row = None
    paper = ("DeepSeek-AI 2025, DeepSeek-V3.2: Pushing the Frontier of Open Large Language "
             "Models, arXiv:2512.02556")
    defaults = {"eps_low": 0.2, "eps_high": 0.28, "delta": 0.5}
    agg_source = ("DAPO's token mean; the mask leaves the normaliser alone (TRL multiplies the "
                  "per-token loss by it), so a dropped response still counts.")
    trainer_flags = {
        "verl": None,  # verl 0.9.1 has no off-policy sequence mask
        "trl": {"loss_type": "dapo", "epsilon": "eps_low", "epsilon_high": "eps_high",
                "importance_sampling_level": "token", "off_policy_mask_threshold": "delta"},
    }
    color = "#1b9e77"
    slider_ranges = {**DAPO.slider_ranges, "delta": (0.0, 2.0, 0.01)}
    param_labels = {**DAPO.param_labels, "delta": "δ"}
    explorer = None  # the mask reads the sampler's log-probs and a sequence mean
    f_latex = (r"f_{\rm DAPO}(\rho_t;A)\cdot\mathrm{1}\big[A\ge 0\ \lor\ "
               r"\tfrac{1}{|y|}\textstyle\sum_t(\log\pi_{\rm samp}-\log\pi_\theta)\le\delta\big]")
    gate_latex = (r"f'_{\rm DAPO}(\rho_t;A)\cdot\mathrm{1}\big[A\ge 0\ \lor\ "
                  r"\overline{\mathrm{KL}}_{y}\le\delta\big]")
    gate_text = "DAPO's, times 0 for a response with A<0 whose mean KL to the sampler is > δ"
    insight = (
        "Drop a response the update would push down only when the sampler has drifted away "
        "from the policy: the response is stale, so its negative signal is noise."
    )


@register
class TopEntropy(EntropyMask, DAPO):
    """DAPO's clip on the highest-entropy tokens only (`EntropyMask`).

    Defaults: DAPO's ε (0.2, 0.28) and q = 0.2, the paper's (it trains DAPO on the top 20 % of
    tokens by entropy). TRL's `top_entropy_quantile` defaults to 1.0 (off); it computes the
    quantile over the real tokens of every process, in float32.
    """

    name, title, date, order = "top_entropy", "Top-entropy tokens (on DAPO)", "June 2025", 27
    chapter = 18
    article_row = None
    paper = ("Wang et al. 2025, Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive "
             "Effective Reinforcement Learning for LLM Reasoning, arXiv:2506.01939")
    defaults = {"eps_low": 0.2, "eps_high": 0.28, "top": 0.2}
    agg_source = ("DAPO's token mean over every real token; the masked tokens still count in the "
                  "normaliser, as in TRL (it multiplies the per-token loss by the mask).")
    trainer_flags = {
        "verl": None,  # verl 0.9.1 has no entropy mask
        "trl": {"loss_type": "dapo", "epsilon": "eps_low", "epsilon_high": "eps_high",
                "importance_sampling_level": "token", "top_entropy_quantile": "top"},
    }
    color = "#d95f02"
    slider_ranges = {**DAPO.slider_ranges, "top": (0.0, 1.0, 0.01)}
    param_labels = {**DAPO.param_labels, "top": "q"}
    explorer = None  # the mask reads each token's entropy
    f_latex = r"f_{\rm DAPO}(\rho_t;A)\cdot\mathrm{1}\big[H_t\ge Q_{1-q}(H)\big]"
    gate_latex = r"f'_{\rm DAPO}(\rho_t;A)\cdot\mathrm{1}\big[H_t\ge Q_{1-q}(H)\big]"
    gate_text = "DAPO's, on tokens whose entropy is in the batch's top share q; else 0"
    insight = (
        "Learn only at the forks: the few high-entropy tokens where the policy is choosing "
        "carry the reasoning; the confident rest is left alone."
    )
