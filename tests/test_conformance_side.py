"""verl's losses that read more than (ρ, A) – dppo_tv, dppo_kl, clip_cov, kl_cov – against
verl 0.9.1's own functions (`get_policy_loss_fn`), value and gradient in float64, on the hard
batch (tests/conformance_batch.py), with the helpers of tests/test_conformance_verl.py.

Not vacuous: each mask or pick acts on this batch (a token it changes, checked against the
same loss without it), and each default is read from the installed verl: its config, and where
its code falls back to another value (DPPO's c = 20, KL-Cov's ppo_kl_coef = 1), from its source.
"""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

import rlgates
from rlgates import _numerics as nx
from rlgates import _side
from rlgates.trainers import conformance, conformance_side
from tests import conformance_batch as cb
from tests import test_conformance_verl as tcv
from tests.test_conformance_verl import TOL, advantages, assert_equal, rlgates_loss, verl_loss

verl, batch = tcv.verl, tcv.batch  # the same fixtures: verl's modules, the hard batch

pytestmark = pytest.mark.xdist_group("trainers")

ROWS = {r.name: r for r in conformance_side.SIDE_ROWS}


def with_hparams(row, **hparams):
    """The row at other hyperparameters (its verl settings read from the method's flags)."""
    from rlgates.trainers.conformance_verl import method_row

    return method_row(row.method, side=row.side, note=row.note, **{**row.hparams, **hparams})


def gradient_of(method, b, adv, side=None):
    leaf = b.leaf()
    method.loss(leaf, b.logp_old, adv, b.mask, side=side).backward()
    return leaf.grad


# --- DPPO: a mask on π − π_old --------------------------------------------------------------------
@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("name, hparams", [
    ("dppo_tv", {}), ("dppo_kl", {}), ("dppo_tv", {"delta_low": 0.05, "delta_high": 0.3}),
    ("dppo_kl", {"delta_low": 0.01, "delta_high": 0.05, "c": 20.0})])
def test_dppo_equals_verl(verl, batch, name, hparams, per_token):
    row = with_hparams(ROWS[name], **hparams)
    verl_adv, ours_adv = advantages(batch, per_token)
    ref = verl_loss(verl, row, batch, verl_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref, TOL)
    # the mask acts on both sides, where π has moved far (π_old far from uniform) ...
    m = rlgates.get(row.method, **row.hparams)
    a = ours_adv[:, None].expand_as(batch.logp) if ours_adv.dim() == 1 else ours_adv
    keep = m.valid(batch.log_ratio, batch.logp.exp(), batch.logp_old.exp(), a)
    for sign in (1, -1):
        real = batch.mask & (a * sign > 0)
        assert (keep[real] == 0).any() and (keep[real] == 1).any(), (name, sign)
    # ... and the truncation at c: a kept token past c gets c·A, not ρ·A
    past = batch.mask & (batch.log_ratio.exp() > m.c) & (keep == 1) & (a != 0)
    assert past.any() or m.c == 20  # no ratio of the batch reaches 20
    # negative controls: PPO's ratio window (same ε) and no mask at all give other gradients
    for other in (rlgates.get("dapo", eps_low=0.2, eps_high=0.2), rlgates.get("cispo",
                  eps_low=1.0, eps_high=m.c - 1)):
        assert (gradient_of(other, batch, ours_adv) - ref[1]).abs().max() > 1e-3


def test_dppo_c_is_the_actor_configs_3_not_the_codes_20(verl):
    """verl's dppo functions read `config.get("clip_ratio_c", 20.0)`; its actor config always
    has clip_ratio_c, 3.0 by default. rlgates' default c is the config's."""
    core_algos, FSDPActorConfig, _, _ = verl
    for name in ("dppo_tv", "dppo_kl"):
        source = inspect.getsource(core_algos.get_policy_loss_fn(name))
        assert re.search(r'config\.get\("clip_ratio_c", 20\.0\)', source), name
        assert rlgates.get(name).hparams["c"] == 3.0
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4)
    assert cfg.clip_ratio_c == 3.0 and cfg.get("clip_ratio_c", 20.0) == 3.0
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (0.2, 0.2)


def test_dppo_c_changes_the_loss(verl, batch):
    """c = 20 (the code's fallback) and c = 3 (the config's) are two losses on this batch."""
    adv = advantages(batch, False)
    low = verl_loss(verl, ROWS["dppo_tv"], batch, adv[0])
    high = verl_loss(verl, with_hparams(ROWS["dppo_tv"], c=20.0), batch, adv[0])
    assert (low[1] - high[1]).abs().max() > 1e-3


def test_dppo_tv_is_a_window_in_rho_scaled_by_one_over_pi_old():
    """On the plane, DPPO-TV's A > 0 edge is ρ = 1 + δ_h/π_old and its A < 0 edge 1 − δ_l/π_old:
    the gate just inside each is min(1, c/ρ), just outside 0."""
    m = rlgates.get("dppo_tv", delta_low=0.1, delta_high=0.3, c=20.0)
    for p in (0.9, 0.5, 0.05):
        side = rlgates.SideInfo(probs_old=p)
        high, low = 1 + 0.3 / p, 1 - 0.1 / p
        r = torch.tensor([high * (1 - 1e-9), high * (1 + 1e-9)], dtype=torch.float64)
        assert m.gate(r, torch.ones(2, dtype=torch.float64), side).tolist() == [1.0, 0.0]
        if low > 0:
            r = torch.tensor([low * (1 + 1e-9), low * (1 - 1e-9)], dtype=torch.float64)
            assert m.gate(r, -torch.ones(2, dtype=torch.float64), side).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dppo_tv_mask_is_verls_where_on_the_edges(dtype):
    """rlgates writes DPPO-TV's mask as a window per token (π − π_old ≤ δ_h for A > 0, ≥ −δ_l for
    A ≤ 0); verl writes torch.where(A > 0, π − π_old ≤ δ_h, π − π_old ≥ −δ_l), comparing with its
    Python floats. The two agree bit for bit at the edges themselves, one step past them, and
    with NaN, ±inf and A = 0 or NaN, in float32 and float64 (where δ = 0.2 differs)."""
    m = rlgates.get("dppo_tv", delta_low=0.2, delta_high=0.2)
    old = torch.tensor([0.3, 0.5, 0.7], dtype=dtype)
    moved = []
    for d in (0.2, -0.2):
        edge = torch.tensor(d, dtype=dtype)
        moved += [edge, torch.nextafter(edge, edge.new_tensor(1.0)),
                  torch.nextafter(edge, edge.new_tensor(-1.0))]
    moved = torch.stack(moved + [torch.tensor(v, dtype=dtype) for v in
                                 (0.0, math.nan, math.inf, -math.inf)])
    prob = (old[:, None] + moved[None, :]).flatten()  # π − π_old lands on each edge value
    prob_old = old[:, None].expand(-1, len(moved)).flatten()
    for a in (1.0, -1.0, 0.0, math.nan):
        adv = torch.full_like(prob, a)
        diff = prob - prob_old
        verl_keep = torch.where(adv > 0, diff <= 0.2, diff >= -0.2)
        keep = m.valid(None, prob, prob_old, adv)
        assert keep.dtype == torch.bool and torch.equal(keep, verl_keep), (dtype, a)
    # not vacuous: each edge keeps on one side and drops on the other, for each sign of A
    for a in (1.0, -1.0):
        keep = m.valid(None, prob, prob_old, torch.full_like(prob, a))
        assert keep.any() and not keep.all()


def test_dppo_kl_edges_solve_the_binary_kl():
    m = rlgates.get("dppo_kl", delta_low=0.02, delta_high=0.05)
    q = torch.tensor([0.9, 0.5, 0.05, 0.001], dtype=torch.float64)
    low, high = m.edges(q)
    from rlgates.methods.dppo import binary_kl

    for edge, delta in ((low, 0.02), (high, 0.05)):
        kl = binary_kl(edge.log(), edge * q, q)
        reachable = edge * q < 1
        assert torch.allclose(kl[reachable], torch.full_like(kl[reachable], delta), rtol=1e-9)
    assert (high[~(high * q < 1)] * q[~(high * q < 1)] == 1).all()  # no edge below π = 1
    assert (low < 1).all() and (high > 1).all()


# --- Clip-Cov: a random few of the high-covariance tokens dropped ---------------------------------
def verl_order_draw(m, b, adv, seed):
    """SideInfo.draw that makes rlgates pick what verl's seeded torch.randperm picks: the
    candidates in torch.nonzero's order, candidate perm[j] given key j/n."""
    logp, logp_old, a, mask = nx.check_loss_inputs(b.logp, b.logp_old, adv, b.mask, m.agg)
    can = m.candidates(logp, logp_old, a, mask, _side.batch_cov(logp, a, mask))
    where = can.flatten().nonzero().squeeze(-1)
    torch.manual_seed(seed)
    perm = torch.randperm(len(where))
    draw = torch.ones(can.numel(), dtype=torch.float64)
    draw[where[perm]] = torch.arange(len(where), dtype=torch.float64) / len(where)
    return draw.view_as(can), len(where)


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("cov_ratio", [2e-4, 0.05])
def test_clip_cov_with_verls_seeded_draw_equals_verl(verl, batch, cov_ratio, per_token):
    row = with_hparams(ROWS["clip_cov"], cov_ratio=cov_ratio)
    m = rlgates.get(row.method, **row.hparams)
    verl_adv, ours_adv = advantages(batch, per_token)
    n_real = int(batch.mask.sum())
    k = max(int(cov_ratio * n_real), 1)
    grads = []
    for seed in (0, 1, 2):
        draw, n_candidates = verl_order_draw(m, batch, ours_adv, seed)
        assert n_candidates > k  # a real choice among the candidates
        torch.manual_seed(seed)
        ref = verl_loss(verl, row, batch, verl_adv)
        ours = rlgates_loss(row, batch, ours_adv, side=rlgates.SideInfo(draw=draw))
        assert_equal(ours, ref, TOL)
        grads.append(ref[1])
        # exactly k tokens dropped: where DAPO's gradient is not 0 and verl's is
        dapo = gradient_of(rlgates.get("dapo", eps_low=0.2, eps_high=0.2), batch, ours_adv)
        assert int(((dapo != 0) & (ref[1] == 0)).sum()) == k
    assert k == 1 if cov_ratio == 2e-4 else k > 1  # one pick below 5,000 tokens
    assert any((g - grads[0]).abs().max() > 1e-6 for g in grads[1:])  # the draw matters


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
def test_clip_cov_selection_rule_apart_from_the_draw(verl, batch, per_token):
    """cov_ratio = 1 drops every candidate, whatever verl's permutation: no seed needed, and
    any draw gives rlgates the same pick."""
    row = with_hparams(ROWS["clip_cov"], cov_ratio=1.0)
    verl_adv, ours_adv = advantages(batch, per_token)
    ref = verl_loss(verl, row, batch, verl_adv)
    for draw in (torch.zeros(batch.logp.shape), torch.rand(batch.logp.shape)):
        assert_equal(rlgates_loss(row, batch, ours_adv, side=rlgates.SideInfo(draw=draw)), ref,
                     TOL)
    # the band matters: a band that holds no token is DAPO
    empty = verl_loss(verl, with_hparams(row, cov_low=50.0, cov_high=60.0), batch, verl_adv)
    dapo = conformance.Row("verl", "clip_cov", {}, "dapo", {"eps_low": 0.2, "eps_high": 0.2})
    assert_equal(rlgates_loss(dapo, batch, ours_adv), empty, TOL)
    assert (empty[1] - ref[1]).abs().max() > 1e-3


def test_clip_cov_needs_a_draw_and_names_it(batch):
    m = rlgates.get("clip_cov")
    with pytest.raises(ValueError, match=r"clip_cov picks tokens at random: sideinfo\.draw"):
        m.loss(batch.logp, batch.logp_old, batch.adv, batch.mask)
    picked = torch.zeros(batch.logp.shape, dtype=torch.bool)  # or the pick itself
    plain = m.loss(batch.logp, batch.logp_old, batch.adv, batch.mask,
                   side=rlgates.SideInfo(picked=picked))
    dapo = rlgates.get("dapo", eps_low=0.2, eps_high=0.2)
    assert float(plain) == float(dapo.loss(batch.logp, batch.logp_old, batch.adv, batch.mask))


# --- KL-Cov: the top-covariance tokens pulled back by κ·|log ρ| ------------------------------------
@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("hparams", [{}, {"cov_ratio": 0.05, "kl_coef": 0.7}])
def test_kl_cov_equals_verl(verl, batch, hparams, per_token):
    row = with_hparams(ROWS["kl_cov"], **hparams)
    verl_adv, ours_adv = advantages(batch, per_token)
    ref = verl_loss(verl, row, batch, verl_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref, TOL)
    # the pulled tokens: where the gradient differs from REINFORCE's, exactly the picks
    m = rlgates.get(row.method, **row.hparams)
    plain = gradient_of(rlgates.get("reinforce"), batch, ours_adv)
    moved = (plain - ref[1]).abs() > 1e-12
    k = max(int(m.hparams["cov_ratio"] * int(batch.mask.sum())), 1)
    assert int(moved.sum()) == k
    side = m.side_from_batch(*nx.check_loss_inputs(batch.logp, batch.logp_old, ours_adv,
                                                   batch.mask, m.agg))
    assert torch.equal(moved, side.picked)
    real = side.cov[batch.mask]
    assert side.cov[side.picked].min() >= real.sort(descending=True).values[k - 1]


def test_cov_defaults_are_verls_config_and_code(verl):
    """clip_cov_ratio, clip_cov_lb/ub and kl_cov_ratio: config and code agree; ppo_kl_coef:
    the config's 0.1, where the code falls back to 1.0."""
    core_algos, _, PolicyLossConfig, _ = verl
    cfg = PolicyLossConfig()
    flags = {n: rlgates.trainers.flags(rlgates.get(n))["verl"] for n in ("clip_cov", "kl_cov")}
    for key in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"):
        assert flags["clip_cov"][key] == getattr(cfg, key)
    assert flags["kl_cov"]["kl_cov_ratio"] == cfg.kl_cov_ratio == 2e-4
    assert flags["kl_cov"]["ppo_kl_coef"] == cfg.ppo_kl_coef == 0.1
    source = inspect.getsource(core_algos.get_policy_loss_fn("kl_cov"))
    assert re.search(r"ppo_kl_coef if config\.policy_loss\.ppo_kl_coef is not None else 1\.0",
                     source)
    source = inspect.getsource(core_algos.get_policy_loss_fn("clip_cov"))
    for key, value in (("clip_cov_ratio", "0.0002"), ("clip_cov_ub", "5.0"),
                       ("clip_cov_lb", "1.0")):
        assert re.search(rf"{key} is not None else {re.escape(value)}", source), key
    assert "torch.randperm(len(top_k_idx))" in source  # unseeded: hence side.draw


def test_side_rows_are_in_the_matrix():
    names = [r.name for r in conformance.matrix() if r.side]
    for name in ("dppo_tv", "dppo_kl", "clip_cov", "kl_cov"):
        assert name in names
        assert set(ROWS[name].side) <= set(_side.FIELDS)


def test_the_verl_adapter_runs_them_like_verls_own(verl, batch):
    """rlgates' methods registered in verl (rlgates.trainers.verl.register): dppo_tv and kl_cov
    equal verl's own; clip_cov draws its pick at random as verl does (one token dropped)."""
    from rlgates.trainers import verl as rverl

    core_algos = verl[0]
    verl_adv, _ = advantages(batch, False)
    for name in ("dppo_tv", "dppo_kl", "clip_cov", "kl_cov"):
        row = ROWS[name]
        ref = verl_loss(verl, row, batch, verl_adv)
        ours_name = rverl.register(rlgates.get(row.method, **row.hparams))
        leaf = batch.leaf()
        _, FSDPActorConfig, PolicyLossConfig, _ = verl
        actor, policy_loss, _ = tcv.split({**row.settings, "policy_loss.loss_mode": ours_name})
        config = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                                 policy_loss=PolicyLossConfig(**policy_loss), **actor)
        value, logged = core_algos.get_policy_loss_fn(ours_name)(
            old_log_prob=batch.logp_old, log_prob=leaf, advantages=verl_adv,
            response_mask=batch.mask, loss_agg_mode=row.agg, config=config)
        value.backward()
        assert "actor/rlgates_gate_mean" in logged
        if name == "clip_cov":
            dapo = gradient_of(rlgates.get("dapo", eps_low=0.2, eps_high=0.2), batch, batch.adv)
            assert int(((dapo != 0) & (leaf.grad == 0)).sum()) == 1
            assert int(((dapo != 0) & (ref[1] == 0)).sum()) == 1
        else:
            assert_equal((value.detach(), leaf.grad), ref, TOL)


# --- verl's clip_cov and kl_cov do not clamp log ρ ------------------------------------------------
def one_token(log_ratio, adv=-1.0):
    """A batch of one real token at the given log-ratio (its covariance is 0: Clip-Cov picks
    nothing, KL-Cov's one pick is the token itself)."""
    logp = torch.full((1, 1), float(log_ratio), dtype=torch.float64)
    z = torch.zeros_like(logp)
    return cb.HardBatch(logp=logp, logp_old=z, adv=torch.tensor([adv], dtype=torch.float64),
                        adv_tokens=torch.full_like(logp, adv),
                        mask=torch.ones_like(logp, dtype=torch.bool),
                        lengths=torch.tensor([1]), kind=("one",))


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "geo_mean"])
def test_unclamped_verl_losses_equal_only_inside_the_clamp(verl, name):
    """verl computes these ratios from the unclamped log_prob − old_log_prob (geo_mean's clamp
    is commented out); rlgates clamps log ρ at ±20 (as verl's vanilla does). One A = −1 token:
    at log ρ = 19 the two agree; at 22 verl's gradient is e^22-sized and rlgates' ratio term is
    0. Their rows say so."""
    core_algos = verl[0]
    source = inspect.getsource(core_algos.get_policy_loss_fn(name))
    live = [ln for ln in source.splitlines() if not ln.strip().startswith("#")]
    assert not any("min=-20.0" in ln for ln in live), name
    assert "min=-20.0, max=20.0" in inspect.getsource(core_algos.get_policy_loss_fn("vanilla"))
    row = next(r for r in conformance.matrix() if r.trainer == "verl" and r.name == name)
    assert row.status == "partial" and "|log ρ| ≤ 20" in row.note
    side = rlgates.SideInfo(draw=torch.ones(1, 1, dtype=torch.float64)) if name == "clip_cov" \
        else None
    kw = {"side": side} if side is not None else {}
    inside = one_token(19.0)
    verl_adv, _ = advantages(inside, False)
    ref = verl_loss(verl, row, inside, verl_adv)
    assert_equal(rlgates_loss(row, inside, inside.adv, **kw), ref, TOL)
    past = one_token(22.0)
    verl_adv, _ = advantages(past, False)
    _, g_verl = verl_loss(verl, row, past, verl_adv)
    _, g_ours = rlgates_loss(row, past, past.adv, **kw)
    assert float(g_verl) == pytest.approx(math.exp(22), rel=1e-6)  # −A·ρ, and KL-Cov's κ·sign
    assert abs(float(g_ours)) <= 1.0  # the clamp: at most KL-Cov's κ = 0.1 is left
