"""The generic check of eq. 5: autograd's gradient of `loss` equals gate·ρ·A·(agg weight)."""

from __future__ import annotations

import torch

from .methods import get


def check_gradient(method, logp, logp_old, adv, mask=None, agg="token-mean"):
    """Return (autograd gradient, closed-form gradient, max abs difference) of `method.loss`."""
    method = get(method) if isinstance(method, str) else method
    leaf = logp.detach().clone().requires_grad_(True)
    (autograd,) = torch.autograd.grad(method.loss(leaf, logp_old, adv, mask, agg), leaf)
    closed = method.expected_grad(logp, logp_old, adv, mask, agg).to(autograd.dtype)
    return autograd, closed, float((autograd - closed).abs().max())

