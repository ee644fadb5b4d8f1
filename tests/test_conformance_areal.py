"""AReaL's rows of the conformance matrix, each against AReaL 1.0.4's own loss functions.

AReaL is optional (`pip install --no-deps areal==1.0.4`, which `tasks.py` setup runs): without it
every test here skips. Its loss functions are executed from the installed files
(rlgates.trainers.conformance_areal.load: functional.py with RejectionSamplingConfig and
KLEstimator from their own definitions in cli_args.py and utils/data.py; M2PO's selection from
actor.py). `areal_loss` calls them as areal/trainer/ppo/actor.py's `grpo_loss_fn` does (its calls
are checked against the installed source), on the hard float64 batch (tests/conformance_batch.py)
with a bool mask, against the row's rlgates method: value and gradient, for one advantage per row
and per token. The comparisons could fail: the batch straddles every edge and the behaviour
weight π_prox/π_behave straddles the bound 5; each row's gradient differs from the ungated
policy gradient's; the defaults and fields are read from the installed cli_args.py.
"""

from __future__ import annotations

import ast

import pytest
import torch

import rlgates
from rlgates import offpolicy
from rlgates import trainers as rt
from rlgates.trainers import conformance
from rlgates.trainers import conformance_areal as ca
from tests import conformance_batch as cb
from tests.conformance_batch import advantages, assert_equal

pytestmark = pytest.mark.skipif(
    not ca.installed(),
    reason=f"AReaL not installed (optional: pip install --no-deps areal=={ca.VERSION})")

ROWS = ca.areal_rows()
EQUAL = [r for r in ROWS if r.status == "equal"]
EQUAL_IDS = [f"{r.name}:{r.method}" for r in EQUAL]
TOL = 1e-12


def _row(name, method=None):
    (row,) = [r for r in ROWS if r.name == name and (method is None or r.method == method)]
    return row


@pytest.fixture(scope="module")
def areal():
    return ca.load()


@pytest.fixture(scope="module")
def batch():
    b = cb.hard_batch()
    cb.check(b)
    return b


def behave_logp(b):
    """The behaviour policy's log-probs: log(π_prox/π_behave) = log ρ, so the weight takes the
    batch's edge ratios and straddles the bound 5."""
    return 2 * b.logp_old - b.logp


def areal_loss(areal, row, b, adv, settings=None):
    """(value, gradient) of AReaL's loss for the row, called as grpo_loss_fn calls it: π_prox is
    the batch's logp_old; π_behave is `behave_logp` under the decoupled loss, else π_prox."""
    kw = ca.loss_kwargs({**row.settings, **(settings or {})})
    prox = b.logp_old
    old = behave_logp(b) if kw["use_decoupled_loss"] else prox
    mask = b.mask
    if kw["m2_threshold"] is not None:
        mask = areal.apply_m2po_masking(old, prox, mask, kw["m2_threshold"])
    leaf = b.leaf()
    f = areal.functional
    if kw["use_sapo_loss"]:
        value, _ = f.sapo_loss_fn(logprobs=leaf, old_logprobs=old, advantages=adv,
                                  tau_pos=kw["sapo_tau_pos"], tau_neg=kw["sapo_tau_neg"],
                                  loss_mask=mask,
                                  importance_sampling_level=kw["importance_sampling_level"])
    else:
        rs = kw["rejection_sampling"]
        value, _ = f.ppo_actor_loss_fn(
            logprobs=leaf, old_logprobs=old, advantages=adv, eps_clip=kw["eps_clip"],
            eps_clip_higher=kw["eps_clip_higher"], loss_mask=mask, c_clip=kw["c_clip"],
            proximal_logprobs=prox,
            rejection_sampling=areal.RejectionSamplingConfig(**rs) if rs else None,
            importance_sampling_level=kw["importance_sampling_level"])
    value.backward()
    return value.detach(), leaf.grad


def rlgates_loss(row, b, adv, is_weight=None, method=None, **kw):
    m = rlgates.get(method or row.method, **({} if method else row.hparams))
    leaf = b.leaf()
    value = rt.loss(m, leaf, b.logp_old, adv, b.mask, agg=row.agg, is_weight=is_weight, **kw)
    value.backward()
    return value.detach(), leaf.grad


def assert_gate_acts(row, b, adv, g_ref, **kw):
    assert g_ref[b.mask].abs().max() > 1e-3 and g_ref[~b.mask].abs().max() == 0
    assert (rlgates_loss(row, b, adv, method="reinforce", **kw)[1] - g_ref).abs().max() > 1e-3


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("row", EQUAL, ids=EQUAL_IDS)
def test_areal_row_equals_its_method(areal, batch, row, per_token):
    theirs_adv, ours_adv = advantages(batch, per_token)
    ref = areal_loss(areal, row, batch, theirs_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref)
    assert_gate_acts(row, batch, ours_adv, ref[1])


def test_sequence_level_row(areal, batch):
    """GSPO at a token mean: equal with one advantage per response; with [B, T] advantages
    AReaL uses each response's mean A, and equals rlgates given those means."""
    row = _row("importance_sampling_level=sequence")
    theirs_adv, ours_adv = advantages(batch, False)
    ref = areal_loss(areal, row, batch, theirs_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref)
    assert_gate_acts(row, batch, ours_adv, ref[1])
    m = batch.mask
    means = torch.where(m, batch.adv_tokens, 0.0).sum(-1) / m.sum(-1).clamp(min=1)
    ref = areal_loss(areal, row, batch, batch.adv_tokens)
    assert_equal(rlgates_loss(row, batch, means), ref)
    assert (rlgates_loss(row, batch, batch.adv_tokens)[1] - ref[1])[m].abs().max() > 1e-6


def behaviour_weight(b, correction):
    """rlgates' weight π_prox/π_behave from the float32-rounded log-probs, as AReaL rounds."""
    return offpolicy.importance_weight(b.logp_old.float(), behave_logp(b).float(), b.mask,
                                       **correction)


@pytest.mark.parametrize("name", ["rejection_sampling:token-mask",
                                  "rejection_sampling:token-clamp"])
def test_token_rejection_sampling_rows(areal, batch, name):
    row = _row(name)
    w = behaviour_weight(batch, row.correction)
    assert w.dtype == torch.float32
    raw = (batch.logp_old - behave_logp(batch)).exp()[batch.mask]
    assert (raw > 5).any() and (raw < 5).any()
    for per_token in (False, True):
        theirs_adv, ours_adv = advantages(batch, per_token)
        ref = areal_loss(areal, row, batch, theirs_adv)
        assert_equal(rlgates_loss(row, batch, ours_adv, is_weight=w), ref)
        # the float64 weight: equal to ~1e-7 only
        w64 = offpolicy.importance_weight(batch.logp_old, behave_logp(batch), batch.mask,
                                          **row.correction)
        v64 = rlgates_loss(row, batch, ours_adv, is_weight=w64)[0]
        assert float(v64) == pytest.approx(float(ref[0]), rel=1e-6)
    assert_gate_acts(row, batch, ours_adv, ref[1], is_weight=w)


def test_sequence_rejection_sampling_row(areal, batch):
    """Every token weighted by its response's geometric-mean weight, 0 past the bound (built
    from the rule, in float32 as AReaL computes it); rlgates' sequence level (the product) is
    another loss."""
    row = _row("rejection_sampling:sequence")
    m = batch.mask
    lw = batch.logp_old.float() - behave_logp(batch).float()
    geo = (torch.where(m, lw, 0.0).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
           ).exp()
    keep = geo <= 5.0
    assert keep[batch.lengths > 0].all()  # at upper 5 all are kept; at 1.05 some are dropped
    for upper in (5.0, 1.05):
        keep = geo <= upper
        w = torch.where(keep & m, geo.expand_as(lw), 0.0)
        for per_token in (False, True):
            theirs_adv, ours_adv = advantages(batch, per_token)
            ref = areal_loss(areal, row, batch, theirs_adv,
                             settings={"actor.rejection_sampling.upper": upper})
            assert_equal(rlgates_loss(row, batch, ours_adv, is_weight=w), ref)
    assert not keep[batch.lengths > 0].all()
    prod = offpolicy.importance_weight(batch.logp_old, behave_logp(batch), m, "mis",
                                       level="sequence", high=1.05)
    assert abs(float(rlgates_loss(row, batch, batch.adv, is_weight=prod)[0]) - float(ref[0])) > 1e-4


def test_m2po_row(areal, batch):
    """M2PO: AReaL's own selection as a 0/1 weight, divided by the kept tokens."""
    row = _row("m2_threshold")
    kept = areal.apply_m2po_masking(behave_logp(batch), batch.logp_old, batch.mask, 0.04)
    assert kept[batch.mask].any() and not kept[batch.mask].all()
    for per_token in (False, True):
        theirs_adv, ours_adv = advantages(batch, per_token)
        ref = areal_loss(areal, row, batch, theirs_adv)
        ours = rlgates_loss(row, batch, ours_adv, is_weight=kept.to(torch.float64),
                            norm=int(kept.sum()))
        assert_equal(ours, ref)
    plain = rlgates_loss(row, batch, ours_adv, is_weight=kept.to(torch.float64))
    assert abs(float(plain[0]) - float(ref[0])) > 1e-4  # the kept-token count matters


# --- the rows' settings are AReaL's own ---------------------------------------------------------
def test_the_settings_are_areals():
    import importlib.metadata

    assert importlib.metadata.version("areal") == ca.VERSION == rt.EXTRA_VERSIONS["areal"]
    defaults = ca.config_defaults()
    assert {k: defaults[k] for k in ca.DEFAULTS} == ca.DEFAULTS
    rs = ca.config_defaults("RejectionSamplingConfig")
    for r in ROWS:
        for k in r.settings:
            field = k.removeprefix("actor.")
            if field.startswith("rejection_sampling."):
                assert field.removeprefix("rejection_sampling.") in rs, k
            else:
                assert field in defaults, k


def test_grpo_loss_fn_calls_as_the_test_does():
    """actor.py's grpo_loss_fn passes these keywords to the loss functions (and the engine
    weighs micro-batches by their token counts: the step's token mean)."""
    text = ca.path(ca.ACTOR_FILE).read_text()
    (fn,) = [n for n in ast.parse(text).body
             if isinstance(n, ast.FunctionDef) and n.name == "grpo_loss_fn"]
    calls = {c.func.id: {kw.arg for kw in c.keywords} for c in ast.walk(fn)
             if isinstance(c, ast.Call) and getattr(c.func, "id", "") in (
                 "ppo_actor_loss_fn", "sapo_loss_fn", "_apply_m2po_masking")}
    assert calls["ppo_actor_loss_fn"] == {
        "logprobs", "old_logprobs", "advantages", "eps_clip", "eps_clip_higher", "loss_mask",
        "c_clip", "proximal_logprobs", "rejection_sampling", "importance_sampling_level",
        "cu_seqlens"}
    assert calls["sapo_loss_fn"] == {"logprobs", "old_logprobs", "advantages", "tau_pos",
                                     "tau_neg", "loss_mask", "importance_sampling_level",
                                     "cu_seqlens"}
    assert 'loss_weight_fn=lambda x: x["loss_mask"].count_nonzero()' in text


def test_every_loss_option_has_a_row():
    keys = set().union(*(r.settings for r in ROWS))
    for field in ("eps_clip_higher", "c_clip", "use_sapo_loss", "use_decoupled_loss",
                  "m2_threshold"):
        assert f"actor.{field}" in keys, field
    assert {r.settings["actor.importance_sampling_level"] for r in ROWS
            if "actor.importance_sampling_level" in r.settings} == {"token", "sequence"}
    rs = {(r.settings["actor.rejection_sampling.level"], r.settings[
        "actor.rejection_sampling.action"]) for r in ROWS
        if "actor.rejection_sampling.level" in r.settings}
    assert {lv for lv, _ in rs} == {"token", "sequence"} and {a for _, a in rs} == {"mask",
                                                                                 "clamp"}


def test_rows_are_well_formed():
    rows = [r for r in conformance.matrix() if r.trainer == "areal"]
    assert rows == ROWS
    for r in rows:
        assert r.method in rlgates.names() and r.agg == rt.AREAL_AGG
        rlgates.get(r.method, **r.hparams)


def test_flags_at_another_aggregation(areal, batch):
    """`flags(m, agg=...)["areal"]` is set at token-mean only, and there AReaL's loss at those
    settings is the method's."""
    adv, checked = advantages(batch, False)[0], 0
    for name in rlgates.names():
        m = rlgates.get(name)
        for agg in rlgates.AGG_MODES:
            f = rt.flags(m, agg=agg)["areal"]
            if f is None:
                continue
            assert agg == rt.AREAL_AGG
            row = conformance.Row("areal", name, f, name, dict(m.hparams), agg)
            assert_equal(rlgates_loss(row, batch, batch.adv), areal_loss(areal, row, batch, adv))
            checked += 1
    assert checked >= 6


def test_defaults_across_trainers_are_the_installed_ones():
    """The AReaL row of rlgates.trainers.defaults_across_trainers() (the table of "Which gate
    when" and the conventions page) against the installed AReaL; verl's and TRL's too."""
    checked = rt.check_installed_defaults()
    assert {"verl", "TRL", "AReaL"} <= set(checked)
    assert len(rt.defaults_across_trainers()) == 9
