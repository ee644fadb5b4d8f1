"""rlgates.inspect.capture on tiny stock TRL GRPOTrainer runs (tests/trl_run.py: 2 optimiser steps of
2 micro-batches each): the captured tokens rebuild the loss the trainer computed, samples are
bounded and exact, the capture changes nothing in the run, ρ ≡ 1 at num_iterations=1, and `load`
refuses what is not a capture it can read."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import rlgates
from rlgates.inspect.capture import SCHEMA_VERSION, capture, load

# Under xdist one worker runs this group (pyproject.toml: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("trainers")

#: A run's name -> (TRL loss_type, the rlgates method whose TRL flags it runs with and whose
#: loss rebuilds it). bnpo and dr_grpo have no method of their own: they are grpo's clip under
#: another normaliser; gspo is grpo's loss_type at the sequence level.
CASES = {"grpo": ("grpo", "grpo"), "bnpo": ("bnpo", "grpo"), "dr_grpo": ("dr_grpo", "grpo"),
         "dapo": ("dapo", "dapo"), "cispo": ("cispo", "cispo"), "sapo": ("sapo", "sapo"),
         "gspo": ("grpo", "gspo")}

_RUNS = {}


def run(tmp_path_factory, case="grpo", num_iterations=2, tokens_per_step=10_000,
        with_capture=True, **settings):
    """A tiny stock GRPOTrainer run (cached per arguments): (trainer, the loaded capture or None).
    case: a key of CASES, or a TRL loss_type that rlgates does not map (run at TRL's defaults)."""
    key = (case, num_iterations, tokens_per_step, with_capture, tuple(sorted(settings.items())))
    if key not in _RUNS:
        from trl import GRPOTrainer

        from rlgates.trainers import flags
        from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

        if case in CASES:
            loss_type, method = CASES[case]
            f = dict(flags(rlgates.get(method))["trl"], loss_type=loss_type)
        else:
            f = {"loss_type": case}
        args = config(num_iterations=num_iterations, **f, **settings)
        trainer = GRPOTrainer(model=tiny_model(), reward_funcs=reward_words, args=args,
                              train_dataset=DATA, processing_class=tiny_tokenizer())
        captured = None
        if with_capture:
            path = tmp_path_factory.mktemp(f"capture_{case}_{num_iterations}")
            with capture(trainer, path, tokens_per_step=tokens_per_step) as handle:
                trainer.train()
                live = handle.buffer.tokens  # the last step, before it is written
                assert not any(v.requires_grad for v in live.values())
            assert "_compute_loss" not in trainer.__dict__  # the class's own method again
            captured = load(path)
        else:
            trainer.train()
        _RUNS[key] = trainer, captured
    return _RUNS[key]


def dense(cap, step, micro):
    """One captured micro-batch as TRL's [B, T] tensors (log π, log π_old, mask) and A [B]."""
    t, m, s = cap.tokens, cap.micro, cap.sequences
    at = (m["step"] == step)
    B, T = int(m["rows"][at][micro]), int(m["length"][at][micro])
    pick = (t["step"] == step) & (t["micro"] == micro)
    rows, pos = t["row"][pick], t["position"][pick]
    out = []
    for name in ("logp", "logp_old"):
        x = torch.zeros(B, T, dtype=torch.float64)
        x[rows, pos] = torch.as_tensor(t[name][pick], dtype=torch.float64)
        out.append(x)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[rows, pos] = torch.as_tensor(t["mask"][pick])
    seq = (s["step"] == step) & (s["micro"] == micro)
    adv = torch.as_tensor(s["advantage"][seq], dtype=torch.float64)
    return (*out, mask, adv)


def recomputed_loss(cap, case, step, micro, same_ratio=False):
    """The micro-batch's loss, rebuilt from the capture with rlgates' TRL normalisers."""
    from rlgates.trainers.trl import trl_loss

    st = cap.settings
    logp, old, mask, adv = dense(cap, step, micro)
    n_items = cap.micro["num_items_in_batch"][cap.micro["step"] == step][micro]
    return float(trl_loss(
        rlgates.get(CASES[case][1]), logp, logp if same_ratio else old, adv, mask,
        st["loss_type"], max_completion_length=st["max_completion_length"],
        num_items_in_batch=torch.tensor(float(n_items)), num_processes=st["num_processes"],
        grad_accum=st["gradient_accumulation_steps"],
        steps_per_generation=st["steps_per_generation"]))


def assert_losses_are_the_logged_ones(trainer, cap):
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert list(cap.steps) == [0, 1] and len(logged) == 2
    for step in (0, 1):
        losses = cap.micro["loss"][cap.micro["step"] == step]
        assert len(losses) == 2  # gradient_accumulation_steps micro-batches
        # The trainer logs the sum of its micro-batches' (already scaled) losses.
        assert float(losses.sum()) == pytest.approx(logged[step], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("case", sorted(CASES))
def test_capture_rebuilds_the_trainers_loss(tmp_path_factory, case):
    trainer, cap = run(tmp_path_factory, case)
    loss_type, method = CASES[case]
    assert cap.settings["loss_type"] == loss_type and cap.settings["num_iterations"] == 2
    assert cap.settings["importance_sampling_level"] == rlgates.get(method).level
    assert_losses_are_the_logged_ones(trainer, cap)
    for step in (0, 1):
        for micro, recorded in enumerate(cap.micro["loss"][cap.micro["step"] == step]):
            assert recomputed_loss(cap, case, step, micro) == pytest.approx(recorded, rel=1e-4,
                                                                            abs=1e-6)
    # Not vacuous: the second step's ρ ≠ 1, and the loss at ρ ≡ 1 is not the recorded one.
    second = cap.tokens["step"] == 1
    assert np.abs(cap.tokens["logp"] - cap.tokens["logp_old"])[second].max() > 1e-3
    at_one = [recomputed_loss(cap, case, 1, k, same_ratio=True) for k in (0, 1)]
    assert np.abs(np.array(at_one) - cap.micro["loss"][cap.micro["step"] == 1]).max() > 1e-4


@pytest.mark.parametrize("loss_type", ["luspo", "vespo"])
def test_capture_of_the_sequence_loss_types(tmp_path_factory, loss_type):
    """LUSPO and VESPO: settings with rlgates' name for their normaliser, losses as logged."""
    from rlgates.trainers.conformance_trl import TRL_AGG

    trainer, cap = run(tmp_path_factory, loss_type)
    assert cap.settings["loss_type"] == loss_type
    assert cap.settings["aggregation"] == TRL_AGG[loss_type] is not None
    assert_losses_are_the_logged_ones(trainer, cap)


def test_what_a_step_records(tmp_path_factory):
    _, cap = run(tmp_path_factory)
    t, m = cap.tokens, cap.micro
    for step in cap.steps:
        assert (t["step"] == step).sum() == m["tokens"][m["step"] == step].sum()  # all kept
    assert t["mask"].all()  # no tool mask: the loss mask is the completion mask
    assert np.isfinite(t["entropy"]).all() and (t["entropy"] > 0).all()
    assert np.isnan(t["logp_sampler"]).all() and np.isnan(t["logp_ref"]).all()  # no vLLM, beta=0
    # dapo's normaliser is the generation batch's token count, which the capture carries.
    assert (m["num_items_in_batch"] > 0).all()
    assert cap.settings["gradient_accumulation_steps"] == 2
    assert cap.settings["aggregation"] == "seq-mean-token-mean"
    # A group's rows share a prompt: per step, each prompt's rows come in whole groups.
    s, k = cap.sequences, cap.settings["num_generations"]
    for step in cap.steps:
        _, counts = np.unique(s["prompt"][s["step"] == step], return_counts=True)
        assert len(counts) > 1 and (counts % k == 0).all()


def test_samples_are_bounded_and_exact(tmp_path_factory):
    _, full = run(tmp_path_factory)
    _, few = run(tmp_path_factory, tokens_per_step=16)
    t, f = few.tokens, full.tokens
    for step in (0, 1):
        at = t["step"] == step
        assert at.sum() == 16 < (f["step"] == step).sum()
        assert len(np.unique(t["micro"][at])) == 2  # drawn from both micro-batches
        coords = set(zip(t["micro"][at], t["row"][at], t["position"][at], strict=True))
        assert len(coords) == 16  # without replacement
    # Same seed, same run: each sampled token carries the values the full capture has there.
    index = {(s, k, r, p): i for i, (s, k, r, p) in enumerate(
        zip(f["step"], f["micro"], f["row"], f["position"], strict=True))}
    rows = [index[c] for c in zip(t["step"], t["micro"], t["row"], t["position"], strict=True)]
    for name in ("logp", "logp_old", "advantage", "entropy"):
        np.testing.assert_array_equal(t[name], f[name][rows])
    # Micro-batch and sequence tables are never sampled.
    np.testing.assert_array_equal(few.micro["loss"], full.micro["loss"])
    np.testing.assert_array_equal(few.sequences["length"], full.sequences["length"])


def test_capture_changes_nothing_in_the_run(tmp_path_factory):
    with_cap, _ = run(tmp_path_factory)
    without, _ = run(tmp_path_factory, with_capture=False)
    keys = ("loss", "grad_norm", "entropy", "clip_ratio/region_mean")
    logs = [[{k: e[k] for k in keys} for e in t.state.log_history if "loss" in e]
            for t in (with_cap, without)]
    assert logs[0] == logs[1]
    for p, q in zip(with_cap.model.parameters(), without.model.parameters(), strict=True):
        assert torch.equal(p, q)
    # Negative control: the comparison can tell two runs apart (ρ ≡ 1 changes the losses).
    one, _ = run(tmp_path_factory, num_iterations=1)
    assert [e["loss"] for e in one.state.log_history if "loss" in e] != [
        e["loss"] for e in without.state.log_history if "loss" in e]


def test_one_iteration_gives_rho_one(tmp_path_factory):
    _, cap = run(tmp_path_factory, num_iterations=1)
    assert cap.settings["num_iterations"] == 1
    np.testing.assert_array_equal(cap.tokens["logp"], cap.tokens["logp_old"])  # ρ ≡ 1, exactly


def test_close_without_a_call_warns_and_restores(tmp_path):
    from trl import GRPOTrainer

    from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

    trainer = GRPOTrainer(model=tiny_model(), reward_funcs=reward_words, args=config(),
                          train_dataset=DATA, processing_class=tiny_tokenizer())
    handle = capture(trainer, tmp_path / "c")
    assert trainer._compute_loss == handle._compute_loss
    with pytest.warns(UserWarning, match="recorded nothing"):
        handle.close()
    assert "_compute_loss" not in trainer.__dict__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle.close()  # idempotent, silent


def _one_line_error(path, match):
    with pytest.raises(ValueError, match=match) as e:
        load(path)
    assert "\n" not in str(e.value)


def test_load_refuses_corrupt_foreign_and_newer_files(tmp_path_factory, tmp_path):
    _, cap = run(tmp_path_factory)
    assert cap.settings["loss_type"] == "grpo"
    src = sorted(next(iter(tmp_path_factory.getbasetemp().glob("capture_grpo_2*")))
                 .glob("step_*.npz"))[0]
    good = dict(np.load(src, allow_pickle=False))
    assert load(src).tokens["logp"].size > 0  # one step file loads on its own

    truncated = tmp_path / "step_00000000.rank0.npz"
    truncated.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    _one_line_error(truncated, "corrupt")
    flipped = bytearray(src.read_bytes())
    middle = len(flipped) // 2
    flipped[middle:middle + 64] = bytes(64)
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(bytes(flipped))
    _one_line_error(damaged, "corrupt")
    text = tmp_path / "notes.npz"
    text.write_text("not a zip")
    _one_line_error(text, "corrupt")

    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    _one_line_error(foreign, "not an rlgates capture")
    array = tmp_path / "array.npy"
    np.save(array, np.ones(3))
    _one_line_error(array, "not an rlgates capture")

    newer = tmp_path / "newer"
    newer.mkdir()
    np.savez(newer / "step_00000000.rank0.npz",
             **dict(good, schema_version=np.asarray(SCHEMA_VERSION + 1)))
    _one_line_error(newer, "newer than this rlgates reads")

    (tmp_path / "empty").mkdir()
    _one_line_error(tmp_path / "empty", "no capture files")
    _one_line_error(tmp_path / "missing", "no such file")
    # Everything loads without pickle: the settings are JSON text, the rest plain arrays.
    assert json.loads(str(good["settings"]))["loss_type"] == "grpo"
    assert all(v.dtype != object for v in good.values())


def test_verl_registered_losses_see_no_entropy_nor_rollout_log_probs():
    """The module docstring's account of verl 0.9.1, read from the installed source."""
    import inspect

    from verl.trainer.ppo import core_algos
    from verl.workers.utils import losses

    for name, fn in core_algos.POLICY_LOSS_REGISTRY.items():
        params = set(inspect.signature(fn).parameters)
        assert not any("entrop" in p for p in params), name
        assert "rollout_log_probs" not in params, name
    source = inspect.getsource(losses.ppo_loss)
    call = source[source.index(" = policy_loss_fn("):]
    call = call[:call.index(")")]
    assert "rollout_is_weights=rollout_is_weights" in call and "entropy" not in call
    assert 'model_output.get("entropy"' in source  # ppo_loss reads the entropy itself
