"""verl 0.9.1's real actor update, captured with rlgates.inspect.capture_verl, for `rlgates inspect`.

    python tests/engines/inspect_verl_run.py OUT_DIR

The fixed batch of tests/engines/verl_runs.py (ragged responses, log ρ spread over both clip
edges, ρ = 4 on three tokens) trained for STEPS optimiser steps by verl's TrainingWorker with
its default loss (`ppo_loss`, loss_mode "vanilla": dual clip, c = 3) on the CPU, with the
engine's entropies on (`calculate_entropy`) and rollout log-probs injected into the batch
(log π_old + N(0, 0.5²): verl's rollout would return them; here no rollout engine runs). The
capture goes to OUT_DIR/capture; OUT_DIR/facts.json holds what the test compares it with: the
engine's own log-probs before the first step and verl's batch counts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.modules.setdefault("rfc3987_syntax", None)  # as verl_runs.py: skip a slow optional import

import torch  # noqa: E402

STEPS = 2


def main():
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    from rlgates.trainers import verl as rv
    from tests import verl_cpu as vc
    from tests.engines import verl_runs as vr

    vc.setup()
    rv.patch_environment()
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from rlgates.inspect.capture_verl import capture_verl

    with tempfile.TemporaryDirectory() as tmp:
        w = vc.worker(vc.tiny_model_dir(os.path.join(tmp, "model")), lr=vr.LR, clip_grad=1e9)
        w.reset()
        base = vr.rollout()
        current = vr.engine_log_probs(w, base)
        old = current - vr.log_ratios()
        g = torch.Generator().manual_seed(1)
        td = vr.for_update(vr.rollout(old), 1, 0)
        sampler = old + 0.5 * torch.randn(old.shape, generator=g, dtype=old.dtype)
        # in verl's no-padding layout, as the batch's other per-token fields
        td["rollout_log_probs"] = torch.nested.as_nested_tensor(
            [sampler[i, :n].float() for i, n in enumerate(vr.LENGTHS)], layout=torch.jagged)
        tu.assign_non_tensor(td, calculate_entropy=True)
        config = vr.actor_config("vanilla", clip_ratio=vr.EPS, clip_ratio_low=vr.EPS,
                                 clip_ratio_high=vr.EPS, clip_ratio_c=vr.C)
        # the worker's own loss, as verl's actor sets it: the capture wraps it and restores it
        own = partial(ppo_loss, config=config)
        w.set_loss_fn(own)
        with capture_verl(w, config, out / "capture") as handle:
            losses = []
            for _ in range(STEPS):
                m = tu.get(w.train_mini_batch(td.clone()), "metrics") or {}
                losses.append({k: (v[0] if isinstance(v, list) else v) for k, v in m.items()
                               if k in ("actor/pg_loss", "actor/pg_clipfrac",
                                        "actor/ppo_kl")})
        assert handle.closed and handle.inner is own and w.loss_fn is own
    facts = {"engine_log_probs": current.tolist(), "old_log_probs": old.tolist(),
             "rollout_log_probs": sampler.tolist(), "lengths": vr.LENGTHS,
             "advantages": vr.ADVANTAGES, "steps": STEPS,
             "metrics": [{k: float(v) for k, v in m.items()} for m in losses]}
    (out / "facts.json").write_text(json.dumps(facts))
    print(f"wrote {out}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
