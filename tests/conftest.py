import gc
import math

import pytest
import torch

import rlgates


def pytest_collection_finish(session):
    """Move what collection imported (torch, matplotlib, the test modules: some 10^5 objects)
    out of the cyclic collector's sight: its full collections, which walk every tracked
    object, then cost milliseconds instead of about a tenth of the suite's time."""
    gc.freeze()


#: Every built-in method, from the registry (a method added as one class is tested here too).
METHODS = rlgates.names()
#: The methods whose gate is 0 or 1 everywhere.
HARD = [n for n in METHODS if rlgates.REGISTRY[n].hard]


def make_batch(B=6, T=9, scale=0.3, seed=0, dtype=torch.float64, per_token_adv=False):
    """A random batch with ragged masks: one sequence fully masked, the others of varied length."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = logp_old + scale * torch.randn(B, T, generator=g, dtype=dtype)
    shape = (B, T) if per_token_adv else (B,)
    adv = torch.randn(*shape, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0  # a fully masked sequence
    return logp, logp_old, adv, rlgates.ragged_mask(lengths, T)


def side_for(method, shape, seed=0, dtype=torch.float64, plane=False):
    """A valid rlgates.SideInfo of `shape` for a method with side inputs (None for a gate of
    (ρ, A) alone): the fields no batch gives (entropy, sampler_logp, a random draw), so that
    `loss` derives the others from the batch; plane=True adds every other field too (π_old,
    a covariance, a pick), as `gate`, `weight` and `signal` read them on a grid."""
    m = rlgates.get(method) if isinstance(method, str) else method
    if not m.side_inputs:
        return None
    g = torch.Generator().manual_seed(seed)

    def uniform():
        return torch.rand(tuple(shape), generator=g, dtype=dtype)

    fields = {"entropy": 2 * uniform(), "sampler_logp": -3 * uniform(), "draw": uniform()}
    if plane:
        fields.update(probs_old=0.05 + 0.9 * uniform(), cov=uniform() - 0.5,
                      picked=uniform() < 0.3)
    return rlgates.SideInfo(**fields)


def held(name, **hparams):
    """rlgates.get(name, **hparams), and for a method with side inputs the same method with
    its side information held fixed at `side_for`'s values as numbers (they broadcast to any
    batch): the loss's calls get the fields no batch gives, the elementwise ones every field.
    The generic tests of inputs, shapes and figures call this instead of rlgates.get."""
    m = rlgates.get(name, **hparams)
    if not m.side_inputs:
        return m
    batch_side, plane_side = side_for(m, ()), side_for(m, (), plane=True)

    class Held(type(m)):
        def loss(self, logp, logp_old, adv, mask=None, agg=None, is_weight=None, side=None):
            return super().loss(logp, logp_old, adv, mask, agg, is_weight, side or batch_side)

        def expected_grad(self, logp, logp_old, adv, mask=None, agg=None, is_weight=None,
                          side=None):
            return super().expected_grad(logp, logp_old, adv, mask, agg, is_weight,
                                         side or batch_side)

        def token_gate(self, logp, logp_old, adv, mask=None, side=None):
            return super().token_gate(logp, logp_old, adv, mask, side or batch_side)

        def weight(self, ratio, adv, side=None):
            return super().weight(ratio, adv, side or plane_side)

        def gate(self, ratio, adv, side=None):
            return super().gate(ratio, adv, side or plane_side)

        def signal(self, ratio, adv, side=None):
            return super().signal(ratio, adv, side or plane_side)

        def objective(self, ratio, adv, side=None):
            return super().objective(ratio, adv, side or plane_side)

    Held.__name__ = Held.__qualname__ = type(m).__name__
    return Held(**m.hparams)


@pytest.fixture(params=METHODS)
def name(request):
    return request.param


@pytest.fixture(params=list(rlgates.AGG_MODES))
def agg(request):
    return request.param


def straddle_edges(method, logp, logp_old, scale=3e-4):
    """For GSPO, whose edges are ±3-4e-4 in log ρ_s, move the batch to straddle them."""
    if method.level == "sequence":
        return logp_old + scale * torch.randn_like(logp)
    return logp


def away_from_kinks(method, logp, logp_old, gap=1e-3, shift=3e-3):
    """Move every token's ratio at least `gap` in log ρ away from each of the gate's edges, so
    that a finite-difference step never crosses a kink."""
    for ratio, _ in method.bounds():
        near = ((logp - logp_old) - math.log(ratio)).abs() < gap
        logp = torch.where(near, logp + shift, logp)
    return logp


def smooth_at(method, ratio, adv, side=None, step=2e-6, jump=1e-3):
    """Where the gate has no edge within ±`step`·ρ: a finite difference there sees no kink.
    For a gate whose edges `bounds()` cannot list (they move with the side information)."""
    lo = method.gate(ratio * (1 - step), adv, side)
    hi = method.gate(ratio * (1 + step), adv, side)
    return (lo - hi).abs() < jump

