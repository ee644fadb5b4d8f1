"""TRL's rows of the conformance matrix, each against TRL 1.16.0's own `_compute_loss`.

Each row's loss is TRL's `GRPOTrainer._compute_loss` with a config built from the row's
settings, at given log-probs (`rlgates.trainers.trl.builtin_loss`: no model forward pass), on the
hard float64 batch (tests/conformance_batch.py), against the row's rlgates method under TRL's
normaliser (`rlgates.trainers.trl.trl_loss`): value and gradient, for one advantage per row and
for per-token advantages. The comparisons could fail:
- the batch straddles every edge, holds an empty row, A = 0 rows and loud padding (`check`);
- each row's gradient differs from the ungated policy gradient's (reinforce) under the same
  normaliser, so its gate acts on this batch;
- the loss types are read from the installed TRL (its config's help and `_compute_loss`'s
  branches), and a made-up one in the help is reported missing.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

import rlgates
from rlgates import _numerics as nx
from rlgates.methods import CISPO, SAPO, EntropyMask, OffPolicyMask
from rlgates.trainers import conformance, conformance_trl
from tests import conformance_batch as cb

pytestmark = pytest.mark.xdist_group("trainers")  # one worker imports TRL (see test_trainers)

ROWS = conformance_trl.trl_rows()
LOSS_ROWS = [r for r in ROWS if r.settings["loss_type"] == r.name]
KNOBS = {r.name: r for r in ROWS if r.settings["loss_type"] != r.name}
IDS = [f"{r.name}:{r.method}" for r in LOSS_ROWS]
TIGHT = 1e-12


@pytest.fixture(scope="module")
def trl():
    """TRL, a tiny model and the adapter, imported when a test here first runs (not at
    collection: the import costs ~12 s of CPU)."""
    from trl import GRPOConfig, GRPOTrainer

    from rlgates.trainers import trl as rtrl
    from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

    return SimpleNamespace(GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer, rtrl=rtrl,
                           DATA=DATA, config=config, reward_words=reward_words,
                           model=tiny_model(), tokenizer=tiny_tokenizer())


@pytest.fixture(scope="module")
def batch():
    b = cb.hard_batch()
    cb.check(b)
    return b


def trainer(trl, settings):
    """A GRPOTrainer on the tiny model with the row's settings; one accumulation step, so that
    TRL's normalisers are those of this batch alone."""
    args = trl.config(gradient_accumulation_steps=1, steps_per_generation=1, **settings)
    t = trl.GRPOTrainer(model=trl.model, reward_funcs=trl.reward_words, args=args,
                        train_dataset=trl.DATA, processing_class=trl.tokenizer)
    t.current_gradient_accumulation_steps = 1  # set by train()
    trl.model.train()
    return t


def trl_loss(trl, settings, b, adv, **kw):
    """(value, gradient in log π) of TRL's own loss for `settings` on batch `b`."""
    leaf = b.leaf()
    value = trl.rtrl.builtin_loss(trainer(trl, settings), leaf, b.logp_old, adv, b.mask, **kw)
    value.backward()
    return value.detach(), leaf.grad


def rlgates_loss(trl, row, b, adv, method=None, logp_old=None, side=None):
    """(value, gradient) of the row's method (or `method`) under TRL's normaliser."""
    m = method or rlgates.get(row.method, **row.hparams)
    leaf = b.leaf()
    value = trl.rtrl.trl_loss(m, leaf, b.logp_old if logp_old is None else logp_old, adv,
                              b.mask, row.settings["loss_type"], side=side,
                              max_completion_length=row.settings.get("max_completion_length"))
    value.backward()
    return value.detach(), leaf.grad


def in_trls_precision(row):
    """The row's method at the hyperparameters TRL computes with: it picks SAPO's temperatures
    with torch.where on Python floats, which gives a float32 tensor."""
    h = dict(row.hparams)
    if row.method == "sapo":
        h = {k: float(torch.tensor(v, dtype=torch.float32)) for k, v in h.items()}
    return rlgates.get(row.method, **h)


def assert_equal(ours, theirs):
    (v, g), (v_ref, g_ref) = ours, theirs
    assert float(v) == pytest.approx(float(v_ref), rel=TIGHT, abs=1e-15)
    torch.testing.assert_close(g, g_ref, rtol=TIGHT, atol=1e-15)


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("row", LOSS_ROWS, ids=IDS)
def test_trl_row_equals_its_method(trl, batch, row, per_token):
    adv = batch.adv_tokens if per_token else batch.adv
    theirs = trl_loss(trl, row.settings, batch, adv)
    if per_token and row.method == "luspo":  # the row's note: TRL averages over the response
        v, g = rlgates_loss(trl, row, batch, adv)
        assert float(v) == pytest.approx(float(theirs[0]), rel=TIGHT)
        m = batch.mask.to(g.dtype)
        averaged = (g * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1) * m
        torch.testing.assert_close(averaged, theirs[1], rtol=TIGHT, atol=1e-15)
        assert (g - theirs[1]).abs().max() > 1e-3  # and the gradients do differ
        return
    assert_equal(rlgates_loss(trl, row, batch, adv, method=in_trls_precision(row)), theirs)
    if row.method == "sapo":  # the row's own τ: TRL's float32 rounding shows, and only it
        v, g = rlgates_loss(trl, row, batch, adv)
        assert 1e-9 < abs(float(v) / float(theirs[0]) - 1) < 1e-6
        torch.testing.assert_close(g, theirs[1], rtol=1e-6, atol=1e-12)
    # not vacuous: gradient on real tokens, none on padding, and the gate acts on this batch
    g_ref = theirs[1]
    assert g_ref[batch.mask].abs().max() > 1e-3 and g_ref[~batch.mask].abs().max() == 0
    _, g_plain = rlgates_loss(trl, row, batch, adv, method=rlgates.get("reinforce"))
    assert (g_plain - g_ref).abs().max() > 1e-3


def test_trl_empty_row_and_dr_grpo_counts_are_trls(trl, batch):
    """The normaliser differences the notes name are real on this batch: rlgates' own loss
    (its own counts) differs from TRL's by exactly the ratio of the counts."""
    rows = {r.name: r for r in LOSS_ROWS}
    b_rows = batch.adv.shape[0]
    n_rows = int((batch.lengths > 0).sum())
    for name, factor in (("grpo", n_rows / b_rows), ("sapo", n_rows / b_rows),
                         ("luspo", n_rows / b_rows),
                         ("dr_grpo", n_rows / b_rows * batch.logp.shape[1] / 8)):
        row = rows[name]
        v_ref, _ = trl_loss(trl, row.settings, batch, batch.adv)
        own = in_trls_precision(row).loss(batch.logp, batch.logp_old, batch.adv, batch.mask,
                                          row.agg)
        assert float(v_ref) / float(own) == pytest.approx(factor, rel=1e-12), name
        assert factor != 1 or name == "dr_grpo"


# --- the loss types, read from the installed TRL -----------------------------------------------
def test_every_trl_loss_type_has_a_row(trl):
    documented = conformance_trl.loss_types()
    branches = conformance_trl.branch_loss_types()
    assert len(documented) >= 8 and sorted(documented) == sorted(branches)
    covered = {r.name for r in LOSS_ROWS}
    missing = sorted(set(documented) - covered)
    assert not missing, f"TRL loss types with no conformance row: {missing}"
    assert set(conformance_trl.TRL_AGG) == covered  # every row's normaliser is mapped
    # negative control: a loss type added to the help is found, and has no row
    field = trl.GRPOConfig.__dataclass_fields__["loss_type"]
    help_text = field.metadata["help"]
    new = help_text.replace("and 'vespo'.", "'vespo', and 'newpo'.")
    assert new != help_text
    original = field.metadata
    try:
        field.metadata = {**original, "help": new}
        assert "newpo" in conformance_trl.loss_types()
        assert "newpo" not in covered
    finally:
        field.metadata = original


def test_the_rows_flags_are_trls_own(trl):
    """Every setting of every row is a GRPOConfig field that TRL accepts, and builds."""
    fields = trl.GRPOConfig.__dataclass_fields__
    for r in ROWS:
        assert set(r.settings) <= set(fields), (r.name, set(r.settings) - set(fields))
        trainer(trl, r.settings)


# --- VESPO: TRL's defaults and its vLLM fold ---------------------------------------------------
def test_vespo_defaults_are_trls_and_peak_where_the_issue_says(trl):
    fields = trl.GRPOConfig.__dataclass_fields__
    trl_defaults = {k: fields[f"vespo_{k}"].default for k in rlgates.get("vespo").defaults}
    m = rlgates.get("vespo", **trl_defaults)
    assert m.hparams == rlgates.get("vespo").hparams == {
        "k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}
    w_peak, phi_peak = m.peak(positive=True)
    assert w_peak == pytest.approx(2 / 3, rel=1e-15)
    assert phi_peak == pytest.approx(math.e * 4 / 9, rel=1e-14)  # e^3·(2/3)²·e^−2
    # the peak is a maximum of φ on a fine grid, for each sign of A
    w = torch.linspace(0.01, 6, 60001, dtype=torch.float64)
    for sign, peak in ((1.0, m.peak(True)), (-1.0, m.peak(False))):
        phi = m.phi(w, torch.full_like(w, sign))
        assert float(w[phi.argmax()]) == pytest.approx(peak[0], abs=1e-4)
        assert float(phi.max()) == pytest.approx(peak[1], rel=1e-8)
    one = torch.ones(1, dtype=torch.float64)
    assert float(m.phi(one, one)) == float(m.phi(one, -one)) == 1.0  # normalised: φ(1) = 1
    pos = m.phi(torch.tensor([0.8, 2.0], dtype=torch.float64), one)
    neg = m.phi(torch.tensor([0.8, 2.0], dtype=torch.float64), -one)
    torch.testing.assert_close(pos, torch.tensor([0.64 * math.exp(0.6), 4 * math.exp(-3)],
                                                 dtype=torch.float64), rtol=1e-14, atol=0)
    torch.testing.assert_close(neg, torch.tensor([0.512 * math.exp(0.4), 8 * math.exp(-2)],
                                                 dtype=torch.float64), rtol=1e-14, atol=0)
    # TRL's own weight function gives the same numbers
    log_ratio = torch.log(torch.tensor([[2 / 3], [0.8], [2.0]], dtype=torch.float64))
    theirs = trl.GRPOTrainer.get_gamma_weights(
        torch.ones(3, 1, dtype=torch.float64), log_ratio, torch.ones(3, 1), None, **{
            f"{k.split('_')[0]}_{k.split('_')[1]}": v for k, v in trl_defaults.items()})
    torch.testing.assert_close(theirs[:, 0], torch.stack([torch.tensor(phi_peak, dtype=torch.float64),
                                                          pos[0], pos[1]]), rtol=1e-14, atol=0)


def trl_token_truncate(logp_old, sampler_logp, mask, cap):
    """TRL 1.16's vLLM correction in mode token_truncate, as `_generate_and_score_completions`
    computes it (it runs only with vLLM generation; its source is asserted below)."""
    diff = torch.nan_to_num((logp_old - sampler_logp) * mask, nan=0.0)
    return torch.clamp(torch.exp(diff), min=None, max=cap)


def test_vespo_folds_trls_vllm_correction_through_logp_old(trl, batch):
    """TRL folds vLLM's per-token correction π_old/π_sampler (truncated at its cap) into w.
    The same loss in rlgates: VESPO with logp_old − log(correction) as its old log-probs, since
    VESPO reads logp_old only through w. The CPU test feeds `_compute_loss` that correction; it
    cannot run vLLM, so the correction's own computation is checked against TRL's source."""
    import inspect

    source = " ".join(inspect.getsource(
        trl.GRPOTrainer._generate_and_score_completions).split())
    for line in ("per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                 "per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)",
                 "vllm_importance_sampling_ratio = torch.exp(logps_diff)",
                 "vllm_importance_sampling_ratio = torch.clamp( vllm_importance_sampling_ratio, "
                 "min=self.vllm_importance_sampling_clip_min, "
                 "max=self.vllm_importance_sampling_clip_max, )"):
        assert line in source, line
    cap = trl.GRPOConfig.__dataclass_fields__["vllm_importance_sampling_clip_max"].default
    assert cap == 3.0
    row = next(r for r in LOSS_ROWS if r.name == "vespo")
    g = torch.Generator().manual_seed(0)
    # the sampler: near π_old on most tokens, far on some (the correction passes the cap)
    sampler = batch.logp_old + 0.3 * torch.randn(batch.logp.shape, generator=g,
                                                 dtype=torch.float64)
    sampler[batch.mask & (torch.rand(batch.logp.shape, generator=g) < 0.15)] -= 2.0
    correction = trl_token_truncate(batch.logp_old, sampler, batch.mask, cap)
    capped = batch.mask & (correction == cap)
    assert capped.any() and (batch.mask & (correction < 1)).any()
    theirs = trl_loss(trl, row.settings, batch, batch.adv,
                      extra_inputs={"importance_sampling_ratio": correction})
    folded = batch.logp_old - correction.log()
    assert_equal(rlgates_loss(trl, row, batch, batch.adv, logp_old=folded), theirs)
    # negative controls: without the fold, or folding the raw sampler (past the cap), they differ
    for old in (batch.logp_old, torch.where(batch.mask, sampler, batch.logp_old)):
        _, g = rlgates_loss(trl, row, batch, batch.adv, logp_old=old)
        assert (g - theirs[1]).abs().max() > 1e-3


# --- the adapter's metrics for the new loss types ----------------------------------------------
@pytest.mark.parametrize("name", ["luspo", "vespo"])
def test_adapter_metrics_are_trls_for_luspo_and_vespo(trl, batch, name):
    row = next(r for r in LOSS_ROWS if r.name == name)
    m = rlgates.get(row.method, **row.hparams)
    t = trainer(trl, row.settings)
    t._metrics["train"].clear()
    trl.rtrl.builtin_loss(t, batch.logp, batch.logp_old, batch.adv, batch.mask)
    ref = {k: v[-1] for k, v in t._metrics["train"].items()}
    ours = trl.rtrl.metrics(m, batch.logp, batch.logp_old, batch.adv, batch.mask,
                            torch.zeros_like(batch.logp))
    assert set(ref) <= set(ours)
    for k, v in ref.items():
        assert ours[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    key = "clip_ratio/region_mean" if name == "luspo" else "vespo/phi_seq_mean"
    assert 0 < ref[key] < 1  # some sequences clipped (luspo), some weights far from 1 (vespo)


def test_rows_are_well_formed_and_in_the_matrix():
    rows = conformance.matrix()
    for r in ROWS:
        assert r in rows and r.trainer == "trl"
        assert r.method in rlgates.names() and r.agg in rlgates.AGG_MODES
        rlgates.get(r.method, **r.hparams)


# --- the knobs that act like gates: a mask read from side information --------------------------
def shifted_sampler(b, shifts=(0.3, 0.0, 0.25, 0.05)):
    """A rollout engine's log-probs: π's, shifted up per row (cycled), so that the responses'
    mean KL to the sampler lies on both sides of the rows' δ (capped at log 1)."""
    shift = torch.tensor([shifts[i % len(shifts)] for i in range(b.logp.shape[0])],
                         dtype=torch.float64)
    return torch.clamp(b.logp + shift[:, None], max=0.0)


def entropies(b, seed=0):
    """Per-token entropies in [0, 3], multiples of 1/64: exact in float32, where TRL takes its
    quantile, so the threshold rounds the same in both."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 193, b.logp.shape, generator=g).to(torch.float64) / 64


def near_on_policy(row, delta=5e-4):
    """The off-policy mask's row at a δ this batch's near-on-policy rows straddle: with the
    sampler at π_old the KL is −log ρ_s, and only those rows' responses with A < 0 are both
    dropped by the mask and open under DAPO's clip."""
    return dataclasses.replace(row, settings={**row.settings, "off_policy_mask_threshold": delta},
                               hparams={**row.hparams, "delta": delta})


def knob_inputs(name, b, engine):
    """(rlgates' SideInfo, builtin_loss's keywords) for a knob row on batch b."""
    if name == "off_policy_mask_threshold":
        if not engine:  # TRL's sampler is then π_old, and rlgates' default too
            return None, {}
        s = shifted_sampler(b)
        return rlgates.SideInfo(sampler_logp=s), {"extra_inputs": {"sampling_per_token_logps": s}}
    h = entropies(b)
    return rlgates.SideInfo(entropy=h), {"entropy": h}


@pytest.mark.parametrize("per_token", [False, True], ids=["adv_row", "adv_token"])
@pytest.mark.parametrize("name, engine", [("off_policy_mask_threshold", False),
                                          ("off_policy_mask_threshold", True),
                                          ("top_entropy_quantile", False)])
def test_trl_knob_row_equals_its_method(trl, batch, name, engine, per_token):
    row = KNOBS[name]
    if name == "off_policy_mask_threshold" and not engine:
        row = near_on_policy(row)
    adv = batch.adv_tokens if per_token else batch.adv
    side, kw = knob_inputs(name, batch, engine)
    theirs = trl_loss(trl, row.settings, batch, adv, **kw)
    assert_equal(rlgates_loss(trl, row, batch, adv, side=side), theirs)
    # not vacuous: the mask drops tokens the base loss (DAPO at the same ε) lets through
    m = rlgates.get(row.method, **row.hparams)
    dapo = rlgates.get("dapo", eps_low=row.hparams["eps_low"], eps_high=row.hparams["eps_high"])
    _, g_base = rlgates_loss(trl, row, batch, adv, method=dapo)
    dropped = batch.mask & (g_base != 0) & (theirs[1] == 0)
    assert dropped.any() and ((theirs[1] != 0) & batch.mask).any()
    picked = m.side_from_batch(*nx.check_loss_inputs(batch.logp, batch.logp_old, adv,
                                                     batch.mask, row.agg), side).picked
    assert torch.equal(dropped, batch.mask & (g_base != 0) & ~picked)
    if name == "off_policy_mask_threshold" and not per_token:  # whole responses, A < 0 only
        neg = (batch.adv < 0) & (batch.lengths > 0)
        kept = picked.any(-1)
        assert (neg & ~kept).any() and (neg & kept).any()
        assert kept[(batch.adv >= 0) & (batch.lengths > 0)].all()


def test_off_policy_mask_without_a_sampler_is_a_gate_of_the_sequence_ratio(batch):
    """With the sampler at π_old the response's KL is −log ρ_s: the mask drops an A < 0 response
    exactly when ρ_s < e^−δ (the plane's one-token reading agrees)."""
    row = near_on_policy(KNOBS["off_policy_mask_threshold"])
    m = rlgates.get(row.method, **row.hparams)
    picked = m.side_from_batch(*nx.check_loss_inputs(batch.logp, batch.logp_old, batch.adv,
                                                     batch.mask, row.agg), None).picked
    rho_s = batch.seq_log_ratio().exp()
    real = batch.lengths > 0
    expected = real & ((batch.adv >= 0) | (rho_s >= math.exp(-m.hparams["delta"])))
    assert torch.equal(picked.any(-1), expected)
    assert (real & ~expected).any()  # some responses dropped
    # the plane: a one-token response at ρ, sampled by π_old
    m = rlgates.get(row.method, **KNOBS["off_policy_mask_threshold"].hparams)  # δ = 0.1
    ratio = torch.tensor([0.85, 0.95, 1.2], dtype=torch.float64)
    probs_old = torch.full_like(ratio, 0.4)
    side = rlgates.SideInfo(sampler_logp=probs_old.log(), probs_old=probs_old)
    neg = -torch.ones_like(ratio)
    dapo = rlgates.get("dapo", eps_low=0.2, eps_high=0.28)
    keep = (ratio >= math.exp(-m.hparams["delta"])).to(ratio.dtype)
    torch.testing.assert_close(m.gate(ratio, neg, side), dapo.gate(ratio, neg) * keep)
    assert float(keep.sum()) == 2  # 0.85 < e^−0.1 ≈ 0.905: dropped
    torch.testing.assert_close(m.gate(ratio, -neg, side), dapo.gate(ratio, -neg))  # A > 0


class SAPOWithOPSM(OffPolicyMask, SAPO):
    """The off-policy mask on SAPO: one class (τ exact in float32, where TRL holds it)."""

    name, title = "sapo_opsm", "OPSM (on SAPO)"
    defaults = {"tau_pos": 1.0, "tau_neg": 1.25, "delta": 0.1}


class CISPOWithTopEntropy(EntropyMask, CISPO):
    """The top-entropy mask on CISPO: one class."""

    name, title = "cispo_top_entropy", "Top-entropy tokens (on CISPO)"
    defaults = {"eps_low": 1.0, "eps_high": 4.0, "top": 0.3}


@pytest.mark.parametrize("cls, base_cls, knob, value", [
    (SAPOWithOPSM, SAPO, "off_policy_mask_threshold", "delta"),
    (CISPOWithTopEntropy, CISPO, "top_entropy_quantile", "top"),
])
def test_a_knob_on_another_loss_is_one_class(trl, batch, cls, base_cls, knob, value):
    m = cls()
    base = base_cls(**{k: v for k, v in m.hparams.items() if k != value})
    settings = {**rlgates.trainers.flags(base)["trl"], knob: m.hparams[value]}
    row = conformance.Row("trl", knob, settings, None, {}, conformance_trl.TRL_AGG[
        settings["loss_type"]], note="a test row")
    side, kw = knob_inputs(knob, batch, engine=True)
    theirs = trl_loss(trl, settings, batch, batch.adv, **kw)
    assert_equal(rlgates_loss(trl, row, batch, batch.adv, method=m, side=side), theirs)
    _, g_base = rlgates_loss(trl, row, batch, batch.adv, method=base)
    assert (batch.mask & (g_base != 0) & (theirs[1] == 0)).any()  # the mask acts


# --- delta is dual-clip only above the window ----------------------------------------------------
@pytest.mark.parametrize("name, window", [("dual_clip", {"eps": 0.2}),
                                          ("dapo_dual_clip", {"eps_low": 0.2, "eps_high": 0.2})])
def test_trls_delta_is_dual_clip_only_above_the_window(trl, name, window):
    """TRL's `delta` clamps coef_1 for every token, whatever the sign of A (grpo_trainer.py:
    `coef_1 = torch.clamp(coef_1, max=self.args.delta)`), so it is dual-clip only for
    c > 1 + ε_h. At c = 1.1 < 1.2 an A = +1 token at ρ = 1.15 is open under dual-clip
    (gradient −ρ·A = −1.15) and shut in TRL (capped at δ): `flags` gives no TRL spelling there,
    and does above the window, where the two agree."""
    one = torch.ones(1, 1, dtype=torch.bool)
    logp = torch.full((1, 1), math.log(1.15), dtype=torch.float64)
    old, adv = torch.zeros_like(logp), torch.tensor([1.0], dtype=torch.float64)

    def grads(m, settings):
        leaf = logp.clone().requires_grad_(True)
        trl.rtrl.builtin_loss(trainer(trl, settings), leaf, old, adv, one).backward()
        ours = m.expected_grad(logp, old, adv, one)
        return float(leaf.grad), float(ours)

    low = rlgates.get(name, c=1.1, **window)
    assert rlgates.trainers.flags(low)["trl"] is None
    delta = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.2, "delta": 1.1}
    theirs, ours = grads(low, delta)
    assert theirs == 0.0 and ours == pytest.approx(-1.15, rel=1e-12)  # TRL's delta is not it
    high = rlgates.get(name, c=3.0, **window)
    settings = rlgates.trainers.flags(high)["trl"]
    assert settings is not None and settings["delta"] == 3.0
    theirs, ours = grads(high, settings)
    assert theirs == pytest.approx(ours, rel=1e-12) and ours == pytest.approx(-1.15, rel=1e-12)
