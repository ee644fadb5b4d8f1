"""Where A comes from: the advantage estimators of verl and TRL, and the critic's value loss.

Each function is written from its formula and tested equal, in float64 on ragged batches, to the
trainer's own code (tests/test_advantages_trainers.py): to rounding, or to float32's rounding
where the trainer computes a step in float32. `VERL_ESTIMATORS` maps every name of verl's
`ADV_ESTIMATOR_REGISTRY` to the function here that computes it.

Shapes. Sequence rewards are [P, G] (P prompts, G responses each) or a flat batch [B] in
batch order with `group_size=G` (consecutive rows form a group, as in TRL and verl's rollouts);
a per-sequence estimator returns its input's shape. Token tensors are [B, T] with the library's
one mask rule (`_numerics.check_mask`: bool, or 0/1 only), B = P·G.

    group_advantages         (r − mean_g) / (std_g + eps), or r − mean_g (Dr. GRPO)
    batch_scaled_advantages  (r − mean_g) / (std of the whole batch + eps) (TRL "batch")
    rloo_advantages          r − mean of the other G − 1 responses of the group
    passk_advantages         r_max − r_2nd for the group's best response, 0 for the others
    gpg_advantages           (B / #nonzero r)·(r − mean_g)
    opo_advantages           r − Σ_g |o|·r / Σ_g |o|  (length-weighted baseline)
    gae                      A_t = Σ_l (γλ)^l δ_{t+l} over the real tokens, returns A + V
    reinforce_plus_plus      discounted reward-to-go, whitened over the batch's tokens
    reinforce_plus_plus_baseline   r − mean_g on every token, whitened over the batch's tokens
    remax_advantages         reward-to-go − the greedy response's reward
    gdpo_advantages          Σ_k w_k·GRPO(r_k), standardised over tokens (verl) or responses
    optimal_token_baseline   reward-to-go − a per-token, variance-weighted group baseline
    kl_penalised_rewards     token rewards − β·k_t (verl's use_kl_in_reward)
    value_loss, value_gate, value_clip_fraction   the critic's clipped loss and its gate

Masked tokens. A multi-turn response has mask zeros inside it (tool or environment tokens). The
token estimators skip them as verl does: a masked token's reward is dropped, its value is not
used, and the recursion runs from one real token to the next, so γ is applied once across a gap
of any width. Every token-level output here is 0 on masked tokens; verl leaves numbers there
that no loss reads (see each function).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _numerics as nx
from .regularisers import kl_estimate

#: Added to the group's std before dividing, as one large trainer does (another uses 1e-4).
STD_EPS = 1e-6
#: verl's whitening (masked_whiten): divide by sqrt(var + WHITEN_EPS).
WHITEN_EPS = 1e-8
#: The per-token KL estimates of `kl_penalised_rewards`, with verl's names for them (its
#: algorithm.kl_penalty; the "+" variants, k1+ and k3+, have the same values).
KL_REWARD_ESTIMATORS = {"k1": ("kl", "k1"), "abs": ("abs",), "k2": ("mse", "k2"),
                        "k3": ("low_var_kl", "k3")}
#: verl clamps its k3 ("low_var_kl") estimate to [−10, 10].
K3_CLAMP = 10.0


# --- input checks ----------------------------------------------------------------------------
def _float(x, name):
    """A float tensor (ints are lifted, bf16/fp16 computed in float32); bool is refused."""
    t = torch.as_tensor(x)
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must hold real numbers, got dtype {t.dtype}")
    return nx.as_float(t, name)


def _grouped(rewards, group_size, name="rewards"):
    """rewards as [P, G] (G ≥ 2): a [P, G] tensor as it is, or a flat [B] cut into consecutive
    groups of `group_size`."""
    r = _float(rewards, name)
    if r.dim() == 1:
        if group_size is None:
            raise ValueError(f"{name} must be [num_prompts, G], got shape ({r.shape[0]},): a flat "
                             "batch needs group_size=G")
        g = int(group_size)
        if g < 1 or r.shape[0] % g:
            raise ValueError(f"group_size={group_size} does not divide the batch of "
                             f"{r.shape[0]} {name}")
        r = r.reshape(-1, g)
    elif r.dim() != 2:
        raise ValueError(f"{name} must be [num_prompts, G] or [B] with group_size, got shape "
                         f"{tuple(r.shape)}")
    elif group_size is not None and group_size != r.shape[1]:
        raise ValueError(f"group_size={group_size} disagrees with {name}' G={r.shape[1]}")
    if r.shape[1] < 2:
        raise ValueError(f"a group needs G ≥ 2 samples to have a baseline, got G={r.shape[1]}")
    if not bool(torch.isfinite(r).all()):
        raise ValueError(f"{name} must be finite")
    return r


def _eps(eps):
    try:
        v = float(eps)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"eps must be a finite number ≥ 0, got {eps!r}")
    return v


def _unit(x, name):
    """γ or λ: a number in [0, 1]."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}") from None
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")
    return v


def _tokens(x, name, shape=None):
    """A [B, T] real tensor (of `shape` when given)."""
    t = _float(x, name)
    if t.dim() != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    return t


def _tokens_shape(x, name):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a [B, T] torch.Tensor, got {shape}")
    return x.shape


def _row_mask(mask, rows):
    """The bool [B, T] mask of a batch of `rows` responses (the rewards' count)."""
    shape = _tokens_shape(mask, "mask")
    if shape[0] != rows:
        raise ValueError(f"mask must have one row per response ({rows}), got shape "
                         f"{tuple(shape)}")
    return nx.check_mask(mask, shape)


def _like_input(adv, rewards):
    """Per-sequence advantages back in the caller's layout ([P, G] or [B])."""
    return adv.reshape(-1) if torch.as_tensor(rewards).dim() == 1 else adv


# --- group-relative, per sequence --------------------------------------------------------------
def group_advantages(rewards, normalize_std: bool = True, eps: float = STD_EPS, group_size=None):
    """A_i = (r_i − mean of the group) / (std of the group + eps), per row.

    rewards: [num_prompts, G], one row per prompt's group of G sampled responses, or a flat [B]
    with group_size=G. The std is torch's unbiased one (divides by G − 1). With
    normalize_std=False (Dr. GRPO) the advantage is r_i − mean, with no division. A group whose
    rewards are all equal gets A = 0. verl's grpo (norm_adv_by_std_in_grpo, eps 1e-6); TRL's
    scale_rewards="group" (eps=1e-4) and "none" (normalize_std=False).
    """
    r = _grouped(rewards, group_size)
    eps = _eps(eps)
    centred = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        centred = centred / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    return _like_input(centred, rewards)


def batch_scaled_advantages(rewards, eps: float = STD_EPS, group_size=None):
    """A_i = (r_i − mean of its group) / (std of all the batch's rewards + eps).

    TRL's scale_rewards="batch" (TRL divides by std + 1e-4: pass eps=1e-4): the baseline stays
    the group's mean, the scale is one number for the batch (unbiased std of every reward), so a
    group of near-equal rewards keeps small advantages instead of being blown up to ±1.
    """
    r = _grouped(rewards, group_size)
    eps = _eps(eps)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(unbiased=True) + eps)
    return _like_input(adv, rewards)


def rloo_advantages(rewards, group_size=None):
    """A_i = r_i − (Σ_{j≠i} r_j) / (G − 1) = G/(G − 1)·(r_i − mean of the group): REINFORCE
    with the leave-one-out baseline (RLOO, Ahmadian et al. 2024, arXiv:2402.14740). verl's rloo
    and rloo_vectorized; TRL's RLOOTrainer (whose KL penalty goes into r first, and whose
    normalize_advantages=True then whitens A over the batch)."""
    r = _grouped(rewards, group_size)
    g = r.shape[1]
    adv = r - (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    return _like_input(adv, rewards)


def passk_advantages(rewards, normalize_std: bool = True, eps: float = STD_EPS, group_size=None):
    """Pass@k training (arXiv:2503.19595; verl's grpo_passk): the group's best response gets
    A = (r_max − r_second) / (std of the group + eps) (no division with normalize_std=False),
    every other response A = 0. With a tie at the top the difference is 0, so which of the tied
    responses is "best" does not matter."""
    r = _grouped(rewards, group_size)
    eps = _eps(eps)
    top2, where = torch.topk(r, 2, dim=1)
    gap = top2[:, :1] - top2[:, 1:]
    if normalize_std:
        gap = gap / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    adv = torch.zeros_like(r).scatter_(1, where[:, :1], gap)
    return _like_input(adv, rewards)


def gpg_advantages(rewards, group_size=None):
    """GPG (arXiv:2504.02546; verl's gpg): A_i = α·(r_i − mean of the group), with
    α = B / (the number of non-zero rewards in the batch, at least 1). verl's f_norm = 1 (the
    only value its trainer passes), so there is no std."""
    r = _grouped(rewards, group_size)
    alpha = r.numel() / max(int(torch.count_nonzero(r)), 1)
    return _like_input(alpha * (r - r.mean(dim=1, keepdim=True)), rewards)


def opo_advantages(rewards, mask, group_size=None):
    """OPO (arXiv:2505.23585; verl's opo): A_i = r_i − b, b = Σ_j |o_j|·r_j / Σ_j |o_j| over the
    group, |o_j| the real tokens of response j (mask [B, T], B = P·G): a longer response
    weighs more in its group's baseline."""
    r = _grouped(rewards, group_size)
    m = _row_mask(mask, r.numel())
    lengths = m.sum(-1).to(r.dtype).view_as(r)
    # an all-empty group has no baseline to weight: verl divides 0 by 0 there (NaN); we use 0
    baseline = (lengths * r).sum(1, keepdim=True) / lengths.sum(1, keepdim=True).clamp(min=1)
    return _like_input(r - baseline, rewards)


# --- whitening over tokens ---------------------------------------------------------------------
def masked_whiten(values, mask):
    """(v − μ) / sqrt(σ² + WHITEN_EPS) on the real tokens, 0 elsewhere; μ and σ² (unbiased) are
    over all the batch's real tokens, so a long response weighs more than a short one.

    verl's masked_whiten, to the last bit: its means divide by (count + 1e-8), kept here so that
    float64 results agree to rounding. Needs at least two real tokens (verl raises too).
    """
    m = nx.check_mask(mask, _tokens_shape(mask, "mask"))
    v = _tokens(values, "values", m.shape)
    n = int(m.sum())
    if n < 2:
        raise ValueError(f"whitening needs at least two real tokens, the mask has {n}")
    zero = v.new_zeros(())
    count = n + 1e-8
    mean = torch.where(m, v, zero).sum() / count
    var = torch.where(m, (v - mean).square(), zero).sum() / count * (n / (n - 1))
    return torch.where(m, (v - mean) * torch.rsqrt(var + WHITEN_EPS), zero)


def reinforce_plus_plus_baseline(rewards, mask, group_size=None):
    """REINFORCE++-baseline (arXiv:2501.03262; verl's reinforce_plus_plus_baseline): every real
    token of response i gets r_i − mean of its group, and the [B, T] result is whitened over the
    batch's real tokens (`masked_whiten`). Returns [B, T], 0 on masked tokens."""
    r = _grouped(rewards, group_size)
    m = _row_mask(mask, r.numel())
    centred = (r - r.mean(dim=1, keepdim=True)).reshape(-1, 1).expand(m.shape)
    return masked_whiten(centred, m)


def gdpo_advantages(rewards, mask=None, weights=None, normalize_std: bool = True,
                    eps: float = STD_EPS, group_size=None):
    """GDPO (arXiv:2601.05242): each reward component k is normalised within its group on its
    own, A_k = `group_advantages`(r_k), and A = Σ_k w_k·A_k is then standardised over the batch:

    - with a mask [B, T] (verl's gdpo): A on every real token, whitened over the batch's real
      tokens (`masked_whiten`); returns [B, T], 0 on masked tokens. K = 1 is verl's fallback
      when no gdpo_reward_keys are set: GRPO, then whitened;
    - mask=None (TRL's multi_objective_aggregation="normalize_then_sum", with eps=1e-4):
      (A − mean) / (std + eps) over the batch's responses (unbiased std); returns [P, G] or [B].

    rewards: [P, G, K], or [B, K] with group_size (K components). weights: K numbers, default 1.
    """
    r = _float(rewards, "rewards")
    if r.dim() not in (2, 3) or (r.dim() == 2 and group_size is None):
        raise ValueError(f"rewards must be [P, G, K], or [B, K] with group_size, got shape "
                         f"{tuple(r.shape)}")
    k = r.shape[-1]
    w = r.new_ones(k) if weights is None else _float(weights, "weights").to(r.device)
    if w.shape != (k,):
        raise ValueError(f"weights must hold one number per reward component ({k}), "
                         f"got shape {tuple(w.shape)}")
    total = sum(w[i] * group_advantages(r[..., i], normalize_std, eps, group_size).reshape(-1)
                for i in range(k))
    if mask is None:
        adv = (total - total.mean()) / (total.std(unbiased=True) + eps)
        return adv.view(r.shape[:-1])
    m = _row_mask(mask, total.numel())
    return masked_whiten(total[:, None].expand(m.shape), m)


# --- token-level: critic and reward-to-go ----------------------------------------------------
def _reverse_scan(rewards, mask, discount, values=None, lam=1.0):
    """The backward recursion over the real tokens of each row; masked tokens carry the state
    through unchanged. Without values: G_t = r_t + γ·G_next. With values: δ_t = r_t + γ·V_next −
    V_t and A_t = δ_t + γλ·A_next, with V_next and A_next those of the next REAL token (0 after
    the last). Returns [B, T], 0 on masked tokens."""
    out = torch.zeros_like(rewards)
    carried = rewards.new_zeros(rewards.shape[0])    # G_next, or A_next
    next_value = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        real = mask[:, t]
        if values is None:
            step = rewards[:, t] + discount * carried
        else:
            delta = rewards[:, t] + discount * next_value - values[:, t]
            step = delta + discount * lam * carried
            next_value = torch.where(real, values[:, t], next_value)
        carried = torch.where(real, step, carried)
        out[:, t] = torch.where(real, step, 0.0)
    return out


def gae(rewards, values, mask, gamma, lam, whiten: bool = False):
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438), per token.

    On the real tokens t_0 < t_1 < … of a row (the mask's ones):
        δ_k = r_{t_k} + γ·V_{t_{k+1}} − V_{t_k}      (V after the last real token is 0)
        A_k = Σ_{l≥0} (γλ)^l δ_{k+l} = δ_k + γλ·A_{k+1},       returns R_k = A_k + V_{t_k}.
    λ = 1 gives the discounted reward-to-go minus V; λ = 0 the one-step TD error.

    rewards, values: [B, T]; mask: [B, T] (None: every token real); gamma, lam in [0, 1].
    Returns (advantages, returns), [B, T], 0 on masked tokens. whiten=True whitens the
    advantages over the batch's real tokens (`masked_whiten`), not the returns: verl's
    compute_gae_advantage_return (adv_estimator="gae", defaults γ = λ = 1).

    Mask zeros inside a response (tool or environment tokens) are skipped as verl skips them: a
    reward on such a token is dropped, its value unused, and γ (γλ) is applied once across the
    gap. verl leaves numbers on masked tokens that no loss reads (inside a response the next
    real token's advantage, after whitening −μ/σ on padding); here they are 0.
    """
    rewards = _tokens(rewards, "rewards")
    values = _tokens(values, "values", rewards.shape)
    m = nx.check_mask(mask, rewards.shape)
    gamma, lam = _unit(gamma, "gamma"), _unit(lam, "lam")
    dtype = nx.compute_dtype(rewards, values)
    rewards, values = rewards.detach().to(dtype), values.detach().to(dtype)
    advantages = _reverse_scan(rewards, m, gamma, values, lam)
    returns = torch.where(m, advantages + values, 0.0)
    if whiten:
        advantages = masked_whiten(advantages, m)
    return advantages, returns


def reinforce_plus_plus(rewards, mask, gamma):
    """REINFORCE++ (arXiv:2501.03262; verl's reinforce_plus_plus): the discounted reward-to-go
    G_t = r_t + γ·G_next over the real tokens, whitened over the batch's real tokens:
    A = masked_whiten(G). No critic, no group. Its KL is in the rewards already (verl's
    use_kl_in_reward: `kl_penalised_rewards` first).

    rewards: [B, T] token rewards; mask [B, T]; gamma in [0, 1] (verl's algorithm.gamma).
    Returns (advantages, returns), [B, T], 0 on masked tokens (masked tokens are skipped as
    in `gae`).
    """
    rewards = _tokens(rewards, "rewards").detach()
    m = nx.check_mask(mask, rewards.shape)
    returns = _reverse_scan(rewards, m, _unit(gamma, "gamma"))
    return masked_whiten(returns, m), returns


def remax_advantages(rewards, baselines, mask):
    """ReMax (arXiv:2310.10505; verl's remax): A_t = Σ_{t'≥t} m·r_{t'} − b, with b the reward of
    the greedy response to the same prompt (verl's reward_baselines), and no discount.
    rewards: [B, T]; baselines: [B]. Returns (advantages, returns), [B, T], 0 on masked tokens
    (verl leaves the reward-to-go there)."""
    rewards = _tokens(rewards, "rewards").detach()
    m = nx.check_mask(mask, rewards.shape)
    b = _float(baselines, "baselines").to(rewards.dtype)
    if b.shape != (rewards.shape[0],):
        raise ValueError(f"baselines must be [B]=({rewards.shape[0]},), got {tuple(b.shape)}")
    to_go = torch.where(m, rewards, 0.0).flip(-1).cumsum(-1).flip(-1)
    returns = torch.where(m, to_go, 0.0)
    return torch.where(m, to_go - b[:, None], 0.0), returns


def kl_penalised_rewards(scores, logp_old, logp_ref, mask, beta, estimator="k1"):
    """r_t = score_t − β·k_t on the real tokens: the KL penalty in the reward (verl's
    algorithm.use_kl_in_reward, its apply_kl_penalty), before any estimator runs.

    k_t is a per-token estimate from d = logp_old − logp_ref (the rollout's log-probs: a
    constant, no gradient): "k1" d (verl's default, "kl"), "abs" |d|, "k2" d²/2 ("mse"),
    "k3" e^{−d} + d − 1 ("low_var_kl", clamped to ≤ K3_CLAMP as verl does).
    scores: [B, T] (an outcome reward sits on a response's last real token).
    """
    scores = _tokens(scores, "scores")
    logp_old = _tokens(logp_old, "logp_old", scores.shape).detach()
    logp_ref = _tokens(logp_ref, "logp_ref", scores.shape).detach()
    m = nx.check_mask(mask, scores.shape)
    if estimator not in KL_REWARD_ESTIMATORS:
        raise ValueError(f"estimator must be one of {tuple(KL_REWARD_ESTIMATORS)}, "
                         f"got {estimator!r}")
    beta = float(beta)
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be finite and ≥ 0, got {beta!r}")
    d = logp_old - logp_ref
    if estimator == "abs":
        k = d.abs()
    else:
        k = kl_estimate(logp_old, logp_ref, estimator)
        if estimator == "k3":
            k = k.clamp(max=K3_CLAMP)
    return scores - beta * torch.where(m, k, 0.0)


def outcome_rewards(rewards, mask):
    """[B, T] token rewards with each response's reward on its last real token (verl puts an
    outcome reward on a response's last token) and 0 elsewhere. rewards: [B]; a row with no
    real token gets none."""
    r = _float(rewards, "rewards")
    if r.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(r.shape)}")
    m = _row_mask(mask, r.shape[0])
    last = m.shape[1] - 1 - m.flip(-1).to(torch.int8).argmax(-1)
    out = torch.zeros(m.shape, dtype=r.dtype, device=r.device)
    has = m.any(-1)
    out[has.nonzero().squeeze(-1), last[has]] = r[has]
    return out


# --- per-token baselines: the optimal token baseline -------------------------------------------
def _otb_baseline(returns, weight, mask, group_size, handle_zero_tail, eps, lone_row_alone):
    """B_t = Σ_i G_{i,t}·W_{i,t} / (Σ_i W_{i,t} + eps) over each group's real tokens at t."""
    rows, width = mask.shape
    if group_size is None or int(group_size) < 2 or rows % int(group_size):
        raise ValueError(f"group_size={group_size} must be ≥ 2 and divide the batch of {rows} "
                         "responses")
    shape = (rows // int(group_size), int(group_size), width)
    m = mask.view(shape)
    g, w = (returns * mask).view(shape), (weight * mask).view(shape)
    baseline = ((g * w).sum(1) / (w.sum(1) + eps))[:, None, :].expand(shape).clone()
    lengths = m.sum(-1)
    if lone_row_alone:  # a response alone among empty ones has no baseline
        lone = (lengths > 0).sum(1, keepdim=True) == 1
        baseline = torch.where(lone[..., None], 0.0, baseline)
    if handle_zero_tail:  # past the second-longest response, the longest one has no peers
        top2 = lengths.topk(2, dim=1).values
        longest = (lengths == top2[:, :1]) & ((lengths == top2[:, :1]).sum(1, keepdim=True) == 1)
        tail = torch.arange(width, device=mask.device) >= top2[:, 1:2]
        baseline = torch.where(longest[..., None] & tail[:, None, :], 0.0, baseline)
    return baseline.reshape(rows, width)


def optimal_token_baseline(rewards, mask, logp_old, sum_pi_squared, group_size, is_weights=None,
                           handle_zero_tail: bool = True, eps: float = 1e-8, by_position=True):
    """The optimal token baseline (verl's optimal_token_baseline; tir_optimal_token_baseline with
    by_position=False): A_t = (G_t − B_t) on the real tokens, G_t the reward-to-go and

        B_t = Σ_i G_{i,t}·W_{i,t} / (Σ_i W_{i,t} + eps)   over the responses i of a group,
        W_t = Σ_{j≤t} w_j,  w_j = (1 − 2π_j + Σ_v π(v)²)·ρ̄_j²,

    π_j = exp(logp_old) of the sampled token, Σ_v π(v)² over the whole vocabulary at that token
    (sum_pi_squared, [B, T]), ρ̄ the rollout importance weight (is_weights, default 1). With
    handle_zero_tail, a group's unique longest response gets B = 0 past the second-longest
    one's length (nothing to compare it with there).

    by_position=True lines the group up by position t (verl's optimal_token_baseline);
    by_position=False by the k-th real token of each response, which for multi-turn masks is
    not the same (verl's tir_optimal_token_baseline, which also gives a response with only empty
    peers no baseline). Returns (advantages, returns), [B, T], 0 on masked tokens.
    """
    rewards = _tokens(rewards, "rewards").detach()
    m = nx.check_mask(mask, rewards.shape)
    logp_old = _tokens(logp_old, "logp_old", rewards.shape).detach()
    w = 1 - 2 * logp_old.exp() + _tokens(sum_pi_squared, "sum_pi_squared", rewards.shape)
    if is_weights is not None:
        w = w * _tokens(is_weights, "is_weights", rewards.shape).square()
    eps = _eps(eps)
    if by_position:
        order = None
    else:  # each row's real tokens first, in order: position k is the k-th real token
        order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices
        rewards, w = rewards.gather(1, order), w.gather(1, order)
        m = torch.arange(m.shape[1], device=m.device) < m.sum(-1)[:, None]
    returns = torch.where(m, rewards, 0.0).flip(-1).cumsum(-1).flip(-1)
    weight = torch.where(m, w, 0.0).cumsum(-1)
    baseline = _otb_baseline(returns, weight, m, group_size, handle_zero_tail, eps,
                             lone_row_alone=not by_position)
    adv = torch.where(m, returns - baseline, 0.0)
    returns = torch.where(m, returns, 0.0)
    if order is not None:  # back to the original positions
        adv = torch.zeros_like(adv).scatter_(1, order, adv)
        returns = torch.zeros_like(returns).scatter_(1, order, returns)
    return adv, returns


# --- the critic: clipped value loss -------------------------------------------------------------
def _value_inputs(values, values_old, returns, clip_range):
    values = _tokens(values, "values")
    values_old = _tokens(values_old, "values_old", values.shape).detach()
    returns = _tokens(returns, "returns", values.shape).detach()
    eps = float(clip_range)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"clip_range must be finite and ≥ 0, got {clip_range!r}")
    dtype = nx.compute_dtype(values, values_old, returns)
    values, values_old, returns = values.to(dtype), values_old.to(dtype), returns.to(dtype)
    # V clamped into the band, as verl clamps it (clip_by_value): inside the band the clipped
    # branch is V itself, bit for bit, so no rounding tie can shut a gate there (V_old +
    # clip(V − V_old, ±eps) can round away from V, and the clipped branch read larger)
    clipped = values.clamp(values_old - eps, values_old + eps)
    return values, clipped, returns


def value_loss(values, values_old, returns, mask=None, clip_range=0.5, agg="token-mean"):
    """PPO's clipped value loss, ½·agg(max((V − R)², (V_clip − R)²)), V_clip = V clipped to
    V_old ± clip_range: verl's compute_value_loss (critic.cliprange_value, default 0.5;
    its critic's loss_agg_mode follows the actor's, token-mean by default).

    values: [B, T] the critic's new predictions (the gradient flows into them); values_old: the
    predictions at rollout; returns: the targets (`gae`'s returns). The max is pessimistic:
    where V has left the band V_old ± clip_range and the clipped branch is the larger, that
    branch is constant in V and the token's gradient is 0 (`value_gate`).
    """
    values, clipped, returns = _value_inputs(values, values_old, returns, clip_range)
    m = nx.check_mask(mask, values.shape)
    per_token = torch.maximum((values - returns).square(), (clipped - returns).square())
    return 0.5 * nx.aggregate(per_token, m, agg)


def value_gate(values, values_old, returns, clip_range=0.5):
    """The gate of the value loss: ∂ℓ_t/∂V_t = g_t·(V_t − R_t) for ℓ_t = ½·max(…), with
    g_t = 0 where the clipped branch is strictly the larger, (V_clip − R)² > (V − R)²: V has
    left the band V_old ± clip_range and R lies nearer to V than to the band's edge, so moving V
    on towards R no longer lowers the loss. g_t = 1 elsewhere. [B, T] of 0.0 and 1.0, unmasked.
    """
    values, clipped, returns = _value_inputs(values, values_old, returns, clip_range)
    shut = (clipped - returns).square() > (values - returns).square()
    return (~shut).to(values.dtype).detach()


def value_clip_fraction(values, values_old, returns, mask=None, clip_range=0.5):
    """The share of real tokens whose value-loss gate is shut (verl's critic/vf_clipfrac:
    the clipped branch strictly the larger). Computed from V before clipping: measured on
    V_clip, |V_clip − V_old| never exceeds clip_range, and the fraction reads 0 (or, written
    as (V_old + clip) − V_old, rounding noise)."""
    gate = value_gate(values, values_old, returns, clip_range)
    m = nx.check_mask(mask, gate.shape)
    return ((gate == 0) & m).sum().to(gate.dtype) / m.sum().clamp(min=1)


# --- verl's registry -----------------------------------------------------------------------------
@dataclass(frozen=True)
class VerlEstimator:
    """One name of verl's ADV_ESTIMATOR_REGISTRY: the rlgates function that computes it (None
    when out of scope) and a note (how it maps, or why it is out of scope)."""

    function: object
    note: str


#: Every name of verl 0.9.1's ADV_ESTIMATOR_REGISTRY (tests/test_advantages_trainers.py fails
#: on a name missing here).
VERL_ESTIMATORS = {
    "gae": VerlEstimator(gae, "gae(..., whiten=True); needs a critic (values)"),
    "grpo": VerlEstimator(group_advantages, "norm_adv_by_std_in_grpo=False: normalize_std=False"),
    "grpo_vectorized": VerlEstimator(
        group_advantages, "the same as grpo, computed in float32 (verl's group_mean_std)"),
    "rloo": VerlEstimator(rloo_advantages, "leave-one-out baseline"),
    "rloo_vectorized": VerlEstimator(
        rloo_advantages, "the same as rloo for G ≥ 2 (a lone response: rloo keeps r, this 0)"),
    "reinforce_plus_plus": VerlEstimator(
        reinforce_plus_plus, "KL first, in the rewards: kl_penalised_rewards"),
    "reinforce_plus_plus_baseline": VerlEstimator(
        reinforce_plus_plus_baseline, "group mean removed, then whitened over tokens"),
    "remax": VerlEstimator(remax_advantages, "needs the greedy response's reward per prompt"),
    "opo": VerlEstimator(opo_advantages, "length-weighted group baseline"),
    "grpo_passk": VerlEstimator(passk_advantages, "only the group's best response learns"),
    "gpg": VerlEstimator(gpg_advantages, "α = B / #non-zero rewards, no std"),
    "gdpo": VerlEstimator(gdpo_advantages, "per-component GRPO, summed, whitened over tokens"),
    "optimal_token_baseline": VerlEstimator(
        optimal_token_baseline, "needs Σ_v π(v)² per token (actor.calculate_sum_pi_squared)"),
    "tir_optimal_token_baseline": VerlEstimator(
        optimal_token_baseline, "by_position=False: lined up by real token (multi-turn)"),
}
