import pytest
import torch

import rlgates

PART_ONE = ["ppo", "grpo", "dapo", "sao", "sapo", "gspo"]


def make_batch(B=6, T=9, scale=0.3, seed=0, dtype=torch.float64, per_token_adv=False):
    """A random batch with ragged masks: one sequence fully masked, the others of varied length."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = logp_old + scale * torch.randn(B, T, generator=g, dtype=dtype)
    shape = (B, T) if per_token_adv else (B,)
    adv = torch.randn(*shape, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0  # a fully masked sequence
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logp, logp_old, adv, mask


@pytest.fixture(params=PART_ONE)
def name(request):
    return request.param


@pytest.fixture(params=list(rlgates.AGG_MODES))
def agg(request):
    return request.param
