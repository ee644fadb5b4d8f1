"""Every registered method: its contract, its edges, and the facts specific to one method
(dual-clip, CISPO, REINFORCE). All in float64."""

import math

import pytest
import torch

import rlgates
from rlgates import _numerics as nx
from tests.conftest import held, make_batch, side_for

F64 = torch.float64

def t(x):
    return torch.as_tensor(x, dtype=F64)

NORM = "seq-mean-token-sum-norm"


def test_registered_with_the_same_contract(name):
    assert name in rlgates.names()
    m = rlgates.get(name)
    assert m.level in ("token", "sequence", "sequence-product") and m.title and m.paper and m.f_latex and m.gate_latex and m.insight
    assert repr(m).startswith(f"rlgates.get('{name}'")
    table = rlgates.table((name,), merge_grpo=False)
    assert m.title in table


def test_defaults():
    assert rlgates.get("dual_clip").hparams == {"eps": 0.2, "c": 3.0}
    assert rlgates.get("cispo").hparams == {"eps_low": 1.0, "eps_high": 4.0}
    assert rlgates.get("reinforce").hparams == {}


@pytest.mark.parametrize("name_, hp", [
    ("dual_clip", {"c": 1.0}), ("dual_clip", {"c": 0.5}), ("dual_clip", {"c": float("nan")}),
    ("dual_clip", {"c": "three"}), ("dual_clip", {"eps": -0.1}), ("dual_clip", {"eps": 1.0}),
    ("dual_clip", {"eps_low": 0.2}),
    ("cispo", {"eps_low": -0.1}), ("cispo", {"eps_low": "wide"}), ("cispo", {"eps_high": -1.0}),
    ("cispo", {"eps_high": float("inf")}), ("cispo", {"eps": 0.2}),
    ("reinforce", {"eps": 0.2}),
])
def test_bad_hyperparameters_raise(name_, hp):
    with pytest.raises(ValueError):
        rlgates.get(name_, **hp)


def test_the_check_covers_every_region():
    """The large-scale batches really reach ρ > c for A < 0 and ρ > 1 + ε_h (else the test above
    would not exercise dual-clip's cap or CISPO's upper clip)."""
    hits_c = hits_h = 0
    for seed in (0, 1, 2):
        logp, logp_old, adv, mask = make_batch(seed=seed, scale=1.5)
        ratio = (logp - logp_old).exp()
        hits_c += int(((ratio > 3) & (adv[:, None] < 0) & mask).sum())
        hits_h += int(((ratio > 5) & mask).sum())
    assert hits_c > 0 and hits_h > 0


@pytest.mark.parametrize("hp", [{"eps_low": 0.2, "eps_high": 0.28}, {"eps_low": 0.0,
                                                                     "eps_high": 0.0}])
def test_cispo_other_windows(agg, hp):
    m = rlgates.get("cispo", **hp)
    for seed in (0, 1):
        batch = make_batch(seed=seed, scale=0.5)
        assert rlgates.check_gradient(m, *batch, agg=agg)[2] < 1e-14


def test_dual_clip_other_c(agg):
    m = rlgates.get("dual_clip", eps=0.1, c=1.5)
    batch = make_batch(seed=7, scale=0.8)
    assert rlgates.check_gradient(m, *batch, agg=agg)[2] < 1e-14


D = 1e-9


DUAL_CLIP_TABLE = [  # (ρ, A, gate, weight) for eps = 0.2, c = 3
    (1.2 - D, 1.0, 1.0, 1.2 - D), (1.2, 1.0, 0.0, 1.2), (1.2 + D, 1.0, 0.0, 1.2),
    (3.0 + D, 1.0, 0.0, 1.2),  # c plays no part for A > 0
    (0.8 - D, 1.0, 1.0, 0.8 - D),  # A > 0 is never clipped below
    (0.8 + D, -1.0, 1.0, 0.8 + D), (0.8, -1.0, 0.0, 0.8), (0.8 - D, -1.0, 0.0, 0.8),
    (1.2 + D, -1.0, 1.0, 1.2 + D),  # A < 0 is not clipped at 1 + ε
    (3.0 - D, -1.0, 1.0, 3.0 - D), (3.0, -1.0, 0.0, 3.0), (3.0 + D, -1.0, 0.0, 3.0),
    (50.0, -1.0, 0.0, 3.0),
    (1.0, 0.0, 0.0, 1.0), (3.5, 0.0, 0.0, 3.0),  # A = 0: gate 0 (and signal 0)
]


@pytest.mark.parametrize("ratio, adv, gate, weight", DUAL_CLIP_TABLE)
def test_dual_clip_boundary_table(ratio, adv, gate, weight):
    m = rlgates.get("dual_clip")
    assert float(m.gate(t(ratio), t(adv))) == gate
    assert float(m.weight(t(ratio), t(adv))) == pytest.approx(weight, abs=1e-15)
    # the loss agrees: autograd of the token loss at that point equals −gate·ρ·A
    leaf = t([[math.log(ratio)]]).requires_grad_(True)
    m.loss(leaf, t([[0.0]]), t([adv])).backward()
    assert float(leaf.grad) == pytest.approx(-gate * ratio * adv, abs=1e-12)


def test_dual_clip_equals_ppo_below_c():
    ppo, dual = rlgates.get("ppo"), rlgates.get("dual_clip")
    ratio = torch.linspace(-1.5, math.log(3) - 1e-6, 301, dtype=F64).exp()[:, None]
    adv = torch.tensor([[-1.0, -0.1, 0.0, 0.1, 1.0]], dtype=F64)
    assert torch.equal(ppo.gate(ratio, adv), dual.gate(ratio, adv))
    assert torch.equal(ppo.weight(ratio, adv), dual.weight(ratio, adv))


CISPO_TABLE = [  # (ρ, A, eps_low, eps_high, gate): gate = clip(ρ)/ρ, whatever the sign of A
    (5.0 - D, 1.0, 1.0, 4.0, 1.0), (5.0, 1.0, 1.0, 4.0, 1.0), (10.0, 1.0, 1.0, 4.0, 0.5),
    (10.0, -1.0, 1.0, 4.0, 0.5), (1e-6, -1.0, 1.0, 4.0, 1.0),  # no lower bound by default
    (1.28, 1.0, 0.2, 0.28, 1.0), (2.56, 1.0, 0.2, 0.28, 0.5), (2.56, -1.0, 0.2, 0.28, 0.5),
    (0.8, -1.0, 0.2, 0.28, 1.0), (0.4, -1.0, 0.2, 0.28, 2.0), (0.4, 1.0, 0.2, 0.28, 2.0),
    (1.0, 0.0, 0.2, 0.28, 1.0),
]


@pytest.mark.parametrize("ratio, adv, eps_low, eps_high, gate", CISPO_TABLE)
def test_cispo_boundary_table(ratio, adv, eps_low, eps_high, gate):
    m = rlgates.get("cispo", eps_low=eps_low, eps_high=eps_high)
    assert float(m.gate(t(ratio), t(adv))) == pytest.approx(gate, rel=1e-12)
    # gate·ρ = clip(ρ): the gradient coefficient of CISPO's own loss
    clip = min(max(ratio, 1 - eps_low), 1 + eps_high)
    assert float(m.signal(t(ratio), t(adv))) == pytest.approx(clip * adv, rel=1e-12, abs=1e-300)
    leaf = t([[math.log(ratio)]]).requires_grad_(True)
    m.loss(leaf, t([[0.0]]), t([adv])).backward()
    assert float(leaf.grad) == pytest.approx(-clip * adv, rel=1e-12, abs=1e-300)


def test_cispo_never_drops_a_token():
    m = rlgates.get("cispo", eps_low=0.2, eps_high=0.28)
    ratio = torch.linspace(-20, 20, 4001, dtype=F64).exp()[:, None]
    adv = torch.tensor([[-1.0, 1.0]], dtype=F64)
    assert (m.gate(ratio, adv) > 0).all()


def test_cispo_weight_is_continuous_and_one_at_one():
    for hp in ({}, {"eps_low": 0.2, "eps_high": 0.28}):
        m = rlgates.get("cispo", **hp)
        assert float(m.weight(t(1.0), t(1.0))) == 1.0
        for edge, _ in m.bounds():
            lo, hi = m.weight(t(edge * (1 - 1e-12)), t(1.0)), m.weight(t(edge * (1 + 1e-12)),
                                                                      t(1.0))
            assert float((hi - lo).abs()) < 1e-10


def test_cispo_value_differs_but_gradient_matches_the_f_form():
    """CISPO's loss value is −agg(sg(clip ρ)·A·log π), not −agg(f·A); the gradients are equal."""
    m = rlgates.get("cispo", eps_low=0.2, eps_high=0.28)
    logp, logp_old, adv, mask = make_batch(seed=3, scale=0.8)
    for agg in rlgates.AGG_MODES:
        a = logp.clone().requires_grad_(True)
        b = logp.clone().requires_grad_(True)
        cispo_form = m.loss(a, logp_old, adv, mask, agg)
        f_objective = rlgates.Method.token_objective(  # the base's f(ρ)·A
            m, b, logp_old, adv[:, None].expand_as(b), mask)
        f_form = -rlgates.aggregate(f_objective, mask, agg)
        cispo_form.backward()
        f_form.backward()
        assert not torch.allclose(cispo_form, f_form)
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-15)


def test_cispo_gradient_survives_the_log_ratio_clamp():
    """The ±20 clamp only limits the weight; the gradient flows through log π itself."""
    m = rlgates.get("cispo")
    logp = t([[25.0, -30.0, 0.5]])
    logp_old = t([[0.0, 0.0, 0.0]])
    adv = t([1.0])
    autograd, closed, diff = rlgates.check_gradient(m, logp, logp_old, adv)
    assert diff == 0
    assert torch.allclose(autograd, t([[-5.0, -math.exp(-20), -math.exp(0.5)]]) / 3)


@pytest.mark.parametrize("ratio", [1e-3, 0.5, 1.0, 3.0, 1e3])
@pytest.mark.parametrize("adv", [-2.0, 0.0, 1.0])
def test_reinforce_table(ratio, adv):
    m = rlgates.get("reinforce")
    assert float(m.gate(t(ratio), t(adv))) == 1.0
    assert float(m.weight(t(ratio), t(adv))) == pytest.approx(ratio, rel=1e-15)
    assert float(m.signal(t(ratio), t(adv))) == pytest.approx(ratio * adv, rel=1e-15)


def test_reinforce_on_policy_is_the_plain_policy_gradient(agg):
    """At ρ = 1 the gradient is −A·w_t: REINFORCE with the advantage."""
    _, _, adv, mask = make_batch(seed=2)
    logp = -torch.rand(mask.shape, dtype=F64)
    autograd, _, _ = rlgates.check_gradient("reinforce", logp, logp, adv, mask, agg)
    w = rlgates.aggregation_weight(mask, agg)
    assert torch.allclose(autograd, -adv[:, None] * w, rtol=1e-15, atol=0)


def test_gate_broadcasts(name):
    m = held(name)
    ratio = torch.linspace(0.1, 6, 7, dtype=F64)[:, None]
    adv = torch.tensor([[-1.0, 0.5, 1.0]], dtype=F64)
    for fn in (m.gate, m.weight, m.signal, m.objective):
        assert fn(ratio, adv).shape == (7, 3)


def test_low_precision_keeps_the_gate_decisions(name):
    m = held(name)
    ratio = torch.tensor([0.5, 0.9, 1.1, 2.0, 4.0, 7.0])
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    ref = m.gate(ratio.double(), adv.double())
    for dtype in (torch.bfloat16, torch.float16):
        g = m.gate(ratio.to(dtype), adv.to(dtype))
        assert g.dtype == torch.float32
        assert torch.equal(g == 0, ref == 0)


def test_planes_and_figures(name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = rlgates.plane(held(name), n=21)
    assert p.gate.shape == (21, 21) and p.signal.shape == (21, 21)
    plt.close(rlgates.plot_gate_signal(held(name)))



def test_the_loss_is_minus_the_aggregated_token_objective():
    """One loss path: for every method, `loss` equals −aggregate(token_objective) bit for bit in
    value and gradient, in every mode, with a bool or a float mask and NaN (logp) and 1e9
    (logp_old) in the padding, which gets zero gradient. Negative control: a subclass that
    doubles `token_objective` doubles the loss."""
    logp, logp_old, adv, mask = make_batch(seed=4, scale=0.8)
    logp, logp_old = logp.masked_fill(~mask, float("nan")), logp_old.masked_fill(~mask, 1e9)
    for name in rlgates.names():
        m = rlgates.get(name)
        side = side_for(m, logp.shape)
        for mk in (mask, mask.double()):
            checked = nx.check_loss_inputs(logp, logp_old, adv, mk, m.agg)
            completed = m.side_from_batch(*checked, side)
            for agg in rlgates.AGG_MODES:
                a, b = (logp.clone().requires_grad_(True) for _ in range(2))
                loss = m.loss(a, logp_old, adv, mk, agg, side=side)
                direct = -rlgates.aggregate(m.token_objective(b, *checked[1:], completed), mk, agg)
                loss.backward()
                direct.backward()
                assert torch.equal(loss, direct) and torch.isfinite(loss), (name, agg)
                assert torch.equal(a.grad, b.grad), (name, agg)
                assert torch.equal(a.grad[~mask], torch.zeros_like(a.grad[~mask])), (name, agg)

    class Doubled(type(rlgates.get("cispo"))):
        def token_objective(self, logp, logp_old, adv, mask, side=None):
            return 2 * super().token_objective(logp, logp_old, adv, mask, side)

    doubled, base = Doubled(), rlgates.get("cispo")
    lp, lo, a, mk = make_batch(seed=4)
    assert torch.allclose(doubled.loss(lp, lo, a, mk), 2 * base.loss(lp, lo, a, mk),
                          rtol=1e-15)
