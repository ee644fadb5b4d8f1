"""Plain reference implementations in the big trainers' eager style.

Written independently of `rlgates.methods` (no shared code beyond torch), the way open-source
trainers write these losses: the max of an unclipped and a clipped loss, torch.clamp, and a
mask multiplied in. The tests check `rlgates` against these in float64; the benchmark times both.
`safety_eps` is the small constant some trainers add to denominators (1e-8); 0 reproduces the
exact definitions.
"""

from __future__ import annotations

import math

import torch


def agg_loss(loss_mat, mask, agg, safety_eps=0.0):
    mask = mask.to(loss_mat.dtype)
    if agg == "token-mean":  # as TRL writes it: one count, clamped so that no tokens give 0
        count = mask.sum()
        return (loss_mat * mask).sum() / (count + safety_eps if safety_eps else count.clamp(min=1))
    token_count = mask.sum(-1)
    seq_loss = (loss_mat * mask).sum(-1)
    if agg == "seq-mean-token-mean":
        seq_loss = seq_loss / token_count.clamp(min=1)
    elif agg == "seq-mean-token-sum-norm":  # Dr. GRPO: a constant normalizer, the padded length
        seq_loss = seq_loss / mask.shape[-1]
    seq_mask = (token_count > 0).to(loss_mat.dtype)
    if seq_mask.sum() == 0:
        return (seq_loss * seq_mask).sum()
    return (seq_loss * seq_mask).sum() / (seq_mask.sum() + safety_eps)


def _ratio(logp, logp_old):
    return torch.exp(torch.clamp(logp - logp_old, min=-20.0, max=20.0))


def clip_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.2, safety_eps=0.0):
    """PPO / GRPO / DAPO: max(−A·ρ, −A·clip(ρ, 1−ε_l, 1+ε_h)), aggregated."""
    ratio = _ratio(logp, logp_old)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    return agg_loss(torch.maximum(losses1, losses2), mask, agg, safety_eps)


def gspo_loss(logp, logp_old, adv, mask, agg, eps_low=3e-4, eps_high=4e-4, safety_eps=0.0):
    """GSPO-token: s_t = sg(ρ_s)·π_t/sg(π_t), then the clipped loss."""
    m = mask.to(logp.dtype)
    seq_log_ratio = ((logp - logp_old) * m).sum(-1) / m.sum(-1).clamp(min=1)
    log_s = logp - logp.detach() + seq_log_ratio.detach()[:, None]
    s = torch.exp(torch.clamp(log_s, min=-20.0, max=20.0))
    losses1 = -adv * s
    losses2 = -adv * torch.clamp(s, 1 - eps_low, 1 + eps_high)
    return agg_loss(torch.maximum(losses1, losses2), mask, agg, safety_eps)


def sapo_loss(logp, logp_old, adv, mask, agg, tau_pos=1.0, tau_neg=1.05, safety_eps=0.0):
    """SAPO: −(4/τ)·σ(τ(ρ−1))·A with τ chosen by the sign of A."""
    ratio = _ratio(logp, logp_old)
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=adv.dtype),
                      torch.as_tensor(tau_neg, dtype=adv.dtype))
    return agg_loss(-torch.sigmoid(tau * (ratio - 1)) * (4.0 / tau) * adv, mask, agg, safety_eps)


def sao_loss(logp, logp_old, adv, mask, agg, eps_low=0.3, eps_high=5.0, safety_eps=0.0):
    """SAO: −clip(ρ, 1−ε_l, 1+ε_h)·A, whatever the sign of A."""
    ratio = _ratio(logp, logp_old)
    return agg_loss(-torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv, mask, agg, safety_eps)


def dual_clip_loss(logp, logp_old, adv, mask, agg, eps=0.2, c=3.0, safety_eps=0.0):
    """Dual-clip PPO as verl writes it: for A < 0, min(−c·A, PPO's loss)."""
    ratio = _ratio(logp, logp_old)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - eps, 1 + eps)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-adv * c, clip1)
    return agg_loss(torch.where(adv < 0, clip2, clip1), mask, agg, safety_eps)


def cispo_loss(logp, logp_old, adv, mask, agg, eps_low=1.0, eps_high=4.0, safety_eps=0.0):
    """CISPO: −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π."""
    clipped = torch.clamp(_ratio(logp, logp_old), 1 - eps_low, 1 + eps_high).detach()
    return agg_loss(-clipped * adv * logp, mask, agg, safety_eps)


def reinforce_loss(logp, logp_old, adv, mask, agg, safety_eps=0.0):
    """The unclipped importance-weighted policy gradient: −ρ·A."""
    return agg_loss(-_ratio(logp, logp_old) * adv, mask, agg, safety_eps)


def decoupled_dual_clip_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.28, c=3.0,
                             safety_eps=0.0):
    """verl's vanilla loss with two clip ratios and clip_ratio_c: dual-clip on DAPO's window."""
    ratio = _ratio(logp, logp_old)
    clip1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    clip2 = torch.min(-adv * c, clip1)
    return agg_loss(torch.where(adv < 0, clip2, clip1), mask, agg, safety_eps)


def gmpo_loss(logp, logp_old, adv, mask, agg, eps_low=0.4, eps_high=0.4, safety_eps=0.0):
    """GMPO per token: the sign-aware clip of log ρ, its mean over the response, and the token
    term s_t = exp(sg(mean) + c_t − sg(c_t)) (GSPO-token's form), times −A."""
    m = mask.to(logp.dtype)
    log_ratio = torch.clamp(logp - logp_old, min=-20.0, max=20.0) * m
    clamped = torch.clamp(log_ratio, -eps_low, eps_high)
    clipped = torch.where(adv > 0, torch.minimum(log_ratio, clamped),
                          torch.maximum(log_ratio, clamped))
    mean = (clipped * m).sum(-1) / m.sum(-1).clamp(min=1)
    s = torch.exp(mean.detach()[:, None] + clipped - clipped.detach())
    return agg_loss(-s * adv, mask, agg, safety_eps)


def gpg_loss(logp, logp_old, adv, mask, agg, safety_eps=0.0):
    """GPG: −A·log π, no importance weight."""
    return agg_loss(-adv * logp, mask, agg, safety_eps)


def dro_loss(logp, logp_old, adv, mask, agg, beta=1.0, safety_eps=0.0):
    """DRO as verl writes it: −(A·log π − ½β(log π − log π_old)²)."""
    return agg_loss(-(logp * adv - 0.5 * beta * (logp - logp_old) ** 2), mask, agg, safety_eps)


def vespo_loss(logp, logp_old, adv, mask, agg, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
               lambda_neg=2.0, safety_eps=0.0):
    """VESPO: −sg(φ(w))·A·log π, φ(w) = e^λ·w^k·e^{−λw} in log space, w the product of the
    response's token ratios (each log-ratio clamped to ±20, the sum to [log 1e-8, 20])."""
    m = mask.to(logp.dtype)
    log_ratio = torch.clamp(logp.detach() - logp_old, min=-20.0, max=20.0)
    log_w = torch.clamp((log_ratio * m).sum(-1, keepdim=True), min=math.log(1e-8), max=20.0)
    k = torch.where(adv >= 0, k_pos, k_neg)
    lam = torch.where(adv >= 0, lambda_pos, lambda_neg)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return agg_loss(-phi * adv * logp, mask, agg, safety_eps)


# --- the other trainers' losses, as each trainer writes them -------------------------------------

def topr_loss(logp, logp_old, adv, mask, agg, pos_weight=1.0, neg_weight=1.0, scores=None,
              safety_eps=0.0):
    """TOPR as ROLL v0.3.0 writes it (roll/pipeline/rlvr/actor_pg_worker.py,
    _compute_topr_loss): −w_+·A·log π on positive samples, −w_−·sg(clamp(ρ, 0, 1))·A·log π on
    the others. ROLL splits by the response's score (`scores > 0`, [B]); without `scores` the
    split is by the sign of A, as rlgates' `topr`."""
    positive = (adv > 0) if scores is None else (scores > 0)[:, None].expand_as(logp)
    ratio = (logp - logp_old).exp()
    positive_loss = -adv * logp * positive.to(logp.dtype)
    clipped_ratio = torch.clamp(ratio, min=0.0, max=1.0).detach()
    negative_loss = -clipped_ratio * adv * logp * (~positive).to(logp.dtype)
    return agg_loss(pos_weight * positive_loss + neg_weight * negative_loss, mask, agg,
                    safety_eps)


def glm5_rollout_is_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.2,
                         safety_eps=0.0):
    """SkyRL's rollout_is (GLM-5 §4.1.2; skyrl/backends/skyrl_train/utils/ppo_utils.py):
    −sg(ρ·1[1−ε_l < ρ < 1+ε_h])·A·log π, ρ against the rollout log-probs (here logp_old)."""
    ratio = _ratio(logp, logp_old)
    in_range = (ratio > 1 - eps_low) & (ratio < 1 + eps_high)
    calibrated_ratio = torch.where(in_range, ratio, torch.zeros_like(ratio))
    return agg_loss(-(calibrated_ratio.detach() * adv * logp), mask, agg, safety_eps)


def ipo_loss(logp, logp_old, adv, mask, agg, eps=0.1, tau=1e-3, safety_eps=0.0):
    """prime-rl's ipo_loss_fn (src/prime_rl/trainer/rl/loss.py, 559b447), logp_old the
    inference log-probs: −1[|π − μ| ≤ ε]·ρ·A + τ(log ρ)² (adv_tau = 1), as a token mean."""
    log_importance_ratio = logp - logp_old
    importance_ratio = torch.exp(log_importance_ratio)
    abs_probs_diff = torch.abs(torch.exp(logp) - torch.exp(logp_old))
    keep_mask = ~(abs_probs_diff > eps)
    pg_loss = keep_mask * adv * importance_ratio
    per_token_loss = -pg_loss + tau * log_importance_ratio**2
    return agg_loss(per_token_loss, mask, agg, safety_eps)


#: The reference loss of every built-in method, with rlgates' hyperparameter names. LUSPO's loss
#: is GSPO's; its length factor is its aggregation (seq-mean-token-sum).
REFERENCES = {"dapo": clip_loss, "gspo": gspo_loss, "sapo": sapo_loss, "sao": sao_loss,
              "dual_clip": dual_clip_loss, "cispo": cispo_loss, "reinforce": reinforce_loss,
              "luspo": gspo_loss, "vespo": vespo_loss, "dapo_dual_clip": decoupled_dual_clip_loss,
              "gmpo": gmpo_loss, "gpg": gpg_loss, "dro": dro_loss, "topr": topr_loss,
              "glm5_rollout_is": glm5_rollout_is_loss, "ipo": ipo_loss}


def reference_loss(name, logp, logp_old, adv, mask, agg, side=None, **hparams):
    """The reference loss for a registry name, with rlgates' hyperparameter names. side: an
    rlgates.SideInfo whose entropy, draw and sampler_logp a method with side inputs reads."""
    if adv.dim() == 1:  # per-sequence advantages broadcast over the tokens
        adv = adv[:, None].expand_as(logp)
    if name in ("ppo", "grpo"):
        eps = hparams.get("eps", 0.2)
        return clip_loss(logp, logp_old, adv, mask, agg, eps, eps, hparams.get("safety_eps", 0.0))
    if name in SIDE_REFERENCES:
        fields = {"clip_cov": "draw", "opsm": "sampler_logp", "top_entropy": "entropy"}
        if name in fields and side is not None and getattr(side, fields[name]) is not None:
            hparams[fields[name]] = getattr(side, fields[name]).to(logp.dtype)
        return SIDE_REFERENCES[name](logp, logp_old, adv, mask, agg, **hparams)
    if name not in REFERENCES:
        raise ValueError(f"no reference for {name!r}")
    return REFERENCES[name](logp, logp_old, adv, mask, agg, **hparams)


# --- losses that read more than (ρ, A): as verl 0.9.1 and TRL 1.16 write them ------------------
# Plain too, with the side information as keyword arguments; tests/test_gradients.py checks them
# against rlgates in float64, tests/test_conformance_* check rlgates against the trainers' own.

def dppo_loss(logp, logp_old, adv, mask, agg, delta_low=0.2, delta_high=0.2, c=3.0, kl=False,
              safety_eps=0.0):
    """verl's dppo_tv (kl=False) or dppo_kl: −M·sg(min(ρ, c))·A·log π, M the trust-region mask
    on π − π_old (TV) or on the binary KL between Bernoulli(π_old) and Bernoulli(π)."""
    log_ratio = torch.clamp(logp - logp_old, min=-20.0, max=20.0)
    truncated = torch.clamp(torch.exp(log_ratio), max=c).detach()
    prob, old_prob = torch.exp(logp), torch.exp(logp_old)
    if kl:
        divergence = old_prob * (logp_old - logp) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        valid_pos = (divergence <= delta_high) | (prob <= old_prob)
        valid_neg = (divergence <= delta_low) | (prob >= old_prob)
    else:
        valid_pos = (prob - old_prob) <= delta_high
        valid_neg = (prob - old_prob) >= -delta_low
    valid = torch.where(adv > 0, valid_pos, valid_neg).detach().to(logp.dtype)
    return agg_loss(-adv * truncated * logp * valid, mask, agg, safety_eps)


def dppo_kl_loss(logp, logp_old, adv, mask, agg, **hparams):
    return dppo_loss(logp, logp_old, adv, mask, agg, kl=True, **hparams)


def _masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def clip_cov_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.2, cov_ratio=2e-4,
                  cov_low=1.0, cov_high=5.0, draw=None, safety_eps=0.0):
    """verl's clip_cov: PPO's clipped loss, times 0 on max(⌊cov_ratio·N⌋, 1) tokens drawn at
    random among the real, unclipped tokens whose covariance lies inside (cov_low, cov_high).
    verl draws them with torch.randperm; here the candidates with the smallest `draw` keys."""
    m = mask.to(logp.dtype)
    ratio = _ratio(logp, logp_old)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip_by_origin = (losses2 > losses1) & (m > 0)
    cov = (adv - _masked_mean(adv, m)) * (logp - _masked_mean(logp.detach(), m))
    cov[m == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(cov_ratio * m.sum().item()), 1)
    candidates = torch.nonzero((cov < cov_high) & (cov > cov_low) & (m > 0))
    order = torch.argsort(draw.expand_as(logp)[candidates[:, 0], candidates[:, 1]], stable=True)
    picked = candidates[order[:clip_num]]
    corr = torch.ones_like(logp)
    corr[picked[:, 0], picked[:, 1]] = 0
    return agg_loss(torch.maximum(losses1, losses2) * corr, mask, agg, safety_eps)


def kl_cov_loss(logp, logp_old, adv, mask, agg, cov_ratio=2e-4, kl_coef=0.1, safety_eps=0.0):
    """verl's kl_cov: −A·ρ, plus κ·|log ρ| on the max(⌊cov_ratio·N⌋, 1) real tokens of largest
    covariance (log π − mean)·(A − mean), means over the real tokens."""
    log_ratio = torch.clamp(logp - logp_old, min=-20.0, max=20.0)
    losses = -adv * torch.exp(log_ratio)
    losses_kl = losses + kl_coef * log_ratio.abs()
    valid = mask.reshape(-1) > 0
    valid_idx = torch.nonzero(valid, as_tuple=True)[0]
    valid_adv = adv.reshape(-1)[valid].detach()
    valid_logp = logp.reshape(-1)[valid].detach()
    if valid_idx.numel():
        cov = (valid_adv - valid_adv.mean()) * (valid_logp - valid_logp.mean())
        top = valid_idx[torch.topk(cov, max(1, int(cov.numel() * cov_ratio))).indices]
        rows, cols = top // logp.shape[1], top % logp.shape[1]
        losses = losses.clone()
        losses[rows, cols] = losses_kl[rows, cols]
    return agg_loss(losses, mask, agg, safety_eps)


def opsm_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.28, delta=0.5,
              sampler_logp=None, safety_eps=0.0):
    """TRL's off_policy_mask_threshold on DAPO's loss: a response with A < 0 whose mean KL to
    the sampler, mean_t(log π_sampler − log π), exceeds δ is dropped (the sampler is π_old when
    not given)."""
    m = mask.to(logp.dtype)
    sampler = logp_old if sampler_logp is None else sampler_logp
    kl = torch.nan_to_num(sampler - logp.detach(), nan=0.0)
    mean_kl = (kl * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)
    keep = ((adv >= 0) | (mean_kl <= delta)).to(logp.dtype)
    ratio = _ratio(logp, logp_old)
    losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    return agg_loss(losses * keep, mask, agg, safety_eps)


def top_entropy_loss(logp, logp_old, adv, mask, agg, eps_low=0.2, eps_high=0.28, top=0.2,
                     entropy=None, safety_eps=0.0):
    """TRL's top_entropy_quantile on DAPO's loss: only tokens whose entropy is at or above the
    (1 − top) quantile of the real tokens' entropies learn."""
    real = mask.bool()
    entropy = entropy.to(logp.dtype).expand_as(logp)
    if real.any():
        threshold = torch.quantile(entropy[real], 1 - top)
        keep = ((entropy * mask.to(logp.dtype)) >= threshold) & real
    else:
        keep = real
    ratio = _ratio(logp, logp_old)
    losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    return agg_loss(losses * keep.to(logp.dtype), mask, agg, safety_eps)


#: The reference loss of every method that reads side information, with rlgates' hyperparameter
#: names; `reference_loss` passes them the fields of an `rlgates.SideInfo` they read
#: (entropy, draw, sampler_logp) as keyword arguments.
SIDE_REFERENCES = {"dppo_tv": dppo_loss, "dppo_kl": dppo_kl_loss, "clip_cov": clip_cov_loss,
                   "kl_cov": kl_cov_loss, "opsm": opsm_loss, "top_entropy": top_entropy_loss}
