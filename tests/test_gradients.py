"""Eq. 5 three ways, for every registered method: autograd, the closed form gate·ρ·A·w, and
finite differences / an independent trainer-style reference.

The functions here take a method name, so that tests/test_registry.py can run them on a method
it registers itself: a method added as one class gets every generic check.
"""

import pytest
import torch

import rlgates
from rlgates import reference
from tests.conftest import METHODS, away_from_kinks, make_batch, straddle_edges


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_autograd_equals_closed_form(name, agg, seed, per_token_adv):
    for scale in (0.3, 1.5):  # 1.5: ratios beyond dual-clip's c = 3 and CISPO's 1 + ε_h = 5
        logp, logp_old, adv, mask = make_batch(seed=seed, scale=scale,
                                               per_token_adv=per_token_adv)
        autograd, closed, diff = rlgates.check_gradient(name, logp, logp_old, adv, mask, agg)
        assert diff < 1e-14
        assert autograd[~mask].abs().max() == 0  # masked tokens get nothing
        assert (autograd != 0).any()  # the check is not vacuous


@pytest.mark.parametrize("name_", METHODS)
def test_finite_differences_of_f_times_a(name_):
    """Autograd's gradient of `loss` equals central finite differences of the f-form objective
    −agg(f(ρ; A)·A), ρ the ratio the gate sees, built here from `weight` alone (so CISPO, whose
    loss value carries a stop-gradient, is checked against its antiderivative f)."""
    m = rlgates.get(name_)
    logp, logp_old, adv, mask = make_batch(B=4, T=5, seed=5, scale=0.8)
    logp = away_from_kinks(m, straddle_edges(m, logp, logp_old, 1e-4), logp_old)
    adv_t = adv[:, None].expand_as(logp)

    def f_form(x, agg):
        log_ratio = torch.where(mask, x - logp_old, 0.0)
        if m.level == "sequence":
            log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1))[:, None].expand_as(x)
        return -rlgates.aggregate(m.objective(log_ratio.exp(), adv_t), mask, agg)

    for agg in rlgates.AGG_MODES:
        leaf = logp.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg), leaf)
        h = 1e-6
        fd = torch.zeros_like(logp)
        for idx in mask.nonzero():
            i, j = int(idx[0]), int(idx[1])
            up, down = logp.clone(), logp.clone()
            up[i, j] += h
            down[i, j] -= h
            fd[i, j] = (f_form(up, agg) - f_form(down, agg)) / (2 * h)
        assert torch.allclose(auto, fd, rtol=1e-6, atol=1e-9), (agg, (auto - fd).abs().max())


@pytest.mark.parametrize("name_", METHODS)
def test_gate_is_the_derivative_of_the_weight(name_):
    """f' (gate) = df/dρ (weight), by autograd and by finite differences, away from the edges."""
    m = rlgates.get(name_)
    ratio = torch.linspace(-2.5, 2.5, 1001, dtype=torch.float64).exp()
    for ratio_edge, _ in m.bounds():
        ratio = ratio[(ratio - ratio_edge).abs() > 1e-4]
    for a in (-1.0, -0.3, 0.4, 2.0):
        adv = torch.full_like(ratio, a)
        r = ratio.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(m.weight(r, adv).sum(), r)
        assert torch.allclose(auto, m.gate(ratio, adv), rtol=1e-12, atol=1e-14)
        h = 1e-6 * ratio
        fd = (m.weight(ratio + h, adv) - m.weight(ratio - h, adv)) / (2 * h)
        assert torch.allclose(fd, m.gate(ratio, adv), rtol=1e-6, atol=1e-8)


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


def test_every_built_in_method_has_a_reference():
    assert set(METHODS) - {"ppo", "grpo"} == set(reference.REFERENCES)


@pytest.mark.parametrize("safety_eps, rtol", [(0.0, 1e-13), (1e-8, 1e-7)])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_values_and_gradients_equal_the_trainer_reference(name, agg, safety_eps, rtol,
                                                         per_token_adv):
    logp, logp_old, adv, mask = make_batch(seed=4, scale=1.2, per_token_adv=per_token_adv)
    m = rlgates.get(name)
    logp = straddle_edges(m, logp, logp_old)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ours = m.loss(a, logp_old, adv, mask, agg)
    theirs = reference.reference_loss(name, b, logp_old, adv, mask, agg, **m.hparams,
                                      safety_eps=safety_eps)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=rtol, atol=1e-15)
    assert torch.allclose(a.grad, b.grad, rtol=rtol, atol=1e-300)


def test_default_aggregation_is_the_methods_own(name):
    """loss(agg=None) is loss(agg=m.agg); expected_grad and check_gradient follow it too."""
    m = rlgates.get(name)
    logp, logp_old, adv, mask = make_batch(seed=6, scale=0.5)
    logp = straddle_edges(m, logp, logp_old)
    assert torch.equal(m.loss(logp, logp_old, adv, mask), m.loss(logp, logp_old, adv, mask, m.agg))
    assert torch.equal(m.expected_grad(logp, logp_old, adv, mask),
                       m.expected_grad(logp, logp_old, adv, mask, agg=m.agg))
    assert rlgates.check_gradient(m, logp, logp_old, adv, mask)[2] < 1e-14
    assert m.agg in rlgates.AGG_MODES and m.agg_source


def test_the_defaults_follow_the_papers_and_match_the_trainers():
    expected = {"grpo": "seq-mean-token-mean", "gspo": "seq-mean-token-mean",
                "sapo": "seq-mean-token-mean"}
    for n in METHODS:
        assert rlgates.get(n).agg == expected.get(n, "token-mean"), n


def test_is_weight_multiplies_the_gradient(name, agg):
    """An importance weight is a constant factor on each token: gradient = w_is × eq. 5."""
    m = rlgates.get(name)
    logp, logp_old, adv, mask = make_batch(seed=7, scale=0.6)
    logp = straddle_edges(m, logp, logp_old)
    w = torch.rand(logp.shape, dtype=logp.dtype, generator=torch.Generator().manual_seed(1)) * 2
    w = torch.where(mask, w, torch.nan)  # padding may hold anything
    autograd, closed, diff = rlgates.check_gradient(m, logp, logp_old, adv, mask, agg,
                                                    is_weight=w)
    assert diff < 1e-14
    plain = m.expected_grad(logp, logp_old, adv, mask, agg)
    assert torch.allclose(closed, plain * torch.where(mask, w, 0.0), rtol=1e-14, atol=0)
    assert not torch.isnan(autograd).any()


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
