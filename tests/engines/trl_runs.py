"""TRL's GRPOTrainer over several steps, its own loss against the rlgates adapter, in lock-step.

    python tests/engines/trl_runs.py OUT.json                           # the one-process cases
    torchrun --nproc_per_node 2 tests/engines/trl_runs.py OUT.json      # the two-process cases

Each case trains two fresh copies of the tiny model from one seed, one with TRL's built-in loss
and one with `RlgatesGRPOTrainer` (plus negative controls), and records per-step loss, grad_norm,
reward, TRL's clip, entropy and length metrics, and the largest |ΔW| of the final weights; in two
processes also each rank's token counts, num_items_in_batch, and each micro-batch's returned loss
and window length. The one-process launch also measures the normalisers (`spg_against_ga`,
`clipping`). The numbers are
merged into OUT.json under "one_process" or "two_process" (tests/engines/test_trl_engine.py
asserts on them; a later chapter reads them). Two processes: gloo on the CPU (use_cpu=True);
`accelerate launch --cpu --num_processes 2` starts one process, so use torchrun.
The one-process launch also runs per-token advantages (`per_token_runs`, TRL's real update;
`per_token_loss_level`, TRL's _compute_loss on a hand-built batch).
"""

from __future__ import annotations

import gc
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

#: TRL's clip metrics (per loss_type) and entropy: the adapter logs them under TRL's names
TRL_METRIC_KEYS = ("clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean",
                   "clip_ratio/high_max", "clip_ratio/region_mean", "cispo_clip_ratio", "entropy")
KEYS = ("loss", "grad_norm", "reward", "completions/min_length", "completions/max_length",
        "rlgates/gate_mean", "rlgates/gate_zero", *TRL_METRIC_KEYS)


class Counting(rtrl.RlgatesGRPOTrainer):
    """The adapter, recording per micro-batch its local token count, num_items_in_batch, the loss
    it returned and the length of its accumulation window (current_gradient_accumulation_steps)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = inputs.get("num_items_in_batch")
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.counts.append((int(inputs["completion_mask"].sum()), None if n is None else int(n),
                            float(out.detach()), self.current_gradient_accumulation_steps))
        return out


class PreFix(GRPOTrainer):
    """TRL's dapo before its GA/SPG rescale (TRL PR #6024): the normaliser num_items_in_batch /
    num_processes, whatever steps_per_generation. TRL's own loss times the factor it now divides
    by, so everything else (metrics, clipping, logging) stays TRL's."""

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.model.training:
            loss = loss * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return loss


class Capture(GRPOTrainer):
    """TRL's trainer, keeping every micro-batch's inputs and the weights before the first one."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self.captured:
            self.w0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.captured.append({k: v.clone() if torch.is_tensor(v) else v
                              for k, v in inputs.items()})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class LocalMean(rtrl.RlgatesGRPOTrainer):
    """A wrong normaliser: each micro-batch's own token mean (divided by its local count)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        local = inputs["completion_mask"].sum()
        a = self.args
        n = local * self.accelerator.num_processes * a.steps_per_generation
        n = n / self.current_gradient_accumulation_steps
        return super().compute_loss(model, {**inputs, "num_items_in_batch": n}, return_outputs)


# --- per-token advantages ------------------------------------------------------------------
# TRL 1.16.0's GRPOTrainer computes one advantage per completion (grpo_trainer.py,
# _generate_and_score_completions: `advantages = rewards - mean_grouped_rewards`, shape (B,)),
# and its _compute_loss takes (B, T) too ("To support subclasses that provide advantages with
# shape (B, T), we *conditionally* unsqueeze"). Between the two the batch is only shuffled and
# split by rows (_prepare_inputs: shuffle_sequence_dict, split_tensor_dict), so a subclass that
# rewrites `advantages` after scoring carries per-token A through TRL's real update path.
TOKEN_GAMMA, TOKEN_LAM = 0.9, 0.8


def per_token(out, kind):
    """[B, T] advantages from TRL's [B] ones: "row", each row's A on every token (a negative
    control: the same loss as [B]); "gae", GAE (rlgates.advantages.gae) of the row's A as a
    reward on its last real token against made-up values that depend on the token ids (so two
    runs with the same completions get the same A)."""
    a, mask = out["advantages"], out["completion_mask"].bool()
    if kind == "row":
        return a[:, None].expand(mask.shape).clone()
    r = torch.zeros(mask.shape, dtype=torch.float64)
    last = mask.sum(-1) - 1
    rows = torch.nonzero(last >= 0).flatten()
    r[rows, last[rows]] = a[rows].double()
    ids = out["completion_ids"].double()
    pos = torch.arange(mask.shape[1], dtype=torch.float64)
    values = 0.8 * torch.cos(1.7 * ids + 0.9 * pos)
    adv, _ = rlgates.advantages.gae(r, values, mask, TOKEN_GAMMA, TOKEN_LAM)
    return adv.to(a.dtype)


def _per_token(base, kind):
    class PerToken(base):
        """`base` with per-token advantages written after TRL scores the completions; records, per
        generation batch, how many rows' A takes both signs."""

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            out["advantages"] = per_token(out, kind)
            a, m = out["advantages"], out["completion_mask"].bool()
            both = ((a > 0) & m).any(-1) & ((a < 0) & m).any(-1)
            self.sign_change_rows.append(int(both.sum()))
            return out

    PerToken.__name__ = f"PerToken{kind.capitalize()}{base.__name__}"
    return PerToken


def per_token_runs(out):
    """TRL's dapo over 4 steps, lock-step: [B] advantages (TRL's own); per-token A constant along
    each row, with TRL's loss and with the adapter; GAE per-token A, with both."""
    m = method_for("dapo")
    args = config(output_dir=out, **flags_for("dapo", m), max_steps=4)
    runs, W = {}, {}
    for name, cls, kw in (
            ("builtin_B", GRPOTrainer, {}),
            ("builtin_row", _per_token(GRPOTrainer, "row"), {}),
            ("adapter_row", _per_token(Counting, "row"), {"method": m}),
            ("builtin_gae", _per_token(GRPOTrainer, "gae"), {}),
            ("adapter_gae", _per_token(Counting, "gae"), {"method": m})):
        t, steps, W[name] = train(cls, args, **kw)
        runs[name] = {"steps": steps, "sign_change_rows": getattr(t, "sign_change_rows", None)}
    pairs = {"row_builtin_vs_B": ("builtin_row", "builtin_B"),
             "row_adapter_vs_B": ("adapter_row", "builtin_B"),
             "gae_adapter_vs_builtin": ("adapter_gae", "builtin_gae"),
             "gae_vs_B_control": ("builtin_gae", "builtin_B")}
    return {"runs": runs, "compare": {k: {"ours": runs[a]["steps"], "ref": runs[b]["steps"],
                                          "max_abs_dW": dW(W[a], W[b])}
                                      for k, (a, b) in pairs.items()}}


def per_token_loss_level():
    """TRL's own _compute_loss (builtin_loss) against the adapter (trl_loss and metrics) on one
    hand-built batch, for every method with a TRL built-in that the adapter carries: ragged rows
    (one empty), GAE per-token A that changes sign inside rows, and the same A averaged per row
    on every token (the control). Returns, per method, the largest |Δ gradient| per token-log-prob
    and |Δ loss| for each A, and whether TRL's logged metrics equal the adapter's."""
    from tests.trl_run import MAX_LEN, tiny_model

    B, T = 6, MAX_LEN
    lengths = [8, 3, 5, 1, 0, 6]
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logp = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 1.2
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    r = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        if n:
            r[i, n - 1] = [1.0, -1.0, 0.5, -0.3, 0.0, 1.2][i]
    values = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    tok, _ = rlgates.advantages.gae(r, values, mask, TOKEN_GAMMA, TOKEN_LAM)
    row = ((tok * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None].expand(B, T).clone()
    model = tiny_model()
    out = {"sign_change_rows": int((((tok > 0) & mask).any(-1) & ((tok < 0) & mask).any(-1))
                                   .sum())}
    for name in rlgates.names():
        m = {"cispo": rlgates.get("cispo", eps_high=0.2),
             "gspo": rlgates.get("gspo", eps_low=0.1, eps_high=0.1)}.get(name, rlgates.get(name))
        f = rt.flags(m)["trl"]
        if f is None or any(k in f for k in ("off_policy_mask_threshold",
                                             "top_entropy_quantile")):
            continue  # no TRL built-in, or one the adapter refuses (rtrl.REFUSED)
        t = GRPOTrainer(model=model, reward_funcs=reward_words, train_dataset=DATA,
                        processing_class=tiny_tokenizer(),
                        args=config(output_dir="/tmp/rlgates-trl-per-token",
                                    gradient_accumulation_steps=1, steps_per_generation=1, **f))
        t.current_gradient_accumulation_steps = 1
        res = {"loss_type": f["loss_type"], "level": getattr(m, "level", "token")}
        for kind, adv in (("token", tok), ("row", row)):
            x = [v.float() for v in (logp, old, adv, ent)]
            leaf = x[0].clone().requires_grad_(True)
            t._metrics["train"].clear()
            v = rtrl.builtin_loss(t, leaf, x[1], x[2], mask, entropy=x[3])
            v.backward()
            ref = {k: val[-1] for k, val in t._metrics["train"].items()}
            side = rtrl.side_info(m, x[3])
            ours_leaf = x[0].clone().requires_grad_(True)
            ours = rtrl.trl_loss(m, ours_leaf, x[1], x[2], mask, f["loss_type"],
                                 max_completion_length=MAX_LEN, side=side)
            ours.backward()
            mine = rtrl.metrics(m, x[0], x[1], x[2], mask, x[3], t.accelerator, side)
            res[kind] = {
                "dloss": abs(float(ours.detach()) - float(v.detach())),
                "dgrad": float((ours_leaf.grad - leaf.grad).abs().max()),
                "grad_scale": float(leaf.grad.abs().max()),
                "metrics_equal": all(abs(mine[k] - val) < 1e-6 or (val != val and
                                                                   mine[k] != mine[k])
                                     for k, val in ref.items())}
        out[name] = res
    return out


def train(cls, args, data=DATA, **kw):
    # accelerate's free_memory runs gc.collect() at every train(): over the ~10^6 objects the
    # imports made, 0.2-0.4 s each; frozen, they are not scanned (nothing of theirs is garbage)
    gc.freeze()
    model = tiny_model()
    t = cls(model=model, reward_funcs=reward_words, args=args, train_dataset=data,
            processing_class=tiny_tokenizer(), **kw)
    t.counts, t.captured, t.sign_change_rows = [], [], []
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


def trl_grad(t, batches, ga, spg, num_items=None):
    """TRL's own loss (GRPOTrainer._compute_loss) summed over `batches` at the trainer's current
    weights, as one accumulation window of length `ga` with steps_per_generation `spg`: the total
    loss and the flat gradient (what the optimiser step would see, before clipping)."""
    t.model.train()
    t.model.zero_grad()
    t.current_gradient_accumulation_steps, spg_run = ga, t.args.steps_per_generation
    t.args.steps_per_generation = spg
    total = 0.0
    try:
        for b in batches:
            if num_items is not None:
                b = {**b, "num_items_in_batch": torch.tensor(num_items)}
            loss = GRPOTrainer._compute_loss(t, t.model, b)
            loss.backward()
            total += float(loss.detach())
    finally:
        t.args.steps_per_generation = spg_run
    g = torch.cat([p.grad.flatten() for p in t.model.parameters()]).clone()
    t.model.zero_grad()
    return total, g


def norm_rel(g, h):
    return float((g - h).norm() / h.norm())


def spg_against_ga(out):
    """One generation batch of 4 micro-batches (steps_per_generation 4), trained in windows of
    GA = 2: two optimiser steps. At the first step's weights, TRL's gradient of each step, their
    mean, the gradient of the same 4 micro-batches as one window (SPG = GA = 4), and the pre-fix
    normaliser (num_items_in_batch / num_processes, no GA/SPG)."""
    args = config(output_dir=out, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
                  num_iterations=1, steps_per_generation=4, max_steps=2)
    t, log, _ = train(Capture, args)
    mbs = t.captured
    assert len(mbs) == 4
    t.model.load_state_dict(t.w0)
    n_gen = int(mbs[0]["num_items_in_batch"])
    n_step = [int(sum(b["completion_mask"].sum() for b in mbs[i:i + 2])) for i in (0, 2)]
    l1, g1 = trl_grad(t, mbs[:2], 2, 4)          # as run: step 1
    _, g2 = trl_grad(t, mbs[2:], 2, 4)           # step 2's tokens, at step 1's weights
    _, g_whole = trl_grad(t, mbs, 4, 4)          # SPG = GA: one window of all 4
    _, g1_pre = trl_grad(t, mbs[:2], 2, 2)       # pre-fix: no GA/SPG factor
    _, g2_pre = trl_grad(t, mbs[2:], 2, 2)
    _, g1_own = trl_grad(t, mbs[:2], 2, 2, num_items=n_step[0])  # step 1 as its own batch
    return {
        "n_gen": n_gen, "n_step": n_step, "ga": 2, "spg": 4,
        "logged_loss": log[0]["loss"], "logged_grad_norm": log[0]["grad_norm"],
        "offline_loss": l1, "offline_grad_norm": float(g1.norm()),
        "mean_vs_whole": norm_rel((g1 + g2) / 2, g_whole),
        "prefix_mean_vs_whole": norm_rel((g1_pre + g2_pre) / 2, g_whole),
        "prefix_factor": float(g1_pre.norm() / g1.norm()),
        "prefix_parallel": norm_rel(g1_pre / 0.5, g1),
        "step1_vs_own_batch": float(g1.norm() / g1_own.norm()),
        "step1_own_parallel": norm_rel(g1 * g1_own.norm() / g1.norm(), g1_own),
    }


def clipping(out):
    """TRL's dapo against the pre-fix normaliser (a loss off by GA/SPG = 1/2), with SGD (Adam
    would hide any constant factor), over one generation batch (two steps): once with every
    step's gradient norm clipped, once with no clipping (max_grad_norm = 0)."""
    res = {}
    for name, mgn in (("clipped", 0.01), ("unclipped", 0.0)):
        args = config(output_dir=out, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
                      num_iterations=1, steps_per_generation=4, max_steps=2, optim="sgd",
                      learning_rate=0.5, max_grad_norm=mgn)
        _, fixed, w_fixed = train(GRPOTrainer, args)
        _, pre, w_pre = train(PreFix, args)
        res[name] = {"max_grad_norm": mgn, "fixed": fixed, "prefix": pre,
                     "max_abs_dW": dW(w_pre, w_fixed)}
    return res


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
    t1 = time.perf_counter()
    normalisers = {"spg_against_ga": spg_against_ga(out), "clipping": clipping(out),
                   "wall_s": time.perf_counter() - t1}
    t2 = time.perf_counter()
    token = {"engine": per_token_runs(out), "loss_level": per_token_loss_level(),
             "wall_s": time.perf_counter() - t2}
    return {"num_processes": 1, "cases": cases, "normalisers": normalisers, "per_token": token,
            "wall_s": time.perf_counter() - t0}


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
        local = [sum(r[0] for r in t.counts[g:g + args.steps_per_generation])
                 for g in range(0, len(t.counts), G)]
        every = [None] * P
        dist.all_gather_object(every, {"local_gen": local, "counts": t.counts})
        glob = [sum(r["local_gen"][i] for r in every) for i in range(len(local))]
        items = [[r[1] for r in rank["counts"]] for rank in every]
        c["num_processes"] = P
        c["rank_gen_tokens"] = [r["local_gen"] for r in every]
        c["global_gen_tokens"] = glob
        c["num_items_in_batch"] = items
        c["num_items_ok"] = all(items[r][i] == glob[i // G] for r in range(P)
                                for i in range(len(items[r])))
        # each micro-batch's returned loss and window length, per rank (the logged loss's parts)
        c["micro_loss"] = [[r[2] for r in rank["counts"]] for rank in every]
        c["window"] = [[r[3] for r in rank["counts"]] for rank in every]
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
