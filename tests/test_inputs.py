"""Bad input gives clear errors; extreme and low-precision input keeps sane numbers."""


import importlib.util

import pytest
import torch

import rlgates
from tests.conftest import held, make_batch


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'trpo'.*ppo.*gspo"):
        rlgates.get("trpo")


def test_names_are_case_insensitive():
    assert rlgates.get("PPO").name == "ppo"


@pytest.mark.parametrize("name, hparams, match", [
    ("ppo", {"eps": -0.1}, "eps must be ≥ 0"),
    ("ppo", {"eps": 1.0}, "eps must be < 1"),
    ("grpo", {"eps": float("nan")}, "eps must be finite"),
    ("dapo", {"eps_low": -0.01}, "eps_low must be ≥ 0"),
    ("dapo", {"eps_high": -0.2}, "eps_high must be ≥ 0"),
    ("sao", {"eps_low": -0.5}, "sao: eps_low must be ≥ 0"),
    ("gspo", {"eps_high": "wide"}, "eps_high must be a number"),
    ("sapo", {"tau_pos": 0.0}, "tau_pos must be > 0"),
    ("sapo", {"tau_neg": -1.0}, "tau_neg must be > 0"),
    ("ppo", {"epsilon": 0.1}, "unknown hyperparameter.*epsilon.*takes eps"),
    ("dapo", {"eps": 0.1}, "unknown hyperparameter.*eps_low, eps_high"),
    ("gmpo", {"eps_high": -0.4}, "gmpo: eps_high must be ≥ 0"),
    ("dro", {"beta": 0.0}, "dro: beta must be > 0"),
    ("dro", {"beta": float("inf")}, "dro: beta must be finite"),
    ("gpg", {"eps": 0.2}, "gpg: unknown hyperparameter.*no hyperparameters"),
    ("dapo_dual_clip", {"c": 1.0}, "dapo_dual_clip: c must be > 1"),
    ("dapo_dual_clip", {"eps_low": -1.0}, "dapo_dual_clip: eps_low must be ≥ 0"),
])
def test_bad_hyperparameters(name, hparams, match):
    with pytest.raises(ValueError, match=match):
        rlgates.get(name, **hparams)


@pytest.mark.parametrize("name", ["dapo", "gspo", "sao", "dapo_dual_clip", "luspo"])
def test_eps_low_of_one_or_more_means_no_lower_edge(name):
    """verl accepts clip_ratio_low ≥ 1 (a lower edge at or below 0): no ratio is clipped from
    below. The negative control: at ε_l = 0.5 the same tokens are shut."""
    ratio = torch.tensor([1e-3, 0.1, 0.4, 0.9, 1.0], dtype=torch.float64)
    adv = -torch.ones_like(ratio)
    for eps_low in (1.0, 1.5):
        m = rlgates.get(name, eps_low=eps_low)
        assert torch.equal(m.gate(ratio, adv), torch.ones_like(ratio)), (name, eps_low)
        assert all(edge > 0 for edge, _ in m.bounds())
    shut = rlgates.get(name, eps_low=0.5).gate(ratio, adv)
    assert shut[:3].eq(0).all() and shut[3:].eq(1).all()


def test_defaults_follow_the_papers():
    assert rlgates.get("ppo").hparams == {"eps": 0.2}
    assert rlgates.get("grpo").hparams == {"eps": 0.2}
    assert rlgates.get("dapo").hparams == {"eps_low": 0.2, "eps_high": 0.28}
    assert rlgates.get("gspo").hparams == {"eps_low": 3e-4, "eps_high": 4e-4}
    assert rlgates.get("sapo").hparams == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert rlgates.get("sao").hparams == {"eps_low": 0.3, "eps_high": 5.0}
    levels = {n: rlgates.get(n).level for n in rlgates.names()}
    assert [n for n, lv in levels.items() if lv == "sequence"] == ["gspo", "luspo", "gmpo"]
    assert [n for n, lv in levels.items() if lv == "sequence-product"] == ["vespo"]
    assert rlgates.get("gmpo").hparams == {"eps_low": 0.4, "eps_high": 0.4}


def test_bad_loss_inputs_name_the_argument():
    m = rlgates.get("ppo")
    logp, logp_old, adv, mask = make_batch(B=3, T=4)
    cases = [
        ((logp[:, :3], logp_old, adv, mask), r"logp_old must have logp's shape \(3, 3\), got \(3, 4\)"),
        ((logp, logp_old, adv[:2], mask), r"adv must be \[B\]=\(3,\) or \[B, T\]=\(3, 4\), got \(2,\)"),
        ((logp, logp_old, adv, mask[:, :2]), r"mask must have shape \(3, 4\), got \(3, 2\)"),
        ((logp.long(), logp_old, adv, mask), "logp must be a floating tensor, got dtype torch.int64"),
        ((logp[0], logp_old[0], adv, None), r"logp must be \[B, T\], got shape \(4,\)"),
        ((logp.tolist(), logp_old, adv, mask), "logp must be a torch.Tensor, got list"),
        ((logp, logp_old, adv, mask.double() * 2), "mask must be bool or hold only 0 and 1"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            m.loss(*args)
    with pytest.raises(ValueError, match=r"agg must be one of .*token-mean.*got 'mean'"):
        m.loss(logp, logp_old, adv, mask, agg="mean")


def test_mask_may_be_bool_or_01(name):
    m = held(name)
    logp, logp_old, adv, mask = make_batch()
    assert torch.equal(m.loss(logp, logp_old, adv, mask), m.loss(logp, logp_old, adv, mask.long()))
    assert torch.equal(m.loss(logp, logp_old, adv, mask), m.loss(logp, logp_old, adv, mask.double()))


@pytest.mark.parametrize("extreme", [200.0, -200.0, 1e6])
def test_extreme_log_ratios_give_finite_loss_and_gradients(name, agg, extreme):
    logp, logp_old, adv, mask = make_batch()
    logp = logp.clone()
    logp[0, :3] = logp_old[0, :3] + extreme
    logp[2, 0] = logp_old[2, 0] - extreme
    leaf = logp.requires_grad_(True)
    loss = held(name).loss(leaf, logp_old, adv, mask, agg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(leaf.grad).all()


def test_padding_with_nan_or_inf_is_ignored(name, agg):
    logp, logp_old, adv, mask = make_batch()
    dirty = logp.clone()
    dirty[~mask] = torch.nan
    dirty_old = logp_old.clone()
    dirty_old[~mask] = -torch.inf
    m = held(name)
    leaf = dirty.requires_grad_(True)
    loss = m.loss(leaf, dirty_old, adv, mask, agg)
    loss.backward()
    assert torch.equal(loss, m.loss(logp, logp_old, adv, mask, agg))
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[~mask] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_keeps_float64_gate_decisions(name, dtype):
    logp, logp_old, adv, mask = make_batch(B=64, T=32, scale=0.3, seed=7)
    if name == "gspo":
        logp = logp_old + 3e-4 * torch.randn_like(logp)
    # the same numbers in both precisions: round to `dtype` first, then lift to float64
    lo, lo_old, a = (x.to(dtype) for x in (logp, logp_old, adv))
    m = held(name)
    leaf = lo.clone().requires_grad_(True)
    loss = m.loss(leaf, lo_old, a, mask)
    assert loss.dtype == torch.float32  # computed in float32 inside
    loss.backward()
    assert leaf.grad.dtype == dtype
    ref = lo.double().requires_grad_(True)
    m.loss(ref, lo_old.double(), a.double(), mask).backward()
    if name in ("sapo", "vespo"):  # smooth gates: no zeros, so compare values, not decisions
        assert torch.allclose(leaf.grad.double(), ref.grad, rtol=1e-2, atol=1e-6)
    else:
        assert torch.equal(leaf.grad != 0, ref.grad != 0)
        assert (ref.grad == 0).any() or name == "sao" or mask.sum() == 0


def test_gate_decisions_on_low_precision_ratios_match_float64(name):
    ratio = torch.linspace(-1, 1, 2001, dtype=torch.float64).exp()
    adv = torch.linspace(-1, 1, 7, dtype=torch.float64)[:, None]
    m = held(name)
    for dtype in (torch.bfloat16, torch.float16):
        r, a = ratio.to(dtype), adv.to(dtype)
        assert m.gate(r, a).dtype == torch.float32
        assert torch.equal(m.gate(r, a) > 0, m.gate(r.double(), a.double()) > 0)


def test_fully_masked_sequence_contributes_nothing(name, agg):
    logp, logp_old, adv, mask = make_batch()
    m = held(name)
    changed = logp.clone()
    changed[1] += 5.0  # row 1 is fully masked
    assert torch.equal(m.loss(logp, logp_old, adv, mask, agg), m.loss(changed, logp_old, adv, mask, agg))
    if agg != "token-mean":  # the mean over sequences skips it
        keep = mask.any(-1)
        sub = m.loss(logp[keep], logp_old[keep], adv[keep], mask[keep], agg)
        assert torch.allclose(sub, m.loss(logp, logp_old, adv, mask, agg), rtol=1e-15, atol=0)


def test_fully_masked_batch_gives_zero_not_nan(name, agg):
    logp, logp_old, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_(True)
    loss = held(name).loss(leaf, logp_old, adv, torch.zeros_like(mask), agg)
    loss.backward()
    assert loss.item() == 0.0 and (leaf.grad == 0).all()


def test_gradients_flow_into_logp_only(name):
    logp, logp_old, adv, mask = make_batch()
    leaves = [x.clone().requires_grad_(True) for x in (logp, logp_old, adv)]
    held(name).loss(*leaves, mask).backward()
    assert leaves[0].grad is not None and leaves[1].grad is None and leaves[2].grad is None


# --- one mask rule: every public function that takes a mask ------------------------------------

def _mask_callers():
    """(label, fn(mask)) for every public function that takes a mask, on a [3, 4] batch (the lab's
    on [2, 3, 4]); each calls its function with everything else valid."""
    from rlgates import diagnostics, lab, offpolicy, regularisers, trainers
    from rlgates.check import check_gradient

    logp, logp_old, adv, _ = make_batch(B=3, T=4, dtype=torch.float32)
    lp3, lo3, a3 = (torch.stack([x, x]) for x in (logp, logp_old, adv))
    m = rlgates.get("ppo")
    logits = torch.randn(3, 4, 5)
    callers = {
        "Method.loss": lambda mk: m.loss(logp, logp_old, adv, mk),
        "Method.expected_grad": lambda mk: m.expected_grad(logp, logp_old, adv, mk),
        "check_gradient": lambda mk: check_gradient(m, logp, logp_old, adv, mk),
        "aggregate": lambda mk: rlgates.aggregate(logp, mk, "token-mean"),
        "aggregation_weight": lambda mk: rlgates.aggregation_weight(mk, "token-mean"),
        "offpolicy.log_weight": lambda mk: offpolicy.log_weight(logp, logp_old, mk),
        "offpolicy.importance_weight": lambda mk: offpolicy.importance_weight(logp, logp_old, mk),
        "regularisers.kl_loss": lambda mk: regularisers.kl_loss(logp, logp_old, mk),
        "regularisers.entropy_bonus": lambda mk: regularisers.entropy_bonus(logits, mk),
        "regularisers.kl_placement": lambda mk: regularisers.kl_placement(
            m, logp, logp_old, logp_old, adv, mk),
        "diagnostics.token_gates": lambda mk: diagnostics.token_gates(m, logp, logp_old, adv, mk),
        "diagnostics.step_stats": lambda mk: diagnostics.step_stats(m, logp, logp_old, adv, mk),
        "trainers.loss": lambda mk: trainers.loss(m, logp, logp_old, adv, mk, norm=10),
        "trainers.gate_stats": lambda mk: trainers.gate_stats(m, logp, logp_old, adv, mk),
        "lab.summed_loss": lambda mk: lab.summed_loss(
            m, lp3, lo3, a3, None if mk is None else torch.stack([mk, mk]), "token-mean"),
        "offpolicy.Correction.weight": lambda mk: offpolicy.Correction("tis").weight(
            logp, logp_old, mk),
        "offpolicy.Unweighted.weight": lambda mk: offpolicy.Unweighted().weight(
            logp, logp_old, mk),
    }
    # the trainer adapters import their trainer (~20 s of CPU): when called, not at collection
    if importlib.util.find_spec("trl"):
        def trl_loss(mk):
            from rlgates.trainers import trl as rt
            return rt.trl_loss(m, logp, logp_old, adv, mk, "dapo")
        callers[TRAINER_CALLERS[0]] = trl_loss
    if importlib.util.find_spec("verl"):
        def verl_policy_loss(mk):
            from rlgates.trainers import verl as rv
            return rv.policy_loss(m)(logp_old, logp, adv[:, None].expand_as(logp), mk)[0]
        callers[TRAINER_CALLERS[1]] = verl_policy_loss
    return callers


TRAINER_CALLERS = ("trainers.trl.trl_loss", "trainers.verl.policy_loss")
# the adapters' cases run on the xdist worker that has imported the trainers (tests/test_trainers.py)
_CALLERS = [pytest.param(c, marks=pytest.mark.xdist_group("trainers")) if c in TRAINER_CALLERS
            else c for c in sorted(_mask_callers())]


def _good_mask():
    return make_batch(B=3, T=4)[3].float()  # 0/1 floats, one row fully masked


@pytest.mark.parametrize("caller", _CALLERS)
@pytest.mark.parametrize("bad, match", [
    (lambda mk: mk * 0.5, "mask must be bool or hold only 0 and 1"),
    (lambda mk: mk * 2.0, "mask must be bool or hold only 0 and 1"),
    (lambda mk: torch.where(mk.bool(), mk, torch.nan), "mask must be bool or hold only 0 and 1"),
    (lambda mk: torch.where(mk.bool(), mk, 1e-40), "mask must be bool or hold only 0 and 1"),
    (lambda mk: mk * (1 - 2**-24), "mask must be bool or hold only 0 and 1"),
    (lambda mk: mk - 2 * (1 - mk), "mask must be bool or hold only 0 and 1"),
    (lambda mk: mk[:, :2], r"mask must have shape \((2, )?3, 4\), got \((2, )?3, 2\)"),
], ids=["half", "two", "nan", "subnormal", "just_below_one", "minus_two", "shape"])
def test_every_mask_taker_refuses_a_bad_mask_with_the_same_error(caller, bad, match):
    if caller == "aggregation_weight" and match.startswith("mask must have"):
        pytest.skip("aggregation_weight takes the mask alone: its shape is the shape")
    fn = _mask_callers()[caller]
    with pytest.raises(ValueError, match=match):
        fn(bad(_good_mask()))


@pytest.mark.parametrize("caller", _CALLERS)
def test_every_mask_taker_accepts_a_float_01_mask_as_its_bool(caller):
    fn = _mask_callers()[caller]
    mk = _good_mask()
    got, want = fn(mk), fn(mk.bool())
    flat = (lambda x: [t for t in (x.values() if isinstance(x, dict) else
                                   (x if isinstance(x, tuple) else [x]))
                       if isinstance(t, torch.Tensor)])
    for a, b in zip(flat(got), flat(want), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=0, equal_nan=True), caller


def test_ragged_mask_is_the_first_lengths_tokens():
    lengths = torch.tensor([3, 0, 5, 1])
    mask = rlgates.ragged_mask(lengths, 5)
    # written out by hand, row by row
    assert mask.tolist() == [[True] * 3 + [False] * 2, [False] * 5, [True] * 5,
                             [True] + [False] * 4]
    assert mask.dtype == torch.bool and mask.sum(1).tolist() == lengths.tolist()
    assert torch.equal(rlgates.ragged_mask([3, 0, 5, 1]), mask)  # T: the longest length
    assert rlgates.ragged_mask(lengths, 7).shape == (4, 7)
    # negative control: equal lengths give a full mask, so the ragged one above is not vacuous
    assert rlgates.ragged_mask([5, 5, 5, 5], 5).all() and not mask.all()
    for bad in ([-1, 2], [2, 6], [[1, 2]], [1.0, 2.0]):
        with pytest.raises(ValueError, match="lengths"):
            rlgates.ragged_mask(bad, 5)


def test_a_float_mask_with_negative_zeros_is_the_bool_mask():
    """-0.0 is 0: a float mask written with -0.0 for padding is accepted as its bool mask."""
    from rlgates import _numerics as nx

    mk = _good_mask()
    signed = torch.where(mk.bool(), mk, -0.0)
    assert torch.signbit(signed).any()
    assert torch.equal(nx.check_mask(signed, signed.shape), mk.bool())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_float_mask_check_accepts_exactly_zeros_and_ones_on_any_bits(dtype):
    """The float mask check accepts exactly the masks whose every value is 0 or 1, on random
    bit patterns (NaN, ±inf, subnormals, huge values that an int8 cast would wrap to 1) and on
    the values next to 0 and 1; -0.0 counts as 0."""
    from rlgates import _numerics as nx

    bits = {torch.float32: torch.int32, torch.float64: torch.int64,
            torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    info = torch.iinfo(bits)
    gen = torch.Generator().manual_seed(11)
    one, zero = torch.ones((), dtype=dtype), torch.zeros((), dtype=dtype)
    edges = [torch.nextafter(one, zero), torch.nextafter(one, 2 * one),
             torch.nextafter(zero, one), -torch.nextafter(zero, one), -one, 2 * one,
             torch.tensor(257.0, dtype=dtype), torch.tensor(-255.0, dtype=dtype),
             torch.tensor(float("nan"), dtype=dtype), torch.tensor(float("inf"), dtype=dtype)]
    refused = 0
    for trial in range(400):
        mask = (torch.rand(3, 5, generator=gen) < 0.6).to(dtype)
        if trial % 2:
            mask[torch.randint(3, (1,), generator=gen), torch.randint(5, (1,), generator=gen)] = \
                edges[trial // 2 % len(edges)] if trial % 4 == 1 else torch.randint(
                    info.min, info.max, (), generator=gen, dtype=torch.int64).to(bits).view(dtype)
        if trial % 5 == 0:
            mask[0, 0] = -0.0
        plain = bool(((mask == 0) | (mask == 1)).all())
        try:
            got = nx.check_mask(mask, mask.shape)
        except ValueError:
            assert not plain, mask
            refused += 1
            continue
        assert plain, mask
        assert torch.equal(got, mask != 0)
    assert 100 < refused < 200  # the control: both kinds of mask were drawn
