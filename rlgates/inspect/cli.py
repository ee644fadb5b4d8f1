"""The command line of `python -m rlgates inspect`.

Exit status (for scripts):
    0  the capture was read and no fault was found; information (INFO: rho_one) and the
       detectors that could not run on this capture (NOT CHECKED, with the reason) are printed
    1  the capture was read and at least one detector found its fault (FINDING lines)
    2  the input could not be inspected: missing, corrupt, not a capture, a newer schema, or
       a bad argument; one line on stderr says why
    3  with --strict only: no fault was found, but a detector --strict names (every one by
       default) could not run on this capture
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNREADABLE, EXIT_NOT_CHECKED = 0, 1, 2, 3
#: A capture with more tokens than this gets a progress bar on stderr (with --progress auto)
PROGRESS_TOKENS = 200_000


def parser():
    p = argparse.ArgumentParser(
        prog="python -m rlgates inspect",
        description="Inspect a capture of a training run (rlgates.inspect.capture): every atlas\n"
        "diagnostic under the trainer's names, the failure modes the book's atlas explains,\n"
        "and an offline HTML report with a JSON summary.",
        epilog="Each finding names the book's sections that explain it: the atlas (chapter 17)\n"
        "and the Troubleshooting page (chapter 21). Under TRL's default num_iterations=1,\n"
        "expect INFO rho_one: not a fault, but such a capture cannot show how far a step\n"
        "moves the policy. A detector that cannot run on a capture is listed as NOT CHECKED\n"
        "with the reason, on every run.\n\n"
        "Exit status: 0 no finding, 1 at least one finding, 2 the input could not be\n"
        "inspected (one line on stderr says why), 3 (with --strict only) no finding, but a\n"
        "detector it names could not run. INFO and NOT CHECKED lines leave it at 0.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a capture directory (step_*.npz files) or one step file")
    p.add_argument("--out", help="directory for report.html and summary.json (default: "
                   "RUN.inspect next to the capture)")
    p.add_argument("--steps", help="comma-separated capture steps to draw on the (A, log ρ) "
                   "plane (default: the first step with ρ ≠ 1, the one with the largest "
                   "abs(log ρ), and the last)")
    p.add_argument("--no-html", action="store_true", help="write the JSON summary only")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help=f"progress bar on stderr (auto: over {PROGRESS_TOKENS:,} tokens)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.add_argument("--strict", nargs="?", const="all", metavar="DETECTORS",
                   help="exit 3 when no detector found a fault but one could not run: every "
                   "detector, or the comma-separated ones named (--strict=micro_normaliser)")
    return p


class Bar:
    """A one-line text progress bar on stderr."""

    def __init__(self, label, stream=None, width=30):
        self.stream = sys.stderr if stream is None else stream  # the one in use now
        self.label, self.width, self.t0 = label, width, time.perf_counter()
        self.shown = -1

    def __call__(self, done, total):
        full = int(self.width * done / max(total, 1))
        if full == self.shown and done < total:  # redraw only when the bar grows
            return
        self.shown = full
        self.stream.write(f"\r{self.label} [{'#' * full}{'.' * (self.width - full)}] "
                          f"{done}/{total} steps {time.perf_counter() - self.t0:.1f} s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _fail(msg) -> int:
    print(f"rlgates inspect: {msg}", file=sys.stderr)
    return EXIT_UNREADABLE


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help exits 0, a usage error 2
        return int(e.code or 0)
    try:
        return _inspect(args)
    except BrokenPipeError:
        raise  # the reader closed our output: python -m rlgates ends quietly (rlgates.__main__)
    except Exception as e:  # noqa: BLE001 - one clear line, never a traceback
        if os.environ.get("RLGATES_DEBUG"):
            raise
        text = str(e).splitlines()[0] if str(e) else ""
        return _fail(f"cannot inspect {args.run}: {type(e).__name__}: {text}")


def _steps(args, run):
    """The --steps to draw (None: the default ones), or the line that refuses them."""
    if not args.steps:
        return None, ""
    try:
        steps = [int(s) for s in args.steps.split(",")]
    except ValueError:
        return None, f"--steps takes comma-separated integers, not {args.steps!r}"
    if bad := sorted(set(steps) - {int(s) for s in run.steps}):
        return None, (f"--steps {bad} not in the capture (its steps: {int(run.steps[0])} to "
                      f"{int(run.steps[-1])})")
    return steps, ""


def _strict(args):
    """The detectors --strict requires to run (() without --strict), or the line refusing it."""
    from .detectors import DETECTORS

    if args.strict is None:
        return (), ""
    names = tuple(DETECTORS) if args.strict == "all" else tuple(
        n.strip() for n in args.strict.split(",") if n.strip())
    if bad := [n for n in names if n not in DETECTORS]:
        return (), f"--strict: no detector {', '.join(bad)} (they are: {', '.join(DETECTORS)})"
    return names, ""


def _write(args, run, numbers, findings, steps):
    """summary.json (and report.html) under --out; returns (the summary, the report's path)."""
    from . import report

    src = Path(args.run)
    out = Path(args.out) if args.out else src.with_name(src.name + ".inspect")
    out.mkdir(parents=True, exist_ok=True)
    summary = report.summarise(run, numbers, findings)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if not args.no_html:
        (out / "report.html").write_text(report.html(run, numbers, findings, steps,
                                                     source=str(src)), encoding="utf-8")
    return summary, out / ("summary.json" if args.no_html else "report.html")


def _print(args, summary, findings, where, n_tokens):
    """The findings, the information, what was not checked and the headline, on stdout."""
    from .report import headline

    if summary["gate"]["method"] is None:  # said even with --quiet: every gate number is NaN
        print(f"no method: {summary['gate']['note']}")
    if args.quiet and not any(f.fault for f in findings):
        return
    for f in findings:
        if f.fired:
            print(f"{'FINDING' if f.fault else 'INFO'} {f.name}: {f.message}\n  read: {f.atlas}")
    for f in findings:
        if not f.checked:
            print(f"NOT CHECKED {f.name}: {f.reason}")
    print(f"{headline(findings)}; {len(summary['steps'])} steps, {n_tokens:,} tokens")
    print(f"report: {where}")


def _status(findings, strict) -> int:
    """The exit status (the module docstring)."""
    if any(f.fault for f in findings):
        return EXIT_FINDINGS
    if any(not f.checked and f.name in strict for f in findings):
        return EXIT_NOT_CHECKED
    return EXIT_HEALTHY


def _inspect(args) -> int:
    from . import detect, run_numbers
    from .capture import load

    strict, refused = _strict(args)
    if refused:
        return _fail(refused)
    try:
        with warnings.catch_warnings():  # the CLI prints the run's notes as one line each
            warnings.simplefilter("ignore", UserWarning)
            run = load(args.run)
    except ValueError as e:
        return _fail(str(e))
    for note in run.notes:  # an old schema, a skipped file
        print(f"note: {note}", file=sys.stderr)
    steps, refused = _steps(args, run)
    if refused:
        return _fail(refused)
    n_tokens = len(run.tokens.get("logp", ()))
    show = (args.progress == "always"
            or (args.progress == "auto" and n_tokens > PROGRESS_TOKENS))
    numbers = run_numbers(run, Bar(f"inspect {n_tokens:,} tokens") if show else None)
    findings = detect(numbers, run.settings)
    summary, where = _write(args, run, numbers, findings, steps)
    _print(args, summary, findings, where, n_tokens)
    return _status(findings, strict)
