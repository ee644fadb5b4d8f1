"""The engine runs' summary that chapter 14 reads: `rlgates/trainers/engine_runs.json`.

The engine step (tests/engines, serial) trains the real trainers and writes its raw numbers under
_build/engines/. Each test then hands the numbers the book states to `check(section, summary)`:
they must equal the committed summary (`rlgates.trainers.engine_runs()`), so the chapter, which
only reads the file and never launches a trainer, states what the installed trainers did.

After a deliberate change (a new case, a trainer upgrade), refresh the file:

    RLGATES_UPDATE_ENGINE_RUNS=1 .venv/bin/python -m pytest tests/engines -m engine -p no:randomly
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

SUMMARY = Path(__file__).resolve().parents[2] / "rlgates" / "trainers" / "engine_runs.json"
UPDATE = os.environ.get("RLGATES_UPDATE_ENGINE_RUNS") == "1"


def _differences(fresh, stored, path="") -> list[str]:
    if isinstance(stored, dict) and isinstance(fresh, dict):
        out = [f"{path}/{k}: missing from the run" for k in stored if k not in fresh]
        out += [f"{path}/{k}: not in the summary" for k in fresh if k not in stored]
        for k in stored.keys() & fresh.keys():
            out += _differences(fresh[k], stored[k], f"{path}/{k}")
        return out
    if isinstance(stored, list) and isinstance(fresh, list) and len(stored) == len(fresh):
        return [d for i, (a, b) in enumerate(zip(fresh, stored, strict=True)) for d in _differences(a, b, f"{path}[{i}]")]
    if isinstance(stored, bool) or isinstance(fresh, bool) or not isinstance(stored, (int, float)):
        return [] if fresh == stored else [f"{path}: run {fresh!r}, summary {stored!r}"]
    # floats: rounding differs across CPUs; a tiny agreement (2e-7 against 3e-7) is the same fact
    ok = isinstance(fresh, (int, float)) and math.isclose(fresh, stored, rel_tol=1e-4, abs_tol=1e-4)
    return [] if ok else [f"{path}: run {fresh!r}, summary {stored!r}"]


def check(section: str, summary: dict) -> None:
    """Assert `summary` equals the committed section (or write it, with RLGATES_UPDATE_ENGINE_RUNS=1)."""
    data = json.loads(SUMMARY.read_text())
    if UPDATE:
        data[section] = summary
        SUMMARY.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return
    diff = _differences(summary, data.get(section, {}), section)
    assert not diff, ("the engine run no longer matches rlgates/trainers/engine_runs.json "
                      "(refresh it with RLGATES_UPDATE_ENGINE_RUNS=1, see tests/engines/record.py):\n"
                      + "\n".join(diff[:40]))
