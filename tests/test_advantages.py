"""rlgates.advantages from its formulas: each estimator against an independent reference written
here, its special cases, and its errors. (The trainers' own functions: test_advantages_trainers.)"""

from __future__ import annotations

import pytest
import torch

from rlgates import advantages as ra
from rlgates._numerics import ragged_mask

GAMMA, LAM = 0.9, 0.8
TOL = dict(rtol=1e-12, atol=1e-12)


def ragged(seed=0, B=6, T=8):
    """Token rewards, values and a ragged mask: an empty row, and mask zeros inside row 0."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = ragged_mask(torch.tensor([8, 0, 5, 3, 7, 1])[:B], T)
    mask[0, 2:5] = False
    return rewards, values, mask


def gae_reference(rewards, values, mask, gamma, lam):
    """The textbook sum A_k = Σ_l (γλ)^l δ_{k+l}, row by row over the list of real tokens."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        real = mask[b].nonzero().flatten().tolist()
        v = [values[b, t].item() for t in real] + [0.0]
        delta = [rewards[b, t].item() + gamma * v[k + 1] - v[k] for k, t in enumerate(real)]
        for k, t in enumerate(real):
            adv[b, t] = sum((gamma * lam) ** j * d for j, d in enumerate(delta[k:]))
    return adv


@pytest.mark.parametrize("gamma, lam", [(GAMMA, LAM), (0.5, 0.3), (1.0, 1.0), (0.95, 0.0)])
def test_gae_equals_the_textbook_sum(gamma, lam):
    rewards, values, mask = ragged()
    adv, returns = ra.gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, gae_reference(rewards, values, mask, gamma, lam), **TOL)
    assert torch.allclose(returns, torch.where(mask, adv + values, 0.0), **TOL)


def test_gae_special_cases():
    """λ = 1: the discounted reward-to-go minus V; λ = 0: the one-step TD error."""
    rewards, values, mask = ragged()
    row, real = 2, 5  # row 2 has 5 real tokens and no gap
    adv1, ret1 = ra.gae(rewards, values, mask, GAMMA, 1.0)
    to_go = [sum(GAMMA ** j * rewards[row, t + j] for j in range(real - t)) for t in range(real)]
    assert torch.allclose(ret1[row, :real], torch.stack(to_go), **TOL)
    adv0, _ = ra.gae(rewards, values, mask, GAMMA, 0.0)
    nxt = torch.cat([values[row, 1:real], values.new_zeros(1)])
    assert torch.allclose(adv0[row, :real], rewards[row, :real] + GAMMA * nxt
                          - values[row, :real], **TOL)


def test_gae_skips_a_gap_instead_of_stepping_through_it():
    """Negative control: stepping through the masked tokens as zero-reward steps (γ per
    position, their values used) gives other numbers on row 0, the same on rows without gaps."""
    rewards, values, mask = ragged()
    adv, _ = ra.gae(rewards, values, mask, GAMMA, LAM)
    through = mask.clone()
    through[0, 2:5] = True
    stepped = gae_reference(torch.where(through & ~mask, 0.0, rewards), values, through,
                            GAMMA, LAM)
    assert (adv[0, :2] - stepped[0, :2]).abs().min() > 1e-3
    assert torch.allclose(adv[2:], stepped[2:], **TOL)


def test_gae_returns_are_lambda_returns():
    """A third form: R_k = r_k + γ·((1 − λ)·V_{k+1} + λ·R_{k+1}) over the real tokens."""
    rewards, values, mask = ragged()
    _, returns = ra.gae(rewards, values, mask, GAMMA, LAM)
    for b in range(rewards.shape[0]):
        real = mask[b].nonzero().flatten().tolist()
        for k, t in enumerate(real):
            nxt = real[k + 1] if k + 1 < len(real) else None
            v_next, r_next = (values[b, nxt], returns[b, nxt]) if nxt is not None else (0.0, 0.0)
            expected = rewards[b, t] + GAMMA * ((1 - LAM) * v_next + LAM * r_next)
            assert torch.allclose(returns[b, t], torch.as_tensor(expected), **TOL)


def test_nan_and_inf_on_masked_tokens_do_not_leak():
    """The library's rule: what sits on masked tokens (padding, tool tokens) never reaches a
    real token's number."""
    rewards, values, mask = ragged()
    dirty_r, dirty_v = rewards.clone(), values.clone()
    dirty_r[~mask], dirty_v[~mask] = torch.nan, torch.inf
    for whiten in (False, True):
        clean = ra.gae(rewards, values, mask, GAMMA, LAM, whiten=whiten)
        assert all(torch.equal(a, b) for a, b in
                   zip(ra.gae(dirty_r, dirty_v, mask, GAMMA, LAM, whiten=whiten), clean, strict=True))
    assert torch.equal(ra.reinforce_plus_plus(dirty_r, mask, GAMMA)[0],
                       ra.reinforce_plus_plus(rewards, mask, GAMMA)[0])
    b = torch.zeros(6, dtype=torch.float64)
    assert torch.equal(ra.remax_advantages(dirty_r, b, mask)[0],
                       ra.remax_advantages(rewards, b, mask)[0])
    logp = -torch.rand(6, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sum_pi_squared = logp.exp().square()
    dirty_logp, dirty_sum = logp.clone(), sum_pi_squared.clone()
    dirty_logp[~mask], dirty_sum[~mask] = -torch.inf, torch.nan
    for by_position in (True, False):
        clean = ra.optimal_token_baseline(rewards, mask, logp, sum_pi_squared, 2,
                                          by_position=by_position)
        dirty = ra.optimal_token_baseline(dirty_r, mask, dirty_logp, dirty_sum, 2,
                                          by_position=by_position)
        assert all(torch.equal(a, b) for a, b in zip(dirty, clean, strict=True))
    assert torch.equal(ra.value_loss(dirty_v, values, dirty_r, mask, 0.2),
                       ra.value_loss(values, values, rewards, mask, 0.2))


def test_whitened_gae_has_zero_mean_and_unit_std_on_the_real_tokens():
    rewards, values, mask = ragged()
    adv, _ = ra.gae(rewards, values, mask, GAMMA, LAM, whiten=True)
    real = adv[mask]
    assert abs(real.mean()) < 1e-9 and abs(real.std() - 1) < 1e-7
    assert torch.all(adv[~mask] == 0)


def test_reinforce_plus_plus_and_remax_returns():
    """The reward-to-go over the real tokens: discounted (γ) for REINFORCE++, plain for ReMax."""
    rewards, _, mask = ragged()
    zero_values = torch.zeros_like(rewards)
    adv, returns = ra.reinforce_plus_plus(rewards, mask, GAMMA)
    assert torch.allclose(returns, gae_reference(rewards, zero_values, mask, GAMMA, 1.0), **TOL)
    assert torch.allclose(adv, ra.masked_whiten(returns, mask), **TOL)
    baselines = torch.arange(6, dtype=torch.float64)
    adv, returns = ra.remax_advantages(rewards, baselines, mask)
    assert torch.allclose(returns, gae_reference(rewards, zero_values, mask, 1.0, 1.0), **TOL)
    assert torch.allclose(adv, torch.where(mask, returns - baselines[:, None], 0.0), **TOL)


# --- per sequence ------------------------------------------------------------------------------
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.9, 0.5], [3.0, -1.0, 0.5, 0.5]],
                       dtype=torch.float64)


def test_flat_and_grouped_layouts_agree():
    flat = REWARDS.reshape(-1)
    for fn in (ra.group_advantages, ra.batch_scaled_advantages, ra.rloo_advantages,
               ra.passk_advantages, ra.gpg_advantages):
        assert torch.equal(fn(flat, group_size=4), fn(REWARDS).reshape(-1)), fn.__name__


def test_rloo_is_dr_grpo_scaled_by_g_over_g_minus_1():
    g = REWARDS.shape[1]
    assert torch.allclose(ra.rloo_advantages(REWARDS),
                          g / (g - 1) * ra.group_advantages(REWARDS, normalize_std=False), **TOL)
    loo = torch.stack([REWARDS[:, i] - torch.cat([REWARDS[:, :i], REWARDS[:, i + 1:]], 1).mean(1)
                       for i in range(g)], 1)
    assert torch.allclose(ra.rloo_advantages(REWARDS), loo, **TOL)


def test_batch_scaling_keeps_the_group_mean_and_one_scale():
    adv = ra.batch_scaled_advantages(REWARDS, eps=0.0)
    centred = REWARDS - REWARDS.mean(1, keepdim=True)
    assert torch.allclose(adv * REWARDS.std(), centred, **TOL)
    assert (adv - ra.group_advantages(REWARDS, eps=0.0)).abs().max() > 0.1


def test_passk_rewards_only_the_best_and_ties_give_zero():
    adv = ra.passk_advantages(REWARDS, normalize_std=False)
    assert torch.equal(adv[0], torch.zeros(4, dtype=torch.float64))  # tie at the top: 1, 1
    assert adv[1, 2] == pytest.approx(0.4) and torch.count_nonzero(adv[1]) == 1
    assert adv[2, 0] == pytest.approx(2.5) and torch.count_nonzero(adv[2]) == 1


def test_gpg_scales_by_the_share_of_nonzero_rewards():
    nonzero = torch.count_nonzero(REWARDS).item()
    assert nonzero < REWARDS.numel()
    assert torch.allclose(ra.gpg_advantages(REWARDS), REWARDS.numel() / nonzero
                          * ra.group_advantages(REWARDS, normalize_std=False), **TOL)


def test_opo_weights_the_baseline_by_length():
    equal = torch.ones(12, 5, dtype=torch.bool)
    dr = ra.group_advantages(REWARDS, normalize_std=False)
    assert torch.allclose(ra.opo_advantages(REWARDS, equal), dr, **TOL)  # equal lengths
    mask = ragged_mask(torch.tensor([5, 1, 1, 1] * 3), 5)
    adv = ra.opo_advantages(REWARDS, mask)
    baseline = (5 * REWARDS[:, 0] + REWARDS[:, 1:].sum(1)) / 8
    assert torch.allclose(adv, REWARDS - baseline[:, None], **TOL)
    assert (adv - dr).abs().max() > 0.1


def test_gdpo_sums_the_normalised_components_then_whitens():
    mask = ragged_mask(torch.tensor([5, 3, 4, 2] * 3), 5)
    parts = torch.stack([REWARDS, REWARDS.square()], -1)
    adv = ra.gdpo_advantages(parts, mask, weights=[1.0, 0.5])
    total = ra.group_advantages(REWARDS) + 0.5 * ra.group_advantages(REWARDS.square())
    expected = ra.masked_whiten(total.reshape(-1, 1).expand(12, 5), mask)
    assert torch.allclose(adv, expected, **TOL)


def test_outcome_rewards_sit_on_the_last_real_token():
    _, _, mask = ragged()
    r = torch.arange(1.0, 7.0, dtype=torch.float64)
    tokens = ra.outcome_rewards(r, mask)
    assert torch.equal(tokens.sum(1), torch.where(mask.any(1), r, 0.0))
    assert tokens[0, 7] == 1 and tokens[2, 4] == 3 and tokens[5, 0] == 6


def test_kl_penalised_rewards_per_estimator():
    g = torch.Generator().manual_seed(3)
    scores = torch.zeros(2, 3, dtype=torch.float64)
    old = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    ref = old - torch.tensor([[0.5, -0.5, 30.0], [0.1, 0.2, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    d = old - ref
    expected = {"k1": d, "abs": d.abs(), "k2": d.square() / 2,
                "k3": (torch.exp(-d) + d - 1).clamp(max=10)}
    for name, k in expected.items():
        shaped = ra.kl_penalised_rewards(scores, old, ref, mask, 0.1, name)
        assert torch.allclose(shaped, -0.1 * k * mask, **TOL), name
    assert ra.kl_penalised_rewards(scores, old, ref, mask, 0.1, "k3")[0, 2] == -1.0  # clamped


# --- bad input ---------------------------------------------------------------------------------
X = torch.zeros(2, 3, dtype=torch.float64)
M = torch.ones(2, 3)


@pytest.mark.parametrize("call, match", [
    (lambda: ra.gae(X, X, M, 1.5, 0.9), r"gamma must lie in \[0, 1\], got 1.5"),
    (lambda: ra.gae(X, X, M, 0.9, -0.1), r"lam must lie in \[0, 1\], got -0.1"),
    (lambda: ra.gae(X, X, M, "high", 0.9), "gamma must be a number"),
    (lambda: ra.gae(X, torch.zeros(2, 4), M, 0.9, 0.9), r"values must have shape \(2, 3\)"),
    (lambda: ra.gae(X[0], X[0], None, 0.9, 0.9), r"rewards must be \[B, T\]"),
    (lambda: ra.gae(X, X, M * 0.5, 0.9, 0.9), "mask must be bool or hold only 0 and 1"),
    (lambda: ra.gae(X, X, torch.ones(3, 2), 0.9, 0.9), r"mask must have shape \(2, 3\)"),
    (lambda: ra.gae(X, X, torch.tensor([[1, 0, 0], [0, 0, 0]]), 0.9, 0.9, whiten=True),
     "whitening needs at least two real tokens, the mask has 1"),
    (lambda: ra.group_advantages(torch.ones(6), group_size=4), "group_size=4 does not divide"),
    (lambda: ra.rloo_advantages(torch.ones(6)), "a flat batch needs group_size=G"),
    (lambda: ra.rloo_advantages(torch.ones(3, 1)), "G ≥ 2"),
    (lambda: ra.rloo_advantages(torch.ones(2, 3), group_size=2), "disagrees"),
    (lambda: ra.passk_advantages(torch.tensor([[1.0, float("nan")]])), "rewards must be finite"),
    (lambda: ra.group_advantages(torch.ones(2, 2, dtype=torch.bool)), "real numbers"),
    (lambda: ra.group_advantages(torch.ones(2, 2), eps=-1), "eps must be"),
    (lambda: ra.opo_advantages(torch.ones(2, 2), torch.ones(3, 5)), "one row per response"),
    (lambda: ra.remax_advantages(X, torch.zeros(3), M), r"baselines must be \[B\]"),
    (lambda: ra.kl_penalised_rewards(X, X, X, M, 0.1, "k4"), "estimator must be one of"),
    (lambda: ra.kl_penalised_rewards(X, X, X, M, -1, "k1"), "beta must be"),
    (lambda: ra.gdpo_advantages(torch.ones(4, 2), M, group_size=2, weights=[1.0]),
     "one number per reward component"),
    (lambda: ra.optimal_token_baseline(X, M, X, X, group_size=3), "group_size=3 must be ≥ 2"),
    (lambda: ra.value_loss(X, X, X, M, clip_range=-0.1), "clip_range must be finite"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- the critic's clipped value loss -------------------------------------------------------------
def critic_batch(seed=0, B=5, T=7, eps=0.2):
    """New and old values whose moves straddle the band ±eps, targets on both sides."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    move = 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)
    move = torch.where((move.abs() - eps).abs() < 1e-3, move + 3e-3, move)  # off the kinks
    returns = old + torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = ragged_mask(torch.tensor([7, 0, 4, 6, 2])[:B], T)
    return old + move, old, returns, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_value_gate_three_ways(agg):
    """The closed form g·(V − R)·w against autograd and central finite differences."""
    from rlgates import aggregation_weight

    values, old, returns, mask = critic_batch()
    leaf = values.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(ra.value_loss(leaf, old, returns, mask, 0.2, agg), leaf)
    gate = ra.value_gate(values, old, returns, 0.2)
    closed = gate * (values - returns) * aggregation_weight(mask, agg)
    assert torch.allclose(grad, closed, **TOL)
    h = 1e-6
    fd = torch.zeros_like(values)
    for i, j in mask.nonzero().tolist():
        up, down = values.clone(), values.clone()
        up[i, j] += h
        down[i, j] -= h
        fd[i, j] = (ra.value_loss(up, old, returns, mask, 0.2, agg)
                    - ra.value_loss(down, old, returns, mask, 0.2, agg)) / (2 * h)
    assert torch.allclose(fd, closed, rtol=1e-6, atol=1e-9)
    real = gate[mask]
    assert 0 < (real == 0).sum() < real.numel()  # some shut, some open


@pytest.mark.parametrize("move, target, open_", [
    (0.1, 1.0, True),     # inside the band: plain squared error
    (0.5, 1.0, False),    # left the band towards R, R nearer V than the edge: shut
    (0.5, 0.4, False),    # R just past the midpoint (0.35) of edge and V
    (0.5, 0.3, True),     # R nearer the edge: the unclipped branch is the larger
    (0.5, -1.0, True),    # moved away from R: pulled back
    (-0.5, -1.0, False),  # the mirror image
])
def test_value_gate_regions(move, target, open_):
    old = torch.zeros(1, 1, dtype=torch.float64)
    gate = ra.value_gate(old + move, old, old + target, clip_range=0.2)
    assert gate.item() == float(open_)


def test_value_clip_fraction_is_read_before_clipping():
    """Measured on the clipped move (a bug reported in a public trainer), the fraction reads 0 on
    a batch where the gate is shut on many tokens. Written as (V_old + clip) − V_old, as that
    trainer wrote it, it reads rounding: |…| exceeds clip_range by an ulp on some tokens."""
    values, old, returns, mask = critic_batch()
    fraction = ra.value_clip_fraction(values, old, returns, mask, 0.2)
    clipped_move = (values - old).clamp(-0.2, 0.2)
    after = ((clipped_move.abs() > 0.2) & mask).sum() / mask.sum()
    left_band = ((values - old).abs() > 0.2) & mask
    assert after == 0 and 0.1 < fraction <= left_band.sum() / mask.sum()
    assert fraction == (ra.value_gate(values, old, returns, 0.2)[mask] == 0).double().mean()
    rebuilt = ((old + clipped_move) - old).abs()
    noise = (rebuilt > 0.2) & mask
    assert (rebuilt[noise] - 0.2).max() < 1e-15 and not (noise & ~left_band).any()


def test_a_wide_band_is_plain_squared_error():
    """Negative control: with clip_range beyond every move the loss is ½·MSE, every gate open."""
    values, old, returns, mask = critic_batch()
    plain = 0.5 * (values - returns)[mask].square().mean()
    assert torch.allclose(ra.value_loss(values, old, returns, mask, 100.0), plain, **TOL)
    assert ra.value_clip_fraction(values, old, returns, mask, 100.0) == 0
    assert ra.value_loss(values, old, returns, mask, 0.2) > plain  # the clip binds at 0.2


def test_optimal_token_baseline_with_equal_weights_is_the_group_mean():
    """Full-length responses and one π everywhere: every W_t is the same across the group, so
    B_t is the group's mean reward-to-go at t (a leave-in baseline, per token)."""
    rewards = torch.randn(8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mask = torch.ones(8, 5, dtype=torch.bool)
    logp = torch.full((8, 5), -1.0, dtype=torch.float64)
    adv, returns = ra.optimal_token_baseline(rewards, mask, logp, torch.full_like(logp, 0.3), 4)
    grouped = returns.view(2, 4, 5)
    expected = (grouped - grouped.mean(1, keepdim=True)).view(8, 5)
    assert torch.allclose(adv, expected, rtol=1e-7, atol=1e-7)  # eps = 1e-8 in the division
    assert (returns - rewards).abs().max() > 0.1
