#!/usr/bin/env python3
"""The project's commands (README):

    python3 tasks.py test    set up, then lint and the unit tests: no browser, no engine runs, no
                             book (a few minutes; the quick check after changing rlgates)
    python3 tasks.py book    set up, then build the book into _build/html (every notebook runs)
    python3 tasks.py check   set up, then run every check; exits non-zero on any failure
    python3 tasks.py lab     set up, then open JupyterLab on your copy of the reader notebooks

All create (or reuse) the virtual environment .venv and install requirements.txt into it, only
when requirements.txt or pyproject.toml changed since the last install. `lab` (and the check's
JupyterLab test) also install JupyterLab into .venv when it is missing.

The chapters are MyST Markdown (chapters/*.md); their .ipynb twins, which nbval collects and the
launch buttons name, are generated before each run (scripts/chapter_sources.py), never committed.
`book` and `check` execute each chapter once, the same way (`execute_chapters`): nbval runs the
chapters in parallel, one notebook per worker, checks their asserts and writes each out with its
outputs (scripts/nbval_record.py); those outputs prime the book's jupyter-cache
(scripts/prime_cache.py), so the book build renders them, glue values included, without
executing again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".requirements-sha256"
BUILD = ROOT / "_build"
BOOK_HTML = BUILD / "html"
EXECUTED = BUILD / "executed"       # the notebooks nbval executed, with their outputs
READER = BUILD / "reader"           # the reader notebooks (scripts/reader_notebooks.py)
JUPYTERLAB = "jupyterlab==4.6.6"    # for `lab` and the JupyterLab browser test (not in Binder's)
LAB_STAMP = VENV / ".jupyterlab"
TEST_ENV = {"MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}  # for every test step and nbval
LOGS = BUILD / "logs"                # the output of steps run in the background
TIMINGS: list[tuple[str, float, int]] = []
#: pytest's arguments for the unit tests, in `test` and `check`: no browser, no engine runs, and
#: not the reader notebooks' tests, which need the built book
UNIT_TESTS = ("-m", "pytest", "tests", "-q", "-m", "not browser and not engine",
              "--ignore", "tests/test_reader_notebooks.py", "-n", "auto")
RUNNING: list[Background] = []      # background steps not yet finished
START = time.perf_counter()


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


class Background:
    """A step run beside the next ones (a core they leave idle): its output goes to a log file,
    printed with its time when `finish` waits for it."""

    def __init__(self, step: str, *cmd, env=None):
        self.step, self.start = step, time.perf_counter()
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log = LOGS / (re.sub(r"\W+", "-", step).strip("-") + ".log")
        print(f"\n==> {step} (beside the next steps; output: {self.log}): "
              f"{' '.join(map(str, cmd))}", flush=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})})
        RUNNING.append(self)
        # its own time, not the time until `finish` waits for it: a thread notes when it ends
        self.end = None
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.end = time.perf_counter()

    def finish(self, check=True) -> int:
        rc = self.proc.wait()
        self.waiter.join()
        RUNNING.remove(self)
        TIMINGS.append((self.step, self.end - self.start, rc))
        print(f"\n==> {self.step}: its output\n{self.log.read_text(errors='replace')}"
              f"<== {self.step}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {TIMINGS[-1][1]:.1f} s", flush=True)
        if rc != 0 and check:
            summary()
            sys.exit(rc)
        return rc


def setup() -> None:
    """Create .venv if needed and install requirements.txt when it changed, then the optional
    trainers of the conformance matrix (requirements-trainers-extra.txt) without their
    dependencies: their tests load only their loss modules (their dependencies would replace
    torch with a CUDA build)."""
    if not PY.exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
        + (ROOT / "requirements-trainers-extra.txt").read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        print("requirements already installed in .venv", flush=True)
        return
    sh("install", PY, "-m", "pip", "install", "--disable-pip-version-check", "-q",
       "-r", "requirements.txt")
    sh("install the optional trainers (--no-deps)", PY, "-m", "pip", "install",
       "--disable-pip-version-check", "-q", "--no-deps", "-r", "requirements-trainers-extra.txt")
    STAMP.write_text(digest)


def chapter_notebooks() -> None:
    """chapters/NN.ipynb from chapters/NN.md: for nbval, and so the launch buttons name the
    .ipynb the notebooks branch publishes."""
    sh("chapter notebooks", PY, "scripts/chapter_sources.py", "notebooks")


def execute_chapters() -> None:
    """Run every chapter once, for `book` and `check` alike: nbval executes the notebooks written
    from chapters/*.md, one notebook per worker (loadfile; each kernel uses one torch thread,
    rlgates.setup), checks each chapter's asserts, and writes each notebook whose every cell
    passed to _build/executed with its outputs (scripts/nbval_record.py, which also prints each
    notebook's time). Those outputs then fill the book's jupyter-cache (scripts/prime_cache.py).
    A failing chapter stops the run, named. Figures use the inline backend, as in the book
    (MPLBACKEND=Agg would show none); RLGATES_PHONE_FIGURES=1 adds each figure's phone version
    to its output's metadata (rlgates/_book/png.py; scripts/phone_figures.py serves it)."""
    shutil.rmtree(EXECUTED, ignore_errors=True)
    chapter_notebooks()
    rc = sh("notebooks (nbval)", PY, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:randomly",
            "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder",
            "-p", "nbval_record", "--nbval-record", EXECUTED,
            "chapters", check=False,
            env={**TEST_ENV, "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                 "RLGATES_PHONE_FIGURES": "1",  # phone versions of figures, for the web book
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"),
                                                             os.environ.get("PYTHONPATH")]))})
    if rc != 0:
        failed = sorted(p.stem for p in (ROOT / "chapters").glob("*.md")
                        if not (EXECUTED / "chapters" / f"{p.stem}.ipynb").is_file())
        print(f"\nchapters that failed (a cell raised or an assert did not hold): "
              f"{', '.join(failed) or 'none written, see above'}", flush=True)
        summary()
        sys.exit(rc)
    # the book renders nbval's outputs instead of executing the chapters again
    sh("prime book cache", PY, "scripts/prime_cache.py", EXECUTED)


def build_book(step: str = "book") -> None:
    """Build the book from the jupyter-cache `execute_chapters` filled (a notebook missing there
    would be executed by the build); the reader notebooks are written when the build finishes
    (scripts/reader_notebooks.py)."""
    # MathJax for the offline book, from npm (or PyPI) into the ignored _build/vendor
    sh("offline assets", PY, "scripts/offline_assets.py")
    shutil.rmtree(BOOK_HTML, ignore_errors=True)
    # --all: re-read every page. Sphinx otherwise keeps a page whose source file did not change,
    # with its old outputs, even when the library under it (and so the cached run) changed.
    # RLGATES_PHONE_FIGURES: the pages the build itself runs (index.md) get phone figures too
    sh(step, BIN / "jupyter-book", "build", ".", "--all", "-W", "-n", "--keep-going",
       env={"RLGATES_PHONE_FIGURES": "1"})


def ensure_jupyterlab() -> None:
    """JupyterLab in .venv (not in requirements.txt: the book and its tests do not need it)."""
    installed = LAB_STAMP.exists() and LAB_STAMP.read_text() == JUPYTERLAB
    if installed and (BIN / "jupyter-lab").exists():
        return
    sh("install jupyterlab", PY, "-m", "pip", "install", "--disable-pip-version-check", "-q",
       JUPYTERLAB)
    LAB_STAMP.write_text(JUPYTERLAB)


def ensure_chromium() -> None:
    """The browser tests drive $CHROMIUM when it is set (a Chromium or Chrome binary), else
    Debian's Chromium (tests/browser/bookserver.py: chromium()); install Debian's, as root, when
    there is neither."""
    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from bookserver import chromium

    found = chromium()
    if found:
        print(f"browser for the browser tests: {found}", flush=True)
        return
    if os.environ.get("CHROMIUM"):
        summary()
        sys.exit(f"CHROMIUM={os.environ['CHROMIUM']} is not a file: set it to a Chromium or "
                 "Chrome binary, or unset it to use Debian's chromium")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        sh("install chromium", "bash", "-c", "apt-get update && apt-get install -y chromium",
           env={"DEBIAN_FRONTEND": "noninteractive"})
        return
    summary()
    sys.exit("the browser tests need Chromium: install Debian's package as root (apt-get update "
             "&& apt-get install -y chromium), or set CHROMIUM to a Chromium or Chrome binary, "
             "then run this again")


def summary() -> None:
    if not TIMINGS and not RUNNING:  # no step ran (`lab` with everything in place): no table
        return
    for job in RUNNING:  # a step failed while others ran beside it: stop them
        job.proc.kill()
        job.proc.wait()
        print(f"stopped {job.step} (output so far: {job.log})")
    print("\nstep timings (steps marked ‖ ran beside others):")
    for step, seconds, rc in TIMINGS:
        print(f"  {step:<26} {seconds:7.1f} s  {'ok' if rc == 0 else f'exit {rc}'}")
    print(f"  {'wall':<26} {time.perf_counter() - START:7.1f} s")


def book() -> None:
    setup()
    execute_chapters()
    build_book()
    summary()
    print(f"\nbook built: {BOOK_HTML / 'index.html'}\nreader notebooks: {READER / 'chapters'}")


def test() -> None:
    setup()
    sh("lint", BIN / "ruff", "check", ".")
    sh("unit tests", PY, *UNIT_TESTS, env={**TEST_ENV, "RLGATES_REQUIRE_BOOK": "0"})
    summary()
    print("\nlint and unit tests passed (every check, book included: python3 tasks.py check)")


def check() -> None:
    setup()
    # the browsers before any test: a missing one is said at once, not after minutes of tests
    ensure_chromium()
    ensure_jupyterlab()
    env = TEST_ENV
    sh("lint", BIN / "ruff", "check", ".")
    # chapter code checked like library code: each code cell exported to a .py file, then linted
    # as one (scripts/export_chapters.py; the duplicate check reads the same files)
    chapter_code = ROOT / "_build" / "chapter_code"
    shutil.rmtree(chapter_code, ignore_errors=True)
    sh("export chapter code", PY, "scripts/export_chapters.py", chapter_code)
    sh("lint chapter code", BIN / "ruff", "check", chapter_code)
    # the GitHub Actions workflow: syntax, expressions, action inputs, shell scripts (see README)
    sh("lint workflow", BIN / "actionlint", *sorted(ROOT.glob(".github/workflows/*.yml")))
    # pytest's exit code 5 (no tests collected) is a failure here, like any non-zero code;
    # the reader notebooks' tests (the converter's and the built notebooks') run once, after
    # the book, below
    sh("unit tests", PY, *UNIT_TESTS, env={**env, "RLGATES_REQUIRE_BOOK": "0"})
    execute_chapters()
    # TRL over many steps and verl's actor update, in one process and in two (torchrun): serial,
    # one torch thread each; the numbers land in _build/engines/ (trl_runs.py, verl_runs.py).
    # They run beside the book build (one core), then beside the tests of the built book.
    # verl's first: its Ray check starts a local cluster, which needs its agent up within 30 s,
    # easier beside the book build (one core) than beside the browser tests
    engine_files = sorted(map(str, (ROOT / "tests" / "engines").glob("test_*.py")),
                          key=lambda f: ("test_verl" not in f, f))
    engines = Background("engine tests ‖", PY, "-m", "pytest", *engine_files, "-m", "engine",
                         "-q", "-p", "no:randomly", env={**env, "OMP_NUM_THREADS": "1"})
    build_book("book (nbval outputs)")
    # The tests of the built book, all at once and to the end (each failing step is named):
    # with the engine tests they keep both cores busy. RLGATES_REQUIRE_BROWSER: a missing book,
    # Chromium or JupyterLab fails the browser tests (a plain `pytest` skips them instead).
    browser_env = {**env, "RLGATES_REQUIRE_BROWSER": "1"}
    beside = [
        Background("reader notebooks ‖", PY, "-m", "pytest", "tests/test_reader_notebooks.py",
                   "-q", "-p", "no:randomly", env={**env, "RLGATES_REQUIRE_BOOK": "1"}),
        # JupyterLab (its own server, kernel and Chromium) on a reader notebook
        Background("jupyterlab test ‖", PY, "-m", "pytest", "tests/browser/test_jupyterlab.py",
                   "-q", "-m", "browser", "-p", "no:randomly", env=browser_env),
    ]
    rc = sh("browser test", PY, "-m", "pytest", "tests/browser", "-q", "-m", "browser",
            "-p", "no:randomly", "--ignore", "tests/browser/test_jupyterlab.py",
            env=browser_env, check=False)
    failed = ["browser test"] if rc else []
    for job in [*beside, engines]:
        if job.finish(check=False):
            failed.append(job.step)
    if failed:
        summary()
        sys.exit(f"\nfailed: {', '.join(failed)} (each step's output is above)")
    summary()
    print("\nall checks passed")


WORKING_COPY = ROOT / "notebooks"  # the reader's copies, opened by `lab` (git-ignored)
COPIES_MANIFEST = ".rlgates-copies.json"  # in WORKING_COPY: the hash of each file as copied


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cells_digest(path: Path) -> str:
    """What a reader can change in a notebook: its cells' types and sources, hashed. Metadata,
    outputs and execution counts are left out: JupyterLab rewrites the metadata when it opens a
    notebook (kernelspec, language_info, "collapsed") and autosaves it, and running a cell only
    adds outputs, so neither makes the notebook the reader's. A file that is not a notebook is
    hashed whole."""
    import json

    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = json.dumps([[c.get("cell_type"), "".join(c.get("source") or "")] for c in cells])
    except (ValueError, KeyError, TypeError, AttributeError):
        return _sha256(path)
    return "cells:" + hashlib.sha256(text.encode()).hexdigest()


def _recorded(digest: str | None, path: Path) -> bool:
    """`path` still holds what the manifest recorded for it (a record from before cell digests,
    a whole-file SHA-256, counts too)."""
    return digest is not None and digest in (_cells_digest(path), _sha256(path))


def sync_working_copy(source: Path, target: Path) -> list[str]:
    """Copy the reader notebooks (source/*.ipynb) into the reader's working copy (target), which
    no build deletes. A file the reader has not changed since it was copied is replaced by the
    build's newer version; a changed one is kept, and the new version is written beside it as
    NAME.new-build.ipynb (itself replaced later only while unchanged). "Changed" means its cells
    changed (_cells_digest): a notebook JupyterLab only opened and autosaved, or that the reader
    only ran, still follows the build. Returns one line per notebook the reader changed and a
    build changed too."""
    import json

    target.mkdir(parents=True, exist_ok=True)
    manifest_path = target / COPIES_MANIFEST
    copied = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    notes = []

    def place(src: Path, dest: Path) -> bool:
        """Write src to dest unless the reader changed dest; True when dest holds src now."""
        new = _cells_digest(src)
        if dest.exists():
            if _cells_digest(dest) == new:  # the same cells (the reader's outputs kept)
                copied[dest.name] = new
                return True
            if not _recorded(copied.get(dest.name), dest):  # the reader's: never overwritten
                return False
        shutil.copyfile(src, dest)
        copied[dest.name] = new
        return True

    for src in sorted(source.glob("*.ipynb")):
        dest = target / src.name
        if dest.exists() and _recorded(copied.get(dest.name), src):
            continue  # the reader has this build's version, changed or not
        if place(src, dest):
            continue
        beside = dest.with_suffix(".new-build.ipynb")
        if place(src, beside):
            notes.append(f"{dest.name}: kept your version; the new build's is {beside.name}")
        else:
            notes.append(f"{dest.name}: kept your version and your {beside.name}; the new "
                         f"build's is in {source}")
    manifest_path.write_text(json.dumps(copied, indent=1, sort_keys=True) + "\n")
    return notes


def lab(args: list[str] = ()) -> None:
    """JupyterLab on the reader's working copy of the reader notebooks (built with the book when
    there are none yet); `args` go to jupyter-lab as they are (--port 8890, --no-browser)."""
    setup()
    ensure_jupyterlab()
    if not (READER / "chapters").is_dir():
        execute_chapters()
        build_book()
    summary()
    notes = sync_working_copy(READER / "chapters", WORKING_COPY)
    # news_url=None: JupyterLab fetches no news, so it asks no "Would you like to get notified
    # about official Jupyter news?" question
    cmd = [str(BIN / "jupyter-lab"), f"--ServerApp.root_dir={WORKING_COPY}", *args,
           "--LabApp.news_url=None"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # Jupyter refuses to run as root without it
    print(f"\nyour notebooks: {WORKING_COPY} (no build deletes them; a notebook you changed is "
          "never overwritten)", *notes, sep="\n  ")
    print(f"\n==> {' '.join(cmd)}", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    commands = {"test": test, "book": book, "check": check, "lab": lab}
    name, extra = (sys.argv[1] if len(sys.argv) > 1 else ""), sys.argv[2:]
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if name not in commands or (extra and name != "lab"):
        sys.exit(f"usage: python3 {Path(__file__).name} {{{'|'.join(commands)}}}"
                 " (lab: then jupyter-lab's options, e.g. lab --port 8890 --no-browser)")
    if name == "lab":
        lab(extra)
    else:
        commands[name]()
