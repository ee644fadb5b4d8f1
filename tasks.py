#!/usr/bin/env python3
"""The project's two commands (README):

    python3 tasks.py book    set up, then build the book into _build/html
    python3 tasks.py check   set up, then run every check; exits non-zero on any failure

Both create (or reuse) the virtual environment .venv and install requirements.txt into it, only
when requirements.txt or pyproject.toml changed since the last install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".requirements-sha256"
BOOK_HTML = ROOT / "_build" / "html"
TIMINGS: list[tuple[str, float, int]] = []


def sh(step: str, *cmd, check=True, env=None) -> int:
    """Run one step, print its wall time, stop the run on failure (exit code kept)."""
    print(f"\n==> {step}: {' '.join(map(str, cmd))}", flush=True)
    start = time.perf_counter()
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, env={**os.environ, **(env or {})})
    TIMINGS.append((step, time.perf_counter() - start, rc))
    print(f"<== {step}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
          f"in {TIMINGS[-1][1]:.1f} s", flush=True)
    if rc != 0 and check:
        summary()
        sys.exit(rc)
    return rc


def setup() -> None:
    """Create .venv if needed and install requirements.txt when it changed."""
    if not PY.exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        print("requirements already installed in .venv", flush=True)
        return
    sh("install", PY, "-m", "pip", "install", "--disable-pip-version-check", "-q",
       "-r", "requirements.txt")
    STAMP.write_text(digest)


def build_book() -> None:
    # MathJax for the offline book, from npm (or PyPI) into the ignored _build/vendor
    sh("offline assets", PY, "scripts/offline_assets.py")
    shutil.rmtree(ROOT / "_build" / "html", ignore_errors=True)
    sh("book", BIN / "jupyter-book", "build", ".", "-W", "-n", "--keep-going")


def ensure_chromium() -> None:
    """The browser test drives Debian's Chromium; install it (as root) when it is missing."""
    if Path("/usr/bin/chromium").exists():
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        sh("install chromium", "bash", "-c", "apt-get update && apt-get install -y chromium",
           env={"DEBIAN_FRONTEND": "noninteractive"})
        return
    summary()
    sys.exit("the browser test needs /usr/bin/chromium: install Debian's package as root "
             "(apt-get update && apt-get install -y chromium), then run this again")


def summary() -> None:
    print("\nstep timings:")
    for step, seconds, rc in TIMINGS:
        print(f"  {step:<22} {seconds:7.1f} s  {'ok' if rc == 0 else f'exit {rc}'}")
    print(f"  {'total':<22} {sum(s for _, s, _ in TIMINGS):7.1f} s")


def book() -> None:
    setup()
    build_book()
    summary()
    print(f"\nbook built: {BOOK_HTML / 'index.html'}")


def check() -> None:
    setup()
    env = {"MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    sh("lint", BIN / "ruff", "check", ".")
    # pytest's exit code 5 (no tests collected) is a failure here, like any non-zero code
    sh("unit tests", PY, "-m", "pytest", "tests", "-q", "-m", "not browser", env=env)
    # one notebook per worker (loadfile): each kernel uses one torch thread (rlgates.setup)
    sh("notebooks (nbval)", PY, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:randomly",
       "-n", "auto", "--dist", "loadfile", "chapters", env=env)
    build_book()
    ensure_chromium()
    # RLGATES_REQUIRE_BROWSER: a missing book or Chromium fails the browser tests (a plain
    # `pytest` skips them instead)
    sh("browser test", PY, "-m", "pytest", "tests/browser", "-q", "-m", "browser",
       "-p", "no:randomly", env={**env, "RLGATES_REQUIRE_BROWSER": "1"})
    summary()
    print("\nall checks passed")


if __name__ == "__main__":
    commands = {"book": book, "check": check}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python3 {Path(__file__).name} {{{'|'.join(commands)}}}")
    commands[sys.argv[1]]()
