"""Eq. 5 three ways, for every registered method: autograd, the closed form gate·ρ·A·w, and
finite differences / an independent trainer-style reference.

The functions here take a method name, so that tests/test_registry.py can run them on a method
it registers itself: a method added as one class gets every generic check.
"""

import pytest
import torch

import rlgates
from rlgates import _numerics as nx
from rlgates import reference, trainers
from tests.conftest import (
    METHODS,
    away_from_kinks,
    make_batch,
    side_for,
    smooth_at,
    straddle_edges,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_autograd_equals_closed_form(name, agg, seed, per_token_adv):
    for scale in (0.3, 1.5):  # 1.5: ratios beyond dual-clip's c = 3 and CISPO's 1 + ε_h = 5
        logp, logp_old, adv, mask = make_batch(seed=seed, scale=scale,
                                               per_token_adv=per_token_adv)
        side = side_for(name, logp.shape, seed)
        autograd, closed, diff = rlgates.check_gradient(name, logp, logp_old, adv, mask, agg,
                                                        side=side)
        assert diff < 1e-14
        assert autograd[~mask].abs().max() == 0  # masked tokens get nothing
        assert (autograd != 0).any()  # the check is not vacuous


@pytest.mark.parametrize("name_", METHODS)
def test_finite_differences_of_f_times_a(name_):
    """Autograd's gradient of `loss` equals central finite differences of the f-form objective
    −agg(f(ρ; A)·A), ρ the ratio the gate sees, built here from `weight` alone (so CISPO, whose
    loss value carries a stop-gradient, is checked against its antiderivative f). A method
    with side inputs is differentiated at the side information of the unperturbed batch (its
    derived fields do not take a gradient)."""
    m = rlgates.get(name_)
    logp, logp_old, adv, mask = make_batch(B=4, T=5, seed=5, scale=0.8)
    logp = away_from_kinks(m, straddle_edges(m, logp, logp_old, 1e-4), logp_old)
    adv_t = adv[:, None].expand_as(logp)
    side = side_for(m, logp.shape)
    held = m.side_from_batch(*nx.check_loss_inputs(logp, logp_old, adv, mask, m.agg), side)

    def f_form(x, agg):
        log_ratio = torch.where(mask, x - logp_old, 0.0)
        share = 1.0
        if m.level == "sequence":
            log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1))[:, None].expand_as(x)
        elif m.level == "sequence-product":  # f(w)·A once per response, shared by its tokens
            log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(x)
            share = 1 / mask.sum(-1, keepdim=True).clamp(min=1)
        objective = m.objective(log_ratio.exp(), adv_t, held) * share
        return -rlgates.aggregate(objective, mask, agg)

    for agg in rlgates.AGG_MODES:
        leaf = logp.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg, side=side), leaf)
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
    side = side_for(m, ratio.shape, plane=True)  # held fixed along ρ
    for a in (-1.0, -0.3, 0.4, 2.0):
        adv = torch.full_like(ratio, a)
        keep = smooth_at(m, ratio, adv, side)  # edges that move with the side information
        assert keep.float().mean() > 0.9
        r = ratio.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(m.weight(r, adv, side).sum(), r)
        gate = m.gate(ratio, adv, side)
        assert torch.allclose(auto[keep], gate[keep], rtol=1e-12, atol=1e-14)
        h = 1e-6 * ratio
        fd = (m.weight(ratio + h, adv, side) - m.weight(ratio - h, adv, side)) / (2 * h)
        assert torch.allclose(fd[keep], gate[keep], rtol=1e-6, atol=1e-8)


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


def _needs_trainer_reference(name):
    """The methods of the chapter where the template bends (`chapter` set) are checked against
    the trainers' own functions (tests/test_conformance_*), not a plain reference here, unless
    they have one too (luspo, vespo)."""
    return rlgates.REGISTRY[name].chapter is not None and name not in reference.REFERENCES


def _built_in(name):
    """A method of the library (defined in rlgates.methods); one registered elsewhere (a
    contributor's experiment, a test) needs no reference in rlgates/reference.py."""
    return rlgates.REGISTRY[name].__module__.startswith("rlgates.methods.")


def test_every_built_in_method_has_a_reference():
    plain = {n for n in METHODS if _built_in(n) and not _needs_trainer_reference(n)}
    assert plain - {"ppo", "grpo"} <= set(reference.REFERENCES) <= set(METHODS)


@pytest.mark.parametrize("safety_eps, rtol", [(0.0, 1e-13), (1e-8, 1e-7)])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_values_and_gradients_equal_the_trainer_reference(name, agg, safety_eps, rtol,
                                                         per_token_adv):
    if _needs_trainer_reference(name) and name not in reference.REFERENCES:
        pytest.skip(f"{name}: checked against the trainer's own function (test_conformance_*)")
    if not _built_in(name) and name not in reference.REFERENCES:
        pytest.skip(f"{name}: not a method of the library, no reference needed")
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


#: hyperparameters at which each side reference's rule acts on no token (the negative control)
RULE_OFF = {"dppo_tv": {"delta_low": 10.0, "delta_high": 10.0},
            "dppo_kl": {"delta_low": 1e9, "delta_high": 1e9}, "kl_cov": {"kl_coef": 0.0},
            "clip_cov": {"cov_low": -2e9, "cov_high": -1e9}, "opsm": {"delta": 1e9},
            "top_entropy": {"top": 1.0}}
#: ... and where the defaults leave this batch untouched, hyperparameters at which it acts
RULE_ON = {"opsm": {"delta": 0.05}}


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("side_name", sorted(reference.SIDE_REFERENCES))
def test_side_references_equal_rlgates(side_name, agg, per_token_adv):
    """The plain references of the methods with side inputs (the benchmark times them) compute
    rlgates' loss and gradient, given a float mask as trainers pass it; and each rule acts on
    this batch (its gradient moves when the rule is switched off)."""
    assert set(RULE_OFF) == set(reference.SIDE_REFERENCES)
    logp, logp_old, adv, mask = make_batch(B=16, T=64, seed=5, scale=0.6,
                                           per_token_adv=per_token_adv)
    m = rlgates.get(side_name, **RULE_ON.get(side_name, {}))
    side = side_for(m, logp.shape, seed=5)

    def ref_grad(**hparams):
        leaf = logp.clone().requires_grad_(True)
        loss = reference.reference_loss(side_name, leaf, logp_old, adv, mask.double(), agg,
                                        side=side, **{**m.hparams, **hparams})
        loss.backward()
        return loss, leaf.grad

    ours, theirs = logp.clone().requires_grad_(True), ref_grad()
    m.loss(ours, logp_old, adv, mask, agg, side=side).backward()
    assert torch.allclose(m.loss(logp, logp_old, adv, mask, agg, side=side), theirs[0],
                          rtol=1e-13, atol=1e-15)
    assert torch.allclose(ours.grad, theirs[1], rtol=1e-13, atol=1e-300)
    assert not torch.allclose(ref_grad(**RULE_OFF[side_name])[1], theirs[1])


def test_default_aggregation_is_the_methods_own(name):
    """loss(agg=None) is loss(agg=m.agg); expected_grad and check_gradient follow it too."""
    m = rlgates.get(name)
    logp, logp_old, adv, mask = make_batch(seed=6, scale=0.5)
    logp = straddle_edges(m, logp, logp_old)
    side = side_for(m, logp.shape)
    assert torch.equal(m.loss(logp, logp_old, adv, mask, side=side),
                       m.loss(logp, logp_old, adv, mask, m.agg, side=side))
    assert torch.equal(m.expected_grad(logp, logp_old, adv, mask, side=side),
                       m.expected_grad(logp, logp_old, adv, mask, agg=m.agg, side=side))
    assert rlgates.check_gradient(m, logp, logp_old, adv, mask, side=side)[2] < 1e-14
    assert m.agg in rlgates.AGG_MODES and m.agg_source


def _verl_agg_disagrees(m):
    """verl's loss_agg_mode in the method's trainer flags, where it is not the method's `agg`."""
    verl = trainers.flags(m)["verl"]
    mode = verl.get("loss_agg_mode") if verl else None
    return mode if mode not in (None, m.agg) else None


def test_the_defaults_follow_the_papers_and_match_the_trainers(name):
    """Read from the class, not listed here: the default is the paper's convention (agg_source
    says which), and where verl's built-in loss computes the method, the flags that make it do
    so (checked against verl in tests/test_trainer_facts.py) name the same aggregation."""
    m = rlgates.get(name)
    assert m.agg in rlgates.AGG_MODES and m.agg_source.strip()  # a sentence: where it comes from
    assert _verl_agg_disagrees(m) is None, (name, m.agg)


def test_a_default_that_disagrees_with_its_trainer_flags_is_caught():
    class SeqPPO(type(rlgates.get("ppo"))):  # PPO's flags say token-mean
        agg = "seq-mean-token-mean"

    assert _verl_agg_disagrees(SeqPPO()) == "token-mean"
    assert _verl_agg_disagrees(rlgates.get("ppo")) is None


def test_is_weight_multiplies_the_gradient(name, agg):
    """An importance weight is a constant factor on each token: gradient = w_is × eq. 5."""
    m = rlgates.get(name)
    logp, logp_old, adv, mask = make_batch(seed=7, scale=0.6)
    logp = straddle_edges(m, logp, logp_old)
    w = torch.rand(logp.shape, dtype=logp.dtype, generator=torch.Generator().manual_seed(1)) * 2
    w = torch.where(mask, w, torch.nan)  # padding may hold anything
    side = side_for(m, logp.shape)
    autograd, closed, diff = rlgates.check_gradient(m, logp, logp_old, adv, mask, agg,
                                                    is_weight=w, side=side)
    assert diff < 1e-14
    plain = m.expected_grad(logp, logp_old, adv, mask, agg, side=side)
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


# --- SAPO in float32: the trained gradient is the closed-form gate -------------------------------

_LN80 = float(torch.log(torch.tensor(80.0, dtype=torch.float64)))


def _sapo_float32_grads(m, sign, agg, dtype=torch.float32):
    """(autograd gradient of m.loss, the closed form −sech²(τ(ρ−1)/2)·ρ·A·w in float64) on one
    sequence of 64 tokens, log ρ from −3 to ln 80, A = ±1, inputs of `dtype` (lifted to float32)."""
    logp = torch.linspace(-3.0, _LN80, 64, dtype=torch.float64)[None, :].to(dtype)
    logp_old = torch.zeros_like(logp)
    adv = torch.full((1,), sign, dtype=dtype)
    mask = torch.ones(logp.shape, dtype=torch.float32)  # a float 0/1 mask, as trainers pass it
    leaf = logp.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg), leaf)
    ratio = logp.to(torch.float64).exp()
    tau = m.hparams["tau_pos"] if sign > 0 else m.hparams["tau_neg"]
    w = rlgates.aggregation_weight(mask.bool(), agg or m.agg)
    closed = -torch.cosh(tau * (ratio - 1) / 2).pow(-2) * ratio * sign * w
    return auto, closed


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("hparams", [{}, {"tau_pos": 0.7, "tau_neg": 1.1}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sapo_float32_gradient_equals_the_closed_form_gate(agg, sign, hparams, dtype):
    """In float32 (bf16 is computed in float32), autograd's gradient of SAPO's loss equals
    −sech²(τ(ρ−1)/2)·ρ·A·w to rtol 1e-4 for ρ up to 80, and is nonzero wherever the float32
    closed-form gate is: the sigmoid's own derivative would be exactly 0 from ρ ≈ 18.3."""
    m = rlgates.get("sapo", **hparams)
    auto, closed = _sapo_float32_grads(m, sign, agg, dtype)
    assert auto.dtype == dtype  # computed in float32, returned in the leaf's dtype
    rtol = 1e-4 if dtype == torch.float32 else 2**-8  # bf16: the float32 gradient, rounded once
    rel = ((auto.double() - closed) / closed).abs().max()
    assert rel <= rtol, rel
    lifted = torch.linspace(-3.0, _LN80, 64, dtype=torch.float64).to(dtype).float().exp()
    gate32 = m.gate(lifted, torch.full_like(lifted, sign))
    assert gate32.dtype == torch.float32 and (gate32 > 0).all()  # representable on the whole grid
    assert (auto != 0).all()
    assert float(auto.abs()[0, -1]) > 0  # ρ = 80: far past the sigmoid's float32 underflow
    # the value is unchanged: f = (4/τ)·σ(τ(ρ−1)), bit for bit
    tau = torch.tensor(m.hparams["tau_pos"] if sign > 0 else m.hparams["tau_neg"])
    assert torch.equal(m.weight(lifted, torch.full_like(lifted, sign)),
                       4 / tau * torch.sigmoid(tau * (lifted - 1)))


def test_the_sigmoid_forms_float32_gradient_is_exactly_zero_at_rho_25(monkeypatch):
    """Negative control: with the old f differentiated by autograd through σ, the float32
    gradient at ρ = 25 is exactly 0 while the closed form is not, so the test above would fail."""
    m = rlgates.get("sapo")

    def sigmoid_form(ratio, adv, side=None):
        tau = m._tau(adv)
        return 4 / tau * torch.sigmoid(tau * (ratio - 1))

    logp = torch.tensor([[0.0, float(torch.log(torch.tensor(25.0)))]])
    leaf = logp.clone().requires_grad_(True)
    (ours,) = torch.autograd.grad(m.loss(leaf, torch.zeros_like(logp), torch.ones(1)), leaf)
    monkeypatch.setattr(m, "_weight", sigmoid_form)
    leaf = logp.clone().requires_grad_(True)
    (old,) = torch.autograd.grad(m.loss(leaf, torch.zeros_like(logp), torch.ones(1)), leaf)
    closed = m.expected_grad(logp, torch.zeros_like(logp), torch.ones(1))
    assert float(old[0, 1]) == 0.0 and float(closed[0, 1]) < 0  # σ(24) rounds to 1 in float32
    assert float(ours[0, 1]) == pytest.approx(float(closed[0, 1]), rel=1e-5)
    assert float(old[0, 0]) == float(ours[0, 0])  # at ρ = 1 the two forms agree
    auto, closed = _sapo_float32_grads(m, 1.0, None)  # the grid test's checks, old form
    assert (auto == 0).any() and ((auto.double() - closed) / closed).abs().max() > 1e-4


def test_sapo_weight_broadcasts_its_gradient_to_the_ratios_shape():
    """The custom backward's gradient is summed back to ρ's shape when A broadcasts it."""
    m = rlgates.get("sapo")
    ratio = torch.linspace(0.5, 3.0, 5, dtype=torch.float64).requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64).expand(2, 5)
    (g,) = torch.autograd.grad(m.weight(ratio, adv).sum(), ratio)
    expected = m.gate(ratio.detach(), adv).sum(0)
    assert g.shape == ratio.shape and torch.allclose(g, expected, rtol=1e-14, atol=0)
