"""verl's rows of the conformance matrix, each against verl 0.9.1's own loss function.

Each row's loss comes from `get_policy_loss_fn(row.name)` with a verl actor config built from
the row's settings (bypass rows go through verl's own `apply_bypass_mode` first), on the hard
float64 batch (tests/conformance_batch.py), and is compared with the row's rlgates method:
value and gradient, for one advantage per row and for per-token advantages. A partial row has
a test of its own that goes as far as the row's note says. The comparisons could fail:
- the batch straddles every edge, holds an A < 0 token past c, an empty row, A = 0 rows and
  loud padding (`check`, asserted here);
- each row's gradient differs from the ungated policy gradient's (`reinforce`), so its gate
  acts on this batch, and the vanilla rows differ from one another;
- a name in verl's registry that no row covers fails `test_every_verl_loss_has_a_row`.
"""

from __future__ import annotations

import pytest
import torch

import rlgates
from rlgates import offpolicy
from rlgates import trainers as rt
from rlgates.trainers import conformance, conformance_verl
from tests import conformance_batch as cb
from tests.conformance_batch import advantages, assert_equal

pytestmark = pytest.mark.xdist_group("trainers")  # one worker imports verl (see test_trainers)

ROWS = conformance_verl.verl_rows()
IDS = [f"{r.name}:{r.method}:{i}" for i, r in enumerate(ROWS)]
EQUAL = [r for r in ROWS if r.status == "equal"]
EQUAL_IDS = [i for i, r in zip(IDS, ROWS, strict=True) if r.status == "equal"]
#: The two agree to rounding (measured: ≤ 5e-16 relative). verl adds 1e-8 to its per-response
#: token counts (seq-mean-token-mean, geo_mean), but a bool mask's count is an integer and
#: integer + 1e-8 is a float32, where the 1e-8 rounds away (a float mask would keep it).
TOL = 1e-12
BYPASS = conformance_verl.BYPASS


@pytest.fixture(scope="module")
def verl():
    """verl's registry and configs, imported when a test here first runs (not at collection)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import core_algos
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    return core_algos, FSDPActorConfig, PolicyLossConfig, RolloutCorrectionConfig


@pytest.fixture(scope="module")
def batch():
    b = cb.hard_batch()
    cb.check(b)
    return b


def split(settings: dict):
    """(actor, policy_loss, rollout_correction) keyword dicts from a row's settings."""
    actor, policy_loss, correction = {}, {}, {}
    for key, value in settings.items():
        if key.startswith(BYPASS):
            correction[key.removeprefix(BYPASS)] = value
        elif key.startswith("policy_loss."):
            policy_loss[key.removeprefix("policy_loss.")] = value
        else:
            assert not key.startswith("algorithm."), key
            actor[key] = value
    return actor, policy_loss, correction


def bypass(verl, b, correction):
    """verl's own bypass wiring (legacy trainer): apply_bypass_mode on a batch with rollout
    log-probs; returns the loss_mode it sets and the old log-probs it puts in the batch."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    data = DataProto.from_dict(tensors={"rollout_log_probs": b.logp_old.clone()})
    policy_loss = OmegaConf.create({"loss_mode": "vanilla"})
    apply_bypass_mode(data, verl[3](**correction), policy_loss)
    return policy_loss.loss_mode, data.batch["old_log_probs"]


def verl_loss(verl, row, b, adv):
    """(value, gradient) of verl's own function for `row` on batch `b` with advantages [B, T]."""
    core_algos, FSDPActorConfig, PolicyLossConfig, RolloutCorrectionConfig = verl
    actor, policy_loss, correction = split(row.settings)
    old = b.logp_old
    if correction:
        policy_loss["loss_mode"], old = bypass(verl, b, correction)
        policy_loss["rollout_correction"] = RolloutCorrectionConfig(**correction)
    assert policy_loss["loss_mode"] == row.name
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                          policy_loss=PolicyLossConfig(**policy_loss), **actor)
    leaf = b.leaf()
    value, _ = core_algos.get_policy_loss_fn(row.name)(
        old_log_prob=old, log_prob=leaf, advantages=adv, response_mask=b.mask,
        loss_agg_mode=cfg.loss_agg_mode, config=cfg)
    value.backward()
    return value.detach(), leaf.grad


def rlgates_loss(row, b, adv, **kw):
    """(value, gradient) of the row's rlgates method (keywords: rlgates.trainers.loss's)."""
    m = rlgates.get(row.method, **row.hparams)
    leaf = b.leaf()
    value = rt.loss(m, leaf, b.logp_old, adv, b.mask, agg=row.agg, **kw)
    value.backward()
    return value.detach(), leaf.grad


def assert_gate_acts(row, b, adv, g_ref):
    """Not vacuous: gradient on real tokens, none on padding, and unlike the ungated one's."""
    assert g_ref[b.mask].abs().max() > 1e-3 and g_ref[~b.mask].abs().max() == 0
    plain = conformance.Row("verl", row.name, {}, "reinforce", {}, row.agg)
    assert (rlgates_loss(plain, b, adv)[1] - g_ref).abs().max() > 1e-3


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("row", EQUAL, ids=EQUAL_IDS)
def test_verl_row_equals_its_method(verl, batch, row, per_token):
    verl_adv, ours_adv = advantages(batch, per_token)
    ref = verl_loss(verl, row, batch, verl_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv), ref, TOL)
    assert_gate_acts(row, batch, ours_adv, ref[1])


def test_vanilla_rows_differ_from_one_another(verl, batch):
    """Each vanilla configuration is its own loss on this batch (so each row's match counts);
    the cispo rows with clip_ratio_low 1 and 1.5 are one loss (no lower bound either way)."""
    adv = advantages(batch, False)[0]
    values = {r.method: float(verl_loss(verl, r, batch, adv)[0]) for r in ROWS
              if r.name == "vanilla"}
    assert len(values) == 5
    vs = sorted(values.values())
    assert min(b - a for a, b in zip(vs, vs[1:], strict=False)) > 1e-4, values
    cispo = [verl_loss(verl, r, batch, adv) for r in ROWS if r.name == "cispo"]
    assert len(cispo) == 2 and torch.equal(cispo[0][1], cispo[1][1])
    low = rlgates.get("cispo", eps_low=0.2, eps_high=4.0)  # control: a lower bound does bite
    assert abs(float(low.loss(batch.logp, batch.logp_old, batch.adv, batch.mask))
               - float(cispo[0][0])) > 1e-4


def _row(name, method, rollout_is=None):
    (row,) = [r for r in ROWS if r.name == name and r.method == method
              and r.settings.get(f"{BYPASS}rollout_is") == rollout_is]
    return row


def test_geo_mean_row(verl, batch):
    """GMPO against verl's geo_mean: equal with verl's denominator (B rows, the empty one
    counted); with per-token advantages, equal in value and on rows whose A is constant."""
    row = _row("geo_mean", "gmpo")
    B = batch.mask.shape[0]
    verl_adv, ours_adv = advantages(batch, False)
    ref = verl_loss(verl, row, batch, verl_adv)
    assert_equal(rlgates_loss(row, batch, ours_adv, norm=B), ref, TOL)
    assert_gate_acts(row, batch, ours_adv, ref[1])
    # rlgates' own seq-mean-token-mean counts the non-empty rows: the values differ by that
    plain = rlgates_loss(row, batch, ours_adv)[0]
    n = int((batch.lengths > 0).sum())
    assert n < B and float(plain) * n / B == pytest.approx(float(ref[0]), rel=TOL)
    # per-token advantages, A ≠ 0 on every token of a row with A ≠ 0: the value is the same,
    # the gradient differs only on rows where A varies (verl uses the row's mean A)
    adv = torch.where(batch.adv_tokens == 0, batch.adv[:, None], batch.adv_tokens)
    v_ref, g_ref = verl_loss(verl, row, batch, adv)
    v, g = rlgates_loss(row, batch, adv, norm=B)
    assert float(v) == pytest.approx(float(v_ref), rel=TOL)
    real = torch.where(batch.mask, adv, adv[:, :1])
    varies = real.amax(-1) != real.amin(-1)
    constant = ~varies[:, None] & batch.mask
    torch.testing.assert_close(g[constant], g_ref[constant], rtol=TOL, atol=1e-15)
    assert (g - g_ref)[varies[:, None] & batch.mask].abs().max() > 1e-3
    # and an A = 0 token inside a row: verl drops its log-ratio from the mean, rlgates does not
    assert abs(float(verl_loss(verl, row, batch, batch.adv_tokens)[0])
               - float(rlgates_loss(row, batch, batch.adv_tokens, norm=B)[0])) > 1e-4


def test_geo_mean_at_verls_default_clip(verl, batch):
    """verl's default clip_ratio 0.2 is GMPO's ε in log space: the window (e^−0.2, e^0.2)."""
    row = _row("geo_mean", "gmpo")
    settings = {**row.settings, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    at_verl = conformance.Row("verl", "geo_mean", settings, "gmpo",
                              {"eps_low": 0.2, "eps_high": 0.2}, row.agg, status="partial",
                              note=row.note)
    verl_adv, ours_adv = advantages(batch, False)
    ref = verl_loss(verl, at_verl, batch, verl_adv)
    assert_equal(rlgates_loss(at_verl, batch, ours_adv, norm=batch.mask.shape[0]), ref, TOL)
    assert (ref[1] - verl_loss(verl, row, batch, verl_adv)[1]).abs().max() > 1e-3


def test_bypass_sequence_is_row(verl, batch):
    """Bypass REINFORCE with sequence TIS: gpg times rlgates.offpolicy's sequence TIS weight of
    π_θ against π_old (= π_rollout), value and gradient; without the weight it is another loss."""
    row = _row("bypass_mode", "gpg", "sequence")
    verl_adv, ours_adv = advantages(batch, False)
    ref = verl_loss(verl, row, batch, verl_adv)
    w = offpolicy.importance_weight(batch.logp, batch.logp_old, batch.mask, "tis",
                                    level="sequence", high=2.0)
    assert (w[batch.mask] < 2).any() and (w[batch.mask] == 2).any()  # truncation acts and not
    assert_equal(rlgates_loss(row, batch, ours_adv, is_weight=w), ref, TOL)
    assert (rlgates_loss(row, batch, ours_adv)[1] - ref[1]).abs().max() > 1e-3


def test_gpg_is_cispo_with_an_empty_window(batch):
    """GPG's loss is CISPO's with ε_l = ε_h = 0, value and gradient; off policy it is not
    REINFORCE's (the gradient of f = ρ carries ρ)."""
    out = {}
    for name, hp in (("gpg", {}), ("cispo", {"eps_low": 0.0, "eps_high": 0.0}),
                     ("reinforce", {})):
        row = conformance.Row("verl", "gpg", {}, name, hp, "token-mean")
        out[name] = rlgates_loss(row, batch, batch.adv_tokens)
    assert_equal(out["gpg"], out["cispo"], 0)
    assert (out["gpg"][1] - out["reinforce"][1]).abs().max() > 1e-3


def test_dro_is_gpg_plus_a_k2_penalty_to_pi_old(batch):
    """DRO's loss = GPG's + β·k2(π_θ‖π_old): the pull it keeps at A = 0 is that penalty."""
    from rlgates import regularisers

    for agg in rlgates.AGG_MODES:
        dro, gpg = rlgates.get("dro", beta=0.7), rlgates.get("gpg")
        a, b = batch.leaf(), batch.leaf()
        lhs = dro.loss(a, batch.logp_old, batch.adv_tokens, batch.mask, agg=agg)
        rhs = gpg.loss(b, batch.logp_old, batch.adv_tokens, batch.mask, agg=agg) \
            + regularisers.kl_loss(b, batch.logp_old, batch.mask, beta=0.7, estimator="k2",
                                   agg=agg)
        lhs.backward()
        rhs.backward()
        assert float(lhs.detach()) == pytest.approx(float(rhs.detach()), rel=1e-13)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-15)
        zero = (batch.adv_tokens == 0) & batch.mask & (batch.log_ratio.abs() > 0.01)
        assert zero.any() and (a.grad[zero] != 0).all()  # it moves A = 0 tokens


def test_flags_at_another_aggregation_are_verls(verl, batch):
    """`flags(m, agg=...)["verl"]` sets loss_agg_mode, and verl's own loss at those settings is
    the method's loss at that aggregation, value and gradient, for every method with verl flags;
    the losses that fix their aggregation (VERL_FIXED_AGG) give None for another, and verl's
    function indeed ignores loss_agg_mode there (while vanilla's does not)."""
    adv, checked = advantages(batch, False)[0], 0
    for name in rlgates.names():
        m = rlgates.get(name)
        for agg in rlgates.AGG_MODES:
            f = rt.flags(m, agg=agg)["verl"]
            if f is None or name == "gmpo" or m.side_inputs:
                continue  # gmpo's divisor: test_geo_mean_row; side inputs: conformance_side's
            row = conformance.Row("verl", f["loss_mode"], conformance_verl.verl_settings(f),
                                  name, dict(m.hparams), agg)
            assert_equal(rlgates_loss(row, batch, batch.adv), verl_loss(verl, row, batch, adv),
                         TOL)
            checked += 1
        assert rt.flags(m, agg="token-mean", normaliser="micro-batch")["verl"] is None
    assert checked >= 40
    for mode, fixed in rt.VERL_FIXED_AGG.items():
        (name,) = [n for n in rlgates.names()
                   if (rt.flags(rlgates.get(n))["verl"] or {}).get("loss_mode") == mode]
        other = next(a for a in rlgates.AGG_MODES if a != fixed)
        assert rt.flags(rlgates.get(name), agg=other)["verl"] is None
    for mode, name, expect_same in (("sapo", "sapo", True), ("geo_mean", "gmpo", True),
                                    ("vanilla", "dapo", False)):
        settings = conformance_verl.verl_settings(rt.flags(rlgates.get(name))["verl"])
        values = set()
        for agg in ("token-mean", "seq-mean-token-sum"):
            row = conformance.Row("verl", mode, {**settings, "loss_agg_mode": agg}, name)
            values.add(float(verl_loss(verl, row, batch, adv)[0]))
        assert (len(values) == 1) == expect_same, mode


def test_the_batch_is_hard(batch):
    cb.check(batch)  # also run by the fixture; here it is its own line in the report


def test_policy_loss_keys_are_verls(verl):
    """The keys the rows file under policy_loss are verl's PolicyLossConfig fields, and the
    other settings are fields of its actor config."""
    import dataclasses

    _, FSDPActorConfig, PolicyLossConfig, _ = verl
    fields = {f.name for f in dataclasses.fields(PolicyLossConfig)} - {"rollout_correction",
                                                                      "_target_"}
    assert set(conformance_verl.POLICY_LOSS_KEYS) == fields
    actor = {f.name for f in dataclasses.fields(FSDPActorConfig)}
    for r in ROWS:
        assert set(split(r.settings)[0]) <= actor, r.settings


def test_every_verl_loss_has_a_row(verl):
    """verl's registry, read from the installed package: every name has a row of the matrix
    (verl's own rows, and those of losses that read side information)."""
    from rlgates.trainers.verl import PREFIX

    registry = {n for n in verl[0].POLICY_LOSS_REGISTRY if not n.startswith(PREFIX)}
    covered = {r.name for r in conformance.matrix() if r.trainer == "verl"}
    assert len(registry) >= 12
    assert not registry - covered, f"verl losses without a row: {sorted(registry - covered)}"
    assert not covered - registry, f"rows for names verl does not have: {covered - registry}"


def test_rows_are_well_formed():
    for r in conformance.matrix():
        assert r.method is None or r.method in rlgates.names(), r
        assert r.agg in rlgates.AGG_MODES
        if r.method:
            rlgates.get(r.method, **r.hparams)  # valid hyperparameters
    table = conformance.markdown()
    assert table.count("\n") == len(conformance.matrix()) + 1
    assert all(f"`{r.name}`" in table for r in conformance.matrix())
