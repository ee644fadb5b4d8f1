"""verl's rows of the conformance matrix, each against verl 0.9.1's own loss function.

Each row's loss comes from `get_policy_loss_fn(row.name)` with a verl actor config built from
the row's settings, on the hard float64 batch (tests/conformance_batch.py), and is compared with
the row's rlgates method: value and gradient, for one advantage per row and for per-token
advantages. The comparisons could fail:
- the batch straddles every edge, holds an A < 0 token past c, an empty row, A = 0 rows and
  loud padding (`check`, asserted here);
- each row's gradient differs from the ungated policy gradient's (`reinforce`), so its gate
  acts on this batch, and the vanilla rows differ from one another;
"""

from __future__ import annotations

import pytest
import torch

import rlgates
from rlgates.trainers import conformance, conformance_verl
from tests import conformance_batch as cb

pytestmark = pytest.mark.xdist_group("trainers")  # one worker imports verl (see test_trainers)

ROWS = conformance_verl.verl_rows()
IDS = [f"{r.name}:{r.method}" + (f":{i}" if [s.method for s in ROWS].count(r.method) > 1 else "")
       for i, r in enumerate(ROWS)]
#: verl adds 1e-8 to its token counts in seq-mean-token-mean (and in GSPO's and GMPO's sequence
#: means), a relative change of ~1e-8; elsewhere the two agree to rounding.
LOOSE, TIGHT = 1e-7, 1e-12


@pytest.fixture(scope="module")
def verl():
    """verl's registry and configs, imported when a test here first runs (not at collection)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import core_algos
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    return core_algos, FSDPActorConfig, PolicyLossConfig, RolloutCorrectionConfig


def actor_config(verl, settings: dict):
    """verl's actor config for a row's settings (keys under actor_rollout_ref.actor., or
    algorithm.rollout_correction.*, which bypass mode copies into policy_loss)."""
    _, FSDPActorConfig, PolicyLossConfig, RolloutCorrectionConfig = verl
    actor, policy_loss, correction = {}, {}, {}
    for key, value in settings.items():
        if key.startswith("algorithm.rollout_correction."):
            correction[key.removeprefix("algorithm.rollout_correction.")] = value
        elif key.startswith("policy_loss."):
            policy_loss[key.removeprefix("policy_loss.")] = value
        elif key.startswith("algorithm."):
            raise ValueError(f"no rule for {key}")
        else:
            actor[key] = value
    if correction:
        policy_loss["rollout_correction"] = RolloutCorrectionConfig(**correction)
    return FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                           policy_loss=PolicyLossConfig(**policy_loss), **actor)


def verl_loss(verl, row, b, adv):
    """(value, gradient) of verl's own function for `row` on batch `b` with advantages [B, T]."""
    core_algos = verl[0]
    cfg = actor_config(verl, row.settings)
    leaf = b.leaf()
    value, _ = core_algos.get_policy_loss_fn(row.name)(
        old_log_prob=b.logp_old, log_prob=leaf, advantages=adv, response_mask=b.mask,
        loss_agg_mode=cfg.loss_agg_mode, config=cfg)
    value.backward()
    return value.detach(), leaf.grad


def rlgates_loss(row, b, adv):
    """(value, gradient) of the row's rlgates method."""
    m = rlgates.get(row.method, **row.hparams)
    leaf = b.leaf()
    value = m.loss(leaf, b.logp_old, adv, b.mask, agg=row.agg)
    value.backward()
    return value.detach(), leaf.grad


def tolerance(row):
    return LOOSE if row.agg == "seq-mean-token-mean" or row.name in ("gspo", "sapo") else TIGHT


@pytest.fixture(scope="module")
def batch():
    b = cb.hard_batch()
    cb.check(b)
    return b


def advantages(b, per_token):
    """[B, T] advantages for verl, and what rlgates is given: [B] per row, or the same [B, T]."""
    if per_token:
        return b.adv_tokens, b.adv_tokens
    return b.adv[:, None].expand_as(b.logp).contiguous(), b.adv


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_verl_row_equals_its_method(verl, batch, row, per_token):
    if row.status != "equal":
        pytest.skip("a partial row is tested by its own test below")  # listed in ROW_TESTS
    verl_adv, ours_adv = advantages(batch, per_token)
    v_ref, g_ref = verl_loss(verl, row, batch, verl_adv)
    v, g = rlgates_loss(row, batch, ours_adv)
    rel = tolerance(row)
    assert float(v) == pytest.approx(float(v_ref), rel=rel, abs=1e-15)
    torch.testing.assert_close(g, g_ref, rtol=rel, atol=1e-15)
    # not vacuous: gradient on real tokens, none on padding, and the gate acts on this batch
    assert g_ref[batch.mask].abs().max() > 1e-3 and g_ref[~batch.mask].abs().max() == 0
    _, g_plain = rlgates_loss(
        conformance.Row("verl", row.name, {}, "reinforce", {}, row.agg), batch, ours_adv)
    assert (g_plain - g_ref).abs().max() > 1e-3


def test_vanilla_rows_differ_from_one_another(verl, batch):
    """Each vanilla configuration is its own loss on this batch (so each row's match counts)."""
    adv = advantages(batch, False)[0]
    values = {r.method: float(verl_loss(verl, r, batch, adv)[0]) for r in ROWS
              if r.name == "vanilla"}
    assert len(values) >= 4
    vs = sorted(values.values())
    assert min(b - a for a, b in zip(vs, vs[1:], strict=False)) > 1e-4, values


def test_the_batch_is_hard(batch):
    cb.check(batch)  # also run by the fixture; here it is its own line in the report


def test_rows_are_well_formed():
    for r in conformance.matrix():
        assert r.method is None or r.method in rlgates.names(), r
        assert r.agg in rlgates.AGG_MODES
        if r.method:
            rlgates.get(r.method, **r.hparams)  # valid hyperparameters
    table = conformance.markdown()
    assert table.count("\n") == len(conformance.matrix()) + 1
