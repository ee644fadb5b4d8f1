"""verl 0.9.1's real actor update (FSDP2 `TrainingWorker.train_mini_batch`, verl's `ppo_loss`) on
the CPU, in one process and in two (torchrun, gloo): verl's built-in losses against the rlgates
adapter, plus the environment they need (the TRL shim, the worker's imports) and the registration
through `external_lib` in a worker of a local Ray cluster.

The runs are made once by tests/engines/verl_runs.py (one launch per process count; verl is
imported once per launch), which writes every number to one JSON file (RLGATES_VERL_JSON,
default _build/engines/verl.json); these tests assert on it. The pairs compared:

- verl `vanilla` with clip_ratio_c = 3 against `rlgates_dual_clip` (ε 0.2, c 3);
- verl `vanilla` with clip_ratio_c = ∞ against `rlgates_ppo`;
- verl `sapo` against `rlgates_sapo` (its fixed seq-mean-token-mean over global_batch_size).

Gradients are read just before the optimiser step (clip_grad 1e9), with verl's grad_norm and
loss; not weights after one Adam step, which hide a loss ×2 (shown below). Nothing passes
vacuously: ρ ≠ 1 on every token, tokens clipped on both sides and past c, ragged lengths, token
counts that differ per micro-batch and per rank; and three wrong losses (no dual clip, a
per-micro-batch token mean, the loss ×2) are told apart. The numbers the book states go to
rlgates/trainers/engine_runs.json["verl"] (tests/engines/record.py).

Per-token advantages (GAE) go through the same update, built-ins against adapters, with
controls ("verl_per_token"); and padding-free batches: the width seq-mean-token-sum-norm
divides by, per micro-batch, with and without loss_scale_factor ("verl_padding").
Slow (about a minute on a quiet two-core machine): marked `engine`, run serially by tasks.py.

The TRL shim: without it verl's `apply_monkey_patch` raises the ImportError about TRL's removed
`AutoModelForCausalLMWithValueHead`; `import rlgates` (and the verl adapter) apply nothing; with
`patch_environment()` the same call passes. The day a TRL or verl release fixes the import, the
negative control fails and says to remove rlgates.trainers._verl_compat.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.engines import launch, record
from tests.engines.launch import rel

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines/verl_runs.py"
JSON = Path(os.environ.get("RLGATES_VERL_JSON", ROOT / "_build/engines/verl.json"))

#: comparison -> (adapter case, built-in case)
PAIRS = {"dual_clip": ("rlgates_dual_clip", "vanilla_c3"), "ppo": ("rlgates_ppo", "vanilla_cinf"),
         "sapo": ("rlgates_sapo", "sapo")}
WORLDS = ("one_process", "two_process")
TOL = 1e-6  # rounding: float32 sums in another order
METRICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")


@pytest.fixture(scope="module")
def runs():
    # the one-process launch first: the two-process run compares against its numbers
    return launch.one_and_two_processes(SCRIPT, JSON, {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"})


# --- the environment -------------------------------------------------------------------------
def test_trl_shim_needed_and_sufficient_for_verl_model_build(runs):
    out = runs["one_process"]["shim"]
    assert not out["applied_by_import"], "import rlgates / rlgates.trainers.verl must not patch TRL"
    assert out["needed"] and out["without"] is not None, (
        "verl's apply_monkey_patch now passes without the shim: a TRL/verl upgrade fixed the "
        "value-head import; remove rlgates/trainers/_verl_compat.py and patch_environment")
    assert "AutoModelForCausalLMWithValueHead" in out["without"], out["without"]
    assert out["patched"] and out["again"]
    assert out["stand_in"] and out["state_dict_is_module"]
    assert "removed from TRL" in out["from_pretrained"]


def test_verl_worker_module_imports_with_declared_packages(runs):
    text = (ROOT / "requirements.txt").read_text()
    pins = dict(re.findall(r"^(uvicorn|fastapi|starlette)==(\S+)", text, flags=re.M))
    assert set(pins) == {"uvicorn", "fastapi", "starlette"}, pins
    out = runs["one_process"]["imports"]
    assert out["worker"]
    assert out["versions"] == pins


# --- the batch is not vacuous ----------------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
def test_batch_exercises_every_bound(runs, world):
    d = runs[world]
    g = d["gate"]
    assert g["rho_ne_1"] == g["tokens"] == 33  # every token: ρ ≠ 1 (|log ρ| > 1e-3)
    assert g["clipped_upper"] > 0 and g["clipped_lower"] > 0  # A > 0 past 1+ε, A < 0 below 1−ε
    assert g["dual_clipped"] > 0 and g["rho_max"] > 3.5  # an A < 0 token past c = 3
    assert g["inside"] > 0
    assert g["min_distance_to_a_bound"] > 1e-3  # rounding cannot move a token across a bound
    micro = d["rank_micro_tokens"]
    assert all(len(set(r)) == len(r) >= 2 for r in micro)  # ragged micro-batches on every rank
    if world == "two_process":
        assert len(micro) == 2 and sum(micro[0]) != sum(micro[1])  # ranks hold different counts
        assert micro == [[8, 6], [10, 9]]
    else:
        assert micro == [[14, 19]]


# --- the adapter equals verl's built-in ------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("pair", list(PAIRS))
def test_adapter_equals_builtin_in_verls_actor_update(runs, world, pair):
    d = runs[world]
    ours, ref = (d["cases"][k] for k in PAIRS[pair])
    assert d["compare"][pair]["grad_rel"] < TOL
    assert rel(ours["grad_norm"], ref["grad_norm"]) < TOL and ref["grad_norm"] > 0.1
    assert abs(ours["loss"] - ref["loss"]) < TOL  # absolute: a loss near 0 (−0.0078 for dual_clip)
    for a, b in zip(ours["micro_losses"], ref["micro_losses"], strict=True):
        assert abs(a - b) < TOL
    # verl's global information reached the loss on every micro-batch
    P = 2 if world == "two_process" else 1
    for c in (ours, ref):
        assert c["dp_size"] == [P] and c["batch_num_tokens"] == [33]
        assert c["global_batch_size"] == [8]
    # both equal rlgates' own loss over the whole batch at the engine's log-probs
    assert abs(ours["loss"] - d["own_loss"][PAIRS[pair][0]]) < TOL


@pytest.mark.parametrize("world", WORLDS)
def test_verl_logs_the_global_loss_as_a_sum_of_micro_batch_losses(runs, world):
    """Each micro-batch's loss is Σ/(global tokens)·dp_size; verl sums them on each rank and
    averages over the ranks (the DDP average of the gradients does the same)."""
    d = runs[world]
    for name, c in d["cases"].items():
        per_rank = [sum(r) for r in d["rank_micro_losses"][name]]
        assert abs(c["loss"] - sum(per_rank) / len(per_rank)) < TOL, name
        assert abs(c["pg_loss"] - c["loss"]) < TOL, name
    if world == "two_process":  # the ranks' sums differ: each is not the global loss
        per_rank = [sum(r) for r in d["rank_micro_losses"]["rlgates_ppo"]]
        assert abs(per_rank[0] - per_rank[1]) > 0.1


@pytest.mark.parametrize("world", WORLDS)
def test_negative_controls_differ(runs, world):
    c = runs[world]["compare"]
    assert c["no_dual_clip_control"]["grad_rel"] > 0.5  # vanilla c = 3 is not rlgates_ppo
    assert c["local_mean_control"]["grad_rel"] > 0.05  # a per-micro-batch token mean
    cases = runs[world]["cases"]
    assert rel(cases["rlgates_ppo_local_mean"]["loss"], cases["vanilla_cinf"]["loss"]) > 0.1


def test_adam_hides_a_doubled_loss(runs):
    """The loss ×2 doubles the gradient and grad_norm, yet one Adam step barely moves apart:
    comparing weights after a step would pass a wrong loss."""
    d = runs["one_process"]
    c, cases = d["compare"]["adam_trap"], d["cases"]
    assert abs(c["grad_rel"] - 1.0) < TOL
    assert rel(cases["rlgates_ppo_times_two"]["grad_norm"], 2 * cases["rlgates_ppo"]["grad_norm"]) < TOL
    assert c["step_rel"] < 1e-2
    assert cases["rlgates_ppo"]["lr"] > 0


def test_two_processes_give_the_one_process_gradient(runs):
    vs = runs["two_process"]["vs_one_process"]
    for name, r in vs.items():
        if name != "rlgates_ppo_local_mean":
            assert r < TOL, (name, r)
    # the wrong normaliser also depends on how the batch is split
    assert vs["rlgates_ppo_local_mean"] > 0.05


# --- metrics under verl's names --------------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("pair", ["dual_clip", "sapo", "ppo"])
def test_adapter_logs_verls_metrics(runs, world, pair):
    d = runs[world]
    ours, ref = (d["cases"][k] for k in PAIRS[pair])
    assert set(ours["logged"]) == set(ref["logged"]) == set(METRICS)
    for k in METRICS:
        assert abs(ours["logged"][k] - ref["logged"][k]) < 1e-7, (k, ours["logged"], ref["logged"])
        for a, b in zip(ours["micro_metrics"], ref["micro_metrics"], strict=True):
            assert abs(a[k] - b[k]) < 1e-7, (k, a, b)
    # not vacuous: vanilla clips on both sides of its rule here; sapo logs no clip fraction
    if pair == "dual_clip":
        assert ref["logged"]["actor/pg_clipfrac"] > 0.1
        assert ref["logged"]["actor/pg_clipfrac_lower"] > 0.01
        # the micro-batch fractions count the clipped tokens of the batch facts, per micro-batch
        g, micro = d["gate"], [m for r in d["rank_micro_metrics"]["vanilla_c3"] for m in r]
        tokens = [n for r in d["rank_micro_tokens"] for n in r]
        upper_or_lower = sum(m["actor/pg_clipfrac"] * n for m, n in zip(micro, tokens, strict=True))
        past_c = sum(m["actor/pg_clipfrac_lower"] * n for m, n in zip(micro, tokens, strict=True))
        assert round(upper_or_lower) == g["clipped_upper"] + g["clipped_lower"]
        assert round(past_c) == g["dual_clipped"]
        # and the logged mean of micro-batch fractions is not the batch's token share
        share = (g["clipped_upper"] + g["clipped_lower"]) / g["tokens"]
        assert abs(ref["logged"]["actor/pg_clipfrac"] - share) > 1e-3
    if pair == "sapo":
        assert ref["logged"]["actor/pg_clipfrac"] == 0.0
    # verl's rule for every metric of the loss: the plain mean over micro-batches (and ranks)
    # of each micro-batch's own value, so not the token share of the whole batch
    for k in METRICS:
        each = [m[k] for r in d["rank_micro_metrics"][PAIRS[pair][1]] for m in r]
        assert abs(ref["logged"][k] - sum(each) / len(each)) < 1e-6, k
    assert ours["rlgates_gate_mean"] is not None and ref["rlgates_gate_mean"] is None
    # the loss path logs no entropy (verl's actor/entropy comes from the trainer, over π_old)
    assert ours["entropy_keys"] == ref["entropy_keys"] == []


# --- registration in a local Ray cluster -----------------------------------------------------
def test_registration_reaches_a_ray_worker_only_through_external_lib(runs):
    r = runs["one_process"]["ray"]
    assert r["pid"] != r["driver_pid"]
    assert r["before"] is not None and r["before"].startswith("Unsupported loss mode: rlgates_ppo")
    assert r["after"] == "rlgates_ppo"


# --- what the book states --------------------------------------------------------------------
def _sig(x, digits=6):
    return float(f"{x:.{digits}g}")


def summary(runs) -> dict:
    one, two = runs["one_process"], runs["two_process"]

    def side(d, pair):
        ours, ref = (d["cases"][k] for k in PAIRS[pair])
        return {"grad_rel": _sig(d["compare"][pair]["grad_rel"], 2),
                "grad_norm": {"builtin": _sig(ref["grad_norm"]), "adapter": _sig(ours["grad_norm"])},
                "loss": {"builtin": _sig(ref["loss"]), "adapter": _sig(ours["loss"])}}

    compares = {"dual_clip": "verl vanilla (clip_ratio 0.2, clip_ratio_c 3) vs rlgates_dual_clip "
                             "(eps 0.2, c 3)",
                "ppo": "verl vanilla (clip_ratio 0.2, clip_ratio_c inf) vs rlgates_ppo (eps 0.2)",
                "sapo": "verl sapo (tau_pos 1, tau_neg 1.05) vs rlgates_sapo "
                        "(agg seq-mean-token-mean)"}
    comparisons = {p: {"compares": compares[p], "one_process": side(one, p),
                       "two_process": side(two, p),
                       "two_vs_one_grad_rel": _sig(max(two["vs_one_process"][k] for k in PAIRS[p]), 2)}
                   for p in PAIRS}
    cases1 = one["cases"]
    controls = {
        "no_dual_clip": {"compares": "verl vanilla (clip_ratio_c 3) vs rlgates_ppo",
                         "grad_rel": {w: _sig(runs[w]["compare"]["no_dual_clip_control"]["grad_rel"], 3)
                                      for w in WORLDS}},
        "local_mean": {"compares": "rlgates_ppo divided by each micro-batch's own token count vs "
                                   "verl vanilla (clip_ratio_c inf)",
                       "grad_rel": {w: _sig(runs[w]["compare"]["local_mean_control"]["grad_rel"], 3)
                                    for w in WORLDS},
                       "two_vs_one_grad_rel": _sig(two["vs_one_process"]["rlgates_ppo_local_mean"], 3)},
        "adam_trap": {"compares": "rlgates_ppo with its loss x2 vs rlgates_ppo, one AdamW step",
                      "grad_rel": _sig(one["compare"]["adam_trap"]["grad_rel"], 3),
                      "grad_norm": {"times_two": _sig(cases1["rlgates_ppo_times_two"]["grad_norm"]),
                                    "adapter": _sig(cases1["rlgates_ppo"]["grad_norm"])},
                      "step_rel": _sig(one["compare"]["adam_trap"]["step_rel"], 2),
                      "lr": cases1["rlgates_ppo"]["lr"]}}
    g = one["gate"]
    batch = {"rows": 8, "tokens": g["tokens"], "response_lengths": [6, 2, 5, 1, 6, 4, 3, 6],
             "micro_batch_tokens": {"one_process": one["rank_micro_tokens"],
                                    "two_process": two["rank_micro_tokens"]},
             "rho_min": _sig(g["rho_min"], 3), "rho_max": _sig(g["rho_max"], 3),
             "clipped_upper": g["clipped_upper"], "clipped_lower": g["clipped_lower"],
             "dual_clipped": g["dual_clipped"], "inside": g["inside"]}
    ppo2 = two["cases"]["rlgates_ppo"]
    normaliser = {
        "dp_size": {"one_process": cases1["rlgates_ppo"]["dp_size"][0],
                    "two_process": ppo2["dp_size"][0]},
        "batch_num_tokens": ppo2["batch_num_tokens"][0],
        "global_batch_size": ppo2["global_batch_size"][0],
        "micro_losses": {"one_process": [_sig(x) for x in one["rank_micro_losses"]["rlgates_ppo"][0]],
                         "two_process": [[_sig(x) for x in r]
                                         for r in two["rank_micro_losses"]["rlgates_ppo"]]},
        "rank_loss_sums": [_sig(sum(r)) for r in two["rank_micro_losses"]["rlgates_ppo"]],
        "logged_loss": {"one_process": _sig(cases1["rlgates_ppo"]["loss"]),
                        "two_process": _sig(ppo2["loss"])},
        "own_token_mean": _sig(one["own_loss"]["rlgates_ppo"])}
    metrics = {w: {p: {k.removeprefix("actor/"): _sig(runs[w]["cases"][PAIRS[p][1]]["logged"][k])
                       for k in METRICS} for p in PAIRS} for w in WORLDS}
    # what the two clip fractions would be as token shares of the whole batch (vanilla, c = 3)
    metrics["token_share"] = {"pg_clipfrac": _sig((g["clipped_upper"] + g["clipped_lower"]) / g["tokens"]),
                              "pg_clipfrac_lower": _sig(g["dual_clipped"] / g["tokens"])}
    r = one["ray"]
    registration = {"driver_only": r["before"].split(".")[0],
                    "external_lib": r["after"]}
    return {"verl": runs["versions"]["verl"], "batch": batch, "comparisons": comparisons,
            "controls": controls, "normaliser": normaliser, "metrics": metrics,
            "registration": registration}


def test_summary_matches_the_committed_one(runs):
    record.check("verl", summary(runs))


# --- per-token advantages (GAE) --------------------------------------------------------------
TOKEN_PAIRS = {"dual_clip": ("rlgates_dual_clip", "vanilla_c3"),
               "ppo": ("rlgates_ppo", "vanilla_cinf"), "gspo": ("rlgates_gspo", "gspo")}


@pytest.mark.parametrize("world", WORLDS)
def test_per_token_batch_is_not_vacuous(runs, world):
    """A from GAE varies along the rows and changes sign inside several; the gates still act on
    both sides (and past c), and GSPO keeps some rows and clips others."""
    t = runs[world]["token"]
    assert t["adv_sign_change_rows"] >= 3
    g = t["gate"]
    assert g["clipped_upper"] > 0 and g["clipped_lower"] > 0 and g["dual_clipped"] > 0
    assert g["inside"] > 0 and g["min_distance_to_a_bound"] > 1e-3
    assert t["gspo_rows"]["inside"] > 0 and t["gspo_rows"]["outside"] > 0


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("pair", list(TOKEN_PAIRS))
def test_adapter_equals_builtin_with_per_token_advantages(runs, world, pair):
    t = runs[world]["token"]
    ours, ref = (t["cases"][k] for k in TOKEN_PAIRS[pair])
    assert t["compare"][pair]["grad_rel"] < TOL
    assert rel(ours["grad_norm"], ref["grad_norm"]) < TOL and ref["grad_norm"] > 0.1
    assert abs(ours["loss"] - ref["loss"]) < TOL
    for a, b in zip(ours["micro_losses"], ref["micro_losses"], strict=True):
        assert abs(a - b) < TOL
    assert abs(ours["loss"] - t["own_loss"][TOKEN_PAIRS[pair][0]]) < TOL
    assert set(ours["logged"]) == set(ref["logged"]) == set(METRICS)
    for k in METRICS:
        assert abs(ours["logged"][k] - ref["logged"][k]) < 1e-7, k
        for a, b in zip(ours["micro_metrics"], ref["micro_metrics"], strict=True):
            assert abs(a[k] - b[k]) < 1e-7, (k, a, b)
    if pair == "dual_clip":  # the dual clip acted on an A < 0 token of a mixed-sign row
        assert ref["logged"]["actor/pg_clipfrac_lower"] > 0.01


@pytest.mark.parametrize("world", WORLDS)
def test_per_token_negative_controls(runs, world):
    """verl always passes A as [B, T]. Called with one A per row ([B]) on the micro-batches of
    the row-A run (constant along each row), the adapter gives the same loss and gradient,
    exactly; the per-token run's gradient is far from the row run's, and replacing its A by the
    row means changes the loss."""
    t = runs[world]["token"]
    d = t["adapter_called_directly"]
    assert d["row_constant"]
    assert d["row_dloss"] == 0.0 and d["row_dgrad"] == 0.0
    assert d["tok_dloss"] > 1e-3
    assert t["token_vs_row_grad_rel"] > 0.1


# --- padding-free batches --------------------------------------------------------------------
PAD = ("v1_fixed_T", "v1_fixed_L", "v1_dynamic_T", "v1_dynamic_L", "padded_fixed_T",
       "padded_fixed_L", "padded_dynamic_T", "padded_dynamic_L", "v1_fixed_T_packed")


def _pairs_of(lengths):
    return [max(lengths[i:i + 2]) for i in range(0, len(lengths), 2)]


def test_padding_free_loss_sees_each_micro_batchs_longest_response(runs):
    """verl's v1 batch is unpadded, but ppo_loss pads each micro-batch again: the loss sees a
    width equal to the micro-batch's longest response, which the split changes; the legacy
    padded batch keeps the rollout's width on every micro-batch. verl's packed forward
    (use_remove_padding) changes nothing the loss sees."""
    p = runs["one_process"]["padding"]
    c = {k: p["cases"][f"{k}/vanilla"] for k in PAD}
    assert set(p["cases"]) == {f"{k}/{m}" for k in PAD for m in ("vanilla", "rlgates_dual_clip")}
    assert c["v1_fixed_T"]["widths"] == _pairs_of(p["lengths"]) == [7, 5, 3, 4]
    for k in PAD:  # the width is each micro-batch's longest response, log-probs re-padded alike
        x = c[k]
        assert x["log_prob_widths"] == x["widths"]
        if k.startswith("v1"):
            assert x["widths"] == [max(r) for r in x["row_lengths"]]
        else:
            assert set(x["widths"]) == {p["width"]} and p["width"] > max(p["lengths"])
        assert sum(x["rows"]) == len(p["lengths"])
    dyn = c["v1_dynamic_T"]
    assert dyn["widths"] != c["v1_fixed_T"]["widths"] and len(set(dyn["rows"])) > 1
    packed = c["v1_fixed_T_packed"]
    assert packed["use_remove_padding"] and packed["widths"] == c["v1_fixed_T"]["widths"]
    assert packed["grad_rel_vs_v1_fixed_T"] < TOL
    assert max(p["adapter_vs_builtin"].values()) < TOL  # the adapter is verl's, in every case


def test_padding_free_normaliser_with_and_without_loss_scale_factor(runs):
    """seq-mean-token-sum-norm divides every micro-batch by loss_scale_factor when it is set, by
    the width the loss saw otherwise (verl's agg_loss: loss_mask.shape[-1]). With the factor,
    the gradient is the same whatever the layout and the split, and equals the whole batch's at
    that constant; without it, it changes with the split and with padding."""
    p = runs["one_process"]["padding"]
    for key, x in p["cases"].items():
        assert abs(x["loss"] - x["closed_form_micro"]) < TOL, key
    c = {k: p["cases"][f"{k}/vanilla"] for k in PAD}
    for k in ("v1_fixed_L", "v1_dynamic_L", "padded_fixed_L", "padded_dynamic_L",
              "padded_fixed_T", "padded_dynamic_T"):  # the padded width is the same constant
        assert c[k]["grad_rel_vs_v1_fixed_L"] < TOL, k
        assert abs(c[k]["loss"] - c[k]["closed_form_whole_L"]) < TOL, k
    for k in ("v1_fixed_T", "v1_dynamic_T"):
        assert c[k]["grad_rel_vs_v1_fixed_L"] > 0.5, k
        assert abs(c[k]["loss"] - c[k]["closed_form_whole_L"]) > 1e-3, k
        assert abs(c[k]["loss"] - c[k]["closed_form_whole_longest"]) > 1e-3, k
    assert c["v1_dynamic_T"]["grad_rel_vs_v1_fixed_T"] > 0.5  # the split alone moves it
    assert c["v1_fixed_T"]["grad_norm"] > c["v1_fixed_L"]["grad_norm"]  # narrower divisors


def token_summary(runs) -> dict:
    out = {}
    for w in WORLDS:
        t = runs[w]["token"]
        out[w] = {p: {"grad_rel": _sig(t["compare"][p]["grad_rel"], 2),
                      "loss": _sig(t["cases"][TOKEN_PAIRS[p][1]]["loss"]),
                      "grad_norm": _sig(t["cases"][TOKEN_PAIRS[p][1]]["grad_norm"])}
                  for p in TOKEN_PAIRS}
        out[w]["token_vs_row_grad_rel"] = _sig(t["token_vs_row_grad_rel"], 3)
    t = runs["one_process"]["token"]
    out["batch"] = {"sign_change_rows": t["adv_sign_change_rows"], **t["gspo_rows"],
                    **{k: t["gate"][k] for k in ("clipped_upper", "clipped_lower",
                                                 "dual_clipped")}}
    return out


def padding_summary(runs) -> dict:
    p = runs["one_process"]["padding"]
    cases = {k: {"widths": x["widths"], "rows": x["rows"], "loss": _sig(x["loss"]),
                 "grad_norm": _sig(x["grad_norm"]),
                 "grad_rel_vs_constant": _sig(x["grad_rel_vs_v1_fixed_L"], 2),
                 "loss_scale_factor": x["loss_scale_factor"],
                 "use_remove_padding": x["use_remove_padding"]}
             for k, x in ((k, p["cases"][f"{k}/vanilla"]) for k in PAD)}
    return {"lengths": p["lengths"], "width": p["width"], "token_budget": p["token_budget"],
            "cases": cases,
            "adapter_vs_builtin_max": _sig(max(p["adapter_vs_builtin"].values()), 2),
            "closed_form_max_abs": _sig(max(abs(x["loss"] - x["closed_form_micro"])
                                            for x in p["cases"].values()), 2)}


def test_per_token_and_padding_summaries_match_the_committed_ones(runs):
    record.check("verl_per_token", token_summary(runs))
    record.check("verl_padding", padding_summary(runs))
