"""The lab's optimiser and its per-run gradient clip, shared by the policy and the critic."""

from __future__ import annotations

import torch


def _adam(params, lr):
    """Adam with its fused kernel where this torch and device have one (measured: a fifth
    faster a lab step on the CPU; the same update up to rounding), else torch.optim.Adam."""
    params = list(params)
    if hasattr(torch, "_fused_adam_") and all(p.device.type in ("cpu", "cuda") for p in params):
        return _FusedAdam(params, lr)
    return torch.optim.Adam(params, lr=lr)


class _FusedAdam:
    """torch.optim.Adam(params, lr, fused=True), its state and its kernel called directly.

    Bit for bit the same update (tests/test_lab.py checks it against torch.optim.Adam). Why not
    torch.optim: its first optimizer imports torch._dynamo and torch.distributed, about a
    second per process, a fifth of a short lab run (each chapter's kernel paid it)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, (self.beta1, self.beta2), self.eps = list(params), lr, betas, eps
        self.state = {}  # param -> (step, exp_avg, exp_avg_sq), made at its first gradient

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        groups = {}  # (device, dtype) -> the lists the kernel takes, as torch.optim groups them
        for p in self.params:
            if p.grad is None:
                continue
            if p not in self.state:  # torch.optim's lazy state: a float32 step on p's device
                self.state[p] = (torch.zeros((), dtype=torch.float32, device=p.device),
                                 torch.zeros_like(p, memory_format=torch.preserve_format),
                                 torch.zeros_like(p, memory_format=torch.preserve_format))
            step, exp_avg, exp_avg_sq = self.state[p]
            group = groups.setdefault((p.device, p.dtype), ([], [], [], [], []))
            for lst, t in zip(group, (p, p.grad, exp_avg, exp_avg_sq, step), strict=True):
                lst.append(t)
        for params, grads, exp_avgs, exp_avg_sqs, steps in groups.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                               lr=self.lr, beta1=self.beta1, beta2=self.beta2,
                               weight_decay=0.0, eps=self.eps, maximize=False,
                               grad_scale=None, found_inf=None)


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
