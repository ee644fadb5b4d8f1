"""Eq. 5 three ways: autograd, the closed form gate·ρ·A·w, and finite differences / a reference."""

import pytest
import torch

import rlgates
from rlgates import reference
from tests.conftest import PART_ONE, make_batch


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_autograd_equals_closed_form(name, agg, seed, per_token_adv):
    logp, logp_old, adv, mask = make_batch(seed=seed, per_token_adv=per_token_adv)
    autograd, closed, diff = rlgates.check_gradient(name, logp, logp_old, adv, mask, agg)
    assert diff < 1e-14
    assert autograd[~mask].abs().max() == 0  # masked tokens get nothing
    assert (autograd != 0).any()  # the check is not vacuous


def test_gspo_every_token_gets_the_same_length_averaged_weight(agg):
    logp, logp_old, adv, mask = make_batch(seed=3, scale=1e-4)  # inside GSPO's tiny clip range
    m = rlgates.get("gspo")
    autograd, closed, diff = rlgates.check_gradient(m, logp, logp_old, adv, mask, agg)
    assert diff < 1e-14
    w = rlgates.aggregation_weight(mask, agg)
    per_weight = torch.where(mask, autograd / w, torch.nan)
    for b in range(logp.shape[0]):
        row = per_weight[b][mask[b]]
        if row.numel():  # one value per sequence: −f'(ρ_s)·ρ_s·A_s
            assert torch.allclose(row, row[0].expand_as(row), rtol=0, atol=1e-12)
            log_rs = ((logp[b] - logp_old[b])[mask[b]]).mean()
            ratio_s = log_rs.exp()
            expected = -m.gate(ratio_s, adv[b]) * ratio_s * adv[b]
            assert torch.allclose(row[0], expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("safety_eps, rtol", [(0.0, 1e-13), (1e-8, 1e-7)])
def test_values_and_gradients_equal_the_trainer_reference(name, agg, safety_eps, rtol):
    logp, logp_old, adv, mask = make_batch(seed=4, scale=0.4)
    if name == "gspo":
        logp = logp_old + 3e-4 * torch.randn_like(logp)  # straddle GSPO's clip edges
    m = rlgates.get(name)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ours = m.loss(a, logp_old, adv, mask, agg)
    theirs = reference.reference_loss(name, b, logp_old, adv, mask, agg, **m.hparams,
                                      safety_eps=safety_eps)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=rtol, atol=0)
    assert torch.allclose(a.grad, b.grad, rtol=rtol, atol=1e-300)


@pytest.mark.parametrize("name_", PART_ONE)
def test_finite_differences_away_from_kinks(name_):
    logp, logp_old, adv, mask = make_batch(B=4, T=5, seed=5, scale=0.3)
    m = rlgates.get(name_)
    if name_ == "gspo":
        logp = logp_old + 1e-4 * torch.randn_like(logp)
    # keep every ratio at least 1e-3 away from any edge, so a 1e-6 step never crosses a kink
    for ratio, _ in m.bounds():
        lr = logp - logp_old
        near = (lr - torch.log(torch.tensor(ratio, dtype=lr.dtype))).abs() < 1e-3
        logp = torch.where(near, logp + 3e-3, logp)
    leaf = logp.clone().requires_grad_(True)
    for agg in rlgates.AGG_MODES:
        assert torch.autograd.gradcheck(
            lambda x, agg=agg: m.loss(x, logp_old, adv, mask, agg), (leaf,), eps=1e-7,
            atol=1e-9, rtol=1e-6)


def test_clipped_tokens_get_exactly_zero_gradient():
    m = rlgates.get("ppo")
    logp_old = torch.zeros(1, 4, dtype=torch.float64)
    ratios = torch.tensor([[1.5, 1.1, 0.5, 0.9]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    leaf = ratios.log().requires_grad_(True)
    m.loss(leaf, logp_old, adv).backward()
    # clipped: A>0 with ρ>1+ε, A<0 with ρ<1−ε; the others get −ρ·A/N
    expected = torch.tensor([[0.0, -1.1 / 4, 0.0, 0.9 / 4]], dtype=torch.float64)
    assert torch.allclose(leaf.grad, expected, rtol=1e-14, atol=0)
