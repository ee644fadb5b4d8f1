"""The lab's optimiser and its per-run gradient clip, shared by the policy and the critic."""

from __future__ import annotations

import torch


def _adam(params, lr):
    """torch.optim.Adam, its fused kernel where this torch and device have one (measured: a
    fifth faster a lab step on the CPU; the same update up to rounding)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def _clip_grad_norm_per_run(params, max_norm):
    """Each run's gradient norm over all parameters ([R]); scale a run's gradients to
    `max_norm` when its norm is larger (torch.nn.utils.clip_grad_norm_, run by run)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.cat([g.flatten(1) for g in grads], 1).norm(dim=1)
    if max_norm:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *[1] * (g.dim() - 1)))
    return norm
