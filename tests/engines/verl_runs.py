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

Two more sets of cases on the same worker: the batch again with per-token advantages (GAE,
`token_advantages`) under the built-ins and the adapters ("token"), and, in one process, a
batch in verl's padding-free v1 layout and in the legacy padded one under
seq-mean-token-sum-norm, split two ways, with loss_scale_factor unset or set, and once with
the packed forward ("padding": what width each micro-batch's loss saw, and the gradient).
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


def rollout(old_log_probs=None, seed=0, vocab=33, advantages=None):
    """The fixed batch in verl's layout, as verl's trainer hands it on (ray_trainer.py
    `_update_actor`: to_tensordict, then left_right_2_no_padding). advantages: [B, T] per token
    (None: one per row, ADVANTAGES, on every token, as verl's GRPO writes them)."""
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
        "advantages": (torch.tensor(ADVANTAGES)[:, None].expand(B, T).clone()
                       if advantages is None else advantages.float()),
    }, batch_size=[B])
    tu.assign_non_tensor_data(td, "temperature", 1.0)
    return left_right_2_no_padding(td)


def token_advantages(lengths=LENGTHS, rewards=ADVANTAGES, seed=3):
    """Per-token advantages as verl's default PPO computes them: GAE (rlgates.advantages.gae,
    γ 0.9, λ 0.8, not whitened) of one reward per row on its last token against a made-up
    critic's values (uniform in ±0.8). A varies along each row and changes sign inside some."""
    B, T = len(lengths), max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    r = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        r[i, n - 1] = rewards[i]
    g = torch.Generator().manual_seed(seed)
    values = (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 1.6
    adv, _ = rlgates.advantages.gae(r, values, mask, gamma=0.9, lam=0.8)
    return adv


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
def actor_config(loss_mode, loss_agg_mode="token-mean", rows=None, **kw):
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=rows or len(LENGTHS), rollout_n=1,
                           ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
                           loss_agg_mode=loss_agg_mode, policy_loss={"loss_mode": loss_mode},
                           **kw)


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


GSPO_EPS = 0.1  # GSPO's ε: some rows' geometric-mean ratio inside 1 ± ε, some outside


def token_cases():
    """The per-token-A cases: name -> (loss_mode, extra actor settings)."""
    assert rv.register(rlgates.get("gspo", eps_low=GSPO_EPS, eps_high=GSPO_EPS)) == "rlgates_gspo"
    clip = {"clip_ratio": EPS, "clip_ratio_low": EPS, "clip_ratio_high": EPS}
    gspo = {"clip_ratio": GSPO_EPS, "clip_ratio_low": GSPO_EPS, "clip_ratio_high": GSPO_EPS,
            "loss_agg_mode": "seq-mean-token-mean"}
    return {
        "vanilla_c3": ("vanilla", {**clip, "clip_ratio_c": C}),
        "rlgates_dual_clip": ("rlgates_dual_clip", {}),
        "vanilla_cinf": ("vanilla", {**clip, "clip_ratio_c": float("inf")}),
        "rlgates_ppo": ("rlgates_ppo", {}),
        "gspo": ("gspo", gspo),
        "rlgates_gspo": ("rlgates_gspo", {"loss_agg_mode": "seq-mean-token-mean"}),
    }


TOKEN_PAIRS = {"dual_clip": ("rlgates_dual_clip", "vanilla_c3"),
               "ppo": ("rlgates_ppo", "vanilla_cinf"), "gspo": ("rlgates_gspo", "gspo")}


def row_vs_token_adapter(micro_row, micro_tok, info):
    """The adapter's verl loss function called directly on micro-batches the engine passed: with
    A of shape [B] (one per row) against the [B, T] verl passed, constant along each row (the
    same loss and gradient, exactly), and the per-token run's A against its row means (a
    varying A: not the same)."""
    from types import SimpleNamespace

    fn = rv.policy_loss(rlgates.get("ppo", eps=EPS))
    cfg = SimpleNamespace(global_batch_info=dict(info))

    def value_grad(m, adv):
        leaf = m["log_prob"].clone().requires_grad_(True)
        loss, _ = fn(m["old"], leaf, adv, m["mask"], "token-mean", cfg)
        loss.backward()
        return float(loss.detach()), leaf.grad

    out = {"row_dloss": 0.0, "row_dgrad": 0.0, "row_constant": True, "tok_dloss": 0.0}
    for m in micro_row:
        a = m["adv"]
        out["row_constant"] &= bool(((a - a[:, :1]).abs() * m["mask"]).max() == 0)
        v_bt, g_bt = value_grad(m, a)
        v_b, g_b = value_grad(m, a[:, 0])
        out["row_dloss"] = max(out["row_dloss"], abs(v_bt - v_b))
        out["row_dgrad"] = max(out["row_dgrad"], float((g_bt - g_b).abs().max()))
    for m in micro_tok:
        a = m["adv"]
        mean = (a * m["mask"]).sum(-1) / m["mask"].sum(-1).clamp(min=1)
        v_bt, _ = value_grad(m, a)
        v_b, _ = value_grad(m, mean)
        out["tok_dloss"] = max(out["tok_dloss"], abs(v_bt - v_b))
    return out


# --- padding-free batches: what seq-mean-token-sum-norm divides by ----------------------------
PAD_LENGTHS = [7, 1, 2, 5, 3, 1, 4, 2]  # fixed pairs: longest 7, 5, 3, 4
PAD_PROMPTS = [3, 2, 3, 2, 3, 2, 3, 2]
PAD_WIDTH = 8  # the rollout's max_response_length: the padded trainer's width
PAD_TOKEN_BUDGET = 12  # use_dynamic_bsz: max_token_len_per_gpu (prompt + response tokens)


def padding_free_batch(old, adv, vocab=33, seed=2):
    """The batch as verl's v1 trainer (trainer.use_v1, the default) hands it to the actor: every
    field per sample, unpadded (agent_loop_tq.py stores each sample's own tensors;
    list_of_dict_to_tensordict makes jagged nested tensors), advantages written back nested
    (trainer_base.py `response_to_nested`), and no `max_response_len`."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, (n, p) in enumerate(zip(PAD_LENGTHS, PAD_PROMPTS, strict=True)):
        ids = torch.randint(3, vocab - 1, (p + n,), generator=g)
        rows.append({"prompts": ids[:p], "responses": ids[p:], "input_ids": ids,
                     "position_ids": torch.arange(p + n),
                     "response_mask": torch.ones(n, dtype=torch.long),
                     "loss_mask": torch.ones(n, dtype=torch.long),
                     "old_log_probs": old[i, :n].float(), "advantages": adv[i, :n].float()})
    td = tu.list_of_dict_to_tensordict(rows)
    tu.assign_non_tensor_data(td, "temperature", 1.0)
    return td


def padded_batch(old, adv, vocab=33, seed=2):
    """The same samples as the legacy trainer (ray_trainer.py) hands them on: responses padded to
    the rollout's width PAD_WIDTH, then left_right_2_no_padding (which packs the prompt and
    response ids but keeps the response fields [B, PAD_WIDTH] and records max_response_len)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    v1 = padding_free_batch(old, adv, vocab, seed)
    B, P = len(PAD_LENGTHS), max(PAD_PROMPTS)
    ids = torch.zeros(B, P + PAD_WIDTH, dtype=torch.long)
    att = torch.zeros(B, P + PAD_WIDTH, dtype=torch.long)
    for i, (n, p) in enumerate(zip(PAD_LENGTHS, PAD_PROMPTS, strict=True)):
        seq = v1["input_ids"][i]
        ids[i, P - p:P + n] = seq  # prompts left-padded, responses right-padded
        att[i, P - p:P + n] = 1
    mask = att[:, P:].clone()
    wide = torch.zeros(B, PAD_WIDTH)
    olds, advs = wide.clone(), wide.clone()
    olds[:, :old.shape[1]], advs[:, :adv.shape[1]] = old.float(), adv.float()
    td = TensorDict({"input_ids": ids, "attention_mask": att,
                     "position_ids": (att.cumsum(-1) - 1).clamp(min=0),
                     "prompts": ids[:, :P], "responses": ids[:, P:], "response_mask": mask,
                     "old_log_probs": olds * mask, "advantages": advs * mask}, batch_size=[B])
    tu.assign_non_tensor_data(td, "temperature", 1.0)
    return left_right_2_no_padding(td)


def padding_cases():
    """name -> (layout, split, loss_scale_factor, use_remove_padding): every combination of the
    two layouts, two micro-batch splits and loss_scale_factor None or PAD_WIDTH, and one case
    with verl's packed forward."""
    out = {f"{lay}_{split}_{'L' if lsf else 'T'}": (lay, split, lsf, False)
           for lay in ("v1", "padded") for split in ("fixed", "dynamic")
           for lsf in (None, PAD_WIDTH)}
    out["v1_fixed_T_packed"] = ("v1", "fixed", None, True)
    return out


def padding_free(w, rec, init):
    """verl's built-in (vanilla: dual-clip, c 3) and the adapter (rlgates_dual_clip) under
    loss_agg_mode seq-mean-token-sum-norm, in verl's real update, for every padding case:
    what each micro-batch's loss saw (its width, rows, tokens), its loss, and the gradient."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    B, T = len(PAD_LENGTHS), max(PAD_LENGTHS)
    adv = token_advantages(PAD_LENGTHS, [1.0, -1.0, 0.5, -0.8, 1.2, 0.6, -0.7, -1.5])
    probe = padding_free_batch(torch.zeros(B, T), adv)
    tu.assign_non_tensor(probe, calculate_entropy=False, compute_loss=False,
                         micro_batch_size_per_gpu=B, global_batch_size=B)
    current = no_padding_2_padding(tu.get(w.infer_batch(probe), "log_probs"), probe).double()
    old = current - log_ratios(PAD_LENGTHS, seed=1)
    layouts = {"v1": padding_free_batch(old, adv), "padded": padded_batch(old, adv)}
    splits = {"fixed": {"micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False},
              "dynamic": {"use_dynamic_bsz": True, "max_token_len_per_gpu": PAD_TOKEN_BUDGET}}
    clip = {"clip_ratio": EPS, "clip_ratio_low": EPS, "clip_ratio_high": EPS, "clip_ratio_c": C}
    out, grads, micro = {}, {}, {}
    for name, (lay, split, lsf, packed) in padding_cases().items():
        for loss_mode, extra in (("vanilla", clip), ("rlgates_dual_clip", {})):
            td = layouts[lay].clone()
            tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False,
                                 distillation_only=False, global_batch_size=B,
                                 mini_batch_size=B, epochs=1, seed=0,
                                 dataloader_kwargs={"shuffle": False}, compute_loss=True,
                                 use_remove_padding=packed, **splits[split])
            with torch.no_grad():
                for p, p0 in zip(w.engine.module.parameters(), init, strict=True):
                    p.copy_(p0)
            w.engine.optimizer.state.clear()
            rec.micro, rec.grads = [], None
            cfg = actor_config(loss_mode, "seq-mean-token-sum-norm", rows=B,
                               loss_scale_factor=lsf, **extra)
            w.set_loss_fn(rec.loss_fn(cfg))
            m = tu.get(w.train_mini_batch(td), "metrics")
            key = f"{name}/{loss_mode}"
            grads[key] = flat(rec.grads)
            micro[key] = rec.micro
            out[key] = {
                "loss": float(m["loss"][0] if isinstance(m["loss"], list) else m["loss"]),
                "grad_norm": float(grads[key].norm()),
                "widths": [mm["mask"].shape[1] for mm in rec.micro],
                "rows": [mm["mask"].shape[0] for mm in rec.micro],
                "row_lengths": [mm["mask"].sum(-1).tolist() for mm in rec.micro],
                "log_prob_widths": [mm["log_prob"].shape[1] for mm in rec.micro],
                "micro_losses": [mm["loss"] for mm in rec.micro],
                "loss_scale_factor": lsf, "use_remove_padding": packed}
    return out, grads, micro


SUM_NORM = "seq-mean-token-sum-norm"


def micro_sum_loss(micro, method, length=None):
    """rlgates' own seq-mean-token-sum-norm (`rlgates.trainers.loss`, norm = the batch's rows) on
    each micro-batch the loss saw, divided by `length`, or (None) by the width that micro-batch
    had, summed over the micro-batches."""
    from rlgates import trainers as rt

    return sum(float(rt.loss(method, m["log_prob"], m["old"], m["adv"], m["mask"], SUM_NORM,
                             norm=len(PAD_LENGTHS), length=length or m["mask"].shape[1]))
               for m in micro)


def whole_loss(micro, method, length):
    """The same loss over the whole batch at once (the micro-batches padded to one width), every
    row's token sum divided by the one constant `length`."""
    from rlgates import trainers as rt

    W = max(m["mask"].shape[1] for m in micro)

    def pad(x):
        return torch.nn.functional.pad(x, (0, W - x.shape[1]))

    cat = {k: torch.cat([pad(m[k]) for m in micro]) for k in ("log_prob", "old", "adv", "mask")}
    return float(rt.loss(method, cat["log_prob"], cat["old"], cat["adv"], cat["mask"], SUM_NORM,
                         norm=len(PAD_LENGTHS), length=length))


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


def gspo_rows(micro):
    """GSPO's gate on this batch: how many rows' geometric-mean ratio lies inside 1 ± ε, and how
    many outside (so the per-token comparison is not vacuous)."""
    inside = outside = 0
    for m in micro:
        n = m["mask"].sum(-1)
        s = (((m["log_prob"] - m["old"]) * m["mask"]).sum(-1) / n.clamp(min=1)).exp()
        ok = (s - 1).abs() <= GSPO_EPS
        inside += int((ok & (n > 0)).sum())
        outside += int((~ok & (n > 0)).sum())
    return {"inside": inside, "outside": outside}


def sign_change_rows(micro):
    """Rows whose advantages take both signs."""
    return sum(int(((m["adv"] > 0) & m["mask"]).any(-1).logical_and(
        ((m["adv"] < 0) & m["mask"]).any(-1)).sum()) for m in micro)


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
    # a local cluster on the loopback; its worker inherits this process's PYTHONPATH. Ray's
    # driver gives its node 30 s to register, and the node first waits for its agent process:
    # on two busy cores (the browser tests run beside this step) that can take longer, so a
    # start that times out is tried again, up to three times in all
    for attempt in range(1, 4):
        try:
            ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=80 * 1024**2, log_to_driver=False)
            break
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception here
            if "timed out during startup" not in str(e) or attempt == 3:
                raise
            print(f"ray.init attempt {attempt} timed out; trying again", file=sys.stderr)
            ray.shutdown()
            time.sleep(2)
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
        # per-token advantages (GAE): the same rows and ratios, A varying along each row
        tok_modes = token_cases()
        td_tok = for_update(rollout(old, advantages=token_advantages()), world, rank)
        tok = {name: run_case(w, rec, init, td_tok, mode, extra)
               for name, (mode, extra) in tok_modes.items()}
        every_tok = [None] * world
        dist.all_gather_object(every_tok, {k: r["micro"] for k, r in tok.items()})
        whole_tok = {k: [m for r in every_tok for m in r[k]] for k in tok}
        g_tok = {k: flat(r["grads"]) for k, r in tok.items()}
        g_row = flat(results["rlgates_ppo"]["grads"])
        info = {"dp_size": world, "global_batch_size": len(LENGTHS),
                "batch_num_tokens": out["cases"]["rlgates_ppo"]["batch_num_tokens"][0]}
        out["token"] = {
            "cases": {k: summarise(r, world) for k, r in tok.items()},
            "gate": gate_facts(whole_tok["rlgates_ppo"]),
            "gspo_rows": gspo_rows(whole_tok["rlgates_gspo"]),
            "adv_sign_change_rows": sign_change_rows(whole_tok["rlgates_ppo"]),
            "compare": {k: {"ours": a, "ref": b, "grad_rel": rel(g_tok[a], g_tok[b])}
                        for k, (a, b) in TOKEN_PAIRS.items()},
            "token_vs_row_grad_rel": rel(g_tok["rlgates_ppo"], g_row),
            "own_loss": {
                "rlgates_ppo": global_token_mean(rlgates.get("ppo", eps=EPS),
                                                 whole_tok["rlgates_ppo"]),
                "rlgates_dual_clip": global_token_mean(rlgates.get("dual_clip", eps=EPS, c=C),
                                                       whole_tok["rlgates_dual_clip"]),
                "rlgates_gspo": global_token_mean(
                    rlgates.get("gspo", eps_low=GSPO_EPS, eps_high=GSPO_EPS),
                    whole_tok["rlgates_gspo"], "seq-mean-token-mean")},
            "adapter_called_directly": row_vs_token_adapter(
                results["rlgates_ppo"]["micro"], tok["rlgates_ppo"]["micro"], info)}
        if world == 1:  # padding-free batches (one process: the split is the point)
            t_pad = time.perf_counter()
            pad, g_pad, micro_pad = padding_free(w, rec, init)
            dc = rlgates.get("dual_clip", eps=EPS, c=C)
            for key, c in pad.items():
                c["grad_rel_vs_v1_fixed_L"] = rel(g_pad[key], g_pad["v1_fixed_L/vanilla"])
                c["grad_rel_vs_v1_fixed_T"] = rel(g_pad[key], g_pad["v1_fixed_T/vanilla"])
                c["closed_form_micro"] = micro_sum_loss(micro_pad[key], dc,
                                                        c["loss_scale_factor"])
                c["closed_form_whole_L"] = whole_loss(micro_pad[key], dc, PAD_WIDTH)
                c["closed_form_whole_longest"] = whole_loss(micro_pad[key], dc,
                                                            max(PAD_LENGTHS))
            names = sorted({k.split("/")[0] for k in pad})
            out["padding"] = {
                "lengths": PAD_LENGTHS, "prompts": PAD_PROMPTS, "width": PAD_WIDTH,
                "token_budget": PAD_TOKEN_BUDGET, "cases": pad,
                "adapter_vs_builtin": {n: rel(g_pad[f"{n}/rlgates_dual_clip"],
                                              g_pad[f"{n}/vanilla"]) for n in names},
                "wall_s": time.perf_counter() - t_pad}
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
