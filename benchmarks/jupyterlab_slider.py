"""A slider move's redraw time in JupyterLab: the reader notebook of chapter 7 (SAPO) in
headless Chromium, all cells run, then N arrow-key steps on a slider, each timed from the key
press to the figure's new image in the page (kernel round trip, matplotlib redraw, PNG, widget
update). Target: under 100 ms.

    .venv/bin/python benchmarks/jupyterlab_slider.py [N]      (needs a built book and JupyterLab:
                                                               python3 tasks.py lab installs it)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from bookserver import LAUNCH_ARGS, chromium  # noqa: E402
from labdriver import lab_server, move_slider, open_notebook, run_all, slider_widget  # noqa: E402

CHAPTER = "07_sapo.ipynb"


def main(n: int = 10) -> None:
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
        times = [move_slider(page, handle, "ArrowRight" if i % 2 else "ArrowLeft") * 1000
                 for i in range(n)]
        browser.close()
    print(f"JupyterLab, {CHAPTER}: run all {run_all_s:.1f} s")
    print(f"slider redraw over {n} moves: median {statistics.median(times):.0f} ms, "
          f"min {min(times):.0f} ms, max {max(times):.0f} ms (target < 100 ms)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
