"""The lab's optimiser and its per-run gradient clip, shared by the policy and the critic."""

from __future__ import annotations

import torch


def _adam(params, lr):
    """torch.optim.Adam(params, lr=lr), fused (`fused=True`, torch's documented fused kernel)
    where every parameter is on the CPU or CUDA, the default implementation elsewhere. Fused,
    so that the lab's numbers stay what they were bit for bit (it called this kernel itself
    before); the default differs from it in the last bits, no faster a lab step on the CPU
    (measured). Its first construction in a process imports torch._dynamo, 1 to 2 s."""
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=lr, fused=True if fused else None)


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
