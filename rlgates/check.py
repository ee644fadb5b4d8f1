"""The generic check of eq. 5: autograd's gradient of `loss` equals gate·ρ·A·(agg weight)."""

from __future__ import annotations

import torch

from .methods import get


def check_gradient(method, logp, logp_old, adv, mask=None, agg=None, is_weight=None):
    """Return (autograd gradient, closed-form gradient, max abs difference) of `method.loss`.

    agg None: the method's own default aggregation. Float32 caveat: SAPO's closed-form gate
    sech² stays positive out to ρ ≈ 95 in float32, while autograd's derivative through the
    sigmoid underflows to 0 from ρ ≈ 18; compare in float64 there.
    """
    method = get(method) if isinstance(method, str) else method
    leaf = logp.detach().clone().requires_grad_(True)
    loss = method.loss(leaf, logp_old, adv, mask, agg, is_weight=is_weight)
    (autograd,) = torch.autograd.grad(loss, leaf)
    closed = method.expected_grad(logp, logp_old, adv, mask, agg, is_weight=is_weight)
    closed = closed.to(autograd.dtype)
    return autograd, closed, float((autograd - closed).abs().max())

