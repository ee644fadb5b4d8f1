"""LUSPO and VESPO, beyond the generic checks every registered method gets (tests/test_gradients:
autograd against the closed form, finite differences of f·A, the gate as f's derivative, the
trainer-style reference): what makes each of them itself, worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

import rlgates
from tests.conftest import make_batch


def test_luspo_is_gspo_times_each_responses_length():
    """Per response, LUSPO's loss is |y| times GSPO's (value and gradient); with unequal lengths
    the two losses differ (so the factor is not a constant)."""
    logp, logp_old, adv, mask = make_batch(seed=3, scale=1e-3)  # straddles GSPO's tiny window
    lengths = mask.sum(-1)
    assert len(set(lengths[lengths > 0].tolist())) > 2  # ragged, one empty row
    luspo, gspo = rlgates.get("luspo"), rlgates.get("gspo")
    for b in range(logp.shape[0]):
        if lengths[b] == 0:
            continue
        rows = slice(b, b + 1)
        a = logp[rows].clone().requires_grad_(True)
        g = logp[rows].clone().requires_grad_(True)
        ours = luspo.loss(a, logp_old[rows], adv[rows], mask[rows])
        theirs = gspo.loss(g, logp_old[rows], adv[rows], mask[rows])
        ours.backward()
        theirs.backward()
        assert float(ours.detach()) == pytest.approx(float(lengths[b]) * float(theirs.detach()),
                                                     rel=1e-13, abs=1e-16)
        torch.testing.assert_close(a.grad, lengths[b] * g.grad, rtol=1e-13, atol=1e-16)
    whole = luspo.loss(logp, logp_old, adv, mask)
    assert float(whole) != pytest.approx(float(gspo.loss(logp, logp_old, adv, mask)) * 5, rel=1e-3)
    # the gate is shut on some tokens and open on others here, so the comparison is not vacuous
    g = luspo.expected_grad(logp, logp_old, adv, mask)
    assert ((g == 0) & mask & (adv[:, None] != 0)).any() and ((g != 0) & mask).any()


def test_vespo_gradient_is_phi_of_the_product_ratio_times_a():
    """Each real token's gradient is −φ(w)·A·w_t, w the product of its response's token ratios
    (not their geometric mean), the same for every token of a response."""
    logp, logp_old, adv, mask = make_batch(seed=2, scale=0.4)
    m = rlgates.get("vespo")
    leaf = logp.clone().requires_grad_(True)
    m.loss(leaf, logp_old, adv, mask, agg="token-mean").backward()
    n = mask.sum()
    for b in range(logp.shape[0]):
        real = mask[b]
        if not real.any():
            assert (leaf.grad[b] == 0).all()
            continue
        log_w = float((logp[b] - logp_old[b])[real].sum())
        k, lam = (2.0, 3.0) if adv[b] >= 0 else (3.0, 2.0)
        phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        expected = torch.full((int(real.sum()),), -phi * float(adv[b]) / float(n),
                              dtype=torch.float64)
        torch.testing.assert_close(leaf.grad[b][real], expected, rtol=1e-12, atol=1e-300)
        assert (leaf.grad[b][~real] == 0).all()
    # negative control: the geometric mean in place of the product gives other gradients
    geo = m.phi(((logp - logp_old) * mask).sum(-1).div(mask.sum(-1).clamp(min=1)).exp(), adv)
    product = m.phi(((logp - logp_old) * mask).sum(-1).exp(), adv)
    assert (geo - product)[mask.sum(-1) > 1].abs().max() > 1e-2


def test_vespo_weight_and_gate_at_one():
    """f(1) = 1 and f'(1) = φ(1) = 1 for both signs of A: on-policy, VESPO is the plain policy
    gradient; and f' is φ(w)/w."""
    m = rlgates.get("vespo", k_pos=1.5, lambda_pos=0.7, k_neg=4.0, lambda_neg=5.0)
    one = torch.ones(2, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(m.weight(one, adv), one, rtol=0, atol=1e-15)
    torch.testing.assert_close(m.gate(one, adv), one, rtol=1e-15, atol=0)
    w = torch.tensor([0.3, 0.9, 1.7, 4.0], dtype=torch.float64)
    for a in (0.5, -0.5):
        av = torch.full_like(w, a)
        torch.testing.assert_close(m.gate(w, av) * w, m.phi(w, av), rtol=1e-14, atol=0)
    assert m.peak(True) == pytest.approx((1.5 / 0.7, math.exp(0.7 - 1.5) * (1.5 / 0.7) ** 1.5))


@pytest.mark.parametrize("hparams, match", [
    ({"k_pos": 0.0}, "vespo: k_pos must be > 0"),
    ({"lambda_neg": -1.0}, "vespo: lambda_neg must be > 0"),
    ({"lambda_pos": float("inf")}, "vespo: lambda_pos must be finite"),
    ({"k_neg": "steep"}, "vespo: k_neg must be a number"),
    ({"k": 2.0}, "vespo: unknown hyperparameter"),
])
def test_vespo_bad_hyperparameters_are_named(hparams, match):
    with pytest.raises(ValueError, match=match):
        rlgates.get("vespo", **hparams)


def test_luspo_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="luspo: eps_low must be < 1"):
        rlgates.get("luspo", eps_low=1.0)
