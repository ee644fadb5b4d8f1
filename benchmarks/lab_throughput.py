"""Throughput of the training lab (rlgates.lab): seeds batched into one computation vs a loop.

    python benchmarks/lab_throughput.py               # cpu (and cuda when present), 10 seeds
    python benchmarks/lab_throughput.py --seeds 10 --steps 40 --method dapo

`lab_throughput(device)` trains the same seeds twice with the lab's configuration for that
device (`LabConfig.for_device`), in this one process: once as ten single-seed calls (the loop)
and once as one call with all ten seeds (batched), and reports runs·steps per second of each.
Best of `repeats` timings; a warm-up call first, so that the one-off cost of building
torch.optim.Adam (it imports torch._dynamo) counts for neither.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlgates import lab


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def lab_throughput(device="cpu", seeds: int = 10, steps: int = 40, repeats: int = 3,
                   method: str = "dapo") -> dict:
    """Runs·steps per second, loop vs batched, and their ratio."""
    dev = torch.device(device)
    cfg = lab.LabConfig.for_device(dev, steps=steps)
    seed_list = list(range(seeds))
    lab.train(method, cfg, seeds=seed_list[:2], steps=2, progress=False)  # warm-up

    def loop():
        for s in seed_list:
            lab.train(method, cfg, seeds=[s], progress=False)

    def batched():
        lab.train(method, cfg, seeds=seed_list, progress=False)

    def best_of(fn):
        times = []
        for _ in range(repeats):
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            times.append(time.perf_counter() - t0)
        return min(times)

    t_loop, t_batch = best_of(loop), best_of(batched)
    work = seeds * steps
    return {
        "device": str(dev), "method": method, "seeds": seeds, "steps": steps,
        "updates_per_step": cfg.minibatches * cfg.epochs,
        "loop_runs_steps_per_s": work / t_loop,
        "batched_runs_steps_per_s": work / t_batch,
        "speedup": t_loop / t_batch,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--method", default="dapo")
    args = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        r = lab_throughput(d, args.seeds, args.steps, method=args.method)
        print(f"lab on {r['device']} ({r['method']}, {r['seeds']} seeds x {r['steps']} steps, "
              f"{r['updates_per_step']} updates a step): loop "
              f"{r['loop_runs_steps_per_s']:,.0f} runs·steps/s, batched "
              f"{r['batched_runs_steps_per_s']:,.0f} runs·steps/s: {r['speedup']:.1f}x")


if __name__ == "__main__":
    main()
