"""Pick the best torch device, and size demos by it."""

from __future__ import annotations

import torch


def device() -> torch.device:
    """The best available device: cuda, then mps, then cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def on_accelerator(dev=None) -> bool:
    """True on cuda or mps: demos then choose their large configuration."""
    return torch.device(dev or device()).type != "cpu"
