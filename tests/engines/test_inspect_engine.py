"""`rlgates inspect` on real runs with known faults: tiny stock TRL GRPOTrainer runs captured with
rlgates.capture, one knob per fault (tests/engines/inspect_runs.py, seed 0; its thresholds were
set on seeds 1 to 3), plus captures injected into a copy of the healthy one (sampler log-probs:
TRL has them with vLLM only, far from π_old and, as a negative control, close to it; a large
negative advantage). Every detector runs on
every run: it fires on its own fault and stays quiet on the healthy run and on every other
fault. The matrix lands in _build/engines/inspect.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlgates.inspect import DETECTORS, inspect_run
from rlgates.inspect.cli import main

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines/inspect_runs.py"
JSON = Path(os.environ.get("RLGATES_INSPECT_JSON", ROOT / "_build/engines/inspect.json"))

#: run -> the one detector that must fire on it (None: none may)
EXPECTED = {"healthy": None, "rho_one": "rho_one", "micro_mean": "micro_normaliser",
            "mismatch": "mismatch", "sampler_ok": None, "low_temp": "entropy_collapse", "big_lr": "step_size",
            "stuck": "stuck_groups", "blowup": "negative_blowup", "length": "length_drift"}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect_runs")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), "0"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return out


@pytest.fixture(scope="module")
def matrix(dumps):
    res = {name: inspect_run(dumps / name) for name in EXPECTED}
    table = {name: {f.name: ("fires" if f.fired else "quiet" if f.checked else "not checked")
                    for f in r.findings} for name, r in res.items()}
    JSON.parent.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps({"seed": 0, "matrix": table,
                                "evidence": {n: [f.as_dict() for f in r.findings]
                                             for n, r in res.items()}}, indent=1))
    return res


def test_every_run_is_what_its_knob_made(matrix):
    """The knobs did what they say, read from the captures themselves."""
    s = {n: r.run.settings for n, r in matrix.items()}
    assert s["healthy"]["num_iterations"] == 2 and s["rho_one"]["num_iterations"] == 1
    assert s["micro_mean"]["loss_type"] == "bnpo" and s["healthy"]["loss_type"] == "dapo"
    assert s["low_temp"]["temperature"] < s["healthy"]["temperature"]
    assert s["big_lr"]["learning_rate"] == pytest.approx(10 * s["healthy"]["learning_rate"])
    assert all("injected" in s[n] for n in ("mismatch", "sampler_ok", "blowup"))
    assert "injected" not in s["healthy"]
    x = {n: r.numbers for n, r in matrix.items()}
    assert x["stuck"]["frac_reward_zero_std"].min() == 1.0  # every group, every step
    assert x["healthy"]["frac_reward_zero_std"].mean() < 0.9
    assert x["healthy"]["rho_is_one"].min() == 0  # the gate had something to act on


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_each_detector_fires_on_its_fault_only(matrix, run):
    got = {f.name: f for f in matrix[run].findings}
    assert set(got) == set(DETECTORS)
    fired = sorted(k for k, f in got.items() if f.fired)
    want = [] if EXPECTED[run] is None else [EXPECTED[run]]
    assert fired == want, {k: f.message for k, f in got.items()}
    for f in got.values():
        assert f.atlas.startswith("chapter ") and f.message


def test_every_detector_is_tested_both_ways(matrix):
    fired_on = {d: [n for n, r in matrix.items() if d in r.fired] for d in DETECTORS}
    assert all(len(v) == 1 for v in fired_on.values()), fired_on
    checked_quiet = {d: sum(1 for r in matrix.values() for f in r.findings
                            if f.name == d and f.checked and not f.fired) for d in DETECTORS}
    assert all(v >= 1 for v in checked_quiet.values()), checked_quiet


def test_collapse_and_step_size_are_told_apart(matrix):
    """Both lower the entropy or move ρ; each run is named by its own cause."""
    low = {f.name: f for f in matrix["low_temp"].findings}
    big = {f.name: f for f in matrix["big_lr"].findings}
    assert low["entropy_collapse"].evidence["entropy_first"] < 0.3  # low before any update
    assert big["entropy_collapse"].evidence["entropy_first"] > 1.5
    assert big["step_size"].evidence["mean_approx_kl"] > 0.02


def test_command_on_real_dumps(dumps, tmp_path, capsys):
    assert main([str(dumps / "healthy"), "--out", str(tmp_path / "h"), "-q"]) == 0
    assert main([str(dumps / "big_lr"), "--out", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "FINDING step_size" in out and "report:" in out
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["fired"] == ["step_size"] and summary["gate"]["method"] == "dapo"
    assert (tmp_path / "h" / "report.html").stat().st_size > 10_000
