"""`rlgates inspect` on real runs with known faults: tiny stock TRL GRPOTrainer runs captured with
rlgates.inspect.capture, one knob per fault (tests/engines/inspect_runs.py, seed 0; its thresholds were
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
from rlgates.inspect.detectors import STEP_SIZE_KL

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines/inspect_runs.py"
JSON = Path(os.environ.get("RLGATES_INSPECT_JSON", ROOT / "_build/engines/inspect.json"))

#: run -> the one detector that must fire on it (None: none may)
EXPECTED = {"healthy": None, "rho_one": "rho_one", "micro_mean": "micro_normaliser",
            "mismatch": "mismatch", "sampler_ok": None, "low_temp": "entropy_collapse", "big_lr": "step_size",
            "stuck": "stuck_groups", "blowup": "negative_blowup", "length": "length_drift",
            "ends_stuck": "stuck_groups", "dropout": "noisy_forward", "no_dropout": None}


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
    assert fired_on == {d: [n for n, want in EXPECTED.items() if want == d]
                        for d in DETECTORS}, fired_on
    assert all(fired_on.values()), fired_on
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
    # the Troubleshooting page's entry 8: the per-update numbers alone would call the low
    # temperature a step-size problem too; the entropy at the first step tells them apart
    assert low["step_size"].evidence["mean_approx_kl"] > STEP_SIZE_KL
    assert not low["step_size"].fired and low["entropy_collapse"].fired
    assert "low before any update" in low["entropy_collapse"].message


def test_command_on_real_dumps(dumps, tmp_path, capsys):
    # --no-html: the report's page is tested on synthetic captures (tests/test_inspect.py,
    # tests/browser/test_inspect_report.py); drawing it here would only add seconds
    assert main([str(dumps / "healthy"), "--out", str(tmp_path / "h"), "-q", "--no-html"]) == 0
    assert main([str(dumps / "big_lr"), "--out", str(tmp_path / "b"), "--no-html"]) == 1
    out = capsys.readouterr().out
    assert "FINDING step_size" in out and "report:" in out
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    # TRL's dapo loss at its default epsilon_high (= epsilon = 0.2): the symmetric clip, which
    # the conformance matrix reads as ppo (before: dapo at eps_high 0.2, the same gate)
    assert summary["fired"] == ["step_size"] and summary["gate"]["method"] in ("ppo", "dapo")
    assert json.loads((tmp_path / "h" / "summary.json").read_text())["status"] == "healthy"


# --- verl ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verl_dump(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect_verl")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "VERL_PLATFORM", "VERL_ENGINE_DEVICE"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(ROOT / "tests/engines/inspect_verl_run.py"),
                        str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return out


def test_verl_capture_through_the_loss_hook(verl_dump):
    """capture_verl wraps ppo_loss through TrainingWorker.set_loss_fn: it sees the engine's
    log-probs, entropies and the rollout log-probs (which a registered loss never sees), and
    verl's global token count; inspect reads the capture like a TRL one."""
    import numpy as np

    from rlgates.inspect.capture import load

    facts = json.loads((verl_dump / "facts.json").read_text())
    run = load(verl_dump / "capture")
    st = run.settings
    assert st["trainer"] == "verl" and st["loss_mode"] == "vanilla"
    assert list(run.steps) == list(range(facts["steps"]))
    t, m = run.tokens, run.micro
    first = t["step"] == 0
    rows = t["micro"][first] * 4 + t["row"][first]  # two micro-batches of four rows
    pos = t["position"][first]
    for key, name in (("logp", "engine_log_probs"), ("logp_old", "old_log_probs"),
                      ("logp_sampler", "rollout_log_probs")):
        want = np.asarray(facts[name])[rows, pos]
        np.testing.assert_allclose(t[key][first], want, rtol=1e-5, atol=1e-5, err_msg=key)
    assert len(rows) == sum(facts["lengths"])  # every response token of the step
    np.testing.assert_allclose(t["advantage"][first], np.asarray(facts["advantages"])[rows],
                               rtol=1e-7)  # float32
    assert np.isfinite(t["entropy"]).all() and (t["entropy"] > 0).all()
    assert (m["num_items_in_batch"] == sum(facts["lengths"])).all()  # batch_num_tokens
    assert list(m["tokens"][m["step"] == 0]) == [14, 19]
    # the policy moved: step 1's log π differs from step 0's on the same tokens
    assert np.abs(t["logp"][t["step"] == 1] - t["logp"][first]).max() > 1e-3

    res = inspect_run(run)
    assert res.summary["gate"]["method"] == "dual_clip"
    assert res.summary["gate"]["hparams"] == {"eps": 0.2, "c": 3.0}
    f = {x.name: x for x in res.findings}
    # verl divides each micro-batch by the global token count: the step's constant fits
    assert f["micro_normaliser"].checked and not f["micro_normaliser"].fired
    assert np.nanmax(res.numbers["fit_step"]) < 1e-6 < np.nanmin(res.numbers["fit_micro"])
    assert f["mismatch"].fired  # the injected rollout log-probs, 0.5 nats off
    assert f["entropy_collapse"].checked and not f["entropy_collapse"].fired


# --- the faults real runs showed: dropout, a run that ends stuck, the exit status ----------
def test_dropout_moves_rho_before_any_update(matrix):
    """With dropout on (TRL's default disable_dropout=False) the forward that computes π_old and
    the loss's differ: ρ ≠ 1 on the first update of each generation batch, where it must be 1.
    The same GPT-2 with dropout off has ρ = 1 there exactly (the negative control)."""
    on, off = matrix["dropout"], matrix["no_dropout"]
    assert on.run.settings["num_iterations"] == off.run.settings["num_iterations"] == 2
    first = {n: {f.name: f for f in r.findings}["noisy_forward"] for n, r in
             (("on", on), ("off", off))}
    assert first["on"].fired and first["on"].evidence["log_ratio_absmax"] > 0.1
    assert "dropout" in first["on"].message and "TRL's step" in first["on"].message
    assert first["off"].checked and first["off"].evidence["log_ratio_absmax"] == 0.0
    assert (off.numbers["rho_is_one"][::2] == 1).all()  # steps 0, 2, ...: the first updates
    assert (on.numbers["rho_is_one"] == 0).all()
    # the large ratios on the dropout run are the forward's noise: step_size defers to it
    step = {f.name: f for f in on.findings}["step_size"]
    assert not step.fired and "noisy_forward" in step.message


def test_a_run_that_ends_stuck(matrix):
    """The reward goes flat at step ENDS_STUCK_AT: the run's mean share of flat groups stays
    below the threshold, its last quarter is above it."""
    from rlgates.inspect.detectors import STUCK_SHARE

    f = {x.name: x for x in matrix["ends_stuck"].findings}["stuck_groups"]
    assert f.evidence["frac_reward_zero_std_mean"] < STUCK_SHARE
    assert f.evidence["frac_reward_zero_std_last"] == 1.0
    assert "ends stuck" in f.message
    healthy = {x.name: x for x in matrix["healthy"].findings}["stuck_groups"]
    assert healthy.evidence["frac_reward_zero_std_last"] < STUCK_SHARE


def test_exit_status_on_real_dumps(dumps, tmp_path, capsys):
    """rho_one is information (exit 0); a real fault exits 1; every run lists what it could not
    check, and --strict turns that into exit status 3."""
    args = ["--no-html", "--out", str(tmp_path / "o")]
    assert main([str(dumps / "rho_one"), *args]) == 0
    out = capsys.readouterr().out
    assert "INFO rho_one" in out and "FINDING" not in out
    assert main([str(dumps / "dropout"), *args]) == 1
    assert "FINDING noisy_forward" in capsys.readouterr().out
    assert main([str(dumps / "healthy"), *args]) == 0
    out = capsys.readouterr().out
    assert "healthy (not checked: mismatch)" in out
    assert main([str(dumps / "healthy"), *args, "--strict"]) == 3
    assert main([str(dumps / "healthy"), *args, "--strict=micro_normaliser"]) == 0
