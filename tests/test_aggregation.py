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



@pytest.mark.parametrize("slice_size", [None, 8])
def test_masked_sum_ignores_what_the_padding_holds_bit_for_bit(slice_size, monkeypatch):
    """On the CPU the masked sum multiplies by the 0/1 mask a slice of rows at a time, and sums
    again on the zeroed values when the sum is not finite or is 0: padding holding NaN, ±inf,
    -0.0 or any number gives the sum of zero padding bit for bit, sign of zero included (both
    dims, empty rows, negative values), which equals where(mask, v, 0).sum() up to rounding.
    Negative control: the plain product's sum differs (a NaN, a zero's sign), so the fallback
    acts."""
    from rlgates import _numerics as nx

    if slice_size:  # a few rows per slice: the sliced product and sum run on small batches
        monkeypatch.setattr(nx, "_SLICE", slice_size)
    gen = torch.Generator().manual_seed(0)
    fallbacks = 0
    for trial in range(160):
        B = int(torch.randint(1, 13, (), generator=gen))
        T = int(torch.randint(1, 7, (), generator=gen))
        v = torch.randn(B, T, generator=gen, dtype=torch.float64 if trial % 3 else torch.float32)
        mask = torch.rand(B, T, generator=gen) < float(torch.rand((), generator=gen))
        if trial % 7 == 0:
            v = -v.abs()
        clean = torch.where(mask, v, 0.0)
        padded = v.clone()
        padded[~mask] = (float("nan"), float("inf"), -0.0, 1e30)[trial % 4]
        for float_mask in (False, True):
            m = nx.check_mask(mask.to(v.dtype) if float_mask else mask, mask.shape)
            for dim in (None, -1):
                want = nx._MaskedSum.apply(clean, m, dim)
                got = nx._MaskedSum.apply(padded, m, dim)
                assert torch.equal(torch.signbit(got), torch.signbit(want))
                assert torch.equal(got, want)
                by_where = clean.sum() if dim is None else clean.sum(dim)
                torch.testing.assert_close(got, by_where, rtol=1e-6, atol=1e-6)
                product = nx._weighted_sum(padded, mask.to(v.dtype), dim)
                fallbacks += not torch.equal(product.nan_to_num(7.0), want) or \
                    not torch.equal(torch.signbit(product), torch.signbit(want))
    assert fallbacks > 10


def test_a_float_mask_weighs_the_loss_as_it_is_and_is_never_written():
    """A 0/1 float mask of the compute dtype is used as the weights itself (no cast): the loss
    and the gradient equal the bool mask's bit for bit for every method at its default
    aggregation, padding may hold NaN, and the caller's mask is unchanged after backward.
    Negative control: the mask really is the same object the sum reads."""
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
    checked = nx.check_mask(float_mask, (B, T))
    assert nx.given_weights(checked, torch.float32) is not None
    assert nx.given_weights(checked, torch.float32).data_ptr() == float_mask.data_ptr()
    assert nx.given_weights(checked, torch.float64) is None  # another dtype: a cast
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
    """ratio_from_log with a gradient skips the clamp and its range masks when the clamp acts
    nowhere; its value and gradient are torch.clamp(...).exp()'s bit for bit, with log-ratios
    inside ±20, on and beyond the edges (zero gradient there, torch's rule: the edge itself
    passes), and NaN (zero gradient)."""
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
    """strict_clamp's backward multiplies by the inside mask when the gradient is finite, and
    uses `where` otherwise: equal to where(inside, grad, 0) in both cases, 0 outside even when
    the incoming gradient there is NaN or inf."""
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


@pytest.mark.parametrize("slice_size", [None, 8])
def test_a_constant_factor_sums_and_differentiates_as_the_product(slice_size, monkeypatch):
    """aggregate(v, mask, agg, factor=f) is aggregate(v·f, mask, agg) with f a constant, bit for
    bit in value and gradient, for a [B, 1] and a [B, T] factor, every mode, bool and float
    masks, with NaN, ±inf or any number in the padding of v and of f: padding gets a zero
    gradient (no NaN) and f is never written. Negative controls: without the factor the value
    differs, and the plain product of the padding is not finite in some trials (the fallback
    acts)."""
    from rlgates import _numerics as nx

    if slice_size:
        monkeypatch.setattr(nx, "_SLICE", slice_size)
    gen = torch.Generator().manual_seed(5)
    fallbacks = 0
    for trial in range(96):
        B = int(torch.randint(1, 13, (), generator=gen))
        T = int(torch.randint(1, 7, (), generator=gen))
        dtype = torch.float64 if trial % 3 else torch.float32
        mask = torch.rand(B, T, generator=gen) < 0.7
        mask[0, 0] = True  # a real token, so that the factor can matter
        v = torch.randn(B, T, generator=gen, dtype=dtype)
        f = torch.randn((B, 1) if trial % 2 else (B, T), generator=gen, dtype=dtype)
        fill = (float("nan"), float("inf"), -0.0, 1e30)[trial % 4]
        padded_v = torch.where(mask, v, fill)
        padded_f = torch.where(mask, f, fill) if f.shape == mask.shape else f
        kept = padded_f.clone()
        clean_f = torch.where(mask, f, 0.0) if f.shape == mask.shape else f
        for float_mask in (False, True):
            m = mask.to(dtype) if float_mask else mask
            for agg in rlgates.AGG_MODES:
                leaf = padded_v.clone().requires_grad_(True)
                got = rlgates.aggregate(leaf, m, agg, factor=padded_f)
                got.backward()
                plain = torch.where(mask, v, 0.0).requires_grad_(True)
                want = rlgates.aggregate(plain * clean_f, m, agg)
                want.backward()
                assert torch.equal(got.detach(), want.detach())
                assert torch.equal(leaf.grad, plain.grad)  # -0.0 == 0.0 on the padding
                assert not leaf.grad[~mask].any() and torch.isfinite(leaf.grad).all()
                assert torch.equal(padded_f.view(torch.uint8), kept.view(torch.uint8))
                assert not torch.equal(got.detach(), rlgates.aggregate(plain, m, agg))
        fallbacks += not bool(torch.isfinite(nx._weighted_sum(padded_v, mask.to(dtype), None,
                                                              padded_f)))
    assert fallbacks > 10


def test_with_slope_is_the_value_with_the_given_derivative():
    """nx.with_slope(v, x, s) has v's value and the derivative s in x (DRO's square uses it):
    as autograd's own graph of x² - 3x, against a finite difference too. Negative control: a
    wrong slope gives another gradient."""
    from rlgates import _numerics as nx

    x = torch.randn(4, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    leaf, plain = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = nx.with_slope(x * x - 3 * x, leaf, 2 * x - 3)
    assert torch.equal(out.detach(), x * x - 3 * x)
    (out * x.cos()).sum().backward()
    ((plain * plain - 3 * plain) * x.cos()).sum().backward()
    torch.testing.assert_close(leaf.grad, plain.grad, rtol=1e-12, atol=1e-15)
    h = 1e-6
    fd = ((x + h) ** 2 - 3 * (x + h) - ((x - h) ** 2 - 3 * (x - h))) / (2 * h) * x.cos()
    torch.testing.assert_close(leaf.grad, fd, rtol=1e-8, atol=1e-8)
    wrong = x.clone().requires_grad_(True)
    (nx.with_slope(x * x - 3 * x, wrong, x - 3) * x.cos()).sum().backward()
    assert not torch.allclose(wrong.grad, plain.grad)
