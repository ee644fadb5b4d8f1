"""The training lab: reproducible, truly lagged, finite metrics, any method, a correct reward."""

import copy
import math

import pytest
import torch

import rlgates
from rlgates import lab

TINY = lab.LabConfig.for_device("cpu", prompts=4, group=4, length=6, steps=3)


def test_same_seed_same_metrics():
    a = lab.train("dapo", TINY, seed=3, progress=False)
    b = lab.train("dapo", TINY, seed=3, progress=False)
    c = lab.train("dapo", TINY, seed=4, progress=False)
    for key in lab.METRIC_KEYS:
        if key != "seconds":
            assert a.metrics[key] == b.metrics[key], key
    assert a.metrics["loss"] != c.metrics["loss"]


def test_train_leaves_global_rng_and_threads_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    lab.train("ppo", TINY, seed=0, steps=2, progress=False)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


def test_lag_zero_gives_ratio_one_on_each_first_update():
    cfg = TINY.replace(minibatches=1, epochs=1, steps=4)
    res = lab.train("ppo", cfg, seed=0, lag=0, progress=False)
    assert max(res.metrics["log_ratio_absmax"]) < 1e-5  # rollout policy = updated policy
    assert res.metrics["staleness"] == [0.0] * 4
    lagged = lab.train("ppo", cfg, seed=0, lag=2, progress=False)
    assert lagged.metrics["staleness"] == [0.0, 1.0, 2.0, 2.0]
    assert lagged.metrics["log_ratio_absmax"][0] < 1e-5  # step 0: nothing to lag behind yet
    assert min(lagged.metrics["log_ratio_absmax"][1:]) > 1e-4


@pytest.mark.parametrize("lag", [1, 3])
def test_rollouts_come_from_the_policy_lag_updates_old(lag):
    """logp of each rollout equals the log-probs of the policy saved `lag` updates earlier."""
    cfg = TINY.replace(steps=5)  # 2 minibatches x 2 epochs: 4 updates per step
    versions = {}
    rollouts = []

    def hook(event, info):
        if event == "update":
            versions[info["update"]] = copy.deepcopy(info["policy"].state_dict())
        else:
            rollouts.append(info)

    with torch.random.fork_rng():
        torch.manual_seed(7)
        init = cfg.policy()
    versions[0] = copy.deepcopy(init.state_dict())
    lab.train("sao", cfg, seed=7, lag=lag, progress=False, hook=hook)
    updates_per_step = cfg.minibatches * cfg.epochs
    for info in rollouts:
        expected = max(0, info["step"] * updates_per_step - lag)
        assert info["version"] == expected
        policy = cfg.policy()
        policy.load_state_dict(versions[expected])
        with torch.no_grad():
            logp = policy.log_probs(info["tokens"], info["prompts"])
        assert (logp - info["logp_rollout"]).abs().max() < 1e-5


def test_metrics_have_the_right_keys_and_finite_values():
    res = lab.train("grpo", TINY, seed=0, lag=1, progress=False)
    assert tuple(res.metrics) == lab.METRIC_KEYS
    for key, values in res.metrics.items():
        assert len(values) == TINY.steps, key
        assert all(math.isfinite(v) for v in values), key
    m = res.metrics
    for key in ("reward", "solved", "rare", "live", "gated", "gated_pos", "gated_neg", "gate_mean"):
        assert all(0 <= v <= 1 for v in m[key]), key
    assert all(v >= 0 for v in m["entropy"] + m["kl"] + m["grad_norm"] + m["log_ratio_std"])
    assert all(1 <= v <= TINY.length for v in m["length"])
    assert res.final("reward", last=2) == pytest.approx(sum(m["reward"][-2:]) / 2)


@pytest.mark.parametrize("name", rlgates.names())
def test_runs_with_every_registry_name(name):
    res = lab.train(name, TINY, seed=0, steps=2, progress=False)
    assert res.method == name
    assert res.agg == lab.default_agg(name)
    assert all(math.isfinite(v) for v in res.metrics["loss"])
    assert all(math.isfinite(v) for v in res.metrics["gated"])


def test_accepts_any_object_with_a_loss_and_an_agg_override():
    class Reinforce:  # no gate: the gate metrics are NaN, training still runs
        name = "my-reinforce"

        def loss(self, logp, logp_old, adv, mask=None, agg="token-mean"):
            obj = torch.where(mask, logp * adv[:, None], 0.0)
            return -rlgates.aggregate(obj, mask, agg)

    res = lab.train(Reinforce(), TINY, seed=0, steps=2, agg="seq-mean-token-sum", progress=False)
    assert res.method == "my-reinforce" and res.agg == "seq-mean-token-sum"
    assert math.isnan(res.metrics["gated"][0])
    res = lab.train(rlgates.get("dapo", eps_high=0.4), TINY, steps=2, agg="seq-mean-token-mean",
                    progress=False)
    assert res.method == "dapo" and res.agg == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="agg"):
        lab.train("ppo", TINY, steps=1, agg="sum", progress=False)
    with pytest.raises(ValueError, match="lag"):
        lab.train("ppo", TINY, steps=1, lag=-1, progress=False)
    with pytest.raises(ValueError, match="unknown method"):
        lab.train("nope", TINY, steps=1, progress=False)


def test_run_many_and_summary():
    runs = lab.run_many(["ppo", "sapo"], seeds=[0, 1], config=TINY, steps=2)
    assert list(runs) == ["ppo", "sapo"] and [r.seed for r in runs["sapo"]] == [0, 1]
    # same seed: the same start, so the same first rollout batch for every method
    assert runs["ppo"][0].metrics["reward"][0] == runs["sapo"][0].metrics["reward"][0]
    s = lab.summary(runs, keys=("reward",), last=1)
    vals = [r.metrics["reward"][-1] for r in runs["ppo"]]
    assert s["ppo"]["reward"]["min"] == pytest.approx(min(vals))
    assert "| ppo |" in lab.summary_table(runs)


def test_reward_on_hand_made_sequences():
    task = lab.PatternTask(vocab=16, length=8, motif=2, eos=3, rare_tokens=2)
    assert task.rare.tolist() == [14, 15] and 3 not in task.common.tolist()
    prompt = torch.tensor([[1, 15]])
    target = torch.tensor([[1, 15, 1, 15, 1, 15, 1, 15]])
    assert torch.equal(task.target(prompt), target)
    cases = {
        (1, 15, 1, 15, 1, 15, 1, 15): 1.0,
        (1, 14, 1, 14, 1, 14, 1, 14): 0.5,  # the common half only
        (15, 1, 15, 1, 15, 1, 15, 1): 0.0,  # right tokens, wrong places
        (1, 15, 1, 15, 3, 15, 1, 15): 0.5,  # ends at t = 4: the rest counts as wrong
        (3, 15, 1, 15, 1, 15, 1, 15): 0.0,  # ends at once
        (1, 15, 1, 0, 1, 15, 0, 15): 0.75,
    }
    tokens = torch.tensor(list(cases))
    reward = task.reward(prompt.expand(len(cases), -1), tokens)
    assert reward.tolist() == list(cases.values())
    mask = task.mask(torch.tensor([[1, 15, 3, 15, 3, 2]]))
    assert mask.tolist() == [[True, True, True, False, False, False]]  # up to the first end token
    assert task.rare_positions().tolist() == [False, True] * 4
    # a three-token motif and no end token
    task3 = lab.PatternTask(vocab=16, length=7, motif=3, eos=None)
    assert task3.target(torch.tensor([[0, 9, 2]])).tolist() == [[0, 9, 2, 0, 9, 2, 0]]
    assert task3.reward(torch.tensor([[0, 9, 2]]), torch.tensor([[0, 9, 2, 0, 9, 2, 3]])) == 6 / 7


def test_prompts_draw_common_then_rare_tokens():
    task = lab.PatternTask(vocab=16, length=8, motif=2, eos=3, rare_tokens=0)
    p = task.prompts(200, torch.Generator().manual_seed(0))
    assert p.shape == (200, 2)
    assert set(p[:, 0].tolist()) <= {0, 1, 2, 4, 5, 6, 7}
    assert set(p[:, 1].tolist()) <= set(range(8, 16))


def test_config_is_sized_by_device():
    cpu, gpu = lab.LabConfig.for_device("cpu"), lab.LabConfig.for_device("cuda")
    assert gpu.batch > cpu.batch and gpu.hidden > cpu.hidden
    assert lab.LabConfig.for_device("cpu", steps=7).steps == 7


def test_lab_policy_sampling_matches_its_log_probs():
    cfg = lab.LabConfig.for_device("cpu")
    torch.manual_seed(0)
    policy = cfg.policy()
    prompts = cfg.task().prompts(16, torch.Generator().manual_seed(1))
    tokens, logp = policy.sample(16, cfg.length, prompts, torch.Generator().manual_seed(2))
    assert (policy.log_probs(tokens, prompts).detach() - logp).abs().max() < 1e-5
    res = lab.train("ppo", cfg.replace(arch="gru"), steps=1, progress=False)
    assert math.isfinite(res.metrics["loss"][0])
