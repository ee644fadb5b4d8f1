"""Chapter 14's verl recipe, as printed, in verl 0.9.1's real actor update on the CPU.

    cd DIR && python tests/engines/verl_recipe_run.py OUT.json OVERRIDES...

DIR holds what tests/engines/test_verl_recipes.py wrote from the chapter's code blocks: the
module `my_losses.py` (the registration lines, then the capture lines) and `train.py` (the
Hydra entry point); it is on PYTHONPATH, as a module must be in every verl worker. OVERRIDES are
the chapter's run lines (`key=value`). This process plays one of verl's actor workers:

1. verl's hook imports the module: `HFModelConfig(external_lib=...)`, as
   `ActorRolloutRefWorker.init_model` builds its model config (and nothing here calls
   `patch_environment` or `register`: the module must);
2. the registered loss against verl's `sapo`, at the loss_agg_mode verl's generated trainer
   config defaults to;
3. verl's TrainingWorker (FSDP2) is built and given the actor's loss as init_model gives it,
   `set_loss_fn(partial(ppo_loss, config=actor_config))`, which the module's `capture_workers`
   hook captures; STEPS optimiser steps of `train_mini_batch` on tests/engines/verl_runs.py's
   fixed batch (ρ ≠ 1, ragged), warnings recorded;
4. a second actor loss (as the driver's `set_loss_fn` sends one) is wrapped in turn, a critic's
   `value_loss` is not captured, and the function the capture gave `atexit` closes it (called
   here, as the interpreter calls it at exit);
5. the entry point, run as the chapter says (`python train.py OVERRIDES`), with an override that
   `check_config` must refuse before verl's main starts.

CPU workarounds (not part of rlgates): tests/verl_cpu.py. Facts go to OUT.json.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import runpy
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.modules.setdefault("rfc3987_syntax", None)  # as verl_runs.py: skip a slow optional import

import torch  # noqa: E402

STEPS = 2


def sapo_vs_builtin(loss_mode, loss_agg_mode):
    """The registered loss and verl's sapo, called as ppo_loss calls them, on a ragged float64
    batch with ρ ≠ 1: |Δ loss| and max |Δ gradient|."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 2, 4, 1])
    mask = (torch.arange(5)[None] < lengths[:, None]).float()
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    logp = old + (torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], dtype=torch.float64)[:, None].expand(4, 5)
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4)
    out = {}
    for mode in ("sapo", loss_mode):
        leaf = logp.clone().requires_grad_(True)
        loss, _ = get_policy_loss_fn(mode)(old_log_prob=old, log_prob=leaf, advantages=adv,
                                           response_mask=mask, loss_agg_mode=loss_agg_mode,
                                           config=cfg)
        loss.backward()
        out[mode] = (float(loss), leaf.grad)
    (v0, g0), (v1, g1) = out["sapo"], out[loss_mode]
    return {"dloss": abs(v0 - v1), "dgrad": float((g0 - g1).abs().max()), "loss": v1}


def entry_point(overrides):
    """`python train.py OVERRIDES` in this process (Hydra reads sys.argv): its exit status and
    what it printed."""
    argv, err = sys.argv, io.StringIO()
    sys.argv = ["train.py", *overrides]
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path("train.py", run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
    return {"exit": code, "stderr": err.getvalue()[-3000:]}


def main():
    out_path = Path(sys.argv[1])
    run = dict(line.split("=", 1) for line in sys.argv[2:])
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    from tests import verl_cpu as vc
    from tests.engines import verl_runs as vr

    vc.setup()
    import verl
    import yaml
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import HFModelConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss, value_loss

    loss_mode = run["actor_rollout_ref.actor.policy_loss.loss_mode"]
    defaults = yaml.safe_load((Path(verl.__file__).parent
                               / "trainer/config/_generated_ppo_trainer.yaml").read_text())
    agg_default = defaults["actor_rollout_ref"]["actor"]["loss_agg_mode"]
    facts = {"cwd": os.getcwd(), "loss_agg_mode_default": agg_default,
             "registered_before": loss_mode in POLICY_LOSS_REGISTRY,
             "stand_in_before": "trl.experimental.ppo" in sys.modules}
    exit_funcs, register = [], atexit.register

    def spy(fn, *args, **kwargs):  # what the module's capture leaves for the exit
        exit_funcs.append(fn)
        return register(fn, *args, **kwargs)

    atexit.register = spy
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = vc.tiny_model_dir(os.path.join(tmp, "model"))
        # 1. verl's own hook imports the module named by the run line
        HFModelConfig(path=model_dir, external_lib=run["actor_rollout_ref.model.external_lib"])
        fn = POLICY_LOSS_REGISTRY.get(loss_mode)
        hooked = TrainingWorker.set_loss_fn
        verls = {k: v for k, v in vars(getattr(hooked, "rlgates_original", hooked)).items()
                 if k != "__wrapped__"}  # verl's @register attributes, which its dispatch reads
        facts.update(registered_after=fn is not None,
                     stand_in_after="trl.experimental.ppo" in sys.modules,
                     hook_installed=hasattr(hooked, "rlgates_original"),
                     dispatch_kept=bool(verls) and all(
                         vars(hooked).get(k) is v for k, v in verls.items()))
        # 2. the recipe's loss at verl's default aggregation
        facts["vs_builtin"] = sapo_vs_builtin(loss_mode, agg_default)
        # 3. verl's actor: built, given its loss as init_model gives it, trained
        w = vc.worker(model_dir, lr=vr.LR, clip_grad=1e9)
        w.reset()
        current = vr.engine_log_probs(w, vr.rollout())
        td = vr.for_update(vr.rollout(current - vr.log_ratios()), 1, 0)
        config = vr.actor_config(loss_mode, loss_agg_mode=agg_default)
        own = partial(ppo_loss, config=config)
        w.set_loss_fn(own)
        handle = getattr(w, "rlgates_capture", None)
        facts["captured"] = handle is not None
        facts["wraps_own_loss"] = handle is not None and handle.inner is own
        facts["capture_path"] = str(handle.path.resolve()) if handle else None
        losses = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(STEPS):
                m = tu.get(w.train_mini_batch(td.clone()), "metrics") or {}
                losses.append({k: float(v[0] if isinstance(v, list) else v)
                               for k, v in m.items() if k in ("loss", "actor/pg_loss")})
        facts["metrics"] = losses
        facts["warnings"] = [f"{w_.category.__name__}: {w_.message}" for w_ in caught
                             if "rlgates" in str(w_.message) or "rlgates" in w_.filename]
        facts["files_before_exit"] = sorted(p.name for p in handle.path.iterdir())
        # 4. a later actor loss is captured in turn; a critic's loss is not
        again = partial(ppo_loss, config=config)
        w.set_loss_fn(again)
        facts["rewrapped"] = handle.inner is again and w.loss_fn == handle._loss
        critic = type("Critic", (), {})()
        TrainingWorker.set_loss_fn(critic, partial(value_loss, config=None))
        facts["critic_captured"] = hasattr(critic, "rlgates_capture")
        closers = [f for f in exit_funcs if f == handle.close]
        facts["atexit_closers"] = len(closers)
        facts["open_before_exit"] = not handle.closed
        for f in closers:
            f()
        facts["closed_at_exit"] = handle.closed
        facts["restored"] = (w.loss_fn is again
                             and "optimizer_step" not in vars(w.engine))
    # 5. the entry point, refusing a run with no module to register the loss
    facts["entry"] = entry_point([f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"])
    facts["wall_s"] = time.perf_counter() - t0
    out_path.write_text(json.dumps(facts, indent=1))
    print(f"wrote {out_path} ({facts['wall_s']:.1f} s)")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
