"""A load generator: keeps CPU cores busy, so that a benchmark can time something on a loaded
machine (a reader's laptop with a browser, a video call, a build running beside the notebook).

    python benchmarks/load.py                  # one core busy until Ctrl-C
    python benchmarks/load.py --cores 2 --seconds 60

`busy(cores)` does the same inside a benchmark: a context manager that starts `cores` processes,
each spinning one core at 100 % in pure Python (no threads, no I/O), and stops them on exit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from contextlib import contextmanager


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(200_000):  # about 10 ms between looks at the stop flag
            x = (x * 1_103_515_245 + 12_345) & 0x7FFFFFFF


@contextmanager
def busy(cores: int = 1):
    """`cores` processes spinning at 100 % for the duration of the `with` block."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        yield procs
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()


def cpu_share(procs, seconds: float = 1.0) -> list[float]:
    """The share of one core each process used over `seconds` (Linux: /proc/PID/stat)."""
    def ticks(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    hz = os.sysconf("SC_CLK_TCK")
    before = [ticks(p.pid) for p in procs]
    time.sleep(seconds)
    return [(ticks(p.pid) - b) / hz / seconds for p, b in zip(procs, before, strict=True)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Keep CPU cores busy.")
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0, help="0: until interrupted")
    args = ap.parse_args(argv)
    with busy(args.cores) as procs:
        print(f"{args.cores} core(s) busy (pids {[p.pid for p in procs]}); Ctrl-C stops",
              flush=True)
        try:
            if args.seconds:
                time.sleep(args.seconds)
            else:
                while True:
                    time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
