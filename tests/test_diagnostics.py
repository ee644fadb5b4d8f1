"""rlgates.diagnostics: the trainers' numbers, recomputed from their own formulas."""

import math

import pytest
import torch

import rlgates
from rlgates import diagnostics, trainers
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
    ent = rlgates.regularisers.entropy(logits)
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
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(stack[0].shape, generator=g, dtype=torch.float64)
    isw = torch.rand(stack[0].shape, generator=g, dtype=torch.float64) + 0.5
    rewards = (torch.rand(3, 16, generator=g) < 0.5).float()
    rewards[0, :4] = 1.0  # a solved group, so that every share has something to count
    for name, agg in (("ppo", "token-mean"), ("gspo", "seq-mean-token-mean"), ("sao", None)):
        m = rlgates.get(name)
        kw = {"agg": agg, "is_weight": isw, "rewards": rewards, "group": 4}
        batched = diagnostics.step_stats(m, *stack, entropy=ent, **kw)
        assert tuple(batched) == diagnostics.keys()
        for r, b in enumerate(runs):
            kw_r = {**kw, "is_weight": isw[r], "rewards": rewards[r]}
            one = diagnostics.step_stats(m, *b, entropy=ent[r], **kw_r)
            for k in diagnostics.keys():
                assert batched[k].shape == (3,)
                assert not batched[k].isnan().any(), (name, k)
                assert torch.allclose(batched[k][r], one[k], atol=1e-12), (name, k)


def test_missing_inputs_are_nan_and_skipped_by_the_adapters():
    logp, logp_old, adv, mask = _batch(seed=5)
    s = diagnostics.step_stats(rlgates.get("ppo"), logp, logp_old, adv, mask)
    assert all(math.isnan(float(s[k])) for k in ("entropy", "reward", "frac_reward_zero_std"))
    assert float(s["is_weight_mean"]) == 1.0  # no weight: weight 1
    stats = trainers.gate_stats(rlgates.get("ppo"), logp, logp_old, adv, mask)
    assert set(stats) == set(diagnostics.keys(logged=True)) >= {"gate_mean", "gate_zero"}

    class NoGate:  # an object with only a loss: every gate diagnostic is NaN, the rest are not
        def loss(self, logp, logp_old, adv, mask=None, agg="token-mean"):
            return -rlgates.aggregate(logp * adv[:, None], mask, agg)

    s = diagnostics.step_stats(NoGate(), logp, logp_old, adv, mask)
    assert math.isnan(float(s["gate_mean"])) and math.isnan(float(s["pg_clipfrac"]))
    assert math.isfinite(float(s["loss"])) and math.isfinite(float(s["ppo_kl"]))


def test_gate_zero_and_gate_mean_over_the_tokens_with_a_signal():
    logp, logp_old, adv, mask = _batch(seed=6, scale=1.0)
    adv[:3] = 0.0  # responses with no signal: left out of both
    m = rlgates.get("dual_clip")
    s = diagnostics.as_floats(diagnostics.step_stats(m, logp, logp_old, adv, mask))
    a = adv[:, None].expand_as(logp)
    live = mask & (a != 0)
    gate = m.gate(torch.exp(logp - logp_old), a)
    assert math.isclose(s["gate_zero"], float(((gate == 0) & live).sum() / live.sum()))
    assert math.isclose(s["gate_mean"], float(gate[live].mean()), rel_tol=1e-12)
    assert 0 < s["gate_zero"] < 1
    assert s["gate_zero"] != float(((gate == 0) & mask).sum() / mask.sum())  # A = 0 counted


def test_the_trainer_names_are_the_trainers_own():
    """Every verl or TRL name in the registry is a metric key the installed trainer writes."""
    from rlgates._book import facts

    def source(relative):  # read, not imported: finding verl.trainer's spec imports verl (~6 s)
        return facts.path(relative).read_text()

    trl = source("trl/trainer/grpo_trainer.py")
    verl = source("verl/trainer/ppo/core_algos.py") + source("verl/trainer/ppo/metric_utils.py")
    named = [(d.trl, trl) for d in diagnostics.REGISTRY.values() if d.trl]
    named += [(d.verl, verl) for d in diagnostics.REGISTRY.values() if d.verl]
    assert len(named) >= 10
    for name, text in named:
        assert f'"{name}"' in text, name
    assert '"clip_ratio/made_up"' not in trl  # the negative control


@pytest.mark.xdist_group("trainers")  # imports verl (~2 s): on the worker that has it already
def test_a_registered_diagnostic_reaches_the_lab_the_tables_and_the_trainer_logs():
    """Adding a diagnostic is one place: register it, and the lab's results, its metric table,
    the lab's summary tables, diagnostics.table() and both adapters' logs carry it."""
    from rlgates import lab

    @diagnostics.register("shut_pos_share", "share of the real tokens with A > 0 and gate 0",
                          trl="shut_made_up")
    def shut_pos_share(b):
        return diagnostics.share(b.shut & b.pos, b.mask)

    try:
        cfg = lab.LabConfig.for_device("cpu", prompts=4, group=4, length=6, steps=2)
        runs = lab.run_many(["dapo"], seeds=[0, 1], config=cfg)
        values = runs["dapo"][0].metrics["shut_pos_share"]
        assert len(values) == 2 and all(0 <= v <= 1 for v in values)
        assert "shut_pos_share" in lab.metric_doc()
        assert "| `shut_pos_share` | share of the real tokens" in diagnostics.table()
        assert "shut_pos_share" in lab.summary_table(runs, keys=("reward", "shut_pos_share"))
        logp, logp_old, adv, mask = _batch(seed=7, scale=1.0)
        m = rlgates.get("dapo")
        logged = trainers.gate_stats(m, logp, logp_old, adv, mask)
        want = float(((m.gate(torch.exp(logp - logp_old), adv[:, None]) == 0)
                      & mask & (adv[:, None] > 0)).sum() / mask.sum())
        assert want > 0 and math.isclose(logged["shut_pos_share"], want, rel_tol=1e-12)
        from rlgates.trainers import verl as rv
        verl_logged = rv.metrics(m, logp, logp_old, adv[:, None].expand_as(logp), mask)
        assert verl_logged["actor/rlgates_shut_pos_share"] == logged["shut_pos_share"]
    finally:
        diagnostics.unregister("shut_pos_share")
    assert "shut_pos_share" not in trainers.gate_stats(m, logp, logp_old, adv, mask)
    with pytest.raises(ValueError, match="already registered"):
        diagnostics.register("ppo_kl", "twice")(lambda b: None)


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
