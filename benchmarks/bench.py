"""Loss forward + backward of every method beside a plain reference, at three sizes.

    python benchmarks/bench.py                        # 512, 8,960 and 1M tokens; cpu (+ cuda)
    python benchmarks/bench.py --devices cuda cpu --methods ppo sapo --sizes 32x16 1M
    python benchmarks/bench.py --memory --lab          # also peak memory, the lab's throughput

For each (device, method, mask, size) it times `m.loss(logp, logp_old, adv, mask).backward()`
and the same formula written as verl writes it (`rlgates.reference`: clamp the log-ratio to
±20, exp, the method's gate, the method's aggregation as `(L*m).sum()/m.sum()`, no input
checks), in this one process, on one CPU thread (--threads), one step of each per repeat, the
order alternating between repeats so that neither always runs second. It prints the median of
each, their ratio (rlgates / reference) with the min-max of the repeats' paired ratios, and at
the smallest size the difference of the medians in µs: the fixed cost of rlgates' input checks.

The sizes, and the targets the summary checks (README.md, "Benchmark"):
    512 tokens   32x16      a chapter demo         rlgates - reference < 100 µs a call
    8,960        1120x8     the lab's minibatch    ratio ≤ 1.15
    1M           1024x1024                         ratio ≤ 1.25
The masks are ragged: each row's length is uniform in [T/4, T]. A method that reads side
information gets the fields no batch gives (entropy, the sampler's log-probs, Clip-Cov's random
draw), the same for both. Before timing, each pair's values and gradients are compared; a
mismatch is flagged in the table (the tests check the same in float64).

Wall-clock timings on a shared machine: the load average is printed at the start and the end;
read ratios on a busy 2-core machine as ±10-15 % (--clock cpu times the CPU's steps by this
process's CPU time, which preemption does not inflate; the cache and memory bandwidth others use
still count). The 1M size takes fewer repeats (--reps to
change). On the CPU a new tensor of a few MB can cost more than the arithmetic on it (glibc
returns large freed blocks to the kernel; the next step pays the page faults), so the 1M ratios
of the cheapest losses move between runs. To time the arithmetic alone:

    MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000 python benchmarks/bench.py
"""

from __future__ import annotations

import argparse
import gc
import os
import re
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
SIZES = ["32x16", "1120x8", "1024x1024"]


def target(tokens):
    """The target at this size (README.md, "Benchmark"): ("us", the most rlgates - reference
    may take a call) up to 4k tokens (a chapter demo), ("ratio", the most rlgates / reference)
    above: 1.15 up to 128k (a lab minibatch), 1.25 beyond (1M)."""
    if tokens <= 2**12:
        return "us", 100.0
    return "ratio", 1.15 if tokens <= 2**17 else 1.25


def parse_size(text):
    """'BxT' (32x16), or a token count with an optional k/M suffix (9k, 1M: T = 1024 from 64k
    tokens up, else 8). Returns (B, T)."""
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m:
        return int(m[1]), int(m[2])
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}: write BxT (32x16) or tokens (9k, 1M)")
    tokens = int(float(m[1]) * {"": 1, "k": 2**10, "m": 2**20}[m[2].lower()])
    T = 1024 if tokens >= 2**16 else 8
    return max(1, tokens // T), T


def default_reps(tokens, device):
    """Repeats per (method, size): many where a step takes well under a millisecond."""
    if tokens <= 2**12:
        return 301
    if tokens <= 2**16:
        return 151
    return 31 if device.startswith("cuda") else 11


def label(tokens):
    return f"{tokens / 2**20:g}M" if tokens >= 2**20 else f"{tokens:,}"


def make_inputs(B, T, device, dtype=torch.float32, seed=0, mask_dtype=torch.bool):
    """Ragged [B, T] inputs (every row keeps at least one token), made in place so that making
    them needs no large temporaries."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    logp_old = torch.rand(B, T, generator=g).mul_(-3)
    logp = torch.randn(B, T, generator=g).mul_(0.2).add_(logp_old)
    adv = torch.randn(B, generator=g)
    lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
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
    """The loss of one implementation; each method's own default aggregation for both."""
    m = rlgates.get(name)
    if impl == "rlgates":
        if side is None:  # the call a reader or a trainer writes
            return lambda lp, lo, a, mk: m.loss(lp, lo, a, mk)
        return lambda lp, lo, a, mk: m.loss(lp, lo, a, mk, side=side)
    return lambda lp, lo, a, mk: reference.reference_loss(name, lp, lo, a, mk, m.agg, side=side,
                                                          **m.hparams)


def one_step(fn, logp, logp_old, adv, mask):
    leaf = logp.detach().requires_grad_(True)
    loss = fn(leaf, logp_old, adv, mask)
    loss.backward()
    return loss.detach(), leaf.grad


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def agree(a, b):
    """Whether two (loss, grad) results agree to float32 rounding."""
    return all(torch.allclose(x.double(), y.double(), rtol=1e-4, atol=1e-7)
               for x, y in zip(a, b, strict=True))


def time_pair(name, B, T, device, reps, mask_dtype=torch.bool, clock=time.perf_counter):
    """Seconds per step of rlgates and of the reference (wall, or this process's CPU time with
    clock=time.process_time), one of each per repeat, in alternating order. Returns
    ({impl: [seconds]}, whether their results agree)."""
    inputs = make_inputs(B, T, device, mask_dtype=mask_dtype)
    side = side_info(name, inputs[0])
    fns = {impl: step_fn(name, impl, side) for impl in ("rlgates", "reference")}
    same = agree(one_step(fns["rlgates"], *inputs), one_step(fns["reference"], *inputs))
    for _ in range(3 if B * T < 2**16 else 1):  # warm up (the check above ran one of each)
        for fn in fns.values():
            one_step(fn, *inputs)
    times = {impl: [] for impl in fns}
    order = list(fns.items())
    gc.collect()
    gc.disable()  # a collection inside one step would charge one side at random
    try:
        for rep in range(reps):
            for impl, fn in (order if rep % 2 == 0 else order[::-1]):
                sync(device)
                start = clock()
                one_step(fn, *inputs)
                sync(device)
                times[impl].append(clock() - start)
    finally:
        gc.enable()
    return times, same


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


def peak_memory(name, impl, B, T, device, mask_dtype=torch.bool):
    """Extra peak memory (bytes) of one step over its inputs."""
    inputs = make_inputs(B, T, device, mask_dtype=mask_dtype)
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


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summarize(device, rows, sizes):
    """One line per size: how many rows meet the target, and the worst."""
    print(f"\ntargets on {device}:")
    for (B, T) in sizes:
        tokens = B * T
        kind, bound = target(tokens)
        cells = [(name, mask, cell) for name, mask, cells in rows
                 for size, cell in cells.items() if size == (B, T)]
        if not cells:
            continue
        key = (lambda c: c[2]["over_us"]) if kind == "us" else (lambda c: c[2]["ratio"])
        worst = max(cells, key=key)
        unit = "µs" if kind == "us" else "×"
        what = "rlgates - reference" if kind == "us" else "rlgates / reference"
        held = sum(key(c) <= bound for c in cells)
        fails = ", ".join(f"{c[0]}/{c[1]} {key(c):.2f}" for c in cells if key(c) > bound)
        print(f"  {label(tokens):>9} tokens ({B}x{T}): {what} ≤ {bound:g}{unit} in {held} of "
              f"{len(cells)}; worst {key(worst):.2f}{unit} ({worst[0]}, {worst[1]} mask)"
              + (f"; over: {fails}" if fails else ""))


def run_device(device, args):
    sizes = args.sizes
    reps = ([args.reps[0]] * len(sizes) if len(args.reps or []) == 1 else args.reps) or \
        [default_reps(B * T, device) for B, T in sizes]
    if len(reps) != len(sizes):
        raise SystemExit(f"--reps: give one number, or one per size ({len(sizes)})")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    cpu_clock = args.clock == "cpu" and not device.startswith("cuda")  # cuda: wall time only
    clock = time.process_time if cpu_clock else time.perf_counter
    print(f"\n=== {device} ({name}); {'CPU' if cpu_clock else 'wall'} time; load average at "
          f"start {load()}")
    print("sizes: " + ", ".join(f"{label(B * T)} tokens = {B}x{T} ({r} repeats)"
                                for (B, T), r in zip(sizes, reps, strict=True)))
    first = "at " + label(sizes[0][0] * sizes[0][1])
    head1 = (f"{'':<21}" + "".join(f"| {f'{label(B * T)} tokens ({B}x{T})':<34}" for B, T in sizes)
             + f"| {first:>9}")
    head2 = (f"{'method':<15}{'mask':<6}" + "| rlgates     ref  ratio [paired]    " * len(sizes)
             + f"| {'rl-ref µs':>9}")
    print(head1)
    print(head2)
    print("-" * len(head2))
    rows = []
    for name in args.methods:
        for mask_name in args.masks:
            cells, line, flags = {}, f"{name:<15}{mask_name:<6}", []
            for (B, T), r in zip(sizes, reps, strict=True):
                times, same = time_pair(name, B, T, device, r, MASKS[mask_name], clock)
                rl, ref = (statistics.median(times[k]) for k in ("rlgates", "reference"))
                paired = [a / b for a, b in zip(times["rlgates"], times["reference"],
                                                strict=True)]
                cell = {"rl_ms": rl * 1e3, "ref_ms": ref * 1e3, "ratio": rl / ref,
                        "lo": min(paired), "hi": max(paired), "over_us": (rl - ref) * 1e6}
                cells[(B, T)] = cell
                if not same:
                    flags.append(f"{label(B * T)}: values differ")
                line += (f"| {cell['rl_ms']:>7.3f} {cell['ref_ms']:>7.3f} {cell['ratio']:>5.2f} "
                         f"[{cell['lo']:.2f}-{cell['hi']:.2f}] ")
            first = cells[sizes[0]]
            line += f"| {first['over_us']:>9.0f}"
            print(line + ("  ! " + "; ".join(flags) if flags else ""), flush=True)
            rows.append((name, mask_name, cells))
    print("(ms: median per step; ratio: rlgates / reference medians; [paired]: min-max of each "
          "repeat's ratio; rl-ref µs: difference of the medians at the first size)")
    summarize(device, rows, sizes)
    print(f"load average at end {load()}")
    if args.memory:
        print(f"\npeak memory over the inputs on {device}, MB (rlgates / reference):")
        for name in args.methods:
            for mask_name in args.masks:
                md = MASKS[mask_name]
                parts = []
                for B, T in sizes:
                    mem = [peak_memory(name, impl, B, T, device, md) / 2**20
                           for impl in ("rlgates", "reference")]
                    parts.append(f"{label(B * T)}: {mem[0]:.2f} / {mem[1]:.2f}")
                print(f"  {name:<15}{mask_name:<6}" + "   ".join(parts), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=None,
                        help="BxT or tokens (9k, 1M); default " + " ".join(SIZES))
    parser.add_argument("--reps", type=int, nargs="+", default=None,
                        help="repeats: one number, or one per size (default: 301 at ≤ 4k "
                             "tokens, 151 at ≤ 64k, 11 above (31 on cuda))")
    parser.add_argument("--devices", nargs="+", default=None,
                        help="default: cpu, and cuda when present")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS,
                        metavar="METHOD")
    parser.add_argument("--masks", nargs="+", default=list(MASKS), choices=list(MASKS))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: time each step by this process's CPU time, which a busy "
                             "machine's preemption does not inflate (cpu devices only)")
    parser.add_argument("--memory", action="store_true", help="also each step's peak memory")
    parser.add_argument("--no-slider", action="store_true", help="skip the slider redraw")
    parser.add_argument("--lab", action="store_true", help="also the training lab's throughput")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or [parse_size(s) for s in SIZES]
    torch.set_num_threads(args.threads)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    start = time.perf_counter()
    print(f"rlgates {rlgates.__file__}\nreference {reference.__file__}\n"
          f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), "
          f"{os.cpu_count()} CPUs, load average {load()}")
    for device in devices:
        run_device(device, args)
    if not args.no_slider:
        inside, widen, (w, h) = slider_redraw_ms()
        print(f"\nslider redraw (dapo, blitted {w}x{h} PNG): {inside:.1f} ms per move, "
              f"{widen:.1f} ms per move that resizes the log ρ axis")
    if args.lab:
        from lab_throughput import lab_throughput

        for device in devices:
            print(f"lab throughput on {device}: {lab_throughput(device)}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s; load average {load()}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    main()
