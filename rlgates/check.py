"""The generic check of eq. 5: autograd's gradient of `loss` equals gate·ρ·A·(agg weight)."""

from __future__ import annotations

import torch

from .methods import get


def check_gradient(method, logp, logp_old, adv, mask=None, agg=None, is_weight=None, side=None):
    """Return (autograd gradient, closed-form gradient, max abs difference) of `method.loss`.

    agg None: the method's own default aggregation. SAPO's backward uses its closed-form gate
    sech², so in float32 the two agree out to ρ ≈ 91, where that gate underflows (autograd's
    derivative of the sigmoid itself would be 0 from ρ ≈ 18; tests/test_gradients.py). A loss
    that does not depend on logp at all (an f that ignores ρ, or detaches it) has gradient 0.
    side: an rlgates.SideInfo for a method with `side_inputs`; both gradients see the same
    (completed) side information.
    """
    method = get(method) if isinstance(method, str) else method
    leaf = logp.detach().clone().requires_grad_(True)
    loss = method.loss(leaf, logp_old, adv, mask, agg, is_weight=is_weight, side=side)
    autograd = (torch.autograd.grad(loss, leaf)[0] if loss.requires_grad
                else torch.zeros_like(leaf))
    closed = method.expected_grad(logp, logp_old, adv, mask, agg, is_weight=is_weight, side=side)
    closed = closed.to(autograd.dtype)
    return autograd, closed, float((autograd - closed).abs().max())

