"""TRL's GRPOTrainer over many steps, in one process and in two (torchrun, gloo): its built-in loss
against the rlgates adapter, in lock-step (same completions, so the same rewards at every step).

The runs are made once by tests/engines/trl_runs.py (one launch per process count), which writes
every number to one JSON file (RLGATES_TRL_JSON, default _build/engines/trl.json); these tests
assert on it. Each comparison could fail: the gate acts (TRL's clip_ratio/region_mean > 0 on
several steps), lengths are ragged, and two wrong losses (REINFORCE: no gate; a per-micro-batch
token mean) are shown to move the trajectory by far more than the tolerance.

Also checked, per step: what the adapter logs under TRL's names (clip_ratio/*, cispo_clip_ratio,
entropy) equals what TRL's built-in logged, where the adapter's old number (rlgates/gate_zero)
would not; the logged loss is the mean over processes of the window's summed micro-batch losses;
and the normalisers (steps_per_generation against GA, the pre-fix factor, gradient-norm
clipping against a loss off by a constant). `summary` gathers the numbers chapter 14 states and
`record.check` holds them to rlgates/trainers/engine_runs.json ["trl"].
Slow (1-2 minutes on a quiet machine): marked `engine`, run serially by tasks.py, not by the
unit-test step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engines import launch, record
from tests.engines.launch import rel

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines/trl_runs.py"
JSON = Path(os.environ.get("RLGATES_TRL_JSON", ROOT / "_build/engines/trl.json"))


@pytest.fixture(scope="module")
def runs():
    return launch.one_and_two_processes(SCRIPT, JSON)


CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean",
             "clip_ratio/high_max", "clip_ratio/region_mean", "cispo_clip_ratio")


def clipped(r):
    """TRL's own clipped-token fraction of a step (clip region, or CISPO's cap); 0 for sapo."""
    return r.get("clip_ratio/region_mean") or r.get("cispo_clip_ratio") or 0.0


def metric_gaps(c):
    """The largest difference between the adapter's and TRL's logged clip metrics (absolute) and
    entropy (relative), over the steps; the metric names TRL logged; and the negative control:
    the largest gap between TRL's clip fraction and what the adapter logged before
    (rlgates/gate_zero)."""
    d_clip = d_ent = old = 0.0
    names = set()
    for r, o in zip(c["builtin"], c["adapter"], strict=True):
        for k in CLIP_KEYS:
            assert (r[k] is None) == (o[k] is None), (k, r[k], o[k])  # the same names logged
            if r[k] is not None:
                names.add(k)
                d_clip = max(d_clip, abs(r[k] - o[k]))
        d_ent = max(d_ent, rel(o["entropy"], r["entropy"]))
        if names:
            old = max(old, abs(o["rlgates/gate_zero"] - clipped(r)))
    return {"max_abs_dclip_metric": d_clip, "max_rel_dentropy": d_ent,
            "trl_metrics": sorted(names) + ["entropy"],
            "old_gate_zero_gap": old if names else None}  # sapo: no clip metric to compare


def case_summary(c):
    ref, ours = c["builtin"], c["adapter"]
    return {"steps": len(ref),
            "max_rel_dloss": max(rel(o["loss"], r["loss"]) for r, o in zip(ref, ours, strict=True)),
            "max_rel_dgrad_norm": max(rel(o["grad_norm"], r["grad_norm"])
                                      for r, o in zip(ref, ours, strict=True)),
            "max_abs_dW": c["max_abs_dW"],
            "max_clipped_fraction": max(clipped(r) for r in ref),
            "steps_clipping": sum(clipped(r) > 0 for r in ref),
            **metric_gaps(c)}


def assert_lockstep(c, steps, loss_rel=1e-5, grad_rel=1e-4, dw=1e-5):
    ref, ours = c["builtin"], c["adapter"]
    assert len(ref) == len(ours) == steps
    for r, o in zip(ref, ours, strict=True):
        assert r["reward"] == o["reward"]  # the same completions: lock-step
        assert rel(o["loss"], r["loss"]) < loss_rel, (r, o)
        assert rel(o["grad_norm"], r["grad_norm"]) < grad_rel, (r, o)
    assert c["max_abs_dW"] < dw
    gaps = metric_gaps(c)  # TRL's names carry TRL's numbers, step by step
    assert gaps["max_abs_dclip_metric"] < 1e-6 and gaps["max_rel_dentropy"] < 1e-5, gaps
    assert gaps["old_gate_zero_gap"] > 1e-3, gaps  # the old number under TRL's name would show
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
    gaps = metric_gaps(c)
    assert gaps["max_abs_dclip_metric"] < 1e-6 and gaps["max_rel_dentropy"] < 1e-5, gaps
    # the gate acted: TRL clipped tokens (sapo has no clip), and the mean gate fell below one
    assert any(clipped(r) > 0 for r in ref) or case == "sapo"
    assert min(o["rlgates/gate_mean"] for o in ours) < 0.99
    assert_logged_loss(c)


def windows(c, rank):
    """The micro-batches of each optimiser step on `rank`: [(start, end), ...]."""
    out, i, w = [], 0, c["window"][rank]
    while i < len(w):
        out.append((i, i + w[i]))
        i += w[i]
    return out


def logged_loss_parts(c):
    """Per step: the logged loss, and three candidates built from what compute_loss returned on
    each rank and micro-batch: the mean over ranks of the window's sum (transformers' rule), rank
    0's own sum (no gather), and the mean over the window's micro-batches (a second division by
    the window's length)."""
    P = c["num_processes"]
    out = []
    for s, step in enumerate(c["adapter"]):
        sums = [sum(c["micro_loss"][r][a:b]) for r in range(P) for a, b in [windows(c, r)[s]]]
        n = windows(c, 0)[s][1] - windows(c, 0)[s][0]
        out.append((step["loss"], sum(sums) / P, sums[0], sum(sums) / P / n))
    return out


def logged_loss_gaps(c):
    """The largest gap, over the steps, between the logged loss and each candidate rule, scaled by
    the run's largest |logged loss| (some steps' loss is near 0: a per-step ratio means nothing)."""
    parts = logged_loss_parts(c)
    scale = max(abs(p[0]) for p in parts)
    gap = [max(abs(p[i] - p[0]) for p in parts) / scale for i in (1, 2, 3)]
    return {"vs_mean_over_ranks_of_window_sum": gap[0], "vs_rank0_window_sum": gap[1],
            "vs_mean_over_micro_batches": gap[2]}


def assert_logged_loss(c):
    gaps = logged_loss_gaps(c)
    assert gaps["vs_mean_over_ranks_of_window_sum"] < 1e-6, gaps
    # not vacuous: rank 0 alone, or a mean over micro-batches, would log another number
    assert gaps["vs_rank0_window_sum"] > 1e-2 and gaps["vs_mean_over_micro_batches"] > 0.3, gaps


def test_normaliser_spg_against_ga(runs):
    """TRL 1.16.0 divides dapo's sum by num_items_in_batch / P x GA / SPG (asserted against the
    source in tests/test_trainer_facts.py). Over a generation batch of SPG = 4 micro-batches in
    windows of GA = 2, the mean of the two steps' gradients equals the gradient of the same tokens
    in one window (SPG = GA), at the same weights; the pre-fix normaliser is off by GA/SPG."""
    n = runs["one_process"]["normalisers"]["spg_against_ga"]
    assert (n["ga"], n["spg"]) == (2, 4) and n["n_gen"] == sum(n["n_step"])
    # the offline recomputation is the run's own step (loss; grad_norm before clipping)
    assert rel(n["offline_loss"], n["logged_loss"]) < 1e-5
    assert rel(n["offline_grad_norm"], n["logged_grad_norm"]) < 1e-5
    assert n["mean_vs_whole"] < 1e-5
    assert abs(n["prefix_factor"] - n["ga"] / n["spg"]) < 1e-6 and n["prefix_parallel"] < 1e-5
    assert abs(n["prefix_mean_vs_whole"] - (1 - n["ga"] / n["spg"])) < 1e-5  # the control
    # not vacuous: the two steps hold different token counts, so one step alone is not the
    # window mean: its gradient is its own batch's times its share n_step·SPG/(n_gen·GA)
    assert n["n_step"][0] != n["n_step"][1]
    share = n["n_step"][0] * n["spg"] / (n["n_gen"] * n["ga"])
    assert abs(n["step1_vs_own_batch"] - share) < 1e-5 and abs(share - 1) > 1e-3
    assert n["step1_own_parallel"] < 1e-5


def test_normaliser_meets_gradient_clipping(runs):
    """A loss off by a constant (the pre-fix 1/2) with SGD: when every step's gradient norm is
    clipped, the updates are the same and only the logged loss and grad_norm (before clipping)
    show the factor; without clipping the weights move apart."""
    n = runs["one_process"]["normalisers"]["clipping"]
    cl, un = n["clipped"], n["unclipped"]
    for r, p in zip(cl["fixed"], cl["prefix"], strict=True):
        assert r["reward"] == p["reward"]  # lock-step
        assert 0.5 * r["grad_norm"] > cl["max_grad_norm"]  # both runs clip every step
        assert abs(p["grad_norm"] / r["grad_norm"] - 0.5) < 1e-5
        assert abs(p["loss"]) < 1e-6 or abs(p["loss"] / r["loss"] - 0.5) < 1e-4
    assert cl["max_abs_dW"] < 1e-6
    assert un["max_grad_norm"] == 0 and un["max_abs_dW"] > 1e-3  # the control


def summary(runs) -> dict:
    one, two = runs["one_process"], runs["two_process"]
    out = {"one_process": {k: case_summary(c) for k, c in one["cases"].items()},
           "two_process": {}, "versions": runs["versions"]}
    d = one["cases"]["dapo"]
    out["one_process"]["dapo"]["max_abs_loss"] = max(abs(a["loss"]) for a in d["builtin"])
    out["one_process"]["dapo"]["negative_controls"] = {  # absolute: some steps' loss is ~0
        name: {"max_abs_dloss": max(abs(b["loss"] - a["loss"]) for a, b in
                                    zip(d["builtin"], d[name], strict=True)),
               "max_abs_dW": d[name.replace("control", "max_abs_dW")]}
        for name in ("reinforce_control", "local_mean_control")}
    for k, c in two["cases"].items():
        a, b = c["rank_gen_tokens"]
        out["two_process"][k] = {
            **case_summary(c), "rank_gen_tokens": c["rank_gen_tokens"],
            "global_gen_tokens": c["global_gen_tokens"], "num_items_global": c["num_items_ok"],
            "window_lengths": [w[1] - w[0] for w in windows(c, 0)],
            # a rank-local count would be off by this factor on some generation batch
            "max_rank_share_gap": max(abs(2 * x / (x + y) - 1) for x, y in zip(a, b, strict=True)),
            "logged_loss": logged_loss_gaps(c)}
    s, cl = one["normalisers"]["spg_against_ga"], one["normalisers"]["clipping"]
    out["normalisers"] = {
        "spg_against_ga": {k: s[k] for k in ("ga", "spg", "n_gen", "n_step", "mean_vs_whole",
                                             "prefix_factor", "prefix_mean_vs_whole",
                                             "step1_vs_own_batch")},
        "clipping": {name: {"max_grad_norm": r["max_grad_norm"], "max_abs_dW": r["max_abs_dW"],
                            "min_grad_norm": min(x["grad_norm"] for x in r["fixed"]),
                            "grad_norm_ratio": [p["grad_norm"] / x["grad_norm"] for x, p in
                                                zip(r["fixed"], r["prefix"], strict=True)]}
                     for name, r in cl.items()}}
    return out


def test_summary_is_the_committed_one(runs):
    """The numbers chapter 14 states (rlgates.trainers.engine_runs()["trl"]) are this run's."""
    record.check("trl", summary(runs))


# --- per-token advantages --------------------------------------------------------------------
def _steps_equal(a, b, loss_rel, grad_rel):
    assert len(a) == len(b) == 4
    for r, o in zip(b, a, strict=True):
        assert r["reward"] == o["reward"]  # the same completions: lock-step
        assert rel(o["loss"], r["loss"]) < loss_rel, (r, o)
        assert rel(o["grad_norm"], r["grad_norm"]) < grad_rel, (r, o)
        for k in CLIP_KEYS:
            assert (r[k] is None) == (o[k] is None) and (r[k] is None or abs(r[k] - o[k]) < 1e-6)


def test_trls_real_update_carries_per_token_advantages(runs):
    """TRL's dapo, 4 steps: a subclass rewrites TRL's [B] advantages as GAE per token after
    scoring (tests/engines/trl_runs.py says where in TRL). The adapter then follows TRL's own
    loss step by step; and the per-token A is not vacuous: it changes sign inside rows of every
    generation batch, the gate clips on the second pass, and the run leaves TRL's [B] run."""
    e = runs["one_process"]["per_token"]["engine"]
    r = e["runs"]
    assert all(n >= 3 for n in r["builtin_gae"]["sign_change_rows"])
    assert r["adapter_gae"]["sign_change_rows"] == r["builtin_gae"]["sign_change_rows"]
    assert r["builtin_row"]["sign_change_rows"] == [0, 0]
    c = e["compare"]["gae_adapter_vs_builtin"]
    _steps_equal(c["ours"], c["ref"], 1e-5, 1e-4)
    assert c["max_abs_dW"] < 1e-5
    assert sum((s["clip_ratio/region_mean"] or 0) > 0 for s in c["ref"]) >= 2
    ctl = e["compare"]["gae_vs_B_control"]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(ctl["ours"], ctl["ref"],
                                                            strict=True)) > 1e-2
    assert ctl["max_abs_dW"] > 1e-2


def test_per_token_advantages_constant_along_rows_equal_trls_B(runs):
    """The negative control: per-token A equal to the row's A on every token gives TRL's [B] run,
    with TRL's loss (exactly) and with the adapter (to float32 rounding)."""
    e = runs["one_process"]["per_token"]["engine"]
    c = e["compare"]["row_builtin_vs_B"]
    _steps_equal(c["ours"], c["ref"], 1e-12, 1e-12)
    assert c["max_abs_dW"] == 0.0
    c = e["compare"]["row_adapter_vs_B"]
    _steps_equal(c["ours"], c["ref"], 1e-5, 1e-4)
    assert c["max_abs_dW"] < 1e-5


def test_per_token_loss_level_against_trls_compute_loss(runs):
    """Every method with a TRL built-in the adapter carries, on one hand-built batch with per-token
    A: the adapter equals TRL's _compute_loss (value, gradient per token, metrics), except the
    sequence-level ratio methods (gspo, luspo). There TRL's loss differentiates ρ_s through the
    mean log-ratio, so every token's gradient carries the row's mean gated A; the adapter, like
    verl's gspo (test_verl_engine), uses GSPO-token's form: token t carries its own A_t. With A
    constant along the rows (the control) they agree."""
    d = runs["one_process"]["per_token"]["loss_level"]
    assert d["sign_change_rows"] >= 2
    methods = {k: v for k, v in d.items() if isinstance(v, dict)}
    assert {"dapo", "grpo", "sapo", "cispo", "vespo", "gspo", "luspo"} <= set(methods)
    for name, x in methods.items():
        for kind in ("token", "row"):
            assert x[kind]["metrics_equal"], (name, kind)
            assert x[kind]["dloss"] < 1e-6 * max(1.0, x[kind]["grad_scale"]), (name, kind)
        assert x["row"]["dgrad"] < 1e-6, name
        if x["level"] == "sequence":
            assert x["token"]["dgrad"] > 0.05 * x["token"]["grad_scale"], name
        else:
            assert x["token"]["dgrad"] < 1e-6, name


def per_token_summary(runs) -> dict:
    pt = runs["one_process"]["per_token"]
    e = pt["engine"]

    def gap(c):
        return {"max_rel_dloss": max(rel(o["loss"], r["loss"])
                                     for r, o in zip(c["ref"], c["ours"], strict=True)),
                "max_abs_dW": c["max_abs_dW"]}

    return {"engine": {k: gap(c) for k, c in e["compare"].items()},
            "sign_change_rows": e["runs"]["builtin_gae"]["sign_change_rows"],
            "loss_level": {k: {"level": v["level"], "loss_type": v["loss_type"],
                               "token_dgrad": v["token"]["dgrad"],
                               "row_dgrad": v["row"]["dgrad"],
                               "grad_scale": v["token"]["grad_scale"]}
                           for k, v in pt["loss_level"].items() if isinstance(v, dict)}}


def test_per_token_summary_is_the_committed_one(runs):
    record.check("trl_per_token", per_token_summary(runs))
