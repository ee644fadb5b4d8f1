"""OpenRLHF's rows of the conformance matrix, each against OpenRLHF 0.11.2's own `PolicyLoss`.

OpenRLHF is optional (`pip install --no-deps openrlhf==0.11.2`, which `tasks.py` setup runs):
without it every test here skips. Its loss modules are loaded from the installed files
(rlgates.trainers.conformance_openrlhf.load: openrlhf/models/utils.py and loss.py under a package
of their own, `deepspeed` stubbed while utils.py loads). Each row's PolicyLoss is built from the
row's settings as openrlhf/trainer/ray/ppo_actor.py builds it, run on the hard float64 batch
(tests/conformance_batch.py) with a bool mask, and compared with the row's rlgates method: value
and gradient, for one advantage per row and per token. The comparisons could fail:
- the batch straddles every edge, the sampler's weight π_old/μ straddles the corrections'
  bounds 0.5 and 5, and each row's gradient differs from the ungated policy gradient's;
- the rows' settings are read back from the installed train_ppo_ray.py (defaults, choices) and
  ppo_actor.py (how PolicyLoss is built), and every policy_loss_type and correction has a row.

The second half adapts OpenRLHF's own loss tests (tests/test_loss_aggregation.py in the
openrlhf 0.11.2 wheel; the release has no sdist on PyPI) to the rlgates equivalents, and runs the
original file against the installed OpenRLHF.
"""

from __future__ import annotations

import ast
import math

import pytest
import torch

import rlgates
from rlgates import offpolicy
from rlgates import trainers as rt
from rlgates.trainers import conformance
from rlgates.trainers import conformance_openrlhf as co
from tests import conformance_batch as cb
from tests.conformance_batch import advantages, assert_equal

pytestmark = pytest.mark.skipif(
    not co.installed(),
    reason=f"OpenRLHF not installed (optional: pip install --no-deps openrlhf=={co.VERSION})")

ROWS = co.openrlhf_rows()
IDS = [f"{r.name}:{r.method}" for r in ROWS]
EQUAL = [r for r in ROWS if r.status == "equal"]
EQUAL_IDS = [f"{r.name}:{r.method}" for r in EQUAL]
TOL = 1e-12
_IS = "algo.advantage.is_correction_"


def _row(name, method=None):
    (row,) = [r for r in ROWS if r.name == name and (method is None or r.method == method)]
    return row


@pytest.fixture(scope="module")
def orl():
    return co.load()


@pytest.fixture(scope="module")
def batch():
    b = cb.hard_batch()
    cb.check(b)
    return b


def sampler_logp(b):
    """The sampler's log-probs μ: log(π_old/μ) = log ρ, so the weight π_old/μ takes the batch's
    edge ratios (0.5·0.99, 0.5·1.01, ..., 5·1.01) and the corrections' bounds are straddled."""
    return 2 * b.logp_old - b.logp


def openrlhf_loss(orl, row, b, adv, logp_old=None, settings=None):
    """(value, gradient) of OpenRLHF's PolicyLoss for the row's settings."""
    loss_fn = orl.loss.PolicyLoss(**co.policy_loss_kwargs({**row.settings, **(settings or {})}))
    leaf = b.leaf()
    value, *_ = loss_fn(leaf, b.logp_old if logp_old is None else logp_old, adv,
                        action_mask=b.mask, rollout_log_probs=sampler_logp(b))
    value.backward()
    return value.detach(), leaf.grad


def rlgates_loss(row, b, adv, logp_old=None, is_weight=None, method=None):
    m = rlgates.get(method or row.method, **({} if method else row.hparams))
    if is_weight is None and row.correction:
        is_weight = offpolicy.importance_weight(b.logp_old, sampler_logp(b), b.mask,
                                                **row.correction)
    leaf = b.leaf()
    value = rt.loss(m, leaf, b.logp_old if logp_old is None else logp_old, adv, b.mask,
                    agg=row.agg, is_weight=is_weight)
    value.backward()
    return value.detach(), leaf.grad


def assert_gate_acts(row, b, adv, g_ref, **kw):
    assert g_ref[b.mask].abs().max() > 1e-3 and g_ref[~b.mask].abs().max() == 0
    plain = rlgates_loss(row, b, adv, method="reinforce", **kw)[1]
    assert (plain - g_ref).abs().max() > 1e-3


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("row", EQUAL, ids=EQUAL_IDS)
def test_openrlhf_row_equals_its_method(orl, batch, row, per_token):
    theirs_adv, ours_adv = advantages(batch, per_token)
    ref = openrlhf_loss(orl, row, batch, theirs_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref)
    assert_gate_acts(row, batch, ours_adv, ref[1])


def test_the_corrections_act(orl, batch):
    """The TIS and IcePop rows differ from the row without a correction, and the weight is
    clamped (TIS) or zeroed (IcePop) on both sides of its band on this batch."""
    adv = advantages(batch, False)[0]
    plain = openrlhf_loss(orl, _row("ppo", "ppo"), batch, adv)
    w = (batch.logp_old - sampler_logp(batch)).exp()[batch.mask]
    assert (w < 0.5).any() and (w > 5).any() and ((w > 0.5) & (w < 5)).any()
    for name in ("is_correction:tis", "is_correction:icepop"):
        assert (openrlhf_loss(orl, _row(name), batch, adv)[1] - plain[1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["gspo", "gspo:is_correction"])
def test_gspo_rows(orl, batch, name):
    """GSPO: equal with one advantage per response; with [B, T] advantages equal in value, and
    the gradient differs (OpenRLHF differentiates the sequence ratio through its mean). With a
    correction on, the ratio is taken against the sampler and no weight applies."""
    row = _row(name)
    old = sampler_logp(batch) if name == "gspo:is_correction" else batch.logp_old
    theirs_adv, ours_adv = advantages(batch, False)
    ref = openrlhf_loss(orl, row, batch, theirs_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv, logp_old=old), ref)
    v_ref, g_ref = openrlhf_loss(orl, row, batch, batch.adv_tokens)
    v, g = rlgates_loss(row, batch, batch.adv_tokens, logp_old=old)
    assert float(v) == pytest.approx(float(v_ref), rel=TOL)
    assert (g - g_ref)[batch.mask].abs().max() > 1e-6
    if name == "gspo:is_correction":  # against π_old instead, it is another loss
        assert (rlgates_loss(row, batch, ours_adv)[1] - ref[1]).abs().max() > 1e-3
    else:
        assert_gate_acts(row, batch, ours_adv, ref[1])


def seq_mask_tis_weight(b, low=0.5, high=5.0):
    """seq-mask-tis, from its rule: w_t = π_old/μ on every token of a response whose geometric
    mean weight exp(mean_t log w_t) lies in [low, high], 0 on the others."""
    lw = torch.where(b.mask, b.logp_old - sampler_logp(b), 0.0)
    geo = (lw.sum(-1) / b.mask.sum(-1).clamp(min=1)).exp()
    keep = (geo >= low) & (geo <= high)
    return torch.where(keep[:, None] & b.mask, lw.exp(), 0.0), keep


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
def test_seq_mask_tis_row(orl, batch, per_token):
    """seq-mask-tis at the row's band [0.5, 5] (every response of this batch kept) and at
    [0.95, 1.05] (some dropped): the rule's weight gives OpenRLHF's loss."""
    row = _row("is_correction:seq-mask-tis")
    real = batch.lengths > 0
    theirs_adv, ours_adv = advantages(batch, per_token)
    for band in ((0.5, 5.0), (0.95, 1.05)):
        w, keep = seq_mask_tis_weight(batch, *band)
        assert keep[real].any() and (band == (0.5, 5.0) or not keep[real].all())
        ref = openrlhf_loss(orl, row, batch, theirs_adv,
                            settings={f"{_IS}threshold": list(band)})
        assert_equal(rlgates_loss(row, batch, ours_adv, is_weight=w), ref)
        # rlgates' sequence-level IcePop weighs by the product Π_t w_t: another loss
        prod = offpolicy.importance_weight(batch.logp_old, sampler_logp(batch), batch.mask,
                                           "icepop", level="sequence", low=band[0], high=band[1])
        ours = rlgates_loss(row, batch, ours_adv, is_weight=prod)[0]
        assert abs(float(ours) - float(ref[0])) > 1e-4


def trust_region_weight(b, gating, delta):
    """The binary_kl / tv trust region, from its rule: w_t where the sampled token's divergence
    between p = μ and q = π_old (both clamped to [1e-6, 1 − 1e-6]) is at most δ, else 0."""
    p = sampler_logp(b).exp().clamp(1e-6, 1 - 1e-6)
    q = b.logp_old.exp().clamp(1e-6, 1 - 1e-6)
    if gating == "binary_kl":
        stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
    else:
        stat = (p - q).abs()
    keep = (stat >= 0) & (stat <= delta)
    return torch.where(keep & b.mask, (b.logp_old - sampler_logp(b)).exp(), 0.0), keep


@pytest.mark.parametrize("gating,delta", [("binary_kl", 0.05), ("tv", 0.05)])
def test_trust_region_rows(orl, batch, gating, delta):
    row = _row("is_correction:binary_kl")
    settings = {f"{_IS}gating": gating, f"{_IS}threshold": [delta]}  # one value: an upper bound
    w, keep = trust_region_weight(batch, gating, delta)
    assert keep[batch.mask].any() and not keep[batch.mask].all()
    for per_token in (False, True):
        theirs_adv, ours_adv = advantages(batch, per_token)
        ref = openrlhf_loss(orl, row, batch, theirs_adv, settings=settings)
        assert_equal(rlgates_loss(row, batch, ours_adv, is_weight=w), ref)


# --- the rows' settings are OpenRLHF's own ------------------------------------------------------
def _choices(option):
    tree = ast.parse(co.path(co.CLI_FILE).read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and getattr(node.args[0], "value", None) == f"--{option}"):
            for kw in node.keywords:
                if kw.arg == "choices":
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"{co.CLI_FILE} has no choices for --{option}")


def test_the_settings_are_openrlhfs():
    """The option defaults the rows assume are train_ppo_ray.py's, PolicyLoss is built from them
    as ppo_actor.py builds it, and every option a row sets is one train_ppo_ray.py defines."""
    import importlib.metadata

    assert importlib.metadata.version("openrlhf") == co.VERSION == rt.EXTRA_VERSIONS["openrlhf"]
    defaults = co.cli_defaults()
    assert {k: defaults[k] for k in co.DEFAULTS} == co.DEFAULTS
    assert co.ppo_actor_policy_loss_args() == co.POLICY_LOSS_ARGS
    for r in ROWS:
        assert set(r.settings) <= set(defaults), (r.name, set(r.settings) - set(defaults))
    assert tuple(_choices("actor.loss_agg_mode")) == rt.OPENRLHF_AGGS


def test_every_policy_loss_type_and_correction_has_a_row():
    types = {r.settings["actor.policy_loss_type"] for r in ROWS}
    assert types == set(_choices("actor.policy_loss_type")) == {"ppo", "gspo"}
    aggs = {r.settings.get("actor.loss_agg_mode") for r in ROWS if r.name == "ppo"}
    assert aggs == set(rt.OPENRLHF_AGGS)
    kinds = {(r.settings.get(f"{_IS}level"), r.settings.get(f"{_IS}mode", "mask"),
              r.settings.get(f"{_IS}gating", "ratio")) for r in ROWS if f"{_IS}level" in r.settings}
    for level in _choices(f"{_IS}level"):
        if level != "off":
            assert any(k[0] == level for k in kinds), level
    for mode in _choices(f"{_IS}mode"):
        assert any(k[1] == mode for k in kinds), mode
    for gating in _choices(f"{_IS}gating"):
        assert any(k[2] == gating for k in kinds) or gating == "tv", gating  # tv: trust-region test


def test_rows_are_well_formed():
    rows = [r for r in conformance.matrix() if r.trainer == "openrlhf"]
    assert rows == ROWS
    for r in rows:
        assert r.method in rlgates.names() and r.agg in rlgates.AGG_MODES
        rlgates.get(r.method, **r.hparams)
    table = conformance.markdown(rows)
    assert table.count("\n") == len(rows) + 1


def test_flags_at_another_aggregation(orl, batch):
    """`flags(m, agg=...)["openrlhf"]`: for each method with OpenRLHF flags and each aggregation
    OpenRLHF has, its PolicyLoss at those settings is the method's loss at that aggregation."""
    adv, checked = advantages(batch, False)[0], 0
    for name in rlgates.names():
        m = rlgates.get(name)
        for agg in rlgates.AGG_MODES:
            f = rt.flags(m, agg=agg)["openrlhf"]
            if f is None:
                continue
            row = conformance.Row("openrlhf", f["actor.policy_loss_type"], f, name,
                                  dict(m.hparams), agg)
            assert_equal(rlgates_loss(row, batch, batch.adv), openrlhf_loss(orl, row, batch, adv))
            checked += 1
        assert rt.flags(m, agg="token-mean", normaliser="micro-batch")["openrlhf"] is None
    assert checked >= 9
    assert rt.flags(rlgates.get("luspo"))["openrlhf"] is None  # gspo is always per-sample


# --- OpenRLHF's own loss tests, adapted to rlgates ----------------------------------------------
# From tests/test_loss_aggregation.py of the openrlhf 0.11.2 wheel. Each keeps the original's
# numbers and asks the same of rlgates; the metric tests (ppo_kl, vllm_kl, the filter fraction)
# and the option-validation test have no rlgates counterpart and are run on OpenRLHF only
# (test_openrlhfs_own_loss_tests_pass).


def test_adapted_token_mean_matches_dp_average(orl):
    """test_token_mean_aggregation_matches_verl_dp_average: each rank divides its sum by the
    global token count (times dp_size, which DDP's average undoes); so does rt.loss(norm=N)."""
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0], [7.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    full = rlgates.aggregate(loss, mask, "token-mean")
    assert float(full) == pytest.approx(float(orl.loss.aggregate_loss(loss, mask)), rel=1e-15)
    n = mask.sum()
    ranks = [orl.loss.aggregate_loss(loss[s], mask[s], dp_size=2, batch_num_tokens=n)
             for s in (slice(0, 2), slice(2, 3))]
    assert float(sum(ranks) / 2) == pytest.approx(float(full), rel=1e-15)
    # rlgates: the same split with the global count is the full batch's token mean
    on_policy = rlgates.get("ppo")  # on policy, ρ = 1: PPO's per-token loss is −A, so A = −loss
    zero = torch.zeros_like(loss)
    ours = sum(rt.loss(on_policy, zero[s], zero[s], -loss[s], mask[s], norm=n)
               for s in (slice(0, 2), slice(2, 3)))
    assert float(ours) == pytest.approx(float(full), rel=1e-15)


def test_adapted_seq_mean_matches_dp_average(orl):
    """test_seq_mean_token_mean_aggregation_matches_verl_dp_average, and
    test_loss_batch_info_excludes_fully_masked_sequences: rlgates' seq-mean-token-mean skips a
    fully masked row, as OpenRLHF's global_batch_size does."""
    loss = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 0.0], [8.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    full = rlgates.aggregate(loss, mask, "seq-mean-token-mean")
    assert float(full) == pytest.approx(float(orl.loss.aggregate_loss(
        loss, mask, token_level_loss=False)), rel=1e-15)
    on_policy, zero = rlgates.get("ppo"), torch.zeros_like(loss)  # ρ = 1: loss −A
    ours = sum(rt.loss(on_policy, zero[s], zero[s], -loss[s], mask[s], agg="seq-mean-token-mean",
                       norm=3) for s in (slice(0, 2), slice(2, 3)))
    assert float(ours) == pytest.approx(float(full), rel=1e-15)
    two = torch.tensor([[1.0, 3.0], [5.0, 7.0]], dtype=torch.float64)
    empty = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    info = orl.loss_utils.get_loss_batch_info(strategy=object(), loss_mask=empty.float())
    assert info["global_batch_size"].item() == 1.0
    assert float(rlgates.aggregate(two, empty, "seq-mean-token-mean")) == 2.0


def test_adapted_policy_loss_token_mean_matches_full_batch(orl):
    """test_policy_loss_token_mean_aggregation_matches_full_batch, on PPO's loss: OpenRLHF's and
    rlgates' agree on the original batch, and split over two ranks."""
    logp = torch.tensor([[-0.20, -0.40, -0.10], [-0.70, -0.30, -0.20], [-0.60, -0.10, -0.50]],
                        dtype=torch.float64)
    old = logp - torch.tensor([[0.03, -0.04, 0.01], [0.02, 0.05, -0.03], [0.04, 0.0, -0.02]],
                              dtype=torch.float64)
    adv = torch.tensor([[1.0, -0.5, 0.0], [0.3, -1.2, 0.5], [1.5, 0.0, -0.7]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 1]], dtype=torch.bool)
    theirs, *_ = orl.loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)(
        logp, old, adv, action_mask=mask)
    ppo, n = rlgates.get("ppo", eps=0.2), mask.sum()
    assert float(ppo.loss(logp, old, adv, mask)) == pytest.approx(float(theirs), rel=1e-14)
    split = sum(rt.loss(ppo, logp[s], old[s], adv[s], mask[s], norm=n)
                for s in (slice(0, 2), slice(2, 3)))
    assert float(split) == pytest.approx(float(theirs), rel=1e-14)


def test_adapted_icepop_filters_an_overflowing_ratio_without_nan(orl):
    """test_icepop_filters_overflowing_ratio_without_nan: a weight of e^1000 is dropped, the
    loss is −0.5 and the gradient finite, 0 on the dropped token."""
    rollout = torch.tensor([[-1000.0, 0.0]], dtype=torch.float64)
    zero = torch.zeros((1, 2), dtype=torch.float64)
    w = offpolicy.importance_weight(zero, rollout, None, "icepop", low=0.5, high=5.0)
    leaf = zero.clone().requires_grad_(True)
    loss = rlgates.get("ppo").loss(leaf, zero, torch.ones_like(zero), None, is_weight=w)
    loss.backward()
    assert float(loss) == -0.5 and torch.isfinite(leaf.grad).all() and leaf.grad[0, 0] == 0
    theirs, *_ = orl.loss.PolicyLoss(is_correction_level="token", is_correction_mode="mask",
                                     is_correction_threshold=[0.5, 5.0])(
        zero, zero, torch.ones_like(zero), action_mask=torch.ones_like(zero),
        rollout_log_probs=rollout)
    assert float(theirs) == float(loss)


def test_adapted_grad_accum_global_norm(orl):
    """test_grad_accum_global_norm_matches_global_token_mean_over_window and its sanity test:
    micro-batches of uneven token counts each divided by the window's count sum to the window's
    token mean (rt.loss(norm=N)); the mean of per-micro-batch means does not."""
    mb0, mask0 = (torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64),
                  torch.tensor([[1, 1, 0]], dtype=torch.bool))
    mb1, mask1 = (torch.tensor([[3.0, 4.0, 5.0], [6.0, 7.0, 0.0]], dtype=torch.float64),
                  torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool))
    n = mask0.sum() + mask1.sum()
    expected = ((mb0 * mask0).sum() + (mb1 * mask1).sum()) / n
    on_policy = rlgates.get("ppo")  # ρ = 1: loss −A
    ours = sum(rt.loss(on_policy, torch.zeros_like(x), torch.zeros_like(x), -x, m, norm=n)
               for x, m in ((mb0, mask0), (mb1, mask1)))
    assert float(ours) == pytest.approx(float(expected), rel=1e-15)
    masks = {id(mb0): mask0.float(), id(mb1): mask1.float()}
    emitted = list(orl.loss_utils.iter_grad_accum_global_norm(
        [(mb0, mask0.float()), (mb1, mask1.float())], strategy=object(), accumulated_gradient=2,
        mask_fn=lambda it: masks[id(it[0])]))
    theirs = sum(orl.loss.aggregate_loss(x, m, dp_size=info["dp_size"],
                                         batch_num_tokens=info["batch_num_tokens"]) / 2
                 for (x, m), info in emitted)
    assert float(theirs) == pytest.approx(float(expected), rel=1e-6)  # OpenRLHF counts in float32
    per_mb = (rlgates.aggregate(mb0, mask0, "token-mean")
              + rlgates.aggregate(mb1, mask1, "token-mean")) / 2
    assert not torch.allclose(per_mb, expected)


def test_adapted_seq_mask_gates_on_the_geometric_mean(orl):
    """test_seq_mask_gates_on_the_per_sequence_geometric_mean_ratio: OpenRLHF keeps row 0
    (geometric mean 1) with per-token weights e^1, e^−1 and drops row 1 (e^2 > 5). The rule's
    weight reproduces it in rlgates; rlgates' own sequence-level IcePop (the product Π_t w_t,
    here 1 for row 0) drops the same row but weighs the kept one 1: another loss."""
    logp = torch.zeros(2, 2, dtype=torch.float64)
    rollout = torch.tensor([[-1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64)
    ones = torch.ones(2, 2, dtype=torch.float64)
    theirs, _, _, _, filt = orl.loss.PolicyLoss(is_correction_level="seq",
                                                is_correction_threshold=[0.5, 5.0])(
        logp, logp, ones, action_mask=ones, rollout_log_probs=rollout)
    expected = -torch.tensor([1.0, -1.0], dtype=torch.float64).exp().sum() / 4
    assert float(theirs) == pytest.approx(float(expected), rel=1e-15) and float(filt) == 0.5
    lw = logp - rollout
    keep = (lw.mean(-1).exp() >= 0.5) & (lw.mean(-1).exp() <= 5.0)
    w = torch.where(keep[:, None], lw.exp(), 0.0)
    ppo = rlgates.get("ppo")
    assert float(ppo.loss(logp, logp, ones, None, is_weight=w)) == pytest.approx(
        float(expected), rel=1e-15)
    prod = offpolicy.importance_weight(logp, rollout, None, "icepop", level="sequence",
                                       low=0.5, high=5.0)
    assert float(ppo.loss(logp, logp, ones, None, is_weight=prod)) == -0.5


def test_adapted_trust_regions(orl):
    """test_binary_kl_trust_region_masks_tokens_and_sequences (token level) and
    test_tv_trust_region_masks_by_sampled_token_probability_gap: the rule's weight in rlgates
    gives OpenRLHF's numbers."""
    ppo = rlgates.get("ppo")
    logp = torch.tensor([[0.0, math.log(0.5)]], dtype=torch.float64)
    mu = torch.tensor([[-math.log(3.0), math.log(0.5)]], dtype=torch.float64)
    ones = torch.ones(1, 2, dtype=torch.float64)
    w = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # token 0 dropped, token 1 weight π/μ = 1
    theirs, *_ = orl.loss.PolicyLoss(is_correction_level="token", is_correction_gating="binary_kl",
                                     is_correction_threshold=[0, 0.05])(
        logp, logp, ones, action_mask=ones, rollout_log_probs=mu)
    assert float(theirs) == float(ppo.loss(logp, logp, ones, None, is_weight=w)) == -0.5
    logp = torch.tensor([[math.log(0.6), math.log(0.52)]], dtype=torch.float64)
    mu = torch.full((1, 2), math.log(0.5), dtype=torch.float64)
    w = torch.tensor([[0.0, 0.52 / 0.5]], dtype=torch.float64)
    theirs, *_ = orl.loss.PolicyLoss(is_correction_level="token", is_correction_gating="tv",
                                     is_correction_threshold=[0, 0.05])(
        logp, logp, ones, action_mask=ones, rollout_log_probs=mu)
    ours = ppo.loss(logp, logp, ones, None, is_weight=w)
    assert float(theirs) == pytest.approx(float(ours), rel=1e-14)
    assert float(ours) == pytest.approx(-(0.52 / 0.5) / 2, rel=1e-14)


def test_adapted_seq_mean_weighs_every_sequence_the_same():
    """test_seq_mean_token_mean_weighs_every_sequence_the_same, on rlgates' GRPO: loss
    −(A0 + A1)/2, gradient −A_i/(T_i·B) per token."""
    logp = torch.full((2, 2), -0.6931, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv = torch.tensor([[2.0, 2.0], [1.0, 0.0]], dtype=torch.float64)
    loss = rlgates.get("grpo").loss(logp, logp.detach(), adv, mask)
    assert float(loss) == pytest.approx(-1.5, rel=1e-15)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5], [-0.5, 0.0]],
                                                       dtype=torch.float64))


def test_openrlhfs_own_loss_tests_pass():
    """OpenRLHF's tests/test_loss_aggregation.py (0.11.2), run as shipped against the installed
    loss modules (`deepspeed` stubbed while its loader imports openrlhf/models/utils.py)."""
    import importlib.util
    import sys
    import types

    file = co.path(co.OWN_TESTS_FILE)
    assert file.is_file(), f"{co.OWN_TESTS_FILE} is no longer in the wheel"
    added = [k for k in ("deepspeed",) if importlib.util.find_spec(k) is None]
    for k in added:
        sys.modules[k] = types.ModuleType(k)
    before = set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location("_openrlhf_own_loss_tests", file)
        own = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(own)
        tests = [getattr(own, n) for n in dir(own) if n.startswith("test_")]
        assert len(tests) >= 10
        for test in tests:
            test()
    finally:
        for k in set(sys.modules) - before:
            if k.startswith(("_openrlhf", "openrlhf")):
                del sys.modules[k]
        for k in added:
            del sys.modules[k]


def test_defaults_across_trainers_are_the_installed_ones():
    """The OpenRLHF row of rlgates.trainers.defaults_across_trainers() (the table of "Which gate
    when" and the conventions page) against the installed OpenRLHF; verl's and TRL's too."""
    checked = rt.check_installed_defaults()
    assert {"verl", "TRL", "OpenRLHF"} <= set(checked)
    assert len(rt.defaults_across_trainers()) == 9
