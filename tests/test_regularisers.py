"""KL estimators, their expected gradients (exact enumeration), the entropy bonus, KL placement.

Each formula is checked against autograd, a closed form, and finite differences or an independent
reference; enumeration sums over every outcome, so the checks are exact (no Monte Carlo).
"""

import pytest
import torch

import rlgates
from rlgates import regularisers as R
from tests.conftest import make_batch

F64 = torch.float64


def logits3(V=6, seed=0, old_shift=0.5):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=F64)
    z_ref = torch.randn(V, generator=g, dtype=F64)
    z_old = z + old_shift * torch.randn(V, generator=g, dtype=F64)
    return z, z_ref, z_old


def batch_ref(seed=0, B=6, T=9, scale=0.3):
    logp, logp_old, adv, mask = make_batch(B=B, T=T, seed=seed, scale=scale)
    g = torch.Generator().manual_seed(100 + seed)
    logp_ref = logp_old + 0.4 * torch.randn(logp.shape, generator=g, dtype=F64)
    return logp, logp_old, logp_ref, adv, mask


# --- per-token estimators ------------------------------------------------------------------------
def test_estimator_values_from_probabilities():
    p = torch.tensor([0.1, 0.5, 0.9], dtype=F64)
    q = torch.tensor([0.3, 0.5, 0.2], dtype=F64)  # π_ref
    lp, lq = p.log(), q.log()
    u = q / p
    assert torch.allclose(R.kl_estimate(lp, lq, "k1"), -u.log(), rtol=1e-14)
    assert torch.allclose(R.kl_estimate(lp, lq, "k2"), 0.5 * u.log() ** 2, rtol=1e-14)
    assert torch.allclose(R.kl_estimate(lp, lq, "k3"), u - u.log() - 1, rtol=1e-13, atol=1e-16)
    assert torch.equal(R.kl_estimate(lp, lq, "k3+"), R.kl_estimate(lp, lq, "k3"))
    assert R.kl_estimate(lp, lq, "k3")[1] == 0  # equal probabilities: zero
    assert (R.kl_estimate(lp, lq, "k3") >= 0).all() and (R.kl_estimate(lp, lq, "k1") < 0).any()


@pytest.mark.parametrize("estimator", R.ESTIMATORS)
def test_estimator_gradient_closed_form_equals_autograd(estimator):
    logp, _, logp_ref, _, _ = batch_ref(seed=1)
    leaf = logp.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(R.kl_estimate(leaf, logp_ref, estimator).sum(), leaf)
    closed = R.kl_estimate_grad(logp, logp_ref, estimator)
    assert torch.allclose(auto, closed, rtol=1e-13, atol=1e-15)
    assert closed.abs().max() > 0.01
    if estimator in ("k2", "k3+"):  # the same gradient, d
        assert torch.allclose(closed, logp - logp_ref, rtol=1e-14)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_estimator_gradient_finite_differences(estimator):
    logp, _, logp_ref, _, _ = batch_ref(seed=2, B=3, T=4)
    leaf = logp.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: R.kl_estimate(x, logp_ref, estimator), (leaf,),
                                    eps=1e-7, atol=1e-8, rtol=1e-6)


# --- exact KL and its gradients ------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_kl_against_torch_kl_div(seed):
    z, z_ref, _ = logits3(seed=seed)
    lp, lr = torch.log_softmax(z, -1), torch.log_softmax(z_ref, -1)
    # kl_div(input, target, log_target) = Σ target·(target − input): KL(target‖input)
    theirs = torch.nn.functional.kl_div(lr, lp, log_target=True, reduction="sum")
    assert torch.allclose(R.kl_exact(z, z_ref), theirs, rtol=1e-14)
    assert not torch.allclose(R.kl_exact(z, z_ref), R.kl_exact(z_ref, z), rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_kl_gradients_closed_form_autograd_finite_differences(seed):
    z, z_ref, _ = logits3(seed=seed)
    reverse, forward = R.kl_exact_grads(z, z_ref)
    leaf = z.clone().requires_grad_(True)
    (auto_rev,) = torch.autograd.grad(R.kl_exact(leaf, z_ref), leaf)
    (auto_fwd,) = torch.autograd.grad(R.kl_exact(z_ref, leaf), leaf)
    assert torch.allclose(reverse, auto_rev, rtol=1e-12, atol=1e-15)
    assert torch.allclose(forward, auto_fwd, rtol=1e-12, atol=1e-15)
    h = 1e-6
    for v in range(z.numel()):
        e = torch.zeros_like(z)
        e[v] = h
        fd_rev = (R.kl_exact(z + e, z_ref) - R.kl_exact(z - e, z_ref)) / (2 * h)
        fd_fwd = (R.kl_exact(z_ref, z + e) - R.kl_exact(z_ref, z - e)) / (2 * h)
        assert abs(float(fd_rev - reverse[v])) < 1e-8
        assert abs(float(fd_fwd - forward[v])) < 1e-8
    assert (reverse - forward).abs().max() > 1e-2  # the two directions really differ here


# --- exact enumeration of the estimators' expected gradients -------------------------------------
def reference_expectation(z, z_ref, estimator, z_old=None, correction=None, score=False):
    """Independent of autograd: E_s[c·k] and Σ_x π_s(x)·(coefficient of ∇_z log π(x)), with
    ∇_z log π(x) = e_x − π written out as a matrix."""
    p = torch.softmax(z, -1)
    lp, lr = p.log(), torch.log_softmax(z_ref, -1)
    s = p if z_old is None else torch.softmax(z_old, -1)
    d = lp - lr
    k = {"k1": d, "k2": d ** 2 / 2, "k3": torch.exp(-d) + d - 1}[
        "k3" if estimator == "k3+" else estimator]
    dk = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d), "k3+": d}[estimator]
    ratio = p / s
    c = ratio if correction else torch.ones_like(d)
    coef = c * dk  # pathwise part
    if correction == "ratio" or score:  # the ratio's (or π_θ's) own gradient: ρ·k·∇log π
        coef = coef + c * k
    jac = torch.eye(len(z), dtype=F64) - p[None, :]  # row x: ∇_z log π(x)
    return (s * c * k).sum(), ((s * coef)[:, None] * jac).sum(0)


SETTINGS = [  # (use π_old samples, correction, score_function)
    (False, None, False), (False, None, True), (True, None, False),
    (True, "ratio", False), (True, "ratio-sg", False)]


@pytest.mark.parametrize("estimator", R.ESTIMATORS)
@pytest.mark.parametrize("old, correction, score", SETTINGS)
@pytest.mark.parametrize("seed", [0, 3])
def test_enumeration_equals_independent_reference(estimator, old, correction, score, seed):
    z, z_ref, z_old = logits3(V=7, seed=seed)
    z_old = z_old if old else None
    value, grad = R.kl_expectation(z, z_ref, estimator, z_old, correction, score)
    ref_value, ref_grad = reference_expectation(z, z_ref, estimator, z_old, correction, score)
    assert torch.allclose(value, ref_value, rtol=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("V", [2, 6, 50])
def test_on_policy_expected_gradients(seed, V):
    """Samples from π_θ, no score-function term: k1 → 0, k2 → ∇KL(π‖ref), k3 → ∇KL(ref‖π)."""
    z, z_ref, _ = logits3(V=V, seed=seed)
    reverse, forward = R.kl_exact_grads(z, z_ref)
    g = {e: R.kl_expectation(z, z_ref, e)[1] for e in R.ESTIMATORS}
    assert g["k1"].abs().max() < 1e-14
    assert (g["k2"] - reverse).abs().max() < 1e-14
    assert (g["k3"] - forward).abs().max() < 1e-14
    assert (g["k3+"] - reverse).abs().max() < 1e-14
    # and k3's is not the reverse KL's, the KL it estimates
    assert (g["k3"] - reverse).abs().max() > 1e-3 * reverse.abs().max()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_and_score_function_gradients(seed):
    z, z_ref, _ = logits3(seed=seed)
    kl_rev = R.kl_exact(z, z_ref)
    reverse, _ = R.kl_exact_grads(z, z_ref)
    for e in ("k1", "k3", "k3+"):  # unbiased for the value
        assert torch.allclose(R.kl_expectation(z, z_ref, e)[0], kl_rev, rtol=1e-13)
    assert abs(float(R.kl_expectation(z, z_ref, "k2")[0] - kl_rev)) > 1e-4  # k2 is biased
    for e in ("k1", "k3"):  # differentiating E_{π_θ}[k] itself gives ∇KL(π‖ref)
        g = R.kl_expectation(z, z_ref, e, score_function=True)[1]
        assert (g - reverse).abs().max() < 1e-14


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_samples_from_pi_old_and_the_importance_correction(seed):
    z, z_ref, z_old = logits3(seed=seed)
    reverse, forward = R.kl_exact_grads(z, z_ref)
    kl_rev = R.kl_exact(z, z_ref)
    # uncorrected π_old samples: k3's value and gradient are biased for both directions
    v, g = R.kl_expectation(z, z_ref, "k3", z_old)
    assert abs(float(v - kl_rev)) > 1e-3
    assert min((g - reverse).abs().max(), (g - forward).abs().max()) > 1e-3
    # sg(ρ): value and gradient are the on-policy ones (k3 → forward KL's gradient)
    v, g = R.kl_expectation(z, z_ref, "k3", z_old, "ratio-sg")
    assert torch.allclose(v, kl_rev, rtol=1e-13) and (g - forward).abs().max() < 1e-13
    # ρ with its gradient (TRL): the score-function term comes back (k3 → reverse KL's)
    v, g = R.kl_expectation(z, z_ref, "k3", z_old, "ratio")
    assert torch.allclose(v, kl_rev, rtol=1e-13) and (g - reverse).abs().max() < 1e-13
    # ... even when π_old = π_θ, where ρ = 1 but ∇ρ = ∇log π ≠ 0
    g = R.kl_expectation(z, z_ref, "k3", z.clone(), "ratio")[1]
    assert (g - reverse).abs().max() < 1e-13 and (g - forward).abs().max() > 1e-3


# --- the KL loss term ----------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", R.ESTIMATORS)
@pytest.mark.parametrize("correction", R.KL_CORRECTIONS)
def test_kl_loss_value_and_gradient_closed_form(estimator, correction, agg):
    logp, logp_old, logp_ref, _, mask = batch_ref(seed=3)
    beta = 0.04
    leaf = logp.clone().requires_grad_(True)
    loss = R.kl_loss(leaf, logp_ref, mask, beta, estimator, agg, logp_old, correction)
    (auto,) = torch.autograd.grad(loss, leaf)
    k = R.kl_estimate(logp, logp_ref, estimator)
    dk = R.kl_estimate_grad(logp, logp_ref, estimator)
    ratio = (logp - logp_old).exp() if correction else torch.ones_like(logp)
    coef = ratio * dk + (ratio * k if correction == "ratio" else 0)
    w = rlgates.aggregation_weight(mask, agg)
    assert torch.allclose(loss, beta * (w * ratio * k).sum(), rtol=1e-13)
    assert torch.allclose(auto, beta * coef * w, rtol=1e-12, atol=1e-16)
    assert auto[~mask].abs().max() == 0 and auto.abs().max() > 0


def test_kl_loss_finite_differences_and_nan_padding():
    logp, logp_old, logp_ref, _, mask = batch_ref(seed=4, B=3, T=5)
    mask[0, 3:] = False
    leaf = logp.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: R.kl_loss(x, logp_ref, mask, 0.1, "k3", "seq-mean-token-mean", logp_old,
                            "ratio"), (leaf,), eps=1e-7, atol=1e-9, rtol=1e-6)
    padded = logp.masked_fill(~mask, float("nan")).requires_grad_(True)
    ref_pad = logp_ref.masked_fill(~mask, float("-inf"))
    loss = R.kl_loss(padded, ref_pad, mask, 0.1, "k3", logp_old=logp_old, correction="ratio")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(padded.grad).all()
    assert padded.grad[~mask].abs().max() == 0


def test_kl_loss_beta_scales_and_zero_beta_is_zero():
    logp, _, logp_ref, _, mask = batch_ref(seed=5)
    a = R.kl_loss(logp, logp_ref, mask, beta=0.04)
    b = R.kl_loss(logp, logp_ref, mask, beta=0.08)
    assert torch.allclose(2 * a, b, rtol=1e-14) and a > 0
    assert R.kl_loss(logp, logp_ref, mask, beta=0) == 0


def test_low_precision_inputs_are_computed_in_float32():
    logp, _, logp_ref, _, mask = batch_ref(seed=6)
    out = R.kl_loss(logp.bfloat16(), logp_ref.bfloat16(), mask)
    assert out.dtype == torch.float32


# --- entropy ---------------------------------------------------------------------------------------
def test_entropy_against_torch_distributions_and_its_gradient():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 4, 11, generator=g, dtype=F64)
    theirs = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(R.entropy(logits), theirs, rtol=1e-13)
    leaf = logits.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(R.entropy(leaf).sum(), leaf)
    assert torch.allclose(auto, R.entropy_grad(logits), rtol=1e-12, atol=1e-15)
    assert torch.autograd.gradcheck(lambda x: R.entropy(x), (leaf,), eps=1e-7, atol=1e-8)
    # uniform logits: maximal entropy log V, zero gradient
    flat = torch.zeros(1, 1, 11, dtype=F64)
    assert torch.allclose(R.entropy(flat), torch.tensor(11.0, dtype=F64).log())
    assert R.entropy_grad(flat).abs().max() < 1e-15


def test_entropy_bonus_gradient_ignores_the_gate_and_the_mask():
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 5, 9, generator=g, dtype=F64)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 2:] = False
    padded = logits.masked_fill(~mask[..., None], float("nan")).requires_grad_(True)
    beta = 0.01
    for agg in rlgates.AGG_MODES:
        (auto,) = torch.autograd.grad(R.entropy_bonus(padded, mask, beta, agg), padded)
        w = rlgates.aggregation_weight(mask, agg)[..., None]
        expected = torch.where(mask[..., None], -beta * w * R.entropy_grad(logits), 0.0)
        assert torch.allclose(auto, expected, rtol=1e-12, atol=1e-17)
        assert auto[~mask].abs().max() == 0


def test_sampled_token_entropy_estimate_has_zero_expected_gradient():
    z, _, _ = logits3(V=8, seed=9)
    leaf = z.clone().requires_grad_(True)
    logp = torch.log_softmax(leaf, -1)
    h_hat = (logp.exp().detach() * -logp).sum()  # E_π[−log π(y)], π not differentiated
    (g_hat,) = torch.autograd.grad(h_hat, leaf)
    assert torch.allclose(h_hat, R.entropy(z), rtol=1e-14)  # unbiased value
    assert g_hat.abs().max() < 1e-15  # ... and zero expected gradient
    assert R.entropy_grad(z).abs().max() > 1e-2  # while the full entropy's is not zero


# --- KL in the reward against KL in the loss -----------------------------------------------------
@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "sapo"])
def test_kl_placement_token_by_token(name):
    logp, logp_old, logp_ref, adv, mask = batch_ref(seed=10, scale=0.5)
    m = rlgates.get(name)
    beta = 0.2
    out = R.kl_placement(m, logp, logp_old, logp_ref, adv, mask, beta)
    agg = m.agg
    # A' = A − β·Σ_{t'≥t} k1 at rollout, written as a loop
    k1 = torch.where(mask, logp_old - logp_ref, 0.0)
    B, T = logp.shape
    to_go = torch.stack([k1[:, t:].sum(-1) for t in range(T)], -1)
    assert torch.allclose(out.adv_shaped, adv[:, None] - beta * to_go, rtol=1e-13)
    # reward route: exactly the method's eq. (5) gradient at A'; its KL share has the same gate
    assert torch.allclose(out.reward_grad, m.expected_grad(logp, logp_old, out.adv_shaped, mask,
                                                           agg=agg), rtol=1e-12, atol=1e-16)
    task_share = m.expected_grad(logp, logp_old, out.adv_shaped, mask, agg=agg) * torch.where(
        out.adv_shaped != 0, adv[:, None] / out.adv_shaped, 0.0)
    assert torch.allclose(out.reward_grad, task_share + out.reward_kl_grad, rtol=1e-10,
                          atol=1e-15)
    # loss route: the KL gradient is β·(1 − π_ref/π)·w on every token, gate or no gate
    w = rlgates.aggregation_weight(mask, agg)
    assert torch.allclose(out.loss_kl_grad, beta * (1 - (logp_ref - logp).exp()) * w,
                          rtol=1e-12, atol=1e-17)
    assert torch.allclose(out.loss_grad, m.expected_grad(logp, logp_old, adv, mask, agg=agg)
                          + out.loss_kl_grad, rtol=1e-12, atol=1e-16)
    if m.hard:  # a 0/1 gate: some tokens shut
        shut = mask & ~out.open_reward
        assert shut.any()
        assert out.reward_kl_grad[shut].abs().max() == 0 and out.reward_grad[shut].abs().max() == 0
        assert (out.loss_kl_grad[shut] != 0).all()
        shut_loss = mask & ~out.open_loss  # with KL in the loss, the gate sees A itself
        assert torch.equal(out.open_loss, (m.gate((logp - logp_old).exp(), adv[:, None]) > 0)
                           & mask)
        assert (out.loss_grad[shut_loss] == out.loss_kl_grad[shut_loss]).all()


def test_kl_placement_beta_zero_routes_agree():
    logp, logp_old, logp_ref, adv, mask = batch_ref(seed=11)
    out = R.kl_placement(rlgates.get("ppo"), logp, logp_old, logp_ref, adv, mask, beta=0)
    assert torch.equal(out.reward_grad, out.loss_grad)
    assert out.reward_kl_grad.abs().max() == 0 and out.loss_kl_grad.abs().max() == 0


# --- bad input -------------------------------------------------------------------------------------
def test_bad_input_raises_value_error_naming_the_argument():
    logp, logp_old, logp_ref, adv, mask = batch_ref(seed=12)
    z, z_ref, z_old = logits3()
    m = rlgates.get("ppo")
    cases = [
        (lambda: R.kl_loss(logp, logp_ref, beta=-0.1), "beta"),
        (lambda: R.kl_loss(logp, logp_ref, beta=float("nan")), "beta"),
        (lambda: R.kl_loss(logp, logp_ref, beta="big"), "beta"),
        (lambda: R.kl_loss(logp, logp_ref, estimator="k4"), "estimator"),
        (lambda: R.kl_loss(logp, logp_ref[:, :-1]), "logp_ref"),
        (lambda: R.kl_loss(logp[0], logp_ref[0]), "logp"),
        (lambda: R.kl_loss(logp, logp_ref.long()), "logp_ref"),
        (lambda: R.kl_loss(logp.tolist(), logp_ref), "logp"),
        (lambda: R.kl_loss(logp, logp_ref, mask[:, :-1]), "mask"),
        (lambda: R.kl_loss(logp, logp_ref, mask.double() * 2), "mask"),
        (lambda: R.kl_loss(logp, logp_ref, agg="sum"), "agg"),
        (lambda: R.kl_loss(logp, logp_ref, correction="ratio"), "logp_old"),
        (lambda: R.kl_loss(logp, logp_ref, logp_old=logp_old, correction="is"), "correction"),
        (lambda: R.kl_loss(logp, logp_ref, logp_old=logp_old[:1]), "logp_old"),
        (lambda: R.kl_estimate(logp, logp_ref, "k5"), "estimator"),
        (lambda: R.kl_exact(z[None], z_ref[None]), "logits_p"),
        (lambda: R.kl_exact(z, z_ref[:-1]), "logits_q"),
        (lambda: R.kl_expectation(z, z_ref, correction="ratio"), "logits_old"),
        (lambda: R.kl_expectation(z, z_ref, logits_old=z_old, score_function=True),
         "score_function"),
        (lambda: R.kl_expectation(z[:1], z_ref[:1]), "logits"),
        (lambda: R.entropy_bonus(z, beta=0.1), "logits"),
        (lambda: R.entropy_bonus(z[None, None], beta=-1), "beta"),
        (lambda: R.entropy(torch.ones(3, dtype=torch.long)), "logits"),
        (lambda: R.kl_placement("ppo", logp, logp_old, logp_ref, adv), "method"),
        (lambda: R.kl_placement(m, logp, logp_old, logp_ref[:1], adv), "logp_ref"),
        (lambda: R.kl_placement(m, logp, logp_old, logp_ref, adv, beta=-1), "beta"),
        (lambda: R.kl_placement(m, logp, logp_old, logp_ref, adv[:2]), "adv"),
        (lambda: R.kl_placement(m, logp, logp_old, logp_ref, adv, reward_estimator="kl"),
         "estimator"),
    ]
    for call, word in cases:
        with pytest.raises(ValueError, match=word):
            call()
