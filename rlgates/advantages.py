"""GRPO's group-relative advantages."""

from __future__ import annotations

import torch

#: Added to the group's std before dividing, as one large trainer does (another uses 1e-4).
STD_EPS = 1e-6


def group_advantages(rewards, normalize_std: bool = True, eps: float = STD_EPS):
    """A_i = (r_i − mean of the group) / (std of the group + eps), per row.

    rewards: [num_prompts, G], one row per prompt's group of G sampled responses.
    The std is torch's unbiased one (divides by G − 1). With normalize_std=False (Dr. GRPO) the
    advantage is r_i − mean, with no division. A group whose rewards are all equal gets A = 0.
    """
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if r.dim() != 2:
        raise ValueError(f"rewards must be [num_prompts, G], got shape {tuple(r.shape)}")
    if r.shape[1] < 2:
        raise ValueError(f"a group needs G ≥ 2 samples to have a baseline, got G={r.shape[1]}")
    if eps < 0:
        raise ValueError(f"eps must be ≥ 0, got {eps}")
    centered = r - r.mean(dim=1, keepdim=True)
    if not normalize_std:
        return centered
    return centered / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
