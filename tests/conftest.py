import math

import pytest
import torch

import rlgates

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
