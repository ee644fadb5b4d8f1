"""The lab's critic (rlgates.lab.critic): its value loss is verl's on a lab batch, its gate
checked three ways through the value model, the clip-fraction metric, KL in the reward through
GAE, run r of a batched call equal to run r alone, and clear errors.

(The estimators themselves against verl and TRL: test_advantages_trainers.py; their gates and
errors on synthetic batches: test_advantages.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from rlgates import advantages as ra
from rlgates import aggregation_weight, lab
from rlgates.figures import plot_value_gate
from rlgates.lab import critic

TINY = lab.LabConfig.for_device("cpu", prompts=4, group=4, length=6, steps=3, dtype="float64")
GAE = TINY.replace(advantage="gae", gamma=0.9, lam=0.8)


def lab_batch(cfg=GAE, seeds=(3, 4), agg="token-mean"):
    """A lab rollout of a fresh policy, and one critic arm (rows: every run) that has scored it,
    with its critic moved off its rollout values (so the value clip can bind)."""
    plan = [lab.loop._Arm(lab.resolve("ppo"), agg, cfg, 0, slice(0, len(seeds)))]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    batch = lab.rollout(cfg, cfg.policy(list(seeds)), gens)
    critics = critic.Critics(plan, cfg, list(seeds), torch.device("cpu"))
    model = critics.arms[0].model
    with torch.no_grad():  # a trained critic's V varies from token to token
        model.w_value.copy_(0.3 * torch.randn(model.w_value.shape, dtype=torch.float64,
                                              generator=torch.Generator().manual_seed(0)))
    batch = critics.advantages(batch)  # V_old: the critic at rollout
    with torch.no_grad():  # then the critic moves, as after some updates
        model.b_value.add_(0.3)
    return batch, critics.arms[0]


def test_lab_batches_are_ragged_and_the_advantages_per_token():
    batch, arm = lab_batch()
    lengths = batch.mask.sum(-1)
    assert lengths.min() < lengths.max() < GAE.length + 1  # ragged: the value loss's agg matters
    assert batch.adv.shape == batch.tokens.shape
    for run in range(2):  # whitened over the run's own real tokens (verl's count + 1e-8), 0 off
        a, m = batch.adv[run], batch.mask[run]
        assert abs(float(a[m].mean())) < 1e-8 and float(a[m].std()) == pytest.approx(1, 1e-4)
        assert float(a[~m].abs().max()) == 0
    assert float(critic.mixed_signs(batch.adv, batch.mask).max()) > 0  # A flips in a response
    assert float(critic.mixed_signs(batch.adv.abs(), batch.mask).max()) == 0  # control


@pytest.mark.xdist_group("trainers")
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_the_critics_update_is_verls_value_loss(agg, monkeypatch):
    """The loss the lab's critic steps on, with its arguments as the lab passes them, equals
    verl's compute_value_loss (float64, ragged lab minibatches): value, gradient, clip fraction."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import compute_value_loss

    batch, arm = lab_batch(agg=agg)
    arm.cfg = arm.cfg.replace(cliprange_value=0.1)  # tight, so the gate shuts some tokens
    seen, shut = [], []

    def recorded(values, values_old, returns, mask, clip, agg_mode):
        ours = ra.value_loss(values, values_old, returns, mask, clip, agg_mode)
        theirs, clipfrac = compute_value_loss(values, returns, values_old, mask.double(), clip,
                                              loss_agg_mode=agg_mode)
        g_ours, = torch.autograd.grad(ours, values, retain_graph=True)
        g_theirs, = torch.autograd.grad(theirs, values, retain_graph=True)
        seen.append((clip, agg_mode, float((ours - theirs).abs().detach()), float(
            (g_ours - g_theirs).abs().max()), float(g_ours.abs().max())))
        ours_frac = ra.value_clip_fraction(values.detach(), values_old, returns, mask, clip)
        shut.append((float(ours_frac), float(clipfrac)))
        return ours

    monkeypatch.setattr(critic, "value_loss", recorded)
    idx = torch.stack([torch.randperm(GAE.batch, generator=torch.Generator().manual_seed(r))
                       for r in range(2)])
    arm.update(batch, idx[:, :8])
    assert len(seen) == 2  # one loss per run
    for clip, agg_mode, d_loss, d_grad, size in seen:
        assert (clip, agg_mode) == (0.1, agg)
        assert d_loss < 1e-12 and d_grad < 1e-12 and size > 1e-3
    assert all(abs(a - b) < 1e-9 for a, b in shut)
    assert max(a for a, _ in shut) > 0  # the gate was shut somewhere


def test_the_value_gate_through_the_value_head_three_ways():
    """∂(value loss)/∂b_value = Σ_t g_t·(V_t − R_t)·w_t: closed form (the gate), autograd and a
    central finite difference, on one run of a lab batch."""
    batch, arm = lab_batch()
    model, old, ret, mask = arm.model, arm.values_old[0], arm.returns[0], batch.mask[0]
    eps = 0.1

    def loss():
        values = model.values(batch.prompts, batch.tokens)[0]
        return ra.value_loss(values, old, ret, mask, eps, "token-mean"), values

    value, values = loss()
    autograd = torch.autograd.grad(value, model.b_value)[0][0, 0]
    values = values.detach()
    gate = ra.value_gate(values, old, ret, eps)
    closed = (gate * (values - ret) * aggregation_weight(mask, "token-mean")).sum()
    h = 1e-6
    with torch.no_grad():
        model.b_value[0] += h
        up = loss()[0]
        model.b_value[0] -= 2 * h
        down = loss()[0]
        model.b_value[0] += h
    assert float(abs(autograd - closed)) < 1e-12
    assert float(abs((up - down) / (2 * h) - closed)) < 1e-8
    shut = (gate == 0) & mask
    assert 0 < int(shut.sum()) < int(mask.sum())  # some gates shut, some open
    open_all = (values - ret) * aggregation_weight(mask, "token-mean")  # control: no clip
    assert float(abs(open_all.sum() - closed)) > 1e-4


def test_kl_in_the_reward_reaches_every_earlier_token_through_gae():
    """γ = λ = 1: the return at t is the outcome reward minus β·Σ_{t' ≥ t} k_t' (k1: log π_old −
    log π_ref), on every real token; KL off, the return is the outcome reward everywhere."""
    beta = 0.5
    cfg = GAE.replace(gamma=1.0, lam=1.0, kl_coef=beta, lr=0.5)
    moved = cfg.policy([3])
    with torch.no_grad():  # a policy away from the reference (the initial one)
        moved.b_head.add_(torch.linspace(-1, 1, cfg.vocab, dtype=torch.float64))
    batch = lab.rollout(cfg, moved, [torch.Generator().manual_seed(3)])
    for coef in (beta, 0.0):
        own = cfg.replace(kl_coef=coef)
        plan = [lab.loop._Arm(lab.resolve("ppo"), "token-mean", own, 0, slice(0, 1))]
        arm = critic.Critics(plan, own, [3], torch.device("cpu")).arms[0]
        arm.advantages(batch)
        mask = batch.mask[0]
        k = batch.logp[0] - cfg.policy([3]).log_probs(batch.tokens, batch.prompts)[0].detach()
        to_go = (k * mask).flip(-1).cumsum(-1).flip(-1)
        expect = torch.where(mask, batch.rewards[0, :, None] - coef * to_go, 0.0)
        assert torch.allclose(arm.returns[0], expect, atol=1e-12)
    assert float(to_go[mask].abs().max()) > 0.1  # the penalty is not vacuous


def train_pair(seeds, **critic_fields):
    cfg = TINY.replace(steps=4)
    arms = {"gae": lab.Arm("ppo", cfg.replace(advantage="gae", **critic_fields)),
            "group": lab.Arm("ppo")}
    return cfg, arms, lab.run_many(arms, seeds, config=cfg, lag=1, agg="token-mean")


def test_critic_arms_batched_equal_each_run_alone():
    """A critic arm (with KL in the reward, γ, λ < 1) and a group arm, batched: each run equals
    that arm trained alone with that seed, critic metrics included; the group arm has none."""
    seeds = [5, 0]
    cfg, arms, together = train_pair(seeds, gamma=0.9, lam=0.8, kl_coef=0.05)
    for label, arm in arms.items():
        keys = lab.metric_doc(critic=label == "gae")
        for r, seed in enumerate(seeds):
            alone = lab.train(arm.method, arm.config or cfg, [seed], lag=1, agg="token-mean",
                              progress=False)[0]
            got = together[label][r]
            assert tuple(got.metrics) == tuple(keys) == tuple(alone.metrics)
            for key in keys:
                x, y = torch.tensor(got.metrics[key]), torch.tensor(alone.metrics[key])
                assert torch.allclose(x, y, atol=1e-9, rtol=1e-7, equal_nan=True), (label, key)
    gae, group = together["gae"][0].metrics, together["group"][0].metrics
    assert gae["loss"] != group["loss"]  # the arms differ
    assert all(math.isfinite(v) for v in gae["kl_ref"] + gae["vf_loss"])
    assert max(abs(v) for v in gae["kl_ref"]) > 0  # the policy left its reference
    assert "vf_loss" not in group


def test_the_clip_fraction_metric_reads_the_gate():
    """vf_clipfrac: > 0 with a tight value clip, 0 with one wider than any move; the loss
    differs between the two (the clip binds), and the runs' policies do too (A differs)."""
    _, _, tight = train_pair([1], cliprange_value=0.005)
    _, _, wide = train_pair([1], cliprange_value=1e3)
    t, w = tight["gae"][0].metrics, wide["gae"][0].metrics
    assert max(t["vf_clipfrac"]) > 0 and max(w["vf_clipfrac"]) == 0
    assert t["vf_loss"][1:] != w["vf_loss"][1:]


def test_plot_value_gate_draws_the_gate():
    """The figure's regions are the library's gate: a point inside the band is open, one past the
    band with R beyond the midpoint is shut (grey), and its mirror image."""
    import matplotlib

    matplotlib.use("Agg")
    fig = plot_value_gate(clip_range=0.5, n=201)
    image = fig.axes[0].get_images()[0].get_array()
    axis = torch.linspace(-1.5, 1.5, 201)

    def at(x, y):
        return float(image[int((axis - y).abs().argmin()), int((axis - x).abs().argmin())])

    assert at(1.0, 0.2) == 2 and at(-1.0, 0.2) == 0  # inside the band: towards R
    assert at(1.2, 1.0) == 1 and at(-1.2, -1.0) == 1  # shut: past the band, R past the midpoint
    assert at(0.6, 1.0) == 0  # past the band, R nearer the edge: pulled back down
    assert fig.axes[0].get_xlabel() and fig.axes[0].get_legend() is not None
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.parametrize(("fields", "match"), [
    ({"advantage": "critic"}, "advantage must be one of"),
    ({"advantage": "gae", "gamma": 1.5}, r"gamma must lie in \[0, 1\]"),
    ({"advantage": "gae", "lam": -0.1}, r"lam must lie in \[0, 1\]"),
    ({"advantage": "gae", "cliprange_value": -1.0}, "cliprange_value must be"),
    ({"advantage": "gae", "critic_lr": 0.0}, "critic_lr must be > 0"),
    ({"advantage": "gae", "kl_coef": math.nan}, "kl_coef must be"),
    ({"kl_coef": 0.1}, "needs advantage='gae'"),
    ({"advantage": "gae", "kl_penalty": "k9"}, "kl_penalty must be one of"),
])
def test_bad_critic_settings_name_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        lab.train("ppo", TINY.replace(**fields), steps=1, progress=False)


def test_the_value_model_wants_runs_first():
    model = critic.LabCritic([0], TINY.vocab, TINY.hidden, TINY.length, TINY.motif)
    with pytest.raises(ValueError, match=r"response must be \[R, B, T\]"):
        model.values(torch.zeros(2, TINY.motif, dtype=torch.long),
                     torch.zeros(2, TINY.length, dtype=torch.long))
    assert not hasattr(model, "w_head")  # no token head
    values = model.values(torch.zeros(1, 2, TINY.motif, dtype=torch.long),
                          torch.zeros(1, 2, TINY.length, dtype=torch.long))
    assert values.shape == (1, 2, TINY.length) and float(values.detach().abs().max()) == 0  # V ≡ 0


def test_inside_the_band_no_rounding_tie_shuts_a_gate():
    """Inside the band both branches are the same number. Clipped as V_old + clip(V − V_old),
    the clipped value rounds away from V on some tokens and the clipped branch reads strictly
    larger (a gate read shut inside the band); clamped into the band, as verl and rlgates clamp
    it, it is V exactly and every gate is open."""
    g = torch.Generator().manual_seed(0)
    old = 0.1 * torch.randn(64, 32, generator=g, dtype=torch.float64)
    values = 0.1 * torch.randn(64, 32, generator=g, dtype=torch.float64)  # drawn on its own
    returns = old + torch.randn(64, 32, generator=g, dtype=torch.float64)
    assert float((values - old).abs().max()) < 0.5  # every token inside the band
    rebuilt = old + (values - old).clamp(-0.5, 0.5)
    assert ((rebuilt - returns).square() > (values - returns).square()).any()  # the tie
    assert float(ra.value_gate(values, old, returns, 0.5).min()) == 1  # every gate open
    assert ra.value_clip_fraction(values, old, returns, None, 0.5) == 0
