"""verl 0.9.1's real actor update on the CPU: its built-in losses against the rlgates adapter.

    python tests/engines/verl_runs.py OUT.json                           # the one-process cases
    torchrun --nproc_per_node 2 tests/engines/verl_runs.py OUT.json      # the two-process cases

Each case runs one `TrainingWorker.train_mini_batch` (verl's `ppo_loss` -> `get_policy_loss_fn`)
on one fixed batch, from the same initial weights (restored between cases, the optimiser state
cleared), and records the gradient just before the optimiser step, verl's grad_norm, its loss and
metrics, and what reached the loss on each micro-batch (dp_size, batch_num_tokens,
global_batch_size, token counts, the engine's log-probs). The numbers are merged into OUT.json
under "one_process" or "two_process"; the one-process gradients also go to a .pt file next to it,
which the two-process run compares its own against (tests/engines/test_verl_engine.py asserts on
both). The one-process launch also checks the TRL shim, verl's worker imports and the
registration in a local Ray cluster, so that verl is imported once. CPU workarounds:
tests/verl_cpu.py.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T_START = time.perf_counter()
# verl imports Ray, Ray imports jsonschema, and jsonschema's optional IRI format checker
# (rfc3987_syntax, installed for Jupyter) compiles its lark grammars at import: seconds of CPU in
# each verl process, for a check no step here makes. Marked absent, jsonschema skips it.
sys.modules.setdefault("rfc3987_syntax", None)

import torch  # noqa: E402

import rlgates  # noqa: E402
from rlgates.trainers import verl as rv  # noqa: E402

SHIM_APPLIED_BY_IMPORT = "trl.experimental.ppo" in sys.modules  # before anything patches it

from tests import verl_cpu as vc  # noqa: E402

PROMPT = 3
LENGTHS = [6, 2, 5, 1, 6, 4, 3, 6]  # ragged; rows 0-3 and 4-7: 14 and 19 tokens
ADVANTAGES = [1.0, -1.0, -0.5, 0.8, -1.2, 0.6, -0.7, 1.5]  # one per row, as GRPO's
EPS, C = 0.2, 3.0
ROWS_PER_MICRO = {1: 4, 2: 2}  # so two micro-batches per rank either way
LR = 5e-2


def log_ratios(lengths=LENGTHS, seed=0):
    """log ρ per response token: uniform in ±0.6 (both sides of 1 ± ε), plus ρ = 4 > c on one
    A < 0 token of each half of the batch (rows 1 and 4) and on one A > 0 token (row 0)."""
    g = torch.Generator().manual_seed(seed)
    lr = (torch.rand(len(lengths), max(lengths), generator=g, dtype=torch.float64) - 0.5) * 1.2
    for row, col in ((1, 0), (4, 2), (0, 3)):
        lr[row, col] = math.log(4.0)
    return lr


def rollout(old_log_probs=None, seed=0, vocab=33):
    """The fixed batch in verl's layout, as verl's trainer hands it on (ray_trainer.py
    `_update_actor`: to_tensordict, then left_right_2_no_padding)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    B, T = len(LENGTHS), max(LENGTHS)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab - 1, (B, PROMPT + T), generator=g)
    attention_mask = torch.ones(B, PROMPT + T, dtype=torch.long)
    attention_mask[2, 0] = 0  # one left-padded prompt
    for i, n in enumerate(LENGTHS):
        attention_mask[i, PROMPT + n:] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, PROMPT:].clone()
    old = torch.zeros(B, T) if old_log_probs is None else old_log_probs.float()
    td = TensorDict({
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "prompts": input_ids[:, :PROMPT], "responses": input_ids[:, PROMPT:],
        "response_mask": response_mask, "old_log_probs": old,
        "advantages": torch.tensor(ADVANTAGES)[:, None].expand(B, T).clone(),
    }, batch_size=[B])
    tu.assign_non_tensor_data(td, "temperature", 1.0)
    return left_right_2_no_padding(td)


def for_update(td, world, rank):
    """This rank's rows, with the non-tensor data `_update_actor` sets."""
    from verl.utils import tensordict_utils as tu

    B = len(LENGTHS)
    rows = B // world
    td = tu.index_select_tensor_dict(td, torch.arange(rank * rows, (rank + 1) * rows))
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False,
                         distillation_only=False, global_batch_size=B, mini_batch_size=B,
                         epochs=1, seed=0, dataloader_kwargs={"shuffle": False},
                         compute_loss=True, micro_batch_size_per_gpu=ROWS_PER_MICRO[world])
    return td


def engine_log_probs(w, td):
    """The engine's own log-probs of the responses (verl's compute_log_prob: infer_batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    td = td.clone()
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False,
                         micro_batch_size_per_gpu=len(LENGTHS), global_batch_size=len(LENGTHS))
    out = w.infer_batch(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).double()


# --- the losses ------------------------------------------------------------------------------
def actor_config(loss_mode, **kw):
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=len(LENGTHS), rollout_n=1,
                           ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
                           loss_agg_mode="token-mean", policy_loss={"loss_mode": loss_mode}, **kw)


def register_controls(world):
    """Two wrong losses under names of their own: the loss ×2 (the Adam trap) and a
    per-micro-batch token mean (a wrong normaliser: each micro-batch divided by its own count,
    scaled as if every micro-batch held the same count)."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    ppo = rv.policy_loss(rlgates.get("ppo", eps=EPS))

    def times_two(*a, **k):
        loss, m = ppo(*a, **k)
        return 2 * loss, m

    def local_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                   config=None, rollout_is_weights=None):
        micro = len(LENGTHS) // world // ROWS_PER_MICRO[world]
        n = int(response_mask.sum()) * micro * world
        cfg = type("Cfg", (), {"global_batch_info": {**config.global_batch_info,
                                                     "batch_num_tokens": n}})()
        return ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, cfg,
                   rollout_is_weights)

    register_policy_loss("rlgates_ppo_times_two")(times_two)
    register_policy_loss("rlgates_ppo_local_mean")(local_mean)


def cases():
    """name -> (loss_mode, extra actor settings); the adapter's names are registered first."""
    assert rv.register(rlgates.get("dual_clip", eps=EPS, c=C)) == "rlgates_dual_clip"
    assert rv.register(rlgates.get("ppo", eps=EPS)) == "rlgates_ppo"
    sapo = rlgates.get("sapo")
    assert rv.register(sapo, agg="seq-mean-token-mean") == "rlgates_sapo"
    clip = {"clip_ratio": EPS, "clip_ratio_low": EPS, "clip_ratio_high": EPS}
    taus = {k: sapo.hparams[k] for k in ("tau_pos", "tau_neg")}
    return {
        "vanilla_c3": ("vanilla", {**clip, "clip_ratio_c": C}),
        "rlgates_dual_clip": ("rlgates_dual_clip", {}),
        "vanilla_cinf": ("vanilla", {**clip, "clip_ratio_c": float("inf")}),
        "rlgates_ppo": ("rlgates_ppo", {}),
        "sapo": ("sapo", taus),
        "rlgates_sapo": ("rlgates_sapo", {}),
        "rlgates_ppo_local_mean": ("rlgates_ppo_local_mean", {}),
        "rlgates_ppo_times_two": ("rlgates_ppo_times_two", {}),
    }


# --- one case --------------------------------------------------------------------------------
def full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


class Recorder:
    """Wraps the worker's optimiser step (to read the gradient) and verl's ppo_loss (to read what
    reaches the loss on each micro-batch)."""

    def __init__(self, w):
        self.w, self.grads, self.micro = w, None, []
        step = w.engine.optimizer_step

        def optimizer_step():
            self.grads = {n: full(p.grad) for n, p in w.engine.module.named_parameters()}
            return step()

        w.engine.optimizer_step = optimizer_step

    def loss_fn(self, config):
        from verl.workers.utils.losses import ppo_loss
        from verl.workers.utils.padding import no_padding_2_padding

        def fn(model_output, data, dp_group=None):
            loss, metrics = ppo_loss(config, model_output, data, dp_group)
            d = data.select("response_mask", "old_log_probs", "advantages").to_padded_tensor()
            info = config.global_batch_info
            self.micro.append({
                "loss": loss.item(), "tokens": int(d["response_mask"].sum()),
                "dp_size": int(info["dp_size"]), "batch_num_tokens": int(info["batch_num_tokens"]),
                "global_batch_size": int(info["global_batch_size"]),
                "metrics": {k: float(v.aggregate()) for k, v in metrics.items()
                            if k.startswith("actor/") and hasattr(v, "aggregate")},
                "log_prob": no_padding_2_padding(model_output["log_probs"], data).detach().double(),
                "old": d["old_log_probs"].double(), "adv": d["advantages"].double(),
                "mask": d["response_mask"].bool()})
            return loss, metrics

        return fn


def run_case(w, rec, init, td, mode, extra):
    from verl.utils import tensordict_utils as tu

    with torch.no_grad():
        for p, p0 in zip(w.engine.module.parameters(), init, strict=True):
            p.copy_(p0)
    w.engine.optimizer.state.clear()
    rec.micro, rec.grads = [], None
    w.set_loss_fn(rec.loss_fn(actor_config(mode, **extra)))
    m = tu.get(w.train_mini_batch(td.clone()), "metrics") or {}
    one = {k: (v[0] if isinstance(v, list) else v) for k, v in m.items()}
    weights = [full(p) for p in w.engine.module.parameters()]
    return {"metrics": {k: float(v) for k, v in one.items() if isinstance(v, (int, float))},
            "micro": rec.micro, "grads": rec.grads, "weights": weights}


def flat(grads):
    return torch.cat([g.double().flatten() for g in grads.values()])


def rel(a, b):
    return float((a - b).norm() / b.norm())


def gate_facts(micro):
    """ρ and the clipped tokens of a case's micro-batches (the engine's log-probs against old)."""
    lr = torch.cat([(m["log_prob"] - m["old"])[m["mask"]] for m in micro])
    a = torch.cat([m["adv"][m["mask"]] for m in micro])
    r = lr.exp()
    bounds = torch.tensor([1 - EPS, 1 + EPS, C], dtype=torch.float64)
    return {"rho_min": float(r.min()), "rho_max": float(r.max()),
            "rho_ne_1": int((lr.abs() > 1e-3).sum()), "tokens": int(r.numel()),
            "clipped_upper": int(((a > 0) & (r > 1 + EPS)).sum()),
            "clipped_lower": int(((a < 0) & (r < 1 - EPS)).sum()),
            "dual_clipped": int(((a < 0) & (r > C)).sum()),
            "inside": int(((r >= 1 - EPS) & (r <= 1 + EPS)).sum()),
            "min_distance_to_a_bound": float((r[:, None] - bounds).abs().min())}


def global_token_mean(method, micro, agg="token-mean"):
    """rlgates' own loss over the whole batch (every micro-batch, this rank) at the engine's
    log-probs: the number verl's summed micro-batch losses must equal."""
    from rlgates import trainers as rt

    T = max(m["mask"].shape[1] for m in micro)

    def pad(x):
        return torch.nn.functional.pad(x, (0, T - x.shape[1]))

    cat = {k: torch.cat([pad(m[k]) for m in micro]) for k in ("log_prob", "old", "adv", "mask")}
    return float(rt.loss(method, cat["log_prob"], cat["old"], cat["adv"], cat["mask"], agg))


def summarise(res, world):
    """The numbers of one case, without tensors."""
    micro = res["micro"]
    keys = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
    return {
        "loss": res["metrics"]["loss"], "grad_norm": res["metrics"]["grad_norm"],
        "lr": res["metrics"].get("lr"), "pg_loss": res["metrics"]["actor/pg_loss"],
        "entropy_keys": sorted(k for k in res["metrics"] if "entropy" in k),
        "micro_losses": [m["loss"] for m in micro], "micro_tokens": [m["tokens"] for m in micro],
        "dp_size": sorted({m["dp_size"] for m in micro}),
        "batch_num_tokens": sorted({m["batch_num_tokens"] for m in micro}),
        "global_batch_size": sorted({m["global_batch_size"] for m in micro}),
        "logged": {k: res["metrics"][k] for k in keys if k in res["metrics"]},
        "micro_metrics": [{k: m["metrics"][k] for k in keys if k in m["metrics"]} for m in micro],
        "rlgates_gate_mean": res["metrics"].get("actor/rlgates_gate_mean"),
        "world": world}


# --- checks that need no worker: the TRL shim and the worker's imports -----------------------
def shim_facts():
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    from rlgates.trainers import _verl_compat as compat

    out = {"applied_by_import": SHIM_APPLIED_BY_IMPORT, "needed": compat.needed()}
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
    out["state_dict_is_module"] = (V.state_dict(model).keys()
                                   == torch.nn.Module.state_dict(model).keys())
    try:
        V.from_pretrained("anything")
        out["from_pretrained"] = None
    except NotImplementedError as e:
        out["from_pretrained"] = str(e)
    return out


def import_facts():
    import importlib.metadata as md

    import verl.workers.engine_workers as ew

    return {"worker": hasattr(ew, "TrainingWorker"),
            "versions": {k: md.version(k) for k in ("uvicorn", "fastapi", "starlette")}}


# --- registration in a local Ray cluster -----------------------------------------------------
def start_ray_check(model_dir):
    """Ask a worker of a local Ray cluster for the loss this (driver) process registered, then
    again after verl's external_lib hook; returns a function that waits for the answer. Started
    before the engine cases, so that the worker imports verl while they run."""
    import ray
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    assert "rlgates_ppo" in POLICY_LOSS_REGISTRY  # registered here, in the driver

    @ray.remote
    def in_worker(model_dir):
        import os

        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config import HFModelConfig

        out = {"pid": os.getpid()}
        try:
            get_policy_loss_fn("rlgates_ppo")
            out["before"] = None
        except ValueError as e:
            out["before"] = str(e)
        # the hook ActorRolloutRefWorker.init_model runs (actor_rollout_ref.model.external_lib)
        HFModelConfig(path=model_dir, external_lib="tests.engines.verl_register")
        out["after"] = get_policy_loss_fn("rlgates_ppo").__name__
        return out

    t0 = time.perf_counter()
    # a local cluster on the loopback; its worker inherits this process's PYTHONPATH
    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=80 * 1024**2, log_to_driver=False)
    ref = in_worker.remote(model_dir)

    def wait():
        try:
            out = ray.get(ref, timeout=300)
        finally:
            ray.shutdown()
        return {**out, "driver_pid": os.getpid(), "wall_s": time.perf_counter() - t0}

    return wait


# --- the launches ----------------------------------------------------------------------------
def main():
    path = Path(sys.argv[1] if len(sys.argv) > 1 else
                os.environ.get("RLGATES_VERL_JSON", ROOT / "_build/engines/verl.json"))
    grads_1p = path.with_suffix(".grads.pt")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    out = {}
    vc.setup()  # before verl's worker module is imported
    if world == 1:
        out["shim"] = shim_facts()
        out["imports"] = import_facts()
    rv.patch_environment()
    import torch.distributed as dist

    register_controls(world)
    modes = cases()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = vc.tiny_model_dir(os.path.join(tmp, "model"))  # each rank: the same seed
        ray_check = start_ray_check(model_dir) if world == 1 else None
        w = vc.worker(model_dir, lr=LR, clip_grad=1e9)
        w.reset()
        out["worker_built_s"] = time.perf_counter() - t0
        gc.freeze()  # the imports' objects: no collection below need scan them again
        init = [p.detach().clone() for p in w.engine.module.parameters()]
        rec = Recorder(w)
        base = rollout()
        current = engine_log_probs(w, base)
        old = current - log_ratios()
        td = for_update(rollout(old), world, rank)
        results = {name: run_case(w, rec, init, td, mode, extra)
                   for name, (mode, extra) in modes.items()}
        out["cases"] = {k: summarise(r, world) for k, r in results.items()}
        # every rank's micro-batches (tensors included), for facts about the whole batch
        every = [None] * world
        dist.all_gather_object(every, {k: r["micro"] for k, r in results.items()})
        whole = {k: [m for r in every for m in r[k]] for k in results}
        out["gate"] = gate_facts(whole["rlgates_ppo"])
        out["rank_micro_tokens"] = [[m["tokens"] for m in r["rlgates_ppo"]] for r in every]
        out["rank_micro_losses"] = {k: [[m["loss"] for m in r[k]] for r in every] for k in results}
        out["rank_micro_metrics"] = {k: [[m["metrics"] for m in r[k]] for r in every]
                                     for k in results}
        # rlgates' own loss over the whole batch at the engine's log-probs
        out["own_loss"] = {
            "rlgates_ppo": global_token_mean(rlgates.get("ppo", eps=EPS), whole["rlgates_ppo"]),
            "rlgates_dual_clip": global_token_mean(rlgates.get("dual_clip", eps=EPS, c=C),
                                                   whole["rlgates_dual_clip"]),
            "rlgates_sapo": global_token_mean(rlgates.get("sapo"), whole["rlgates_sapo"],
                                              "seq-mean-token-mean")}
        out["cases_done_s"] = time.perf_counter() - t0
        g = {k: flat(r["grads"]) for k, r in results.items()}
        w0 = torch.cat([p.double().flatten() for p in (full(q) for q in init)])
        W = {k: torch.cat([x.double().flatten() for x in r["weights"]]) for k, r in results.items()}
        pairs = {"dual_clip": ("rlgates_dual_clip", "vanilla_c3"),
                 "ppo": ("rlgates_ppo", "vanilla_cinf"), "sapo": ("rlgates_sapo", "sapo"),
                 "no_dual_clip_control": ("rlgates_ppo", "vanilla_c3"),
                 "local_mean_control": ("rlgates_ppo_local_mean", "vanilla_cinf"),
                 "adam_trap": ("rlgates_ppo_times_two", "rlgates_ppo")}
        out["compare"] = {k: {"ours": a, "ref": b, "grad_rel": rel(g[a], g[b]),
                              "step_rel": rel(W[a] - w0, W[b] - w0)}
                          for k, (a, b) in pairs.items()}
        if world == 1:
            torch.save({k: v.float() for k, v in g.items()}, grads_1p)
            out["ray"] = ray_check()
        else:
            ref = torch.load(grads_1p)
            out["vs_one_process"] = {k: rel(v, ref[k].double()) for k, v in g.items()}
        dist.barrier()
    out["wall_s"] = time.perf_counter() - t0
    out["imports_s"] = t0 - T_START
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data["two_process" if world > 1 else "one_process"] = out
        data["versions"] = {"torch": torch.__version__, "verl": __import__("verl").__version__}
        path.write_text(json.dumps(data, indent=1))
        print(f"wrote {path} ({out['wall_s']:.1f} s)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
