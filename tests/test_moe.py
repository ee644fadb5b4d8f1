"""The mixture-of-experts policy: top-k routing against a per-token reference, routing replay
(exact log ρ = 0 at equal weights, with a negative control), the lab's batched runs, bad input."""

import pytest
import torch

from rlgates import lab, moe
from rlgates.policy import LabPolicy

TINY = lab.LabConfig.for_device("cpu", prompts=4, group=4, length=6, steps=3)


def _batch(pol, cfg, seeds):
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    return lab.rollout(cfg, pol, gens)


def _reference_layer(pol, r, layer, h, experts=None):
    """One run's MoE layer on one token, by hand: top-k by score (or `experts`), softmax over
    the kept scores, the weighted sum of the kept experts' outputs, tanh."""
    scores = h @ pol.w_router[r, layer] + pol.b_router[r, layer]
    if experts is None:
        order = sorted(range(pol.experts), key=lambda e: -float(scores[e].detach()))
        experts = order[:pol.top_k]
    kept = torch.stack([scores[e] for e in experts])
    weights = torch.exp(kept - kept.max()) / torch.exp(kept - kept.max()).sum()
    out = sum(w * (h @ pol.w_expert[r, layer, e] + pol.b_expert[r, layer, e])
              for w, e in zip(weights, experts, strict=True))
    return torch.tanh(out), sorted(experts)


def test_top_k_routing_and_the_mixture_match_a_per_token_reference():
    cfg = TINY.replace(moe=moe.MoEConfig(experts=5, top_k=2, layers=2), dtype="float64")
    pol = cfg.policy([0, 1])
    b = _batch(pol, cfg, [0, 1])
    x = pol._inputs(b.prompts, b.tokens)
    with torch.no_grad():
        h, used, own = pol._moe(x)
    assert torch.equal(used, own) and own.shape == (2, 16, 6, 2, 2)
    for r, i, t in [(0, 0, 0), (1, 3, 5), (0, 7, 2), (1, 15, 4)]:
        hid = torch.tanh(x[r, i, t])
        for layer in range(pol.layers):
            hid, experts = _reference_layer(pol, r, layer, hid)
            assert sorted(own[r, i, t, layer].tolist()) == experts, (r, i, t, layer)
        assert torch.allclose(hid, h[r, i, t], atol=1e-12)


def test_one_expert_one_layer_is_the_dense_lab_policy():
    """experts = top_k = layers = 1: gate 1, so the body is LabPolicy's tanh(tanh(x) W + b)."""
    dense = LabPolicy([3], hidden=16).double()
    one = moe.MoEPolicy([3], hidden=16, experts=1, top_k=1, layers=1).double()
    with torch.no_grad():
        for name, p in dense.named_parameters():
            if name in dict(one.named_parameters()):
                getattr(one, name).copy_(p)
        one.w_expert[:, 0, 0].copy_(dense.w_body)
        one.b_expert[:, 0, 0].copy_(dense.b_body)
    prompt = torch.tensor([[[1, 9], [4, 12]]])
    tokens = torch.tensor([[[0, 5, 2, 7], [3, 3, 1, 0]]])
    assert torch.allclose(one.log_probs(tokens, prompt), dense.log_probs(tokens, prompt),
                          atol=1e-12)
    one.w_expert.data.mul_(1.01)  # the negative control: the expert matters
    assert not torch.allclose(one.log_probs(tokens, prompt), dense.log_probs(tokens, prompt))


def test_replay_gives_the_engine_routing_and_log_ratio_exactly_zero():
    """A noisy-router engine picks other experts for some tokens; with the same weights,
    replaying its routing makes the trainer's pass the engine's: log ρ = 0 exactly. Without
    replay (the negative control) log ρ ≠ 0 where the routing differs."""
    cfg = TINY.replace(moe=moe.MoEConfig())
    pol = cfg.policy([0, 1, 2])
    b = _batch(pol, cfg, [0, 1, 2])
    g = torch.Generator().manual_seed(0)
    logp_engine, routing_engine = moe.engine_log_probs(pol, b.tokens, b.prompts, "noise",
                                                       router_noise=0.3, generator=g)
    own = pol.routing(b.prompts, b.tokens)
    assert moe.changed_experts(routing_engine, own).min() > 0.05  # the routing differs
    with torch.no_grad():
        native = pol.log_probs(b.tokens, b.prompts)
        replayed = pol.log_probs(b.tokens, b.prompts, routing=routing_engine)
        feats = pol.features(b.prompts, b.tokens, routing=routing_engine)
    assert torch.equal(replayed, logp_engine)  # exactly: the same network, the same arithmetic
    assert (native - logp_engine).abs().max() > 1e-3  # the control: no replay, no equality
    # the replayed pass used the given experts: a per-token reference with them agrees
    x = pol._inputs(b.prompts, b.tokens)
    for r, i, t in [(0, 2, 3), (2, 9, 0)]:
        hid = torch.tanh(x[r, i, t])
        for layer in range(pol.layers):
            hid, _ = _reference_layer(pol, r, layer, hid, routing_engine[r, i, t, layer].tolist())
        assert torch.allclose(hid, feats[r, i, t], atol=1e-5)
    # sampling records the routing the teacher-forced pass picks (same weights, no noise)
    assert moe.changed_experts(b.routing, own, b.mask).max() == 0


def test_replay_still_trains_the_router():
    """The replayed experts are fixed, their mixing weights are the current router's softmax."""
    cfg = TINY.replace(moe=moe.MoEConfig())
    pol = cfg.policy([0])
    b = _batch(pol, cfg, [0])
    pol.log_probs(b.tokens, b.prompts, routing=b.routing).sum().backward()
    assert pol.w_router.grad.abs().sum() > 0


def test_changed_experts_and_tokens_rerouted_by_hand():
    ref = torch.tensor([[[[0, 1], [2, 3]], [[0, 1], [2, 3]]]])  # [B=1, T=2, L=2, k=2]
    new = torch.tensor([[[[1, 0], [2, 1]], [[0, 1], [2, 3]]]])  # token 0, layer 1: 3 → 1
    assert float(moe.changed_experts(new, ref)) == pytest.approx(1 / 8)  # 1 of 8 experts
    assert float(moe.tokens_rerouted(new, ref)) == pytest.approx(1 / 2)
    mask = torch.tensor([[False, True]])
    assert float(moe.changed_experts(new, ref, mask)) == 0.0  # the moved token is padding
    assert float(moe.changed_experts(ref, ref)) == 0.0  # the control
    with pytest.raises(ValueError, match="same shape"):
        moe.changed_experts(new[..., :1], ref)


@pytest.mark.parametrize("moe_cfg, anchor", [
    (moe.MoEConfig(router_replay="R3", engine="noise", router_noise=0.2), "behaviour"),
    (moe.MoEConfig(router_replay="R2", engine="bf16"), "proximal"),
])
def test_lab_run_r_of_the_batch_equals_run_r_alone(moe_cfg, anchor):
    cfg = TINY.replace(steps=3, dtype="float64", moe=moe_cfg, anchor=anchor)
    seeds = [4, 0]
    batched = lab.train("gspo", cfg, seeds=seeds, progress=False)
    keys = [*lab.metric_doc(), *moe.MOE_METRICS]
    for r, seed in enumerate(seeds):
        alone = lab.train("gspo", cfg, seeds=[seed], progress=False)[0]
        for key in keys:
            a, b = torch.tensor(batched[r].metrics[key]), torch.tensor(alone.metrics[key])
            assert torch.allclose(a, b, atol=1e-9, rtol=1e-7, equal_nan=True), (key, r)
    assert batched[0].metrics["reward"] != batched[1].metrics["reward"]


def test_lab_metrics_see_drift_and_mismatch_and_r3_removes_the_engine_gap():
    """Engine with router noise, ratio against the engine's log-probs: at the step's first
    update (π_θ = π_old) R3 makes log ρ 0 on every token (up to rounding); without replay it is
    not."""
    base = TINY.replace(minibatches=1, steps=2,
                        moe=moe.MoEConfig(engine="noise", router_noise=0.3))
    off = lab.train("ppo", base, seeds=[1], progress=False, keep_log_ratios=True)[0]
    r3 = lab.train("ppo", base.replace(moe=base.moe.replace(router_replay="R3")), seeds=[1],
                   progress=False, keep_log_ratios=True)[0]
    assert off.metrics["routing_mismatch"][0] > 0.05
    assert off.log_ratios[0].abs().max() > 1e-3  # the control
    # one update per step: the first sees π_old. Up to rounding: the update reads the batch's
    # rows in its minibatch order, and a BLAS kernel may round a row by its place in the batch
    # (exact on some CPUs, a few 1e-7 on others)
    assert r3.log_ratios[0].abs().max() <= 1e-6
    assert off.metrics["routing_drift"][0] == 0  # the first update pass is π_old's own


def test_bad_input_is_refused_with_its_name():
    with pytest.raises(ValueError, match="top_k"):
        moe.MoEConfig(experts=2, top_k=3)
    with pytest.raises(ValueError, match="router_replay"):
        moe.MoEConfig(router_replay="R4")
    with pytest.raises(ValueError, match="engine"):
        moe.MoEConfig(engine="vllm")
    with pytest.raises(ValueError, match="router_noise"):
        moe.MoEConfig(router_noise=0.1)  # noise without the noise engine
    with pytest.raises(ValueError, match="experts"):
        moe.MoEConfig(experts=0)
    with pytest.raises(ValueError, match="anchor='proximal'"):
        lab.train("ppo", TINY.replace(moe=moe.MoEConfig(router_replay="R2")), progress=False)
    pol = moe.MoEPolicy([0], experts=4, top_k=2, layers=2)
    prompt, tokens = torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 3,
                                                                         dtype=torch.long)
    good = torch.tensor([0, 1]).expand(1, 2, 3, 2, 2)
    pol.log_probs(tokens, prompt, routing=good)  # accepted
    with pytest.raises(ValueError, match="shape"):
        pol.log_probs(tokens, prompt, routing=good[..., :1])
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        pol.log_probs(tokens, prompt, routing=good + 3)
    with pytest.raises(ValueError, match="different experts"):
        pol.log_probs(tokens, prompt, routing=torch.zeros_like(good))
    with pytest.raises(ValueError, match="int64"):
        pol.log_probs(tokens, prompt, routing=good.float())
    with pytest.raises(ValueError, match="router_noise"):
        moe.engine_log_probs(pol, tokens, prompt, "noise")
    with pytest.raises(ValueError, match="moe="):
        lab.drift_after_updates(TINY, [0])


@pytest.mark.parametrize("mode", ["disabled", "R2", "R3"])
def test_lab_replays_what_its_mode_names(mode):
    """Every update pass of a step gets: nothing (disabled), π_old's own routing on the rollout
    (R2, recorded as the step begins) or the engine's (R3); the engine here has router noise,
    so the two recorded routings differ."""
    cfg = TINY.replace(steps=2, anchor="proximal",
                       moe=moe.MoEConfig(router_replay=mode, engine="noise", router_noise=0.3))
    seen, given = {}, []

    def hook(event, info):
        if event != "rollout":
            return
        pol = info["policy"]
        seen["old"] = pol.routing(info["prompts"][None], info["tokens"][None])
        if "spy" not in seen:
            real = pol.routed_logits

            def spy(prompts, tokens, routing=None, noise=None):
                if tokens.shape[1] == TINY.batch // TINY.minibatches:  # an update pass
                    given.append((routing, seen["old"]))
                return real(prompts, tokens, routing, noise)
            pol.routed_logits = seen["spy"] = spy

    lab.train("ppo", cfg, seeds=[3], progress=False, hook=hook)
    assert len(given) == 2 * TINY.minibatches
    for routing, _ in given:
        if mode == "disabled":
            assert routing is None
        else:
            assert routing is not None
    if mode == "disabled":
        return
    # is each replayed response's routing one of π_old's responses' routings?
    found = [(r[0][:, None] == o[0][None]).flatten(2).all(-1).any(1) for r, o in given]
    found = torch.cat(found)
    if mode == "R2":
        assert found.all()
    else:  # R3: the engine's noisy routing, not π_old's, for most responses
        assert found.float().mean() < 0.5
