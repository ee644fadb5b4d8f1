"""verl 0.9.1 builds (and trains) a model in the project's environment, next to TRL 1.16.0.

Each test runs a fresh `python -c` in this interpreter (verl resolves its platform, process group
and patches once per process), on the CPU, with a tiny LlamaForCausalLM built in code:

- the shim is needed: without it, verl's `apply_monkey_patch` raises the ImportError about TRL's
  removed `AutoModelForCausalLMWithValueHead`; `import rlgates` (and the verl adapter) apply
  nothing; with `patch_environment()` the same call passes. The day a TRL or verl release fixes
  the import, the negative control fails and says to remove rlgates.trainers._verl_compat;
- verl's worker module imports with the packages requirements.txt declares for it (uvicorn,
  fastapi, starlette, which verl 0.9.1 imports but does not declare), at the pinned versions;
- verl's FSDP TrainingWorker builds on the CPU (workarounds in tests/verl_cpu.py) and runs one
  `train_mini_batch` with verl's `ppo_loss` and an rlgates loss registered in verl's registry.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.engine  # subprocesses, ~1 min: the serial engine step

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "VERL_PLATFORM",
              "VERL_ENGINE_DEVICE"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    line = [s for s in p.stdout.splitlines() if s.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


MONKEY_PATCH = """
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import rlgates, rlgates.trainers.verl as rv
from rlgates.trainers import _verl_compat as compat
from verl.models.transformers.monkey_patch import apply_monkey_patch

out = {"applied_by_import": "trl.experimental.ppo" in sys.modules, "needed": compat.needed()}
cfg = LlamaConfig(vocab_size=33, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg)
try:
    apply_monkey_patch(model, use_remove_padding=False)
    out["without"] = None
except ImportError as e:
    out["without"] = str(e)
out["patched"] = rv.patch_environment()
out["again"] = rv.patch_environment()
apply_monkey_patch(model, use_remove_padding=False)
from trl.experimental.ppo import AutoModelForCausalLMWithValueHead as V
out["stand_in"] = bool(getattr(V, "rlgates_stand_in", False))
out["state_dict_is_module"] = V.state_dict(model).keys() == torch.nn.Module.state_dict(model).keys()
try:
    V.from_pretrained("anything")
    out["from_pretrained"] = None
except NotImplementedError as e:
    out["from_pretrained"] = str(e)
print("RESULT " + json.dumps(out))
"""


def test_trl_shim_needed_and_sufficient_for_verl_model_build():
    out = result(run(MONKEY_PATCH))
    assert not out["applied_by_import"], "import rlgates / rlgates.trainers.verl must not patch TRL"
    assert out["needed"] and out["without"] is not None, (
        "verl's apply_monkey_patch now passes without the shim: a TRL/verl upgrade fixed the "
        "value-head import; remove rlgates/trainers/_verl_compat.py and patch_environment")
    assert "AutoModelForCausalLMWithValueHead" in out["without"], out["without"]
    assert out["patched"] and out["again"]
    assert out["stand_in"] and out["state_dict_is_module"]
    assert "removed from TRL" in out["from_pretrained"]


def _pins() -> dict:
    text = (ROOT / "requirements.txt").read_text()
    return dict(re.findall(r"^(uvicorn|fastapi|starlette)==(\S+)", text, flags=re.M))


def test_verl_worker_module_imports_with_declared_packages():
    pins = _pins()
    assert set(pins) == {"uvicorn", "fastapi", "starlette"}, pins
    out = result(run("""
        import json, importlib.metadata as md
        import verl.workers.engine_workers as ew
        print("RESULT " + json.dumps({"worker": hasattr(ew, "TrainingWorker"),
              "versions": {k: md.version(k) for k in ("uvicorn", "fastapi", "starlette")}}))
    """))
    assert out["worker"]
    assert out["versions"] == pins


TRAIN = """
import functools, json, math, tempfile
from tests import verl_cpu as vc
vc.setup()
import rlgates
from rlgates.trainers import verl as rv
rv.patch_environment()
name = rv.register(rlgates.get("grpo", eps=0.2))
w = vc.worker(vc.tiny_model_dir(tempfile.mkdtemp()))
w.reset()
before = {k: v.detach().full_tensor().clone() if hasattr(v, "full_tensor") else v.detach().clone()
          for k, v in w.engine.module.state_dict().items()}
from verl.workers.config import FSDPActorConfig
from verl.workers.utils.losses import ppo_loss
ac = FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2,
                     rollout_n=1, use_dynamic_bsz=False, policy_loss={"loss_mode": name})
w.set_loss_fn(functools.partial(ppo_loss, config=ac))
from verl.utils import tensordict_utils as tu
m = tu.get(w.train_mini_batch(vc.ppo_batch()), "metrics")
after = {k: v.detach().full_tensor() if hasattr(v, "full_tensor") else v.detach()
         for k, v in w.engine.module.state_dict().items()}
moved = sum(int(not (before[k] == after[k]).all()) for k in before)
def num(x):
    x = x[0] if isinstance(x, list) else x
    return float(x)
print("RESULT " + json.dumps({"name": name, "keys": sorted(m), "loss": num(m["loss"]),
      "grad_norm": num(m["grad_norm"]), "gate_mean": num(m["actor/rlgates_gate_mean"]),
      "moved": moved, "n": len(before)}))
"""


def test_verl_fsdp_training_worker_train_mini_batch_on_cpu():
    out = result(run(TRAIN))
    assert out["name"] == "rlgates_grpo"
    assert math_finite(out["loss"]) and out["loss"] != 0.0
    assert math_finite(out["grad_norm"]) and out["grad_norm"] > 0
    assert 0.0 <= out["gate_mean"] <= 1.0
    assert out["moved"] > 0, out  # the optimiser stepped


def math_finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")
