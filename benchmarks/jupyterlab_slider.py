"""A slider move's redraw time in JupyterLab, on a loaded machine: the reader notebook of chapter 7
(SAPO) in headless Chromium, all cells run, then N arrow-key steps on a slider, each timed from
the key press to the figure's new image in the page (kernel round trip, matplotlib redraw, PNG,
widget update). While the moves are timed, `benchmarks/load.py` keeps LOAD cores busy (default
one), as a reader's other programs would. Target: a median under 100 ms over 30 moves.

    .venv/bin/python benchmarks/jupyterlab_slider.py [--moves 30] [--load 1]
        (needs the reader notebooks of a built book, and JupyterLab: python3 tasks.py lab
         installs it; READER_NOTEBOOKS=... times another build's)

Reported: the median, the quartiles and the range of the N moves, the load generator's share of
its core(s), the machine's load average and core count. With PYTHONPATH set, the kernel imports
the rlgates found there (JupyterLab passes the environment on). Then, in this process, without
JupyterLab: the kernel's CPU time for one move (`box.redraw()`: the gate, its edges, the blit,
the PNG) at the live figure's scale (rlgates.interactive.LIVE_SCALE) against the static figures'
(rlgates.notebook.IMAGE_SCALE) as the reference; CPU time, so a busy machine does not blur it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "browser"))
sys.path.insert(0, str(HERE))
from bookserver import LAUNCH_ARGS, chromium  # noqa: E402
from labdriver import lab_server, move_slider, open_notebook, run_all, slider_widget  # noqa: E402
from load import busy, cpu_share  # noqa: E402

CHAPTER = "07_sapo.ipynb"
TARGET_MS = 100


def time_moves(n: int, load: int) -> dict:
    """Run the chapter, then time `n` slider moves with `load` cores kept busy."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    if exe is None:
        sys.exit("no Chromium: install Debian's package, or set CHROMIUM to a browser binary")
    with lab_server([CHAPTER]) as (base, token, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        open_notebook(page, base, token, CHAPTER)
        run_all_s = run_all(page)
        handle, _ = slider_widget(page)
        move_slider(page, handle)  # warm-up
        with busy(load) as procs:
            share = cpu_share(procs) if procs else []
            times = [move_slider(page, handle, "ArrowRight" if i % 2 else "ArrowLeft") * 1000
                     for i in range(n)]
            loadavg = os.getloadavg()
        browser.close()
    return {"times": times, "run_all_s": run_all_s, "share": share, "loadavg": loadavg}


def kernel_cpu_ms(n: int, scale: float) -> float:
    """Median CPU milliseconds of `n` redraws of chapter 7's first slider, drawn at `scale`."""
    import time

    import matplotlib

    matplotlib.use("Agg")
    from rlgates import interactive

    saved, interactive.LIVE_SCALE = interactive.LIVE_SCALE, scale
    try:
        box = interactive.explore("sapo")
    finally:
        interactive.LIVE_SCALE = saved
    slider = next(iter(box.sliders.values()))
    slider.value += slider.step  # warm-up: the static frame is drawn once
    times = []
    for i in range(n):
        t0 = time.process_time()
        slider.value += slider.step if i % 2 else -slider.step
        times.append((time.process_time() - t0) * 1000)
    box.panels.close()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=30)
    ap.add_argument("--load", type=int, default=1, help="cores kept busy (0: none)")
    ap.add_argument("--kernel-only", action="store_true", help="only the kernel's CPU time")
    args = ap.parse_args(argv)
    if not args.kernel_only:
        report_lab(args)
    from rlgates.interactive import LIVE_SCALE
    from rlgates.notebook import IMAGE_SCALE

    live, ref = kernel_cpu_ms(args.moves, LIVE_SCALE), kernel_cpu_ms(args.moves, IMAGE_SCALE)
    print(f"kernel CPU per move (median of {args.moves}): {live:.0f} ms at {LIVE_SCALE}x, "
          f"{ref:.0f} ms at {IMAGE_SCALE}x (reference): ratio {live / ref:.2f}")
    return 0


def report_lab(args) -> None:
    r = time_moves(args.moves, args.load)
    t = sorted(r["times"])
    q1, med, q3 = statistics.quantiles(t, n=4)
    busy_text = (f"{args.load} core(s) kept busy by benchmarks/load.py (at "
                 + ", ".join(f"{s:.0%}" for s in r["share"]) + " of a core)"
                 if args.load else "no load generator")
    print(f"JupyterLab, {CHAPTER}: run all {r['run_all_s']:.1f} s")
    print(f"load: {busy_text}; load average {r['loadavg'][0]:.1f} on {os.cpu_count()} cores")
    print(f"slider redraw over {args.moves} moves: median {statistics.median(t):.0f} ms, "
          f"quartiles {q1:.0f}-{q3:.0f} ms, range {t[0]:.0f}-{t[-1]:.0f} ms "
          f"(target: median < {TARGET_MS} ms)")


if __name__ == "__main__":
    sys.exit(main())
