"""Loss forward + backward throughput of every method beside a plain trainer-style reference.

    python benchmarks/bench.py                 # 1M and 8M tokens, cpu (and cuda if present)
    python benchmarks/bench.py --tokens 1 --devices cpu --methods ppo sapo

For each (method, size, device) it prints the time per step of rlgates and of the reference
(`rlgates.reference`, the big trainers' eager style) run in the same process, as the median of
--reps steps with their min-max spread, their ratio (rlgates / reference: ≤ 1.0 means no
slower) with the min-max of the ratios of the steps run side by side (one of each per repeat,
so that they share the machine's load), the ratio against the reference given a mask that needs
no cast (ref0), the ratio of CPU times (steadier on a shared machine) with its paired min-max,
and the peak memory of each. A method that reads side information gets the fields no batch
gives (entropy, the sampler's log-probs, Clip-Cov's random draw), the same for both; the
references of those methods are `rlgates.reference.SIDE_REFERENCES`. Peak memory is measured
in a fresh subprocess per implementation: the rise of the peak RSS during one step on the CPU, and
torch.cuda.max_memory_allocated on cuda. It also times a slider redraw and, when present, the
training lab's throughput.

On the CPU a new tensor of a few MB or more can cost more than the arithmetic on it: glibc gives
large freed blocks back to the kernel, and the next step pays a page fault per 4 kB. Whether a
1M-token step's tensors fault depends on what the process freed before, so the 1M ratios of the
cheapest losses move between runs; the 8M ones are steady. To time the arithmetic alone, keep
freed memory in the process:

    MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000 python benchmarks/bench.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import rlgates
from rlgates import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METHODS = rlgates.names()
MASKS = {"bool": torch.bool, "float": torch.float32}  # float: 0/1, as trainers pass it


def make_inputs(tokens, device, dtype=torch.float32, seed=0, mask_dtype=torch.bool):
    """Ragged [B, T] inputs, made in place so that making them needs no large temporaries."""
    T = 1024 if tokens <= 2**20 else 2048
    B = tokens // T
    g = torch.Generator(device="cpu").manual_seed(seed)
    logp_old = torch.rand(B, T, generator=g).mul_(-3)
    logp = torch.randn(B, T, generator=g).mul_(0.2).add_(logp_old)
    adv = torch.randn(B, generator=g)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(mask_dtype)
    return (*(x.to(device, dtype) for x in (logp, logp_old, adv)), mask.to(device))


def side_info(name, logp):
    """The side information no batch gives, for a method that reads it (None otherwise): each
    token's entropy, the sampler's log-probs or a random draw (Clip-Cov's pick), as the tests
    make them. Both implementations get the same; each derives the rest (π_old, the
    covariance) itself."""
    m = rlgates.get(name)
    if not m.side_inputs:
        return None
    g = torch.Generator(device="cpu").manual_seed(1)
    fields = {"entropy": torch.rand(logp.shape, generator=g).mul_(2),
              "sampler_logp": torch.rand(logp.shape, generator=g).mul_(-3),
              "draw": torch.rand(logp.shape, generator=g)}
    wanted = set(m.side_inputs) | ({"draw"} if name == "clip_cov" else set())
    return rlgates.SideInfo(**{k: v.to(logp.device) for k, v in fields.items() if k in wanted})


def step_fn(name, impl, side=None):
    m = rlgates.get(name)
    agg = m.agg  # each method's own default aggregation, for both implementations
    if impl == "rlgates":
        return lambda lp, lo, a, mk: m.loss(lp, lo, a, mk, agg, side=side)
    return lambda lp, lo, a, mk: reference.reference_loss(name, lp, lo, a, mk, agg, side=side,
                                                          **m.hparams)


def one_step(fn, logp, logp_old, adv, mask):
    leaf = logp.detach().requires_grad_(True)
    fn(leaf, logp_old, adv, mask).backward()
    return leaf.grad


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_pair(name, tokens, device, reps, mask_dtype=torch.bool):
    """Seconds per step of rlgates, the reference, and the reference given its mask already in
    the compute dtype ("ref0": it casts nothing; with a float mask it is the reference itself),
    interleaved to share the noise, in alternating order. Returns {impl: (median, min, max,
    median CPU seconds)} and {"wall": [...], "cpu": [...]}, the ratios rlgates / reference of
    each repeat's pair of steps.
    The CPU time (this process's, all threads) is steadier than the wall time on a shared
    machine."""
    inputs = make_inputs(tokens, device, mask_dtype=mask_dtype)
    side = side_info(name, inputs[0])
    runs = {impl: (step_fn(name, impl, side), inputs) for impl in ("rlgates", "reference")}
    if mask_dtype != inputs[0].dtype:
        runs["ref0"] = (runs["reference"][0], (*inputs[:3], inputs[3].to(inputs[0].dtype)))
    for fn, args in runs.values():  # warm up
        one_step(fn, *args)
    wall, cpu = {impl: [] for impl in runs}, {impl: [] for impl in runs}
    order = list(runs.items())
    for rep in range(reps):
        # each other repeat runs the reference first: a step inherits the allocator's state (the
        # pages the step before it freed), so neither side always comes second
        for impl, (fn, args) in (order if rep % 2 == 0 else order[::-1]):
            sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            one_step(fn, *args)
            sync(device)
            wall[impl].append(time.perf_counter() - start)
            cpu[impl].append(time.process_time() - start_cpu)
    out = {impl: (statistics.median(t), min(t), max(t), statistics.median(cpu[impl]))
           for impl, t in wall.items()}
    out.setdefault("ref0", out["reference"])
    paired = {kind: [a / b for a, b in zip(times["rlgates"], times["reference"],
                                                 strict=True)]
              for kind, times in (("wall", wall), ("cpu", cpu))}
    return out, paired


class PeakTensorMemory(TorchDispatchMode):
    """Counts the bytes of every tensor storage an op creates, until it is freed; keeps the peak.

    Storages that exist before the mode starts (the inputs) are not counted, so the peak is the
    extra memory of the step. Deterministic, unlike sampling the process's RSS.
    """

    def __init__(self, *existing):
        super().__init__()
        self.live = self.peak = 0
        self.seen = {t.untyped_storage().data_ptr() for t in existing}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self.seen:
                continue
            self.seen.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key, size):
        self.live -= size
        self.seen.discard(key)


def peak_memory(name, impl, tokens, device, mask_dtype=torch.bool):
    """Extra peak memory (bytes) of one step over its inputs."""
    inputs = make_inputs(tokens, device, mask_dtype=mask_dtype)
    fn = step_fn(name, impl, side_info(name, inputs[0]))
    one_step(fn, *inputs)  # warm up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        one_step(fn, *inputs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with PeakTensorMemory(*inputs) as tracker:
        one_step(fn, *inputs)
    return tracker.peak


def slider_redraw_ms(n=20):
    """Notebook slider (rlgates.explore("dapo")): ms per move within the default axis, ms per move
    that widens or narrows the log ρ axis (the static frame is redrawn too), and the PNG's size."""
    import io

    import matplotlib
    from PIL import Image

    matplotlib.use("Agg")
    box = rlgates.explore("dapo")
    slider = box.sliders["eps_high"]
    start = time.perf_counter()
    for i in range(n):
        slider.value = 0.3 + 0.01 * (i % 10)
    inside = (time.perf_counter() - start) / n * 1000
    start = time.perf_counter()
    for i in range(n // 2):  # beyond the default axis and back: the axis follows the bound
        slider.value = 4.0 if i % 2 == 0 else 0.3
    widen = (time.perf_counter() - start) / (n // 2) * 1000
    size = Image.open(io.BytesIO(box.image.value)).size
    return inside, widen, size


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8], help="millions (2^20)")
    parser.add_argument("--devices", nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--masks", nargs="+", default=list(MASKS), choices=list(MASKS))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; median of {args.reps} steps "
          "[min-max] in ms; ratio = rlgates / reference median (≤ 1.0 is no slower) [min-max "
          "of the repeats' paired ratios]; ref0: the reference given its mask in the compute "
          "dtype (casts nothing); cpu: the ratio of median CPU times [paired min-max]")
    header = (f"{'method':<9} {'mask':<5} {'tokens':>6} {'device':<6} {'rlgates ms':>17} "
              f"{'ref ms':>17} {'ratio [paired]':>17} {'ref0':>6} {'cpu [paired]':>17} "
              f"{'rlgates MB':>11} "
              f"{'ref MB':>8} {'mem ratio':>9}")
    print(header)
    print("-" * len(header))
    rows = []
    for device in devices:
        for millions in args.tokens:
            tokens = millions * 2**20
            for name in args.methods:
                for mask_name in args.masks:
                    md = MASKS[mask_name]
                    t, paired = time_pair(name, tokens, device, args.reps, md)
                    if args.no_memory:
                        mem = {"rlgates": float("nan"), "reference": float("nan")}
                    else:
                        mem = {impl: peak_memory(name, impl, tokens, device, md) / 2**20
                               for impl in ("rlgates", "reference")}
                    rl, ref = t["rlgates"], t["reference"]
                    row = (name, mask_name, f"{millions}M", device, rl[0] * 1e3, ref[0] * 1e3,
                           rl[0] / ref[0], mem["rlgates"], mem["reference"],
                           mem["rlgates"] / mem["reference"] if mem["reference"] else float("nan"),
                           rl[0] / t["ref0"][0], rl[3] / ref[3])
                    rows.append(row)
                    spread = {k: f"[{v[1] * 1e3:.0f}-{v[2] * 1e3:.0f}]" for k, v in t.items()}
                    pair = {k: f"[{min(v):.2f}-{max(v):.2f}]" for k, v in paired.items()}
                    print(f"{row[0]:<9} {row[1]:<5} {row[2]:>6} {row[3]:<6} "
                          f"{row[4]:>7.1f} {spread['rlgates']:>9} {row[5]:>7.1f} "
                          f"{spread['reference']:>9} {row[6]:>5.2f} {pair['wall']:>11} "
                          f"{row[10]:>6.2f} {row[11]:>5.2f} {pair['cpu']:>11} "
                          f"{row[7]:>11.0f} {row[8]:>8.0f} {row[9]:>9.2f}",
                          flush=True)
    inside, widen, (w, h) = slider_redraw_ms()
    print(f"\nslider redraw (dapo, blitted {w}x{h} PNG): {inside:.1f} ms per move, "
          f"{widen:.1f} ms per move that resizes the log ρ axis")
    try:
        from lab_throughput import lab_throughput
    except ImportError:
        return rows
    for device in devices:
        print(f"lab throughput on {device}: {lab_throughput(device)}")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    main()
