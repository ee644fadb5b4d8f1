"""TRL's GRPOTrainer over many steps, in one process and in two (torchrun, gloo): its built-in loss
against the rlgates adapter, in lock-step (same completions, so the same rewards at every step).

The runs are made once by tests/engines/trl_runs.py (one launch per process count), which writes
every number to one JSON file (RLGATES_TRL_JSON, default _build/engines/trl.json); these tests
assert on it. Each comparison could fail: the gate acts (TRL's clip_ratio/region_mean > 0 on
several steps), lengths are ragged, and two wrong losses (REINFORCE: no gate; a per-micro-batch
token mean) are shown to move the trajectory by far more than the tolerance.
Slow (about a minute): marked `engine`, run serially by tasks.py, not by the unit-test step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines/trl_runs.py"
JSON = Path(os.environ.get("RLGATES_TRL_JSON", ROOT / "_build/engines/trl.json"))


def _launch(*cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([*map(str, cmd), SCRIPT, JSON], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]


@pytest.fixture(scope="module")
def runs():
    JSON.unlink(missing_ok=True)
    _launch(sys.executable)
    with socket.socket() as s:  # a free port for the rendezvous (torchrun's 0 can hang)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _launch(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", port)
    return json.loads(JSON.read_text())


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def assert_lockstep(c, steps, loss_rel=1e-5, grad_rel=1e-4, dw=1e-5):
    ref, ours = c["builtin"], c["adapter"]
    assert len(ref) == len(ours) == steps
    for r, o in zip(ref, ours, strict=True):
        assert r["reward"] == o["reward"]  # the same completions: lock-step
        assert rel(o["loss"], r["loss"]) < loss_rel, (r, o)
        assert rel(o["grad_norm"], r["grad_norm"]) < grad_rel, (r, o)
    assert c["max_abs_dW"] < dw
    assert min(o["rlgates/gate_mean"] for o in ours) < 0.9
    # not vacuous: the gate clipped tokens on several steps, and the lengths are ragged
    assert sum(r["clip_ratio/region_mean"] > 0 for r in ref) >= 3
    assert any(r["completions/min_length"] is not None
               and r["completions/min_length"] < r["completions/max_length"] for r in ref)


ONE = ["dapo", "grpo", "dapo_spg4"]


@pytest.mark.parametrize("case", ONE)
def test_one_process_trajectory(runs, case):
    d = runs["one_process"]
    assert d["num_processes"] == 1
    assert_lockstep(d["cases"][case], 10)


def test_one_process_negative_controls(runs):
    c = runs["one_process"]["cases"]["dapo"]
    ref = c["builtin"]
    for name, bound in (("reinforce_control", 1e-2), ("local_mean_control", 1e-3)):
        diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(ref, c[name], strict=True))
        assert diff > bound, (name, diff)
    assert c["reinforce_max_abs_dW"] > 1e-3 and c["local_mean_max_abs_dW"] > 1e-3


TWO = ["grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo", "dapo_partial", "grpo_partial"]


@pytest.mark.parametrize("case", TWO)
def test_two_processes(runs, case):
    d = runs["two_process"]
    assert d["num_processes"] == 2
    c = d["cases"][case]
    assert c["num_processes"] == 2
    a, b = c["rank_gen_tokens"]  # each rank's tokens per generation batch
    assert a != b  # the ranks' counts differ: a local mean would not be the global one
    assert c["global_gen_tokens"] == [x + y for x, y in zip(a, b, strict=True)]
    assert c["num_items_ok"]  # num_items_in_batch on each rank, each micro-batch: the global count
    ref, ours = c["builtin"], c["adapter"]
    if case.endswith("_partial"):  # 9 micro-batches in windows of 2: the last window has one
        assert c["micro_batches"] == 9 and len(ref) == len(ours) == 5
    else:
        assert c["micro_batches"] == 8 and len(ref) == len(ours) == 4
    for r, o in zip(ref, ours, strict=True):
        assert r["reward"] == o["reward"]
        assert rel(o["loss"], r["loss"]) < 1e-5, (r, o)
        assert rel(o["grad_norm"], r["grad_norm"]) < 1e-4, (r, o)
    assert c["max_abs_dW"] < 1e-5
    # the gate acted: TRL clipped tokens (it logs no clip region for sapo and cispo), and the
    # adapter's mean gate fell below one
    assert any((r["clip_ratio/region_mean"] or 0) > 0 for r in ref) or case in ("sapo", "cispo")
    assert min(o["rlgates/gate_mean"] for o in ours) < 0.99
