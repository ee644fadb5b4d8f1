"""rlgates.diagnostics: the trainers' numbers, recomputed from their own formulas."""

import math

import torch

import rlgates
from rlgates import diagnostics
from tests.conftest import make_batch


def _batch(seed=0, scale=0.4, B=16, T=12):
    logp, logp_old, adv, mask = make_batch(B=B, T=T, scale=scale, seed=seed)
    return logp, logp_old, adv, mask


def _masked_mean(x, mask):  # verl_F.masked_mean / TRL masked_batch_mean
    return float((x * mask).sum() / mask.sum())


def test_clip_shares_match_trl_and_verl_formulas():
    logp, logp_old, adv, mask = _batch()
    m = rlgates.get("dapo", eps_low=0.2, eps_high=0.28)
    s = diagnostics.as_floats(diagnostics.step_stats(m, logp, logp_old, adv, mask))
    ratio = torch.exp(logp - logp_old)
    a = adv[:, None].expand_as(ratio)
    # TRL GRPOTrainer, loss_type "dapo"
    low = ((ratio < 1 - 0.2) & (a < 0)).float()
    high = ((ratio > 1 + 0.28) & (a > 0)).float()
    assert 0 < _masked_mean(low, mask) and 0 < _masked_mean(high, mask)
    assert math.isclose(s["clip_ratio/low_mean"], _masked_mean(low, mask), abs_tol=1e-12)
    assert math.isclose(s["clip_ratio/high_mean"], _masked_mean(high, mask), abs_tol=1e-12)
    assert math.isclose(s["clip_ratio/region_mean"], _masked_mean(low + high, mask),
                        abs_tol=1e-12)
    # verl compute_policy_loss_vanilla: the clipped branch is the larger loss
    pg1 = -a * ratio
    pg2 = -a * ratio.clamp(1 - 0.2, 1 + 0.28)
    assert math.isclose(s["pg_clipfrac"], _masked_mean((pg2 > pg1).float(), mask),
                        abs_tol=1e-12)
    assert s["pg_clipfrac_lower"] == 0.0  # no dual clip in dapo
    ppo_kl = _masked_mean(-(logp - logp_old), mask)
    assert math.isclose(s["ppo_kl"], ppo_kl, rel_tol=1e-12)


def test_dual_clip_lower_matches_verl():
    logp, logp_old, adv, mask = _batch(seed=1, scale=1.5)
    m = rlgates.get("dual_clip", eps=0.2, c=3.0)
    s = diagnostics.as_floats(diagnostics.step_stats(m, logp, logp_old, adv, mask))
    ratio = torch.exp(logp - logp_old)
    a = adv[:, None].expand_as(ratio)
    pg1 = -a * ratio
    pg2 = -a * ratio.clamp(0.8, 1.2)
    clip1 = torch.maximum(pg1, pg2)
    pg3 = -a * 3.0
    lower = ((clip1 > pg3) & (a < 0)).float()
    assert _masked_mean(lower, mask) > 0
    assert math.isclose(s["pg_clipfrac_lower"], _masked_mean(lower, mask), abs_tol=1e-12)
    assert math.isclose(s["pg_clipfrac"], _masked_mean((pg2 > pg1).float(), mask),
                        abs_tol=1e-12)


def test_shares_by_sign_and_signal_lost():
    logp, logp_old, adv, mask = _batch(seed=2)
    m = rlgates.get("ppo")
    s = diagnostics.as_floats(diagnostics.step_stats(m, logp, logp_old, adv, mask,
                                                     agg="token-mean"))
    ratio = torch.exp(logp - logp_old)
    a = adv[:, None].expand_as(ratio)
    gate = m.gate(ratio, a)
    pos, neg = mask & (a > 0), mask & (a < 0)
    assert math.isclose(s["clipfrac_pos"], float((gate == 0)[pos].float().mean()))
    assert math.isclose(s["clipfrac_neg"], float((gate == 0)[neg].float().mean()))
    size = (ratio * a).abs()
    lost = float(size[mask & (gate == 0)].sum() / size[mask].sum())
    assert 0 < lost < 1
    assert math.isclose(s["signal_lost"], lost, rel_tol=1e-9)
    # a smooth gate never shuts: nothing lost
    sapo = diagnostics.step_stats(rlgates.get("sapo"), logp, logp_old, adv, mask)
    assert float(sapo["signal_lost"]) == 0.0 and float(sapo["clipfrac_pos"]) == 0.0


def test_kl_entropy_and_absmax():
    logp, logp_old, adv, mask = _batch(seed=3)
    V = 7
    logits = torch.zeros(*logp.shape, V, dtype=torch.float64)
    ent = diagnostics.token_entropy(logits)
    assert torch.allclose(ent, torch.full_like(ent, math.log(V)))
    s = diagnostics.as_floats(diagnostics.step_stats(rlgates.get("ppo"), logp, logp_old, adv,
                                                     mask, entropy=ent))
    assert math.isclose(s["entropy"], math.log(V))
    lr = (logp - logp_old)[mask]
    assert math.isclose(s["log_ratio_absmax"], float(lr.abs().max()))
    assert math.isclose(s["approx_kl"], float((lr.exp() - 1 - lr).mean()), rel_tol=1e-12)
    assert s["approx_kl"] > 0
    no_ent = diagnostics.step_stats(rlgates.get("ppo"), logp, logp_old, adv, mask)
    assert math.isnan(float(no_ent["entropy"]))


def test_sequence_level_uses_the_sequence_ratio():
    logp, logp_old, adv, mask = _batch(seed=4, scale=0.002)
    m = rlgates.get("gspo")
    s = diagnostics.as_floats(diagnostics.step_stats(m, logp, logp_old, adv, mask))
    lengths = mask.sum(-1)
    seq_lr = (torch.where(mask, logp - logp_old, 0.0).sum(-1) / lengths.clamp(min=1))
    high_seq = (seq_lr > math.log(1 + m.hparams["eps_high"])) & (adv > 0)
    expect = float((high_seq[:, None] & mask).sum() / mask.sum())
    assert expect > 0
    assert math.isclose(s["clip_ratio/high_mean"], expect, abs_tol=1e-12)


def test_leading_runs_dimension_is_per_run():
    runs = [_batch(seed=10 + r) for r in range(3)]
    stack = [torch.stack([b[i] for b in runs]) for i in range(4)]
    ent = torch.rand(stack[0].shape, generator=torch.Generator().manual_seed(0),
                     dtype=torch.float64)
    for name in ("ppo", "gspo", "sao"):
        m = rlgates.get(name)
        batched = diagnostics.step_stats(m, *stack, entropy=ent)
        for r, b in enumerate(runs):
            one = diagnostics.step_stats(m, *b, entropy=ent[r])
            for k in diagnostics.KEYS:
                assert batched[k].shape == (3,)
                assert torch.allclose(batched[k][r], one[k], atol=1e-12), (name, k)


def test_group_stats_matches_trl_and_splits_solved_from_stuck():
    # three groups of four: all right, all equally wrong, mixed; then one run more ([2, 12])
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.25, 0.25, 0.25, 0.25, 0.0, 0.5, 1.0, 0.5],
                            [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]])
    s = diagnostics.group_stats(rewards, group=4)
    # TRL GRPOTrainer: std per group, repeated over its responses, isclose(std, 0), mean
    std = rewards.view(2, -1, 4).std(-1).repeat_interleave(4, -1)
    trl = torch.isclose(std, torch.zeros_like(std)).float().mean(-1)
    torch.testing.assert_close(s["frac_reward_zero_std"], trl)
    torch.testing.assert_close(s["frac_reward_zero_std"], torch.tensor([2 / 3, 2 / 3]))
    torch.testing.assert_close(s["solved_groups"], torch.tensor([1 / 3, 1 / 3]))
    torch.testing.assert_close(s["stuck_groups"], torch.tensor([1 / 3, 1 / 3]))
    # with these advantages, zero spread is exactly a group whose every A is 0
    adv = rlgates.group_advantages(rewards.view(-1, 4)).view(2, -1, 4)
    dead = (adv == 0).all(-1).float().mean(-1)
    torch.testing.assert_close(dead, s["frac_reward_zero_std"])
    # a lower bar for "solved" moves groups from stuck to solved, never the total
    t = diagnostics.group_stats(rewards, group=4, top=0.25)
    torch.testing.assert_close(t["solved_groups"] + t["stuck_groups"], trl)
    assert float(t["stuck_groups"][0]) == 0.0
