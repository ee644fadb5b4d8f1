"""`rlgates inspect`: read a capture of your own run (`rlgates.inspect.capture`), compute every
atlas diagnostic under the trainer's names, flag the failure modes it can detect, and write an
offline HTML report and a JSON summary.

    python -m rlgates inspect RUN            # RUN: a capture directory (or one step file)

    from rlgates import inspect
    result = inspect.inspect_run("run.capture")    # .numbers, .findings, .summary
"""

from __future__ import annotations

from dataclasses import dataclass

from .capture import Run, load
from .detectors import DETECTORS, HEALTHY, Finding, detect
from .stats import method_for, run_numbers


@dataclass
class Inspection:
    run: Run
    numbers: dict
    findings: list

    @property
    def fired(self):
        return [f.name for f in self.findings if f.fired]

    @property
    def summary(self):
        from .report import summarise

        return summarise(self.run, self.numbers, self.findings)


def inspect_run(run, progress=None) -> Inspection:
    """Inspect a capture: `run` a path (loaded with `rlgates.inspect.capture.load`) or a loaded
    Run."""
    run = load(run) if not isinstance(run, Run) else run
    numbers = run_numbers(run, progress)
    return Inspection(run, numbers, detect(numbers, run.settings))


__all__ = ["DETECTORS", "HEALTHY", "Finding", "Inspection", "detect", "inspect_run",
           "method_for", "run_numbers"]
