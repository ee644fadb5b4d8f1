"""The aggregation modes, Dr. GRPO's constant normaliser in particular."""


import pytest
import torch

import rlgates
from tests.conftest import make_batch

F64 = torch.float64

def t(x):
    return torch.as_tensor(x, dtype=F64)

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


def test_norm_mode_is_accepted_and_unknown_modes_are_not():
    assert NORM in rlgates.AGG_MODES
    logp, logp_old, adv, mask = make_batch()
    with pytest.raises(ValueError, match="agg"):
        rlgates.get("cispo").loss(logp, logp_old, adv, mask, "seq-sum")



def test_aggregate_ignores_what_the_padding_holds():
    """Padding holding NaN, ±inf, -0.0 or 1e30 adds nothing to any mode's value and gets zero
    gradient; the value equals the verl-style sum of v·m over a float mask of clean values.
    Negative control: the plain product with the padded values is not finite or differs."""
    import rlgates

    gen = torch.Generator().manual_seed(0)
    differs = 0
    for trial in range(60):
        B = int(torch.randint(1, 9, (), generator=gen))
        T = int(torch.randint(1, 7, (), generator=gen))
        v = torch.randn(B, T, generator=gen, dtype=torch.float64)
        mask = torch.rand(B, T, generator=gen) < 0.6
        mask[0, 0] = True
        padded = v.clone()
        padded[~mask] = (float("nan"), float("inf"), -0.0, 1e30)[trial % 4]
        m = mask.double()
        for agg in rlgates.AGG_MODES:
            leaf = padded.clone().requires_grad_(True)
            got = rlgates.aggregate(leaf, mask, agg)
            got.backward()
            clean = torch.where(mask, v, 0.0)
            assert torch.allclose(got, rlgates.aggregate(clean, m, agg), rtol=1e-15, atol=0)
            assert torch.equal(leaf.grad[~mask], torch.zeros(int((~mask).sum()), dtype=v.dtype))
            if agg == "token-mean":
                want = (clean * m).sum() / m.sum()
                assert torch.allclose(got, want, rtol=1e-14, atol=1e-300)
        differs += not torch.equal((padded * m).sum(), (v * m).sum())
    assert differs > 10


def test_a_float_mask_weighs_the_loss_as_it_is_and_is_never_written():
    """A 0/1 float mask gives the loss and the gradient of the bool mask bit for bit for every
    method at its default aggregation, padding may hold NaN, and the caller's mask is unchanged
    after backward."""
    import rlgates
    from rlgates import _numerics as nx

    gen = torch.Generator().manual_seed(3)
    B, T = 5, 9
    logp_old = -torch.rand(B, T, generator=gen) * 3
    logp = logp_old + 0.3 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    mask = nx.ragged_mask(torch.tensor([9, 4, 0, 7, 1]), T)
    logp[~mask] = float("nan")
    float_mask = mask.float()
    kept = float_mask.clone()
    for name in rlgates.names():
        m = rlgates.get(name)
        side = None
        if m.side_inputs:
            side = rlgates.SideInfo(**{k: v for k, v in {
                "entropy": torch.rand(B, T, generator=gen),
                "sampler_logp": logp_old - 0.1,
                "draw": torch.rand(B, T, generator=gen)}.items()
                if k in set(m.side_inputs) | ({"draw"} if name == "clip_cov" else set())})
        grads = []
        for mk in (mask, float_mask):
            leaf = logp.clone().requires_grad_(True)
            loss = m.loss(leaf, logp_old, adv, mk, side=side)
            loss.backward()
            grads.append((loss.detach(), leaf.grad))
        assert torch.equal(grads[0][0], grads[1][0]), name
        assert torch.isfinite(grads[1][0]), name
        assert torch.equal(grads[0][1], grads[1][1]), name
        assert torch.equal(grads[1][1][~mask], torch.zeros(int((~mask).sum()))), name
        assert torch.equal(float_mask, kept), name


@pytest.mark.parametrize("kind", ["inside", "clamped", "nan"])
def test_the_ratio_is_torch_clamp_then_exp_bit_for_bit(kind):
    """ratio_from_log's value and gradient are torch.clamp(...).exp()'s bit for bit, with
    log-ratios inside ±20, on and beyond the edges (zero gradient there, torch's rule: the edge
    itself passes), and NaN (zero gradient)."""
    from rlgates import _numerics as nx

    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(6, 7, generator=gen, dtype=dtype) * 3
        if kind == "clamped":
            x[0, :4] = torch.tensor([20.0, -20.0, 25.0, -31.0], dtype=dtype)
        if kind == "nan":
            x[1, 2] = float("nan")
        g = torch.randn(6, 7, generator=gen, dtype=dtype)
        got_x, want_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        got = nx.ratio_from_log(got_x * 1)  # a non-leaf, as in the losses
        want = torch.clamp(want_x * 1, -nx.LOG_RATIO_CLAMP, nx.LOG_RATIO_CLAMP).exp()
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0))
        got.backward(g)
        want.backward(g)
        assert torch.equal(got_x.grad, want_x.grad)
        if kind == "clamped":  # the control: the clamp acted
            assert got_x.grad[0, 2] == 0 and got_x.grad[0, 0] != 0
        if kind == "nan":
            assert got_x.grad[1, 2] == 0


def test_strict_clamp_backward_is_where_and_zero_outside_even_for_nan():
    """strict_clamp's backward is where(inside, grad, 0): 0 outside, even when the incoming
    gradient there is NaN or inf, and 0 at the edges themselves."""
    from rlgates import _numerics as nx

    x = torch.linspace(0.0, 8.0, 41, dtype=torch.float64)
    inside = (x > 0.7) & (x < 6.0)
    for bad in (None, float("nan"), float("inf")):
        g = torch.linspace(-1.0, 1.0, 41, dtype=torch.float64)
        if bad is not None:
            g[0] = bad  # outside the window
        leaf = x.clone().requires_grad_(True)
        nx.strict_clamp(leaf, 0.7, 6.0).backward(g)
        assert torch.equal(leaf.grad, torch.where(inside, g, 0.0))
        assert leaf.grad[0] == 0
