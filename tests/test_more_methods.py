"""Part II: dual-clip PPO, CISPO, REINFORCE, the bring-your-own-gate helper and Dr. GRPO's
constant-normalizer aggregation. All in float64."""

import math

import pytest
import torch

import rlgates
from rlgates import byo
from tests.conftest import make_batch

PART_TWO = ["dual_clip", "cispo", "reinforce"]
F64 = torch.float64


def t(x):
    return torch.as_tensor(x, dtype=F64)


# --------------------------------------------------------------------------------------------
# independent references, in the trainers' eager style (no rlgates code)
# --------------------------------------------------------------------------------------------
def ref_agg(loss_mat, mask, agg):
    m = mask.to(loss_mat.dtype)
    lengths = m.sum(-1)
    n_seq = max(int((lengths > 0).sum()), 1)
    per_seq = (loss_mat * m).sum(-1)
    if agg == "token-mean":
        return (loss_mat * m).sum() / max(float(m.sum()), 1.0)
    if agg == "seq-mean-token-mean":
        return (per_seq / lengths.clamp(min=1)).sum() / n_seq
    if agg == "seq-mean-token-sum":
        return per_seq.sum() / n_seq
    if agg == "seq-mean-token-sum-norm":  # per-sequence sum / max length, then the batch mean
        return (per_seq / mask.shape[-1]).sum() / n_seq
    raise ValueError(agg)


def ref_dual_clip(logp, logp_old, adv, mask, agg, eps=0.2, c=3.0):
    """The dual-clip PPO loss as an open-source trainer writes it."""
    ratio = torch.exp(torch.clamp(logp - logp_old, -20.0, 20.0))
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - eps, 1 + eps)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-adv * c, clip1)
    return ref_agg(torch.where(adv < 0, clip2, clip1), mask, agg)


def ref_cispo(logp, logp_old, adv, mask, agg, eps_low=1.0, eps_high=4.0):
    ratio = torch.exp(torch.clamp(logp - logp_old, -20.0, 20.0))
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    return ref_agg(-clipped * adv * logp, mask, agg)


def ref_reinforce(logp, logp_old, adv, mask, agg):
    ratio = torch.exp(torch.clamp(logp - logp_old, -20.0, 20.0))
    return ref_agg(-ratio * adv, mask, agg)


REFERENCES = {"dual_clip": ref_dual_clip, "cispo": ref_cispo, "reinforce": ref_reinforce}


@pytest.fixture(params=PART_TWO)
def name2(request):
    return request.param


# --------------------------------------------------------------------------------------------
# registry and metadata
# --------------------------------------------------------------------------------------------
def test_registered_with_the_same_contract(name2):
    assert name2 in rlgates.names()
    m = rlgates.get(name2)
    assert m.level == "token" and m.title and m.paper and m.f_latex and m.gate_latex and m.insight
    assert repr(m).startswith(f"rlgates.get('{name2}'")
    table = rlgates.table((name2,), merge_grpo=False)
    assert m.title in table


def test_defaults():
    assert rlgates.get("dual_clip").hparams == {"eps": 0.2, "c": 3.0}
    assert rlgates.get("cispo").hparams == {"eps_low": 1.0, "eps_high": 4.0}
    assert rlgates.get("reinforce").hparams == {}


@pytest.mark.parametrize("name_, hp", [
    ("dual_clip", {"c": 1.0}), ("dual_clip", {"c": 0.5}), ("dual_clip", {"c": float("nan")}),
    ("dual_clip", {"c": "three"}), ("dual_clip", {"eps": -0.1}), ("dual_clip", {"eps": 1.0}),
    ("dual_clip", {"eps_low": 0.2}),
    ("cispo", {"eps_low": -0.1}), ("cispo", {"eps_low": 1.5}), ("cispo", {"eps_high": -1.0}),
    ("cispo", {"eps_high": float("inf")}), ("cispo", {"eps": 0.2}),
    ("reinforce", {"eps": 0.2}),
])
def test_bad_hyperparameters_raise(name_, hp):
    with pytest.raises(ValueError):
        rlgates.get(name_, **hp)


# --------------------------------------------------------------------------------------------
# eq. 5: autograd = closed form, for every aggregation, ragged masks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", [0.3, 1.5])  # 1.5: many ratios beyond c = 3 and 1 + ε_h = 5
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_autograd_equals_expected_grad(name2, agg, seed, scale, per_token_adv):
    logp, logp_old, adv, mask = make_batch(seed=seed, scale=scale, per_token_adv=per_token_adv)
    autograd, closed, diff = rlgates.check_gradient(name2, logp, logp_old, adv, mask, agg)
    assert diff < 1e-14
    assert autograd[~mask].abs().max() == 0
    assert (autograd != 0).any()


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


@pytest.mark.parametrize("safety", [False, True])
def test_values_and_gradients_equal_trainer_references(name2, agg, safety):
    logp, logp_old, adv, mask = make_batch(seed=4, scale=1.2)
    if safety:  # per-token advantages too
        logp, logp_old, adv, mask = make_batch(seed=5, scale=1.2, per_token_adv=True)
    m = rlgates.get(name2)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ours = m.loss(a, logp_old, adv, mask, agg)
    adv_t = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv
    theirs = REFERENCES[name2](b, logp_old, adv_t, mask, agg, **m.hparams)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=1e-13, atol=1e-15)
    assert torch.allclose(a.grad, b.grad, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("name_", PART_TWO)
def test_finite_differences_away_from_kinks(name_):
    logp, logp_old, adv, mask = make_batch(B=4, T=5, seed=5, scale=1.0)
    m = rlgates.get(name_)
    for ratio, _ in m.bounds():
        lr = logp - logp_old
        near = (lr - math.log(ratio)).abs() < 1e-3
        logp = torch.where(near, logp + 3e-3, logp)
    leaf = logp.clone().requires_grad_(True)
    for agg in rlgates.AGG_MODES:
        if name_ == "cispo":
            # CISPO's loss value has a stop-gradient inside, so finite differences of *it* are
            # not its gradient. Its f-form (weight f, a genuine antiderivative of the gate) is
            # differentiated numerically, and must match the CISPO loss's autograd gradient.
            def loss(x, agg=agg):
                adv_t = adv[:, None].expand_as(x)
                return -rlgates.aggregate(rlgates.Method.token_objective(
                    m, x, logp_old, adv_t, mask), mask, agg)

            (g_cispo,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg), leaf)
            (g_f,) = torch.autograd.grad(loss(leaf), leaf)
            assert torch.allclose(g_cispo, g_f, rtol=1e-12, atol=1e-15)
        else:
            def loss(x, agg=agg):
                return m.loss(x, logp_old, adv, mask, agg)
        assert torch.autograd.gradcheck(loss, (leaf,), eps=1e-7, atol=1e-9, rtol=1e-6)


@pytest.mark.parametrize("name_", PART_TWO)
def test_gate_is_the_derivative_of_the_weight(name_):
    """f' (gate) = df/dρ (weight), by autograd and by finite differences, away from the edges."""
    m = rlgates.get(name_)
    ratio = torch.linspace(-2.5, 2.5, 1001, dtype=F64).exp()
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


# --------------------------------------------------------------------------------------------
# hand-worked boundary tables: at, just inside and just outside each bound, both signs of A
# --------------------------------------------------------------------------------------------
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
        f_form = -rlgates.aggregate(rlgates.Method.token_objective(
            m, b, logp_old, adv[:, None].expand_as(b), mask), mask, agg)
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


def test_gate_broadcasts(name2):
    m = rlgates.get(name2)
    ratio = torch.linspace(0.1, 6, 7, dtype=F64)[:, None]
    adv = torch.tensor([[-1.0, 0.5, 1.0]], dtype=F64)
    for fn in (m.gate, m.weight, m.signal, m.objective):
        assert fn(ratio, adv).shape == (7, 3)


def test_low_precision_keeps_the_gate_decisions(name2):
    m = rlgates.get(name2)
    ratio = torch.tensor([0.5, 0.9, 1.1, 2.0, 4.0, 7.0])
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    ref = m.gate(ratio.double(), adv.double())
    for dtype in (torch.bfloat16, torch.float16):
        g = m.gate(ratio.to(dtype), adv.to(dtype))
        assert g.dtype == torch.float32
        assert torch.equal(g == 0, ref == 0)


def test_planes_and_figures(name2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = rlgates.plane(name2, n=21)
    assert p.gate.shape == (21, 21) and p.signal.shape == (21, 21)
    plt.close(rlgates.plot_gate_signal(name2))


# --------------------------------------------------------------------------------------------
# bring your own gate
# --------------------------------------------------------------------------------------------
def ppo_weight(r, a, eps=0.2):
    return torch.where(a > 0, torch.where(r < 1 + eps, r, 1 + eps),
                       torch.where(r > 1 - eps, r, 1 - eps))


def test_byo_reproduces_ppo():
    mine = byo.make(ppo_weight, "my_ppo", bounds=lambda eps: [(1 + eps, 1), (1 - eps, -1)],
                    eps=0.2)
    ppo = rlgates.get("ppo")
    ratio = torch.cat([torch.linspace(-1, 1, 401, dtype=F64).exp(), t([1.2, 0.8])])[:, None]
    adv = torch.tensor([[-2.0, -1.0, -1e-3, 1e-3, 0.5, 1.0]], dtype=F64)
    assert torch.equal(mine.gate(ratio, adv), ppo.gate(ratio, adv))  # edges included
    assert torch.equal(mine.weight(ratio, adv), ppo.weight(ratio, adv))
    adv0 = torch.tensor([[-1.0, 0.0, 1.0]], dtype=F64)
    assert torch.equal(mine.signal(ratio, adv0), ppo.signal(ratio, adv0))  # A = 0 too
    assert mine.bounds() == ppo.bounds()
    for agg in rlgates.AGG_MODES:
        logp, logp_old, adv_b, mask = make_batch(seed=1, scale=0.5)
        a, _, diff = rlgates.check_gradient(mine, logp, logp_old, adv_b, mask, agg)
        b, _, _ = rlgates.check_gradient(ppo, logp, logp_old, adv_b, mask, agg)
        assert diff < 1e-14 and torch.equal(a, b)
    v = byo.verify(mine)
    assert v.ok, str(v)
    assert v.gate_at_one == (1.0, 1.0)


def test_byo_hyperparameters_and_registry():
    m = byo.make(ppo_weight, "byo_test_ppo", register=True, eps=0.2,
                 check=lambda eps: None if 0 < eps < 1 else (_ for _ in ()).throw(
                     ValueError("eps must be in (0, 1)")))
    try:
        assert rlgates.get("byo_test_ppo", eps=0.3).hparams == {"eps": 0.3}
        assert float(rlgates.get("byo_test_ppo", eps=0.3).gate(t(1.25), t(1.0))) == 1.0
        assert float(m.gate(t(1.25), t(1.0))) == 0.0
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", eps=1.5)
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", tau=1.0)
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", eps="x")
    finally:
        rlgates.methods.REGISTRY.pop("byo_test_ppo", None)
    with pytest.raises(ValueError):
        byo.make(ppo_weight, "ppo", register=True)
    with pytest.raises(ValueError):
        byo.make("not a function")


def test_byo_catches_broken_weights():
    # a .detach() inside f: the gate autograd sees is 0, but f really does depend on ρ
    detached = byo.make(lambda r, a: r.detach() * 1.0, "detached")
    v = byo.verify(detached)
    assert not v.ok and v.fd_kinks > 0.5
    # a gate that turns negative: f = ρ·exp(−(log ρ)²/2) falls beyond ρ = e
    falling = byo.make(lambda r, a: r * torch.exp(-r.log() ** 2 / 2), "falling")
    v = byo.verify(falling, grid_lim=2.0)
    assert not v.ok and v.gate_range[0] < 0 and v.notes
    # not elementwise: the weight mixes tokens
    with pytest.raises(ValueError):
        byo.make(lambda r, a: r.sum(), "mixing").gate(t([1.0, 2.0]), t([1.0, 1.0]))
    # constant in ρ: the gate is 0 everywhere (and the signal with it)
    const = byo.make(lambda r, a: torch.ones_like(r), "const")
    assert torch.equal(const.gate(t([0.5, 2.0]), t([1.0, -1.0])), t([0.0, 0.0]))


def test_byo_verify_on_the_built_in_methods(name2):
    v = byo.verify(name2)
    assert v.ok, str(v)
    assert max(v.eq5.values()) < 1e-13


def test_byo_is_usable_by_the_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smooth = byo.make(lambda r, a, w=0.5: torch.where(a > 0, r, r) * 1.0, "id", w=0.5)
    plt.close(rlgates.plot_gate_signal(smooth))
    plt.close(byo.plot_profiles(smooth, "ppo", "cispo"))
    panels = rlgates.GatePanels(smooth, n=21)
    panels.update(rlgates.get("dual_clip"))
    panels.close()


# --------------------------------------------------------------------------------------------
# seq-mean-token-sum-norm (Dr. GRPO's constant normalizer)
# --------------------------------------------------------------------------------------------
NORM = "seq-mean-token-sum-norm"


def test_norm_mode_value_and_weight():
    logp, logp_old, adv, mask = make_batch(seed=0)
    values = torch.randn(mask.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    B, T = mask.shape
    n_seq = int((mask.sum(-1) > 0).sum())
    expected = (values * mask).sum() / (n_seq * T)
    assert torch.allclose(rlgates.aggregate(values, mask, NORM), expected, rtol=1e-15)
    assert torch.allclose(rlgates.aggregate(values, mask, NORM),
                          rlgates.aggregate(values, mask, "seq-mean-token-sum") / T, rtol=1e-15)
    # the other trainer's convention (Σ / T, no batch mean) is ours times the number of sequences
    assert torch.allclose(rlgates.aggregate(values, mask, NORM) * n_seq,
                          (values * mask).sum() / T, rtol=1e-15)
    leaf = values.clone().requires_grad_(True)
    rlgates.aggregate(leaf, mask, NORM).backward()
    assert torch.allclose(leaf.grad, rlgates.aggregation_weight(mask, NORM), rtol=1e-15)
    w = rlgates.aggregation_weight(mask, NORM)
    assert torch.allclose(w[mask], torch.full_like(w[mask], 1 / (n_seq * T)))  # flat in length


def test_norm_mode_edge_cases():
    empty = torch.zeros(3, 4, dtype=torch.bool)
    values = torch.randn(3, 4, dtype=F64)
    assert float(rlgates.aggregate(values, empty, NORM)) == 0.0
    assert float(rlgates.get("ppo").loss(values, values, t([1.0, -1.0, 0.5]), empty, NORM)) == 0
    assert (rlgates.aggregation_weight(empty, NORM) == 0).all()
    # the normalizer is the padded length T, so it does not change with the responses' lengths
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, :3] = True
    mask[1, :1] = True
    assert torch.allclose(rlgates.aggregation_weight(mask, NORM)[mask], torch.full((4,), 1 / 16,
                                                                                  dtype=F64))


@pytest.mark.parametrize("name_", ["ppo", "dapo", "sapo", "gspo", "sao", "grpo",
                                   *PART_TWO])
def test_norm_mode_eq5_for_every_method(name_):
    for seed in (0, 1):
        batch = make_batch(seed=seed, scale=0.5)
        if name_ == "gspo":
            logp, logp_old, adv, mask = batch
            batch = (logp_old + 3e-4 * torch.randn_like(logp), logp_old, adv, mask)
        assert rlgates.check_gradient(name_, *batch, agg=NORM)[2] < 1e-14


def test_norm_mode_is_accepted_and_unknown_modes_are_not():
    assert NORM in rlgates.AGG_MODES
    logp, logp_old, adv, mask = make_batch()
    with pytest.raises(ValueError, match="agg"):
        rlgates.get("cispo").loss(logp, logp_old, adv, mask, "seq-sum")
