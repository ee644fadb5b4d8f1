"""Regularisers beside the gate: KL to a reference policy, and the entropy bonus.

Notation, per sampled token y_t: d = log π_θ(y_t) − log π_ref(y_t), u = π_ref/π_θ = e^{−d}.
Schulman's three estimators of KL(π_θ‖π_ref) from samples y ~ π_θ (his "Approximating KL
Divergence" note, 2020):

    k1 = d                 unbiased, can be negative
    k2 = d²/2              biased (its mean is not a KL), never negative
    k3 = u − log u − 1     unbiased, never negative (GRPO's, DeepSeekMath arXiv:2402.03300)
    k3+                    the value of k3 with the gradient of k2 (straight-through; verl's
                           kl_loss_type "k3+")

Used as a loss, autograd differentiates k through log π_θ(y_t) only: the sampling distribution
is not differentiated (no score-function term). `kl_expectation` computes what that gives in
expectation, exactly, on a categorical policy. `kl_placement` sets KL in the reward (it becomes
part of A, so it passes through the gate) beside KL in the loss (its own path, ungated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _numerics as nx

ESTIMATORS = ("k1", "k2", "k3", "k3+")
#: The KL term's ratio corrections (not rlgates.offpolicy.CORRECTIONS, the importance weights).
#: None: no correction. "ratio": multiply by ρ = π_θ/π_old with its gradient (TRL's
#: use_bias_correction_kl; DeepSeek-V3.2, arXiv:2512.02556). "ratio-sg": by sg(ρ), value only.
KL_CORRECTIONS = (None, "ratio", "ratio-sg")


def _beta(beta):
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta must be a number, got {beta!r}") from None
    if not math.isfinite(b) or b < 0:
        raise ValueError(f"beta must be finite and ≥ 0, got {beta!r}")
    return b


def _tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    return x


def _same_shape(x, name, like, like_name="logp"):
    _tensor(x, name)
    if x.shape != like.shape:
        raise ValueError(f"{name} must have {like_name}'s shape {tuple(like.shape)}, "
                         f"got {tuple(x.shape)}")
    return x


def _estimator(estimator):
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    return estimator


def _mask(mask, shape, device):
    return nx.check_mask(mask, shape, device)  # the losses' rule


# --- per-token estimators ------------------------------------------------------------------------
def kl_estimate(logp, logp_ref, estimator="k3"):
    """Per-token KL estimate from d = logp − logp_ref (any shape; gradient flows into logp)."""
    _estimator(estimator)
    _same_shape(logp_ref, "logp_ref", _tensor(logp, "logp"))
    d = logp - logp_ref.detach()
    if estimator == "k1":
        return d
    k2 = 0.5 * d.square()
    if estimator == "k2":
        return k2
    k3 = torch.exp(-d) + d - 1
    if estimator == "k3":
        return k3
    return k2 - k2.detach() + k3.detach()  # k3+: k3's value, k2's gradient


def kl_estimate_grad(logp, logp_ref, estimator="k3"):
    """Closed-form ∂k/∂logp per token: k1 → 1, k2 → d, k3 → 1 − π_ref/π_θ, k3+ → d."""
    _estimator(estimator)
    d = (_tensor(logp, "logp") - _same_shape(logp_ref, "logp_ref", logp)).detach()
    if estimator == "k1":
        return torch.ones_like(d)
    if estimator == "k3":
        return 1 - torch.exp(-d)
    return d


def kl_loss(logp, logp_ref, mask=None, beta=0.04, estimator="k3", agg="token-mean",
            logp_old=None, correction=None):
    """β · aggregate(c_t · k_t): the KL penalty as a loss term, beside the policy loss.

    logp, logp_ref, mask: [B, T]. The tokens were sampled from π_old (logp_old), not π_θ. With
    correction="ratio", c_t = ρ_t = π_θ/π_old, gradient included (TRL's use_bias_correction_kl):
    the sample mean of ρ·k becomes an unbiased estimate of E_{π_θ}[k], and because ρ carries
    ∇log π_θ the score-function term comes back, so k1 and k3 give ∇KL(π_θ‖π_ref) in
    expectation. correction="ratio-sg" uses sg(ρ): the value is corrected the same way, and the
    expected gradient is k's on-policy pathwise one (for k3 that is ∇KL(π_ref‖π_θ)).
    Otherwise c_t = 1. Masked tokens get zero gradient even when they hold NaN.
    """
    beta = _beta(beta)
    _tensor(logp, "logp")
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    _same_shape(logp_ref, "logp_ref", logp)
    if correction not in KL_CORRECTIONS:
        raise ValueError(f"correction must be one of {KL_CORRECTIONS}, got {correction!r}")
    if correction is not None and logp_old is None:
        raise ValueError(f"logp_old is required with correction={correction!r}")
    if logp_old is not None:
        _same_shape(logp_old, "logp_old", logp)
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    mask = _mask(mask, logp.shape, logp.device)
    dtype = nx.compute_dtype(logp, logp_ref)
    # fill padding before any exp, so NaN or inf there cannot reach the gradient
    lp = logp.to(dtype).masked_fill(~mask, 0.0)
    lr = logp_ref.detach().to(dtype).masked_fill(~mask, 0.0)
    k = kl_estimate(lp, lr, estimator)
    if correction is not None:
        lo = logp_old.detach().to(dtype).masked_fill(~mask, 0.0)
        ratio = nx.ratio_from_log(lp - lo)
        k = k * (ratio if correction == "ratio" else ratio.detach())
    return beta * nx.aggregate(k, mask, agg)


# --- exact enumeration on a categorical policy ---------------------------------------------------
def _logits(x, name):
    _tensor(x, name)
    if x.dim() != 1 or x.numel() < 2:
        raise ValueError(f"{name} must be 1-D logits over at least 2 outcomes, "
                         f"got shape {tuple(x.shape)}")
    return x


def kl_exact(logits_p, logits_q):
    """KL(p‖q) = Σ_x p(x)(log p(x) − log q(x)) for p = softmax(logits_p), q = softmax(logits_q)."""
    _logits(logits_p, "logits_p")
    _same_shape(_logits(logits_q, "logits_q"), "logits_q", logits_p, "logits_p")
    lp, lq = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def kl_exact_grads(logits, logits_ref):
    """Closed-form gradients in the logits z of π_θ = softmax(z):

    ∇_z KL(π_θ‖π_ref) = π_θ ⊙ (d − E_{π_θ}[d]),  d = log π_θ − log π_ref   (reverse KL)
    ∇_z KL(π_ref‖π_θ) = π_θ − π_ref                                          (forward KL)
    """
    _logits(logits, "logits")
    _same_shape(_logits(logits_ref, "logits_ref"), "logits_ref", logits, "logits")
    lp = torch.log_softmax(logits.detach(), -1)
    lr = torch.log_softmax(logits_ref.detach(), -1)
    p, d = lp.exp(), lp - lr
    return p * (d - (p * d).sum()), p - lr.exp()


def kl_expectation(logits, logits_ref, estimator="k3", logits_old=None, correction=None,
                   score_function=False):
    """Exact (E[c·k], E[∇_z c·k]) over every outcome x, with no sampling.

    Samples come from π_s = softmax(logits_old) if given, else from π_θ = softmax(logits).
    c = 1, ρ or sg(ρ) (see `kl_loss`). The gradient is autograd's of Σ_x π_s(x)·c(x)·k(x) in the
    logits z of π_θ. score_function=False treats π_s as a constant, as a trainer's loss does;
    True also differentiates π_s (only meaningful when π_s is π_θ): ∇ of E_{π_θ}[k] itself.
    """
    _estimator(estimator)
    _logits(logits, "logits")
    _same_shape(_logits(logits_ref, "logits_ref"), "logits_ref", logits, "logits")
    if correction not in KL_CORRECTIONS:
        raise ValueError(f"correction must be one of {KL_CORRECTIONS}, got {correction!r}")
    if logits_old is not None:
        _same_shape(_logits(logits_old, "logits_old"), "logits_old", logits, "logits")
    elif correction is not None:
        raise ValueError(f"logits_old is required with correction={correction!r}")
    if score_function and logits_old is not None:
        raise ValueError("score_function=True needs samples from π_θ: pass logits_old=None")
    z = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1)
    logp_ref = torch.log_softmax(logits_ref.detach(), -1)
    if logits_old is None:
        logp_s = logp if score_function else logp.detach()
    else:
        logp_s = torch.log_softmax(logits_old.detach(), -1)
    term = kl_estimate(logp, logp_ref, estimator)
    if correction is not None:
        ratio = torch.exp(logp - logp_s)
        term = term * (ratio if correction == "ratio" else ratio.detach())
    value = (logp_s.exp() * term).sum()
    (grad,) = torch.autograd.grad(value, z)
    return value.detach(), grad


# --- entropy bonus -------------------------------------------------------------------------------
def entropy(logits):
    """Full-distribution entropy per position, H = −Σ_v π_v log π_v over the last axis."""
    lp = torch.log_softmax(_tensor(logits, "logits"), -1)
    return -(lp.exp() * lp).sum(-1)


def entropy_grad(logits):
    """Closed form ∂H/∂z_v = −π_v (log π_v + H), same shape as logits."""
    lp = torch.log_softmax(_tensor(logits, "logits").detach(), -1)
    h = -(lp.exp() * lp).sum(-1, keepdim=True)
    return -lp.exp() * (lp + h)


def entropy_bonus(logits, mask=None, beta=0.01, agg="token-mean"):
    """−β · aggregate(H_t): the entropy bonus as a loss term, H_t from the full distribution.

    logits: [B, T, V]; mask: [B, T]. This is what verl (entropy_coeff, aggregated with the
    actor's loss_agg_mode) and TRL (entropy_coef, always the token mean) compute. Its gradient
    never meets the gate: it does not depend on ρ or A. (The sampled-token
    estimate −log π(y_t) is unbiased for H's value, but used as a loss its expected gradient is
    E_π[−∇log π] = 0, like k1's.)
    """
    beta = _beta(beta)
    _tensor(logits, "logits")
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    mask = _mask(mask, logits.shape[:2], logits.device)
    h = entropy(logits.masked_fill(~mask[..., None], 0.0))
    return -beta * nx.aggregate(h, mask, agg)


# --- KL in the reward against KL in the loss -----------------------------------------------------
@dataclass
class KLPlacement:
    """Per-token [B, T] results of `kl_placement`; every gradient is ∂loss/∂logp_t."""

    adv: torch.Tensor          # the task advantage A_t
    adv_shaped: torch.Tensor   # A'_t = A_t − β·Σ_{t'≥t} k_{t'}: KL in the reward
    open_reward: torch.Tensor  # bool, f'(ρ_t; A'_t) ≠ 0: the gate with KL in the reward
    open_loss: torch.Tensor    # bool, f'(ρ_t; A_t) ≠ 0: the gate with KL in the loss
    reward_kl_grad: torch.Tensor  # KL's share of the reward route: −f'(ρ; A')·ρ·(A'−A)·w
    reward_grad: torch.Tensor     # autograd of method.loss with A'
    loss_kl_grad: torch.Tensor    # autograd of kl_loss: β·∂k/∂logp·w, whatever the gate
    loss_grad: torch.Tensor       # autograd of method.loss with A plus kl_loss


def kl_placement(method, logp, logp_old, logp_ref, adv, mask=None, beta=0.04, agg=None,
                 reward_estimator="k1", loss_estimator="k3"):
    """One batch, two places for the KL penalty, token by token.

    In the reward (InstructGPT, arXiv:2203.02155; verl use_kl_in_reward): each token's reward gets
    −β·k_t, with k_t computed at rollout from logp_old (a constant), and the advantage is the
    reward-to-go with γ = λ = 1 and no critic: A'_t = A_t − β·Σ_{t'≥t} m·k_{t'}. The KL then acts
    only through A', so a token whose gate is shut loses its KL share with the rest.
    In the loss (GRPO; verl use_kl_loss; TRL beta): β·aggregate(k(logp, logp_ref)) beside the
    policy loss, so its gradient reaches every token. `agg` None: the method's own (m.agg).
    """
    from .methods import Method

    if not isinstance(method, Method):
        raise ValueError(f"method must be an rlgates Method, got {type(method).__name__}")
    beta = _beta(beta)
    _estimator(reward_estimator)
    _estimator(loss_estimator)
    agg = method.agg if agg is None else agg
    logp, logp_old, adv, mask = nx.check_loss_inputs(logp, logp_old, adv, mask, agg)
    _same_shape(logp_ref, "logp_ref", logp)
    logp_ref = logp_ref.detach().to(logp.dtype)
    adv = adv.expand_as(logp)
    k_roll = torch.where(mask, kl_estimate(logp_old, logp_ref, reward_estimator), 0.0)
    to_go = k_roll.flip(-1).cumsum(-1).flip(-1)
    adv_shaped = adv - beta * to_go

    leaf = logp.detach().clone().requires_grad_(True)
    (reward_grad,) = torch.autograd.grad(
        method.loss(leaf, logp_old, adv_shaped, mask, agg=agg), leaf)
    log_ratio = nx.gate_log_ratio(leaf.detach(), logp_old, mask, method.level)
    ratio = nx.ratio_from_log(log_ratio)
    inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
    gate = method.gate(ratio, adv_shaped) * inside
    open_loss = (method.gate(ratio, adv) * inside != 0) & mask
    w = nx.aggregation_weight(mask, agg).to(logp.dtype)
    reward_kl_grad = -gate * ratio * (adv_shaped - adv) * w

    leaf_kl = logp.detach().clone().requires_grad_(True)
    (loss_kl_grad,) = torch.autograd.grad(
        kl_loss(leaf_kl, logp_ref, mask, beta, loss_estimator, agg), leaf_kl)
    leaf_all = logp.detach().clone().requires_grad_(True)
    total = (method.loss(leaf_all, logp_old, adv, mask, agg=agg)
             + kl_loss(leaf_all, logp_ref, mask, beta, loss_estimator, agg))
    (loss_grad,) = torch.autograd.grad(total, leaf_all)
    return KLPlacement(adv, adv_shaped, (gate != 0) & mask, open_loss, reward_kl_grad,
                       reward_grad, loss_kl_grad, loss_grad)
