"""Property tests (hypothesis) on the elementwise gate, weight and signal."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlgates
from tests.conftest import HARD, held, make_batch

log_ratios = st.floats(-6, 6, allow_nan=False)
advs = st.floats(-5, 5, allow_nan=False)
eps_ = st.floats(0.0, 0.95)
taus = st.floats(0.05, 10.0)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


@settings(max_examples=200, deadline=None)
@given(log_ratios, advs, st.sampled_from(HARD))
def test_hard_gates_are_zero_or_one(lr, a, name):
    g = float(held(name).gate(t(lr).exp(), t(a)))
    assert g in (0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.floats(-3, 3), advs, taus, taus)
def test_sapo_gate_in_unit_interval_and_equals_sech2(lr, a, tau_pos, tau_neg):
    m = rlgates.get("sapo", tau_pos=tau_pos, tau_neg=tau_neg)
    ratio = math.exp(lr)
    g = float(m.gate(t(ratio), t(a)))
    tau = tau_pos if a > 0 else tau_neg
    assert 0 < g <= 1
    assert math.isclose(g, 1 / math.cosh(tau * (ratio - 1) / 2) ** 2, rel_tol=1e-9, abs_tol=1e-300)
    sigma = 1 / (1 + math.exp(-tau * (ratio - 1)))
    assert math.isclose(g, 4 * sigma * (1 - sigma), rel_tol=0, abs_tol=1e-12)


@settings(deadline=None)  # timing is not the property; a loaded machine once took 200 ms
@given(advs, taus, taus)
def test_sapo_gate_is_one_at_ratio_one(a, tau_pos, tau_neg):
    assert float(rlgates.get("sapo", tau_pos=tau_pos, tau_neg=tau_neg).gate(t(1.0), t(a))) == 1.0


@settings(max_examples=100, deadline=None)
@given(eps_, st.integers(0, 10_000))
def test_dapo_with_equal_eps_is_ppo(eps, seed):
    ppo, dapo = rlgates.get("ppo", eps=eps), rlgates.get("dapo", eps_low=eps, eps_high=eps)
    logp, logp_old, adv, mask = make_batch(seed=seed)
    ratio = (logp - logp_old).exp()
    for fn in ("weight", "gate", "signal"):
        assert torch.equal(getattr(ppo, fn)(ratio, adv[:, None]), getattr(dapo, fn)(ratio, adv[:, None]))
    for agg in rlgates.AGG_MODES:
        assert torch.equal(ppo.loss(logp, logp_old, adv, mask, agg), dapo.loss(logp, logp_old, adv, mask, agg))


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.integers(0, 10_000))
def test_gspo_on_one_token_sequences_is_dapo(eps_low, eps_high, seed):
    gspo = rlgates.get("gspo", eps_low=eps_low, eps_high=eps_high)
    dapo = rlgates.get("dapo", eps_low=eps_low, eps_high=eps_high)
    logp, logp_old, adv, _ = make_batch(B=8, T=1, seed=seed)
    for agg in rlgates.AGG_MODES:
        a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        la, lb = gspo.loss(a, logp_old, adv, None, agg), dapo.loss(b, logp_old, adv, None, agg)
        la.backward()
        lb.backward()
        assert torch.allclose(la, lb, rtol=1e-15, atol=0)
        assert torch.allclose(a.grad, b.grad, rtol=1e-15, atol=0)


@settings(max_examples=300, deadline=None)
@given(log_ratios, advs, st.sampled_from(rlgates.names()))
def test_signal_is_zero_where_gate_is_zero_and_is_gate_rho_a(lr, a, name):
    m = held(name)
    ratio = t(lr).exp()
    g, s = m.gate(ratio, t(a)), m.signal(ratio, t(a))
    if g == 0:
        assert s == 0
    assert torch.allclose(s, g * ratio * a, rtol=1e-15, atol=0)


@settings(max_examples=100, deadline=None)
@given(st.floats(-4, 4), advs, st.sampled_from(rlgates.names()))
def test_gate_is_the_derivative_of_the_weight(lr, a, name):
    """f' by autograd on f equals the closed-form gate (at any ρ, kinks included)."""
    m = held(name)
    ratio = t(lr).exp().requires_grad_(True)
    (dfdr,) = torch.autograd.grad(m.weight(ratio, t(a)), ratio)
    if a != 0:  # at A = 0 the gate is defined as 0 (the objective f·A is flat there)
        # a gate that is a difference of terms of size 1/ρ (DRO's, at its zero log ρ = A/β)
        # keeps their rounding: the absolute floor scales with 1/ρ
        floor = 1e-15 * max(1.0, 1 / float(ratio.detach()))
        assert torch.allclose(dfdr, m.gate(ratio.detach(), t(a)), rtol=1e-12, atol=floor)


def test_grpo_gate_is_ppo_gate():
    ratio = torch.linspace(-3, 3, 301, dtype=torch.float64).exp()[:, None]
    adv = torch.linspace(-2, 2, 41, dtype=torch.float64)[None, :]
    assert torch.equal(rlgates.get("grpo").gate(ratio, adv), rlgates.get("ppo").gate(ratio, adv))
