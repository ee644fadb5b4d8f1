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



def test_masked_sum_product_path_is_the_where_path_bit_for_bit():
    """On the CPU the masked sum multiplies by the 0/1 mask and falls back to `where` when the
    sum is not finite or is 0: the result equals where(mask, v, 0).sum(), sign of zero included,
    with NaN or -0.0 in the padding, empty rows and negative values (both dims)."""
    from rlgates import _numerics as nx

    gen = torch.Generator().manual_seed(0)
    fallbacks = 0
    for trial in range(120):
        B, T = (int(x) for x in torch.randint(1, 7, (2,), generator=gen))
        v = torch.randn(B, T, generator=gen, dtype=torch.float64 if trial % 3 else torch.float32)
        mask = torch.rand(B, T, generator=gen) < float(torch.rand((), generator=gen))
        if trial % 4 == 0:
            v[~mask] = float("nan")
        if trial % 5 == 0:
            v[~mask] = -0.0
        if trial % 7 == 0:
            v = -v.abs()
        for dim in (None, -1):
            want = torch.where(mask, v, 0.0)
            want = want.sum() if dim is None else want.sum(dim)
            got = nx._MaskedSum.apply(v, mask, dim)
            assert torch.equal(torch.signbit(got), torch.signbit(want))
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
            product = v * mask.to(v.dtype)
            product = product.sum() if dim is None else product.sum(dim)
            fallbacks += not torch.equal(product.nan_to_num(7.0), want.nan_to_num(7.0)) or \
                not torch.equal(torch.signbit(product), torch.signbit(want))
    assert fallbacks > 10  # the plain product differs (NaN, a zero's sign): the fallback acts
