"""A symmetric trust region on π − μ plus a squared log-ratio pull: prime-rl's IPO.

    J = 1[|π − μ| ≤ ε]·ρ·A − τ(log ρ)²,   ρ = π/μ (μ: the rollout engine's probability)
    gradient (1[|π − μ| ≤ ε]·ρ·A − 2τ log ρ)·∇log π
    f' = 1[|π − μ| ≤ ε] − 2τ log ρ/(ρA)   (A ≠ 0),   f = clip(ρ, 1 − ε/μ, 1 + ε/μ) − τ(log ρ)²/A

The mask reads the probability μ itself (as DPPO's reads π_old), so it is a side input; the
(log ρ)² term is a pull back towards the sampler whose gate, like DRO's, scales with 1/A.
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, register
from .dro import DRO


@register
class IPO(Method):
    """IPO (prime-rl's "INTELLECT" / "Importance Policy Optimization" loss): the policy gradient
    with the importance ratio to the sampler, masked where the token's probability has moved
    more than ε from the sampler's in either direction, plus Kimi-K2.5's τ(log ρ)² term.

    Source read: PrimeIntellect-ai/prime-rl, commit 559b447 (2026-08-21, tag v0.8.1.dev67),
    src/prime_rl/trainer/rl/loss.py `ipo_loss_fn`:

        log_importance_ratio = trainer_logprobs - inference_logprobs
        abs_probs_diff = torch.abs(torch.exp(trainer_logprobs) - torch.exp(inference_logprobs))
        keep_mask = loss_mask & ~(abs_probs_diff > loss_config.ipo_threshold)
        pg_loss = keep_mask * adv_tau * advantages * importance_ratio
        per_token_loss = -pg_loss + kl_tau * loss_mask * log_importance_ratio**2

    summed, and divided by the step's global count of loss tokens (src/prime_rl/trainer/rl/
    train.py: rl_scale): a token mean. There is no π_old: ρ = π/μ, μ the inference engine's
    log-probs, so pass those as `logp_old`; the mask reads μ's probability (`probs_old`, which
    the loss derives as exp(logp_old)). In ρ the kept band is 1 − ε/μ ≤ ρ ≤ 1 + ε/μ (edges
    included, as `abs_probs_diff > eps` drops), whatever the sign of A: DPPO-TV's band without
    the advantage-sign condition and without the truncation at c. The (log ρ)² term is on every
    real token, kept or not.

    The gate for A ≠ 0 is 1[kept] − 2τ log ρ/(ρA): the pull makes it negative past the sampler
    on the side A pushes (log ρ > ρA/(2τ) for A > 0), as in DRO. At A = 0 the template's f·A
    is flat: `weight` is the band alone there, f = clip(ρ, 1 − ε/μ, 1 + ε/μ), and the gate its
    derivative, the mask (the limit of the policy-gradient part), while the loss still pulls
    by −2τ log ρ, a term outside the gate. Elsewhere `weight` is
    f = clip(ρ, 1 − ε/μ, 1 + ε/μ) − τ(log ρ)²/A, f(1) = 1.

    Defaults, from the code read: `ipo_threshold` = 0.1 (ε) and `kl_tau` = 1e-3 (τ)
    (packages/prime-rl-configs/src/prime_rl/configs/trainer.py, IPOLossConfig), `adv_tau` = 1
    (not a hyperparameter here). IPO was opt-in at that commit (`[trainer.loss] type = "ipo"`;
    the default was DPPO-TV + the same KL term). After it, per the pull requests' descriptions
    (not read as code): PR #3418 (merged 2026-08-27) made IPO the only built-in and default loss
    and renamed `ipo_threshold` to `eps`; PR #3586 (merged 2026-09-18) changed the defaults to
    eps = 0.3 and kl_tau = 0.0 (`rlgates.get("ipo", eps=0.3, tau=0.0)`).
    """

    name, title, date, order = "ipo", "IPO (prime-rl)", "March 2026", 42
    chapter = 18
    paper = ("PrimeIntellect 2026, prime-rl IPO loss (PR #1930), with the squared log-ratio term "
             "of Kimi K2.5 (arXiv:2602.02276)")
    #: where the formula was read: repository, release (commit), path
    source = ("PrimeIntellect-ai/prime-rl 559b447 (2026-08-21, v0.8.1.dev67): "
              "src/prime_rl/trainer/rl/loss.py, ipo_loss_fn; defaults in "
              "packages/prime-rl-configs/src/prime_rl/configs/trainer.py (IPOLossConfig)")
    side_inputs = ("probs_old",)
    defaults = {"eps": 0.1, "tau": 1e-3}
    agg = "token-mean"
    agg_source = ("prime-rl sums the per-token loss and divides by the step's global count of "
                  "loss tokens (train.py's rl_scale): a token mean.")
    trainer_flags = {"verl": None, "trl": None}  # prime-rl only: use rlgates.trainers
    color = "#637939"
    log_ratio_lim = 1.0
    slider_ranges = {"eps": (0.0, 1.0, 0.01), "tau": (0.0, 0.1, 0.001)}
    param_labels = {**Method.param_labels, "tau": "τ"}
    explorer = None  # the mask reads μ's probability: not a function of (ρ, A) alone
    f_latex = (r"\operatorname{clip}\big(\rho_t,\,1-\tfrac{\epsilon}{\mu},\,1+\tfrac{\epsilon}{\mu}"
               r"\big)-\frac{\tau(\log\rho_t)^2}{A_t}\quad\big(\text{loss: }"
               r"\mathbf{1}[|\pi-\mu|\le\epsilon]\rho_tA_t-\tau(\log\rho_t)^2,\ "
               r"\rho_t=\pi_\theta/\mu\big)")
    gate_latex = (r"\mathbf{1}[|\pi_\theta-\mu|\le\epsilon]-\frac{2\tau\log\rho_t}{\rho_tA_t}"
                  r"\quad(A_t\neq 0)")
    gate_text = "1[−ε ≤ π − μ ≤ ε] − 2τ log ρ/(ρA), whatever the sign of A (ratio to the sampler)"
    insight = (
        "A trust region in probability around the sampler, the same on both sides of A, and a "
        "gentle pull back to it: rare tokens may move far in ratio, likely ones barely."
    )

    def _validate(self):
        h = self.hparams
        h["eps"] = _hparam(self.name, "eps", h["eps"], low=0)
        h["tau"] = _hparam(self.name, "tau", h["tau"], low=0)
        self.eps, self.tau = h["eps"], h["tau"]

    def keep(self, prob, prob_old):
        """1[|π − μ| ≤ ε] as prime-rl computes it (`~(abs_probs_diff > eps)`), a bool."""
        return ~((prob - prob_old).abs() > self.eps)

    def edges(self, prob_old):
        """(ρ_l, ρ_h): the kept band in ρ at μ = `prob_old` (ρ_l ≤ 0: no lower edge)."""
        return 1 - self.eps / prob_old, 1 + self.eps / prob_old

    # --- on the plane: π = ρ·μ ----------------------------------------------------------------
    def _gate(self, ratio, adv, side=None):
        kept = self.keep(ratio * side.probs_old, side.probs_old).to(ratio.dtype)
        pull = 2 * self.tau * torch.log(ratio) / (ratio * DRO._nonzero(adv))
        return torch.where(adv == 0, kept * torch.ones_like(pull), kept - pull)

    def _weight(self, ratio, adv, side=None):
        low, high = self.edges(side.probs_old)
        band = torch.minimum(torch.maximum(ratio, low), high)
        f = band - self.tau * torch.log(ratio).square() / DRO._nonzero(adv)
        return torch.where(adv == 0, band * torch.ones_like(f), f)

    # --- the loss, as prime-rl writes it ------------------------------------------------------
    def _kept(self, logp, logp_old, mask, side):
        prob = torch.where(mask, logp.detach(), 0.0).exp()
        return self.keep(prob, side.probs_old).to(logp.dtype)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """prime-rl's J_t = 1[kept]·ρ·A − τ(log ρ)² (minus its per-token loss)."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        ratio = nx.ratio_from_log(log_ratio)
        return self._kept(logp, logp_old, mask, side) * ratio * adv - self.tau * log_ratio.square()

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """1[kept]·ρ·A (0 where the ±20 clamp of log ρ is active) − 2τ log ρ (no clamp)."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        ratio = nx.ratio_from_log(log_ratio)
        kept = self._kept(logp, logp_old, mask, side)
        return kept * ratio * adv * inside - 2 * self.tau * log_ratio
