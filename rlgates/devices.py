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


def synchronize(dev) -> None:
    """Wait for queued kernels, so that a wall-clock time covers the work (no-op on the CPU)."""
    kind = torch.device(dev).type
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()


def time_step(step, dev, reps: int = 20, warmup: int = 3) -> float:
    """Seconds per call of the zero-argument `step`, after `warmup` calls, synchronised on `dev`."""
    import time

    for _ in range(warmup):
        step()
    synchronize(dev)
    start = time.perf_counter()
    for _ in range(reps):
        step()
    synchronize(dev)
    return (time.perf_counter() - start) / reps


def compare_devices(make_step, dev, reps: int = 20, label: str = "loss + backward") -> dict:
    """Time the same step on the CPU and on `dev`; print both and the speed-up; return the times.

    `make_step(device)` moves the data to `device` and returns a zero-argument callable that runs
    one step there.
    """
    times = {}
    for d in dict.fromkeys([torch.device("cpu"), torch.device(dev)]):
        times[str(d)] = time_step(make_step(d), d, reps)
    line = ", ".join(f"{d}: {t * 1e3:.2f} ms" for d, t in times.items())
    if len(times) == 2:
        cpu, acc = times.values()
        line += f" (speed-up {cpu / acc:.1f}x)"
    print(f"{label}: {line}")
    return times


def time_loss(method, batch, dev, reps: int = 20, agg=None):
    """On an accelerator: time `method.loss` forward + backward on `batch` (logp, logp_old, adv,
    mask) on the CPU and on `dev`, print both and the speed-up, and return the times. On the
    CPU alone there is nothing to compare: it returns None and prints nothing.
    """
    if not on_accelerator(dev):
        return None
    logp, logp_old, adv, mask = batch

    def make_step(d):
        lp, lo, a = (t.detach().to(d) for t in (logp, logp_old, adv))
        mk = None if mask is None else mask.to(d)
        leaf = lp.requires_grad_(True)

        def step():
            leaf.grad = None
            method.loss(leaf, lo, a, mk, agg).backward()

        return step

    label = f"{method.title or method.name}: loss + backward on {logp.numel()} tokens"
    return compare_devices(make_step, dev, reps, label)
