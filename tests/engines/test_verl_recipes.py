"""Chapter 14's verl recipe, as the page prints it, run the way the page says.

The code blocks are read from chapters/14_real_trainers.md by their first line: the module
(`# my_losses.py: ...`), the run lines (the `text` block with `external_lib=`), the capture lines
(`# and, to capture the run, in my_losses.py:`) and the entry point (`# train.py: ...`).

Without verl (unit tests): the module, the run lines and the entry point are the verl adapter's
docstring, line for line both ways, and the capture lines are capture_verl's; read with `ast`,
so that this file imports neither verl nor TRL.

With verl (marked `engine`): tests/engines/verl_recipe_run.py, in a fresh process whose working
directory holds `my_losses.py` (module + capture lines) and `train.py`, plays one of verl's actor
workers on the CPU (tests/verl_cpu.py: a CPU platform and a gloo group; a real worker needs
NCCL). verl's own hook imports the module (`HFModelConfig(external_lib=...)`), so the module
alone must apply the TRL shim and register the loss; the registered loss equals verl's `sapo`
at verl's default loss_agg_mode; `TrainingWorker.train_mini_batch` trains with
`partial(ppo_loss, config)` as verl's init_model sets it, and the module's `capture_workers`
captures that loss into `sapo.capture/rank0`, which `inspect` reads; and `python train.py` with
an rlgates loss_mode and no external_lib stops in `check_config`, before verl's main. About 20 s.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "chapters/14_real_trainers.md"
RUNNER = ROOT / "tests/engines/verl_recipe_run.py"


def block(lang, first=None, containing=None) -> str:
    """The one fenced `lang` block of chapter 14 whose first line is `first` (or that contains
    `containing`), as the page prints it."""
    found = [b for b in re.findall(rf"^```{lang}\n(.*?)^```$", CHAPTER.read_text(),
                                   flags=re.M | re.S)
             if (first is None or b.splitlines()[0] == first)
             and (containing is None or containing in b)]
    assert len(found) == 1, (lang, first, containing, len(found))
    return found[0]


def module_block():
    return block("python", "# my_losses.py: a module of yours, importable in every worker")


def run_lines():
    return block("text", containing="actor_rollout_ref.model.external_lib=").split()


def capture_block():
    return block("python", "# and, to capture the run, in my_losses.py:")


def entry_block():
    return block("python", "# train.py: verl's main_ppo with the check first. Run it as verl's:")


def docstring(relpath) -> str:
    return ast.get_docstring(ast.parse((ROOT / relpath).read_text()), clean=False)


def code_lines(text):
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


# --- the page is the docstrings (no verl needed) ---------------------------------------------
def test_module_and_run_lines_are_the_adapters_docstring_both_ways():
    blocks = docstring("rlgates/trainers/verl.py").split("\n\n")
    assert code_lines(blocks[1]) == code_lines(module_block())
    assert [ln.strip(" #") for ln in blocks[2].splitlines()][1:] == run_lines()
    module = module_block()
    assert "rv.patch_environment()" in module  # verl 0.9.1 builds no model next to TRL 1.16
    assert 'agg="seq-mean-token-mean"' in module  # else token-mean SAPO at verl's default


def test_entry_point_is_the_adapters_docstring():
    doc = docstring("rlgates/trainers/verl.py")
    lines = entry_block().splitlines()
    start = doc.index("    " + lines[0])
    shown = []
    for ln in doc[start:].splitlines():  # the indented block, blank lines inside it included
        if ln and not ln.startswith("    "):
            break
        shown.append(ln[4:])
    assert "\n".join(shown).strip() == entry_block().strip()


def test_capture_lines_are_capture_verls_docstring():
    doc = docstring("rlgates/inspect/capture_verl.py")
    for line in code_lines(capture_block())[1:]:
        assert line in doc, line


# --- the recipe in verl's actor update -------------------------------------------------------
@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    d = tmp_path_factory.mktemp("verl_recipe")
    (d / "my_losses.py").write_text(module_block() + capture_block())  # "two more lines"
    (d / "train.py").write_text(entry_block())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HYDRA_FULL_ERROR": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(d), str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_MODULES"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(RUNNER), str(d / "facts.json"), *run_lines()],
                       cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return d, json.loads((d / "facts.json").read_text())


@pytest.mark.engine
def test_module_alone_patches_and_registers_in_the_worker(recipe):
    _, f = recipe
    assert not f["registered_before"] and not f["stand_in_before"]
    assert f["registered_after"] and f["stand_in_after"]  # P1: the model then builds (below)
    assert f["hook_installed"]
    assert f["dispatch_kept"]  # verl's @register attributes survive the capture's wrapper


@pytest.mark.engine
def test_recipe_is_verls_sapo_at_verls_default_aggregation(recipe):
    _, f = recipe
    assert f["loss_agg_mode_default"] == "token-mean"
    vs = f["vs_builtin"]
    assert vs["dloss"] < 1e-12 and vs["dgrad"] < 1e-12 and abs(vs["loss"]) > 1e-3


@pytest.mark.engine
def test_recipe_trains_in_verls_actor_update_and_is_captured(recipe):
    import numpy as np

    from rlgates.inspect import inspect_run
    from rlgates.inspect.capture import load

    d, f = recipe
    assert f["warnings"] == []  # agg= given: no AggregationWarning
    assert f["captured"] and f["wraps_own_loss"]  # the worker's own loss, not a fresh ppo_loss
    path = d / "sapo.capture" / "rank0"  # relative to the worker's working directory
    assert Path(f["capture_path"]).resolve() == path.resolve()
    assert f["files_before_exit"] == [f"step_{s:08d}.rank0.npz" for s in range(2)]
    run = load(path)
    assert list(run.steps) == [0, 1]
    st = run.settings
    assert st["trainer"] == "verl" and st["loss_mode"] == "rlgates_sapo"
    assert st["loss_agg_mode"] == "token-mean"
    for step, m in enumerate(f["metrics"]):  # the captured losses are the ones verl trained on
        micro = run.micro["loss"][run.micro["step"] == step]
        assert len(micro) == 2
        assert abs(float(np.sum(micro)) - m["loss"]) < 1e-5, (micro, m)
    assert f["metrics"][0]["loss"] != f["metrics"][1]["loss"]
    assert inspect_run(run).summary["status"]


@pytest.mark.engine
def test_capture_follows_the_actor_and_closes_at_exit(recipe):
    _, f = recipe
    assert f["rewrapped"]  # a later actor loss (the driver's set_loss_fn) is captured in turn
    assert not f["critic_captured"]  # value_loss is not an actor loss
    assert f["atexit_closers"] == 1 and f["open_before_exit"]
    assert f["closed_at_exit"] and f["restored"]


@pytest.mark.engine
def test_entry_point_refuses_before_verl_starts(recipe):
    _, f = recipe
    e = f["entry"]
    assert e["exit"] == 1, e
    assert "no module registers it" in e["stderr"] and "external_lib" in e["stderr"], e
