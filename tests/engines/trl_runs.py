"""TRL's GRPOTrainer over several steps, its own loss against the rlgates adapter, in lock-step.

    python tests/engines/trl_runs.py OUT.json                           # the one-process cases
    torchrun --nproc_per_node 2 tests/engines/trl_runs.py OUT.json      # the two-process cases

Each case trains two fresh copies of the tiny model from one seed, one with TRL's built-in loss
and one with `RlgatesGRPOTrainer` (plus negative controls), and records per-step loss, grad_norm,
reward, TRL's clip and length metrics, and the largest |ΔW| of the final weights. The numbers are
merged into OUT.json under "one_process" or "two_process" (tests/engines/test_trl_engine.py
asserts on them; a later chapter reads them). Two processes: gloo on the CPU (use_cpu=True);
`accelerate launch --cpu --num_processes 2` starts one process, so use torchrun.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

import rlgates  # noqa: E402
from rlgates import trainers as rt  # noqa: E402
from rlgates.trainers import trl as rtrl  # noqa: E402
from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer  # noqa: E402

KEYS = ("loss", "grad_norm", "reward", "clip_ratio/region_mean", "completions/min_length",
        "completions/max_length", "rlgates/gate_mean")


class Counting(rtrl.RlgatesGRPOTrainer):
    """The adapter, recording each micro-batch's local token count and num_items_in_batch."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = inputs.get("num_items_in_batch")
        self.counts.append((int(inputs["completion_mask"].sum()),
                            None if n is None else int(n)))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class LocalMean(rtrl.RlgatesGRPOTrainer):
    """A wrong normaliser: each micro-batch's own token mean (divided by its local count)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        local = inputs["completion_mask"].sum()
        a = self.args
        n = local * self.accelerator.num_processes * a.steps_per_generation
        n = n / self.current_gradient_accumulation_steps
        return super().compute_loss(model, {**inputs, "num_items_in_batch": n}, return_outputs)


def train(cls, args, data=DATA, **kw):
    model = tiny_model()
    t = cls(model=model, reward_funcs=reward_words, args=args, train_dataset=data,
            processing_class=tiny_tokenizer(), **kw)
    t.counts = []
    t.train()
    steps = [{k: e.get(k) for k in KEYS} for e in t.state.log_history if "loss" in e]
    W = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    return t, steps, W


def dW(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def flags_for(loss_type, m):
    f = dict(rt.flags(m)["trl"])
    f["loss_type"] = loss_type
    return f


def method_for(loss_type):
    if loss_type == "cispo":  # a cap at ρ = 1.2 (TRL's epsilon_high = 1.2): reached here
        return rlgates.get("cispo", eps_high=0.2)
    return rlgates.get({"grpo": "grpo", "bnpo": "dapo", "dr_grpo": "grpo", "dapo": "dapo",
                        "sapo": "sapo"}[loss_type])


def pair(loss_type, out, data=DATA, **cfg):
    m = method_for(loss_type)
    args = config(output_dir=out, **flags_for(loss_type, m), **cfg)
    _, ref, w_ref = train(GRPOTrainer, args, data)
    t, ours, w_ours = train(Counting, args, data, method=m)
    return {"loss_type": loss_type, "method": m.name, "cfg": cfg, "builtin": ref,
            "adapter": ours, "max_abs_dW": dW(w_ours, w_ref), "micro_batches": len(t.counts),
            "hparams": {k: float(v) for k, v in m.hparams.items()}}, t, args, w_ref


def one_process(out):
    cases = {}
    t0 = time.perf_counter()
    for name, lt, cfg in (("dapo", "dapo", {}), ("grpo", "grpo", {}),
                          ("dapo_spg4", "dapo", {"num_iterations": 1, "steps_per_generation": 4})):
        c, _, args, w_ref = pair(lt, out, max_steps=10, **cfg)
        if name == "dapo":
            _, neg, w_neg = train(rtrl.RlgatesGRPOTrainer, args, method=rlgates.get("reinforce"))
            _, bad, w_bad = train(LocalMean, args, method=rlgates.get("dapo"))
            c["reinforce_control"] = neg
            c["reinforce_max_abs_dW"] = dW(w_neg, w_ref)
            c["local_mean_control"] = bad
            c["local_mean_max_abs_dW"] = dW(w_bad, w_ref)
        cases[name] = c
    return {"num_processes": 1, "cases": cases, "wall_s": time.perf_counter() - t0}


def two_process(out):
    import torch.distributed as dist

    cases = {}
    t0 = time.perf_counter()
    # the last case: one epoch of 9 micro-batches (3 generation batches × 3 passes) in windows
    # of GA = 2, so the last window holds one micro-batch
    partial = {"steps_per_generation": 1, "num_iterations": 3, "max_steps": -1,
               "num_train_epochs": 1}
    runs = [(lt, lt, DATA, {"max_steps": 4})
            for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo")]
    runs += [(f"{lt}_partial", lt, DATA.select(range(12)), partial) for lt in ("dapo", "grpo")]
    for name, lt, data, cfg in runs:
        c, t, args, _ = pair(lt, out, data, **cfg)
        P = t.accelerator.num_processes
        # the generation batch: steps_per_generation micro-batches, reused num_iterations times
        G = args.steps_per_generation * args.num_iterations
        local = [sum(n for n, _ in t.counts[g:g + args.steps_per_generation])
                 for g in range(0, len(t.counts), G)]
        every = [None] * P
        dist.all_gather_object(every, {"local_gen": local, "counts": t.counts})
        glob = [sum(r["local_gen"][i] for r in every) for i in range(len(local))]
        items = [[n for _, n in r["counts"]] for r in every]
        c["num_processes"] = P
        c["rank_gen_tokens"] = [r["local_gen"] for r in every]
        c["global_gen_tokens"] = glob
        c["num_items_in_batch"] = items
        c["num_items_ok"] = all(items[r][i] == glob[i // G] for r in range(P)
                                for i in range(len(items[r])))
        cases[name] = c
    return {"num_processes": int(os.environ.get("WORLD_SIZE", 1)), "cases": cases,
            "wall_s": time.perf_counter() - t0}


def main():
    path = Path(sys.argv[1] if len(sys.argv) > 1 else
                os.environ.get("RLGATES_TRL_JSON", ROOT / "_build/engines/trl.json"))
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", 1))
    with tempfile.TemporaryDirectory() as out:
        result = two_process(out) if world > 1 else one_process(out)
    if int(os.environ.get("RANK", 0)) == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data["two_process" if world > 1 else "one_process"] = result
        data["versions"] = {"torch": torch.__version__,
                            "trl": __import__("trl").__version__}
        path.write_text(json.dumps(data, indent=1))
        print(f"wrote {path} ({result['wall_s']:.1f} s)")


if __name__ == "__main__":
    main()
