"""The training lab: batched runs equal single runs, truly lagged, finite metrics, any method,
decoupled PPO, a correct reward, honest reporting."""

import math

import pytest
import torch

import rlgates
from rlgates import diagnostics, lab

TINY = lab.LabConfig.for_device("cpu", prompts=4, group=4, length=6, steps=3)


def test_same_seed_same_metrics():
    a = lab.train("dapo", TINY, seeds=[3], progress=False)[0]
    b = lab.train("dapo", TINY, seeds=[3], progress=False)[0]
    c = lab.train("dapo", TINY, seeds=[4], progress=False)[0]
    assert a.metrics == b.metrics
    assert a.metrics["reward"] != c.metrics["reward"] or a.metrics["entropy"] != c.metrics["entropy"]


def test_train_leaves_global_rng_and_threads_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    lab.train("ppo", TINY, seeds=[0], steps=2, progress=False)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize(("name", "lag", "anchor"), [
    ("ppo", 0, "behaviour"), ("gspo", 2, "behaviour"), ("sapo", 0, "behaviour"),
    ("dual_clip", 3, "proximal"),
])
def test_run_r_of_the_batch_equals_run_r_alone(name, lag, anchor):
    """Per-run seeds, Adam state and grad-norm clip: batching changes nothing but speed."""
    cfg = TINY.replace(steps=6, dtype="float64", anchor=anchor, max_grad_norm=0.05)
    seeds = [5, 0, 9]
    batched = lab.train(name, cfg, seeds=seeds, lag=lag, progress=False)
    for r, seed in enumerate(seeds):
        alone = lab.train(name, cfg, seeds=[seed], lag=lag, progress=False)[0]
        assert batched[r].seed == seed
        for key in lab.metric_doc():
            a, b = torch.tensor(batched[r].metrics[key]), torch.tensor(alone.metrics[key])
            assert torch.allclose(a, b, atol=1e-9, rtol=1e-7, equal_nan=True), (key, r)
    # the runs differ from each other, and the clip was active (norms above 0.05)
    assert batched[0].metrics["reward"] != batched[1].metrics["reward"]
    assert max(batched[0].metrics["grad_norm"]) > 0.05


def test_arms_trained_together_equal_each_arm_alone():
    """run_many batches arms that differ in method, anchor, weight rule, lag and aggregation;
    each arm's runs equal that arm trained alone, and a shared field may not differ."""
    cfg = TINY.replace(steps=4, dtype="float64")
    prox = cfg.replace(anchor="proximal")
    arms = {"ppo": lab.Arm("ppo", lag=2), "sao k0": lab.Arm("sao", lag=0),
            "mis": lab.Arm("ppo", prox.replace(correction=rlgates.offpolicy.Correction("mis")),
                           lag=3),
            "gspo seq": lab.Arm("gspo", prox, agg="seq-mean-token-mean")}
    seeds = [5, 0]
    together = lab.run_many(arms, seeds, config=cfg, lag=1)
    for label, arm in arms.items():
        lag = 1 if arm.lag is None else arm.lag
        alone = lab.train(arm.method, arm.config or cfg, seeds, lag=lag,
                          agg=arm.agg, progress=False)
        for a, b in zip(together[label], alone, strict=True):
            assert (a.lag, a.agg, a.config) == (b.lag, b.agg, b.config)
            for key in lab.metric_doc():
                x, y = torch.tensor(a.metrics[key]), torch.tensor(b.metrics[key])
                assert torch.allclose(x, y, atol=1e-9, rtol=1e-7, equal_nan=True), (label, key)
    assert together["ppo"][0].metrics["loss"] != together["mis"][0].metrics["loss"]  # arms differ
    with pytest.raises(ValueError, match="may differ"):
        lab.run_many({"a": lab.Arm("ppo", cfg.replace(lr=1e-2))}, seeds, config=cfg)



def test_run_many_labels_a_list_of_arms_by_method_and_refuses_a_shared_label():
    """A list of arms is labelled by their methods; two arms under one label would leave only
    the last in the result, so that is refused (a dict gives each its own label)."""
    cfg = TINY.replace(steps=1)
    got = lab.run_many([lab.Arm("ppo"), lab.Arm("sapo", lag=1)], [0], config=cfg)
    assert list(got) == ["ppo", "sapo"] and got["sapo"][0].lag == 1
    with pytest.raises(ValueError, match="share a label"):
        lab.run_many([lab.Arm("ppo"), lab.Arm("ppo", lag=1)], [0], config=cfg)
    both = lab.run_many({"k0": lab.Arm("ppo"), "k1": lab.Arm("ppo", lag=1)}, [0], config=cfg)
    assert [r[0].lag for r in both.values()] == [0, 1]  # the control: labelled, both kept

def test_per_run_grad_clip_and_summed_loss_per_run():
    g = torch.Generator().manual_seed(0)
    R, b, T = 3, 5, 4
    logp = (-torch.rand(R, b, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(R, b, T, generator=g, dtype=torch.float64)
    adv = torch.randn(R, b, generator=g, dtype=torch.float64)
    mask = torch.rand(R, b, T, generator=g) < 0.7
    mask[:, :, 0] = True
    isw = torch.rand(R, b, T, generator=g, dtype=torch.float64) + 0.5
    for agg in rlgates.AGG_MODES:
        m = rlgates.get("dapo")
        total = lab.summed_loss(m, logp, old, adv, mask, agg)
        expect = sum(m.loss(logp[r], old[r], adv[r], mask[r], agg) for r in range(R))
        assert torch.allclose(total, expect, atol=1e-12), agg
        (g1,) = torch.autograd.grad(total, logp)
        (g2,) = torch.autograd.grad(expect, logp)
        assert torch.allclose(g1, g2, atol=1e-12), agg

    class Weighted:  # a loss with an is_weight keyword, as Method.loss has it
        def loss(self, logp, logp_old, adv, mask, agg, is_weight=None):
            obj = logp * adv[:, None] * (1 if is_weight is None else is_weight)
            return -rlgates.aggregate(obj, mask, agg)

    for agg in rlgates.AGG_MODES:
        total = lab.summed_loss(Weighted(), logp, old, adv, mask, agg, is_weight=isw)
        expect = sum(Weighted().loss(logp[r], old[r], adv[r], mask[r], agg, isw[r])
                     for r in range(R))
        assert torch.allclose(total, expect, atol=1e-12), agg
    for name in ("ppo", "gspo", "cispo", "sapo"):  # the loss metric: each run's own m.loss
        m = rlgates.get(name)
        for agg in rlgates.AGG_MODES:
            for w in (None, isw):
                got = diagnostics.step_stats(m, logp, old, adv, mask, agg=agg, is_weight=w,
                                             keys=("loss",))["loss"]
                kw = [{} if w is None else {"is_weight": w[r]} for r in range(R)]
                want = torch.stack([m.loss(logp[r], old[r], adv[r], mask[r], agg, **kw[r])
                                    for r in range(R)])
                assert torch.allclose(got, want.detach(), atol=1e-12), (name, agg)
    p = torch.nn.Parameter(torch.zeros(2, 3))
    p.grad = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0]])
    norm = lab.loop._clip_grad_norm_per_run([p], 1.0)
    assert torch.allclose(norm, torch.tensor([5.0, 0.5]))
    assert torch.allclose(p.grad, torch.tensor([[0.6, 0.8, 0.0], [0.3, 0.4, 0.0]]), atol=1e-5)


def test_rollout_scores_with_the_task_and_is_per_run():
    """lab.rollout (the loop's ROLLOUT, and chapter 10's): the task's reward, zero-mean group
    advantages, and run r's batch the same whether it is drawn alone or with other runs."""
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    both = lab.rollout(TINY, TINY.policy([3, 4]), gens)
    assert both.tokens.shape == (2, TINY.batch, TINY.length) and both.adv.shape == (2, TINY.batch)
    assert torch.equal(both.rewards, TINY.task().reward(both.prompts, both.tokens))
    assert both.adv.view(2, -1, TINY.group).sum(-1).abs().max() < 1e-5
    assert both.adv.abs().max() > 0  # not all groups flat
    alone = lab.rollout(TINY, TINY.policy([4]), [torch.Generator().manual_seed(4)])
    for a, b in zip(alone, both, strict=True):
        if a is None:  # routing: only a mixture-of-experts policy records it
            assert b is None
            continue
        assert torch.equal(a[0], b[1])
    assert not torch.equal(both.tokens[0], both.tokens[1])  # the runs differ


def test_lag_zero_gives_ratio_one_on_each_first_update():
    cfg = TINY.replace(minibatches=1, epochs=1, steps=4)
    res = lab.train("ppo", cfg, seeds=[0], lag=0, progress=False)[0]
    assert max(res.metrics["log_ratio_absmax"]) < 1e-5  # rollout policy = updated policy
    assert res.metrics["staleness"] == [0.0] * 4
    lagged = lab.train("ppo", cfg, seeds=[0], lag=2, progress=False)[0]
    assert lagged.metrics["staleness"] == [0.0, 1.0, 2.0, 2.0]
    assert lagged.metrics["log_ratio_absmax"][0] < 1e-5  # step 0: nothing to lag behind yet
    assert min(lagged.metrics["log_ratio_absmax"][1:]) > 1e-4
    # decoupled PPO: ρ against the policy at the step start, so ρ = 1 again; the gap to the
    # behaviour policy moves into the weight min(π_prox/π_behav, C)
    prox = lab.train("ppo", cfg.replace(anchor="proximal", is_cap=1.5), seeds=[0], lag=2,
                     progress=False)[0]
    assert max(prox.metrics["log_ratio_absmax"]) < 1e-5
    assert prox.metrics["is_weight_mean"][0] == pytest.approx(1.0)
    assert all(v <= 1.5 for v in prox.metrics["is_weight_mean"])
    assert any(abs(v - 1) > 1e-4 for v in prox.metrics["is_weight_mean"])


@pytest.mark.parametrize("lag", [1, 3])
def test_rollouts_come_from_the_policy_lag_updates_old(lag):
    """logp of each rollout equals the log-probs of the policy saved `lag` updates earlier."""
    cfg = TINY.replace(steps=5, minibatches=2, epochs=2)  # 4 updates per step
    versions = {0: cfg.policy([7, 8]).state()}
    rollouts = []

    def hook(event, info):
        if event == "update":
            versions[info["update"]] = info["policy"].state()
        else:
            rollouts.append(info)

    lab.train("sao", cfg, seeds=[7, 8], lag=lag, progress=False, hook=hook)
    for info in rollouts:
        expected = max(0, info["step"] * 4 - lag)
        assert info["version"] == expected
        policy = cfg.policy([7, 8])
        policy.load_state_dict(versions[expected])
        with torch.no_grad():
            logp = policy.log_probs(info["tokens"], info["prompts"])
        assert (logp - info["logp_behaviour"]).abs().max() < 1e-5


def test_metrics_have_the_right_keys_and_finite_values():
    res = lab.train("grpo", TINY, seeds=[0], lag=1, progress=False)[0]
    assert tuple(res.metrics) == tuple(lab.metric_doc())
    for key, values in res.metrics.items():
        assert len(values) == TINY.steps, key
        assert all(math.isfinite(v) for v in values), key
    m = res.metrics
    for key in ("reward", "solved", "rare", "live", "clipfrac_pos", "clipfrac_neg",
                "pg_clipfrac", "signal_lost", "gate_mean"):
        assert all(0 <= v <= 1 for v in m[key]), key
    assert all(v >= 0 for v in m["entropy"] + m["grad_norm"] + m["log_ratio_absmax"])
    assert all(1 <= v <= TINY.length for v in m["length"])
    assert res.final("reward", last=2) == pytest.approx(sum(m["reward"][-2:]) / 2)


@pytest.mark.parametrize("name", rlgates.names())
def test_runs_with_every_registry_name(name):
    res = lab.train(name, TINY, seeds=[0, 1], steps=2, progress=False)
    assert [r.method for r in res] == [name, name]
    assert res[0].agg == lab.default_agg(name)
    assert all(math.isfinite(v) for v in res[0].metrics["pg_clipfrac"])


def test_accepts_any_object_with_a_loss_and_an_agg_override():
    class Reinforce:  # no gate: the gate metrics are NaN, training still runs
        name = "my-reinforce"

        def loss(self, logp, logp_old, adv, mask=None, agg="token-mean"):
            obj = torch.where(mask, logp * adv[:, None], 0.0)
            return -rlgates.aggregate(obj, mask, agg)

    res = lab.train(Reinforce(), TINY, seeds=[0, 1], steps=2, agg="seq-mean-token-sum",
                    progress=False)[0]
    assert res.method == "my-reinforce" and res.agg == "seq-mean-token-sum"
    assert math.isnan(res.metrics["pg_clipfrac"][0])
    assert math.isfinite(res.metrics["entropy"][0])
    res = lab.train(rlgates.get("dapo", eps_high=0.4), TINY, steps=2,
                    agg="seq-mean-token-mean", progress=False)[0]
    assert res.method == "dapo" and res.agg == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="agg"):
        lab.train("ppo", TINY, steps=1, agg="sum", progress=False)
    with pytest.raises(ValueError, match="lag"):
        lab.train("ppo", TINY, steps=1, lag=-1, progress=False)
    with pytest.raises(ValueError, match="anchor"):
        lab.train("ppo", TINY.replace(anchor="old"), steps=1, progress=False)
    with pytest.raises(ValueError, match="unknown method"):
        lab.train("nope", TINY, steps=1, progress=False)


def test_run_many_summary_and_paired_differences():
    runs = lab.run_many(["ppo", "sapo"], seeds=[0, 1, 2], config=TINY, steps=2)
    assert list(runs) == ["ppo", "sapo"] and [r.seed for r in runs["sapo"]] == [0, 1, 2]
    # same seed: the same start, so the same first rollout batch for every method
    assert runs["ppo"][0].metrics["reward"][0] == runs["sapo"][0].metrics["reward"][0]
    s = lab.summary(runs, keys=("reward",), last=1)
    vals = torch.tensor([r.metrics["reward"][-1] for r in runs["ppo"]], dtype=torch.float64)
    assert s["ppo"]["reward"]["mean"] == pytest.approx(float(vals.mean()))
    half = 4.303 * float(vals.std()) / math.sqrt(3)  # t_{0.975, 2} = 4.303
    assert s["ppo"]["reward"]["hi"] == pytest.approx(float(vals.mean()) + half)
    assert "| ppo |" in lab.summary_table(runs)
    d = lab.paired_difference(runs, "ppo", "sapo", "reward", last=1)
    diffs = vals - torch.tensor([r.metrics["reward"][-1] for r in runs["sapo"]],
                                dtype=torch.float64)
    assert d["mean"] == pytest.approx(float(diffs.mean())) and d["n"] == 3


def test_interval_and_verdict_words():
    iv = lab.interval([1.0, 2.0, 3.0, 4.0])
    assert iv["mean"] == 2.5 and iv["hi"] - iv["mean"] == pytest.approx(
        3.182 * math.sqrt(5 / 3) / 2)
    assert lab.report.t975(40) == pytest.approx(2.021, abs=1e-3)
    assert lab.verdict({"lo": 0.1, "hi": 0.3}) == "higher"
    assert lab.verdict({"lo": -0.3, "hi": -0.1}) == "lower"
    assert lab.verdict({"lo": -0.1, "hi": 0.3}) == "no difference detected"
    assert iv["half"] == pytest.approx(iv["hi"] - iv["mean"]) and iv["half"] > 0
    assert lab.format_interval(iv) == lab.format_interval([1.0, 2.0, 3.0, 4.0])
    assert lab.format_interval(iv, ".2f") == f"2.50 [{iv['lo']:.2f}, {iv['hi']:.2f}]"
    # a ratio's null is 1: the same interval above 0 is "no difference" against 1
    ratio = {"lo": 0.9, "hi": 1.3}
    assert lab.verdict(ratio) == "higher" and lab.verdict(ratio, null=1.0) == (
        "no difference detected")
    assert lab.verdict({"lo": 1.1, "hi": 1.3}, null=1.0) == "higher"


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
    assert gpu.batch > cpu.batch
    assert lab.LabConfig.for_device("cpu", steps=7).steps == 7


def test_lab_policy_sampling_matches_its_log_probs_and_runs_are_independent():
    cfg = lab.LabConfig.for_device("cpu")
    policy = cfg.policy([0, 1])
    alone = cfg.policy([1])
    assert torch.equal(policy.w_head[1], alone.w_head[0])  # seed 1's weights, batched or not
    assert not torch.equal(policy.w_head[0], policy.w_head[1])
    prompts = cfg.task().prompts(16, torch.Generator().manual_seed(1))
    prompts = torch.stack([prompts, prompts])
    gens = [torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)]
    tokens, logp = policy.sample(prompts, cfg.length, gens)
    assert tokens.shape == (2, 16, cfg.length)
    assert (policy.log_probs(tokens, prompts).detach() - logp).abs().max() < 1e-5
    # run 0's loss moves run 0's weights only
    policy.log_probs(tokens, prompts)[0].sum().backward()
    assert policy.w_head.grad[1].abs().max() == 0 and policy.w_head.grad[0].abs().max() > 0


def test_lagged_log_ratios_run_on_the_lab_policy():
    out = rlgates.lagged_log_ratios(lags=(0, 2, 6), vocab=16, hidden=16, prompts=4, group=4,
                                    length=6, lr=1e-2)
    assert out[0][0].shape == (16, 6) and out[0][1].shape == (16,)
    assert out[0][0].abs().max() < 1e-5  # lag 0: float rounding, not drift
    spread = [out[k][0].std().item() for k in (0, 2, 6)]
    assert spread[0] < 1e-5 < spread[1] < spread[2]


def test_a_single_run_takes_unbatched_tensors():
    cfg = lab.LabConfig.for_device("cpu")
    one, two = cfg.policy([3]), cfg.policy([3, 4])
    prompts = cfg.task().prompts(5, torch.Generator().manual_seed(0))
    tokens = torch.randint(0, cfg.vocab, (5, cfg.length))
    flat = one.log_probs(tokens, prompts)
    assert flat.shape == (5, cfg.length)
    assert torch.equal(flat, one.log_probs(tokens[None], prompts[None])[0])
    with pytest.raises(ValueError, match="single run"):
        two.log_probs(tokens, prompts)


def test_a_single_run_hook_and_the_unweighted_proximal_anchor():
    """A single run's hook sees [B, ...] tensors; anchor="proximal" with correction=Unweighted()
    takes the ratio against π_prox with no behaviour weight."""
    seen = []
    one = TINY.replace(minibatches=1)  # one update per step: it sees the step's start policy
    cfg = one.replace(anchor="proximal", correction=rlgates.offpolicy.Unweighted())
    res = lab.train("ppo", cfg, seeds=[2], lag=2, progress=False,
                    hook=lambda e, i: seen.append(i) if e == "rollout" else None)[0]
    assert res.seed == 2 and seen[0]["tokens"].dim() == 2
    assert res.metrics["is_weight_mean"] == [1.0] * TINY.steps  # no behaviour weight
    assert max(res.metrics["log_ratio_absmax"]) < 1e-5  # ρ against π_prox: 1 at each step start
    behaviour = lab.train("ppo", one, seeds=[2], lag=2, progress=False)[0]
    assert max(behaviour.metrics["log_ratio_absmax"][1:]) > 1e-4  # the negative control
    assert all(0 <= v <= 1 for v in res.metrics["gate_zero"])
    assert all(math.isfinite(v) for v in res.metrics["loss"])


def _diff_with_p(p, sign=1.0):
    """A paired difference over two seeds (df = 1, Cauchy) whose two-sided p-value is `p`."""
    se = 1 / math.sqrt(2)  # std 1, n = 2
    mean = sign * math.tan(math.pi / 2 * (1 - p)) * se
    half = lab.report.t975(1) * se
    return {"mean": mean, "std": 1.0, "n": 2, "lo": mean - half, "hi": mean + half}


def test_t_pvalue_is_student_t():
    t_pvalue = lab.report.t_pvalue
    # the table of 95 % quantiles: p = 0.05 at t_{0.975, df} (the table has three decimals)
    for df in range(1, 31):
        assert t_pvalue(lab.report.t975(df), df) == pytest.approx(0.05, abs=1e-4)
    # df = 1 is Cauchy, df = 2 has a closed form, a large df is the normal
    assert t_pvalue(1.0, 1) == pytest.approx(0.5, abs=1e-15)
    assert t_pvalue(3.0, 2) == pytest.approx(1 - 3 / math.sqrt(2 + 9), abs=1e-15)
    assert t_pvalue(1.959964, 4000) == pytest.approx(0.05, abs=2e-4)
    # against the density integrated numerically, for odd and even df
    for df in (3, 4, 9, 10):
        x = torch.linspace(0, 2.5, 20_001, dtype=torch.float64)
        logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        dens = torch.exp(logc - (df + 1) / 2 * torch.log1p(x**2 / df))
        inside = 2 * float(torch.trapezoid(dens, x))
        assert t_pvalue(2.5, df) == pytest.approx(1 - inside, abs=1e-8)
        assert t_pvalue(-2.5, df) == t_pvalue(2.5, df)  # two-sided
    assert t_pvalue(0.0, 5) == 1.0 and t_pvalue(math.inf, 5) == 0.0


def test_family_verdicts_holm_and_marginal():
    # Holm on four p-values (hand-worked): sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1,
    # kept increasing: 0.02, 0.03, 0.06, 0.06. Two stay significant at 0.05, two do not.
    raw = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}
    diffs = {k: _diff_with_p(p, sign=-1.0 if k == "d" else 1.0) for k, p in raw.items()}
    fam = lab.family_verdicts(diffs)
    for k, p in raw.items():
        assert fam[k]["p"] == pytest.approx(p, rel=1e-9)
    holm = {k: fam[k]["p_holm"] for k in raw}
    assert holm == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02}, rel=1e-9)
    assert {k: fam[k]["raw"] for k in raw} == {"a": "higher", "b": "higher", "c": "higher",
                                               "d": "lower"}
    assert {k: fam[k]["holm"] for k in raw} == {
        "a": "higher", "b": "no difference detected", "c": "no difference detected",
        "d": "lower"}
    # negative controls: a family of one is not adjusted; a null family stays null
    one = lab.family_verdicts({"b": diffs["b"]})["b"]
    assert one["p_holm"] == one["p"] and one["holm"] == one["raw"] == "higher"
    null = {k: _diff_with_p(0.5) for k in "xyz"}
    assert all(v["raw"] == v["holm"] == "no difference detected"
               for v in lab.family_verdicts(null).values())
    # marginal: an end of the interval within 0.005 of zero, on either side of it
    def iv(lo, hi):
        return {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "std": (hi - lo), "n": 10}
    ends = {"close below": iv(-0.098, -0.001), "far below": iv(-0.098, -0.02),
            "close above": iv(0.004, 0.09), "straddles, near": iv(-0.09, 0.003),
            "straddles, far": iv(-0.09, 0.05)}
    flags = {k: v["marginal"] for k, v in lab.family_verdicts(ends).items()}
    assert flags == {"close below": True, "far below": False, "close above": True,
                     "straddles, near": True, "straddles, far": False}
    table = lab.family_table(ends)
    assert "lower (marginal)" in table and "| far below |" in table and "Holm" in table
    assert lab.marked_verdict(ends["close below"]) == "lower (marginal)"
    assert lab.marked_verdict(ends["far below"]) == "lower"


def test_interval_verdict_agrees_with_the_t_test():
    g = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(400):
        v = 0.02 * torch.randn(10, generator=g, dtype=torch.float64) + 0.01
        d = lab.interval(v)
        f = lab.family_verdicts({"x": d})["x"]
        if abs(f["p"] - 0.05) > 1e-3:  # the quantile table has three decimals
            checked += 1
            assert (f["raw"] != "no difference detected") == (f["p"] < 0.05)
    assert checked > 350


def _fake(curves_by_label):
    """{label: [LabResult]} whose reward curves are the given [seeds, steps] rows."""
    return {label: [lab.LabResult(label, s, 0, "token-mean", TINY, {"reward": row.tolist()})
                    for s, row in enumerate(rows)]
            for label, rows in curves_by_label.items()}


def test_area_tells_speed_where_the_last_five_cannot():
    steps, noise = torch.arange(60.0), 0.01 * torch.randn(8, 60, generator=torch.Generator()
                                                         .manual_seed(0))
    fast = (steps / 20).clamp(max=1) + noise  # reaches 1 at step 20
    slow = (steps / 40).clamp(max=1) + noise  # the same end, reached at step 40
    runs = _fake({"fast": fast, "slow": slow, "same": fast.clone()})
    end = lab.paired_difference(runs, "fast", "slow", "reward")
    speed = lab.paired(runs, "fast", "slow", lab.area)
    assert end["mean"] == pytest.approx(0, abs=1e-12) and lab.verdict(end) != "higher"
    assert lab.verdict(speed) == "higher"  # the area sees the 20 steps' head start
    assert speed["mean"] == pytest.approx(float((fast - slow).mean()))
    # negative control: identical curves differ in nothing
    same = lab.paired(runs, "same", "fast", lab.area)
    assert same["mean"] == 0 and lab.verdict(same) == "no difference detected"
    # at a budget of 20 steps the last five already see the head start
    at20 = lab.paired_difference(lab.upto(runs, 20), "fast", "slow", "reward")
    assert lab.verdict(at20) == "higher"
    table = lab.budget_table(runs, "slow", budgets=(20, 60))
    fast_row = next(line for line in table.splitlines() if line.startswith("| fast"))
    assert fast_row.count("higher") == 3 and "no difference detected" in fast_row


def test_slope_and_plateau():
    g = torch.Generator().manual_seed(1)
    x = torch.arange(100.0)
    rising = 0.002 * x + 0.3 + 0.002 * torch.randn(10, 100, generator=g)
    level = (0.02 * x).clamp(max=0.6) + 0.002 * torch.randn(10, 100, generator=g)
    runs = _fake({"rising": rising, "level": level})
    assert lab.interval(lab.slope(runs["rising"], last=50))["mean"] == pytest.approx(0.002,
                                                                                     rel=0.05)
    exact = _fake({"line": (0.5 * x).expand(3, 100)})["line"]
    assert lab.slope(exact, last=10).tolist() == pytest.approx([0.5] * 3)
    # negative control: a curve that keeps rising never plateaus
    assert lab.plateau(runs["rising"], last=50) is None
    # the level curve is flat from step 30: a 50-step window ending at n holds the ramp's
    # last steps until n nears 30 + 50
    n = lab.plateau(runs["level"], last=50)
    assert n is not None and 55 <= n <= 85
    iv = lab.interval(lab.slope(lab.upto(runs, n)["level"], last=50))
    assert iv["lo"] <= 0 <= iv["hi"]
    before = lab.interval(lab.slope(lab.upto(runs, n - 1)["level"], last=50))
    assert before["lo"] > 0


def test_upto_equals_a_shorter_run():
    longer = lab.run_many(["ppo", "sapo"], seeds=[0, 1], config=TINY, steps=4,
                          keep_log_ratios=True)
    shorter = lab.run_many(["ppo", "sapo"], seeds=[0, 1], config=TINY, steps=2)
    cut = lab.upto(longer, 2)
    for label in shorter:
        for a, b in zip(cut[label], shorter[label], strict=True):
            assert a.metrics == b.metrics and a.config == b.config
            assert len(a.log_ratios) == 2
    assert len(longer["ppo"][0].metrics["reward"]) == 4  # the original is left whole
    with pytest.raises(ValueError):
        lab.upto(longer, 5)


def test_the_labs_adam_is_torch_fused_adam_bit_for_bit():
    from rlgates.lab._optim import _adam

    g = torch.Generator().manual_seed(0)
    shapes = [((3, 4), torch.float32), ((5,), torch.float64), ((2, 2), torch.float32)]
    start = [torch.randn(s, generator=g, dtype=d) for s, d in shapes]
    ours = [p.clone().requires_grad_(True) for p in start]
    theirs = [p.clone().requires_grad_(True) for p in start]
    opt_ours = _adam(ours, 3e-2)
    opt_theirs = torch.optim.Adam(theirs, lr=3e-2, fused=True)
    assert isinstance(opt_ours, torch.optim.Adam) and opt_ours.defaults["fused"]
    assert opt_ours.defaults["lr"] == 3e-2
    for step in range(6):
        grads = [torch.randn(s, generator=g, dtype=d) for s, d in shapes]
        for opt, params in ((opt_ours, ours), (opt_theirs, theirs)):
            opt.zero_grad()
            assert all(p.grad is None for p in params)
            for i, (p, grad) in enumerate(zip(params, grads, strict=True)):
                if not (i == 2 and step < 2):  # a parameter with no gradient yet: untouched
                    p.grad = grad.clone()
            opt.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
    # not vacuous: every parameter moved, the late one by its own (lazily started) step count
    assert all(not torch.equal(a, b) for a, b in zip(ours, start, strict=True))


def test_t_quantile_inverts_t_pvalue():
    tq = lab.report.t_quantile
    for df in range(1, 31):  # the 95 % table, to its three decimals
        assert tq(0.05, df) == pytest.approx(lab.report.t975(df), abs=6e-4)
    for p in (0.5, 0.05, 0.0125, 1e-4):  # df = 1 is Cauchy: tan(π/2 (1 − p))
        assert tq(p, 1) == pytest.approx(math.tan(math.pi / 2 * (1 - p)), rel=1e-8)
        assert lab.report.t_pvalue(tq(p, 7), 7) == pytest.approx(p, rel=1e-7)
    with pytest.raises(ValueError):
        tq(0.0, 5)


def test_effects_holm_intervals_have_known_widths_and_agree_with_holm():
    # the four p-values of test_family_verdicts_holm_and_marginal (df = 1, se = 1/√2): Holm
    # keeps d (at α/4) and a (at α/3), then fails at c (α/2) and stops, so c and b both get
    # the interval of level 1 − α/2, though b's own p (0.04) is below α
    raw = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}
    diffs = {k: _diff_with_p(p, sign=-1.0 if k == "d" else 1.0) for k, p in raw.items()}
    eff = lab.effects(diffs)
    se = 1 / math.sqrt(2)
    level = {"d": 0.05 / 4, "a": 0.05 / 3, "c": 0.05 / 2, "b": 0.05 / 2}
    for k, e in eff.items():
        half = math.tan(math.pi / 2 * (1 - level[k])) * se
        assert e["lo_adj"] == pytest.approx(diffs[k]["mean"] - half, rel=1e-7)
        assert e["hi_adj"] == pytest.approx(diffs[k]["mean"] + half, rel=1e-7)
        assert e["level"] == pytest.approx(1 - level[k]) and e["m"] == 4
    holm = lab.family_verdicts(diffs)
    assert {k: e["word"] for k, e in eff.items()} == {k: v["holm"] for k, v in holm.items()}
    assert eff["b"]["lo_adj"] < 0 < diffs["b"]["lo"]  # widened past 0: withdrawn
    # Bonferroni: every interval at 1 − α/m; no correction: the 95 % interval itself
    bonf = lab.effects(diffs, correction="bonferroni")
    half = math.tan(math.pi / 2 * (1 - 0.05 / 4)) * se
    assert all(e["hi_adj"] - e["mean"] == pytest.approx(half) for e in bonf.values())
    plain = lab.effects(diffs, correction=None)
    assert all(e["lo_adj"] == pytest.approx(diffs[k]["lo"], abs=1e-3) for k, e in plain.items())
    with pytest.raises(ValueError):
        lab.effects(diffs, correction="sidak")
    # negative controls: a null family reads no difference; a family of one is uncorrected
    null = lab.effects({k: _diff_with_p(0.5) for k in "xyz"})
    assert all(e["word"] == "no difference detected" and e["lo_adj"] < 0 < e["hi_adj"]
               for e in null.values())
    one = lab.effects({"b": diffs["b"]})["b"]
    assert one["lo_adj"] == pytest.approx(diffs["b"]["lo"], abs=1e-3) and one["word"] == "higher"
    assert lab.effect_words(eff["a"]).endswith("after Holm's correction over 4 comparisons)")


def test_effect_table_from_runs_and_from_differences():
    g = torch.Generator().manual_seed(1)
    base = 0.5 + 0.01 * torch.randn(10, 20, generator=g, dtype=torch.float64)
    runs = _fake({"base": base, "up": base + 0.1,  # +0.1 on every seed: a known answer
                  "noise": base + 0.01 * torch.randn(10, 20, generator=g, dtype=torch.float64)})
    eff = lab.effects({f"{m} − base": lab.paired_difference(runs, m, "base")
                       for m in ("up", "noise")})
    assert eff["up − base"]["mean"] == pytest.approx(0.1)
    assert eff["up − base"]["word"] == "higher"
    assert eff["noise − base"]["word"] == "no difference detected"  # the negative control
    table = lab.effect_table(runs, baseline="base", measures={"up − base": "a shift of 0.1"})
    assert "| up − base | a shift of 0.1 | +0.100 |" in table
    assert "Holm's correction over these 2 comparisons" in table
    assert lab.effect_table(dict(eff)).count("\n|") == 3


def test_a_share_band_stays_between_0_and_1():
    """plot_shut_by_sign cuts its 95 % band at 0 and 1 (a share cannot leave them; R16), while
    plot_runs without limits draws the plain band (the control reaches below 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlgates import figures

    class Run:  # the two metrics a shut-by-sign plot reads, ten seeds near 0
        def __init__(self, v):
            self.metrics = {"step": [1, 2, 3], "clipfrac_pos": [v, 0.0, v],
                            "clipfrac_neg": [0.0, v, 0.0]}

    runs = [Run(v) for v in (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3)]
    ax = figures.plot_shut_by_sign(runs)
    lows = [p.get_paths()[0].vertices[:, 1].min() for p in ax.collections]
    assert min(lows) >= 0.0
    _, ax2 = plt.subplots()
    figures.plot_runs({"x": runs}, "clipfrac_pos", ax=ax2)
    assert ax2.collections[0].get_paths()[0].vertices[:, 1].min() < 0
    plt.close("all")
