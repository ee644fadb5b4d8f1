"""rlgates.inspect.capture on tiny stock TRL GRPOTrainer runs (tests/trl_run.py: 2 optimiser steps of
2 micro-batches each): the captured tokens rebuild the loss the trainer computed, samples are
bounded and exact, the capture changes nothing in the run, ρ ≡ 1 at num_iterations=1, and `load`
refuses what is not a capture it can read."""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import rlgates
from rlgates.inspect.capture import SCHEMA_VERSION, capture, load

ROOT = Path(__file__).resolve().parents[1]

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
            captured.path = path  # where its files are
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


# --- the sums over every token (P7), one run per directory (P8), crash-safe files (P9) -----------
def test_recorded_sums_are_the_tokens_own(tmp_path_factory):
    """The per-micro-batch sums a capture records over every token equal the ones rebuilt from a
    capture that keeps every token, for each gate (token, sequence level, cispo's own form)."""
    from rlgates.inspect.stats import _token_sums, method_for, recorded_sums

    for case in sorted(CASES):
        _, cap = run(tmp_path_factory, case)
        method, _, _ = method_for(cap.settings)
        assert cap.settings["token_loss_method"]["name"] == method.name
        for step in cap.steps:
            rec, rebuilt = recorded_sums(cap, method, step), _token_sums(cap, method, step)
            np.testing.assert_allclose(rec, rebuilt, rtol=1e-6, atol=1e-9, err_msg=case)
    # the gate-free sums: k3 KL and the largest abs(log ρ) of every token, no sampler log-probs
    t, m = cap.tokens, cap.micro
    for step in cap.steps:
        at, mat = t["step"] == step, m["step"] == step
        lr = (t["logp"][at] - t["logp_old"][at]).astype(float)
        assert m["approx_kl_sum"][mat].sum() == pytest.approx((np.exp(lr) - 1 - lr).sum(),
                                                              rel=1e-5)
        assert m["log_ratio_absmax"][mat].max() == pytest.approx(np.abs(lr).max(), rel=1e-6)
    assert (m["sampler_tokens"] == 0).all() and np.isnan(m["mismatch_absmax"]).all()
    s = cap.sequences  # per row: the micro-batch's sums split by response
    for step in cap.steps:
        for k in (0, 1):
            rows = (s["step"] == step) & (s["micro"] == k)
            assert s["token_loss_sum"][rows].sum() == pytest.approx(
                m["token_loss_sum"][(m["step"] == step)][k], rel=1e-9, abs=1e-12)


def test_a_sampled_capture_checks_the_normaliser(tmp_path_factory):
    """P7: a bnpo run captured with tokens_per_step below a step's tokens (as the default 4096
    is for any real run). Schema 1 captured only the sampled tokens: micro_normaliser could not
    run and the command said "healthy". The recorded sums let it run, and it fires."""
    from rlgates.inspect import inspect_run

    found = {}
    for case in ("bnpo", "dapo"):
        _, cap = run(tmp_path_factory, case, tokens_per_step=16)
        for step in cap.steps:  # sampled: fewer tokens kept than the step has
            assert (cap.tokens["step"] == step).sum() == 16 < cap.micro["tokens"][
                cap.micro["step"] == step].sum()
        res = inspect_run(cap)
        found[case] = {f.name: f for f in res.findings}["micro_normaliser"]
        assert found[case].checked, found[case].message
        assert (res.numbers["fit_recorded"] == 1).all()
    assert found["bnpo"].fired and not found["dapo"].fired  # dapo: one count for the step
    # negative control: without the sums (as schema 1 wrote it) the same capture is not checked
    _, cap = run(tmp_path_factory, "bnpo", tokens_per_step=16)
    old = copy.deepcopy(cap)
    for k in ("token_loss_sum", "token_loss_abs_sum"):
        del old.micro[k]
    f = {x.name: x for x in inspect_run(old).findings}["micro_normaliser"]
    assert not f.checked and not f.fired


def _step_files(path):
    return sorted(Path(path).glob("step_*.npz"))


def test_a_capture_directory_holds_one_run(tmp_path_factory, tmp_path):
    """P8: capturing into a directory that holds anything is refused (one line), unless
    overwrite=True, which removes the capture files there and nothing else; files of two runs,
    or with different settings, are refused by load."""
    trainer, cap = run(tmp_path_factory, "dapo")
    src = _step_files(cap.path)
    used = tmp_path / "used"
    shutil.copytree(src[0].parent, used)
    (used / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty .*overwrite=True") as e:
        capture(trainer, used)
    assert "\n" not in str(e.value) and "_compute_loss" not in trainer.__dict__
    assert _step_files(used) and load(used).run_id == cap.run_id  # untouched
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        capture(trainer, tmp_path / "other")  # any file, not only a capture's
    handle = capture(trainer, used, overwrite=True)
    assert _step_files(used) == [] and (used / "notes.txt").read_text() == "mine"
    with pytest.warns(UserWarning, match="recorded nothing"):
        handle.close()

    # every file carries the run id and the settings; load refuses a mix
    ids = {json.loads(str(np.load(f)["settings"]))["run_id"] for f in src}
    assert ids == {cap.run_id} and len(cap.run_id) == 32
    _, grpo = run(tmp_path_factory, "grpo")
    assert grpo.run_id != cap.run_id
    mixed = tmp_path / "mixed"
    shutil.copytree(src[0].parent, mixed)
    other = _step_files(grpo.path)
    shutil.copy(other[-1], mixed / "step_00000002.rank0.npz")
    with pytest.raises(ValueError, match=f"from run {grpo.run_id} but .* from run {cap.run_id}"):
        load(mixed)
    same_id = tmp_path / "same_id"  # one run id, settings changed in one file
    shutil.copytree(src[0].parent, same_id)
    f = _step_files(same_id)[-1]
    data = dict(np.load(f))
    settings = json.loads(str(data["settings"]))
    data["settings"] = np.asarray(json.dumps({**settings, "loss_type": "bnpo"}))
    np.savez(f, **data)
    with pytest.raises(ValueError, match="different settings .*loss_type 'dapo' against 'bnpo'|"
                                         "different settings .*loss_type 'bnpo' against 'dapo'"):
        load(same_id)


def test_a_corrupt_last_file_is_skipped_with_a_warning(tmp_path_factory, tmp_path):
    """P9: a truncated last step file (a crash while it was written) costs that step only; a
    corrupt file before the last is refused."""
    _, cap = run(tmp_path_factory, "dapo")
    src = _step_files(cap.path)
    cut = tmp_path / "cut"
    shutil.copytree(src[0].parent, cut)
    last = _step_files(cut)[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.warns(UserWarning, match="step_00000001.rank0.npz: corrupt .* skipped"):
        got = load(cut)
    assert list(got.steps) == [0] and "skipped" in got.notes[0]
    np.testing.assert_array_equal(got.micro["loss"], cap.micro["loss"][cap.micro["step"] == 0])
    first = _step_files(cut)[0]
    last.write_bytes(src[-1].read_bytes())
    first.write_bytes(first.read_bytes()[:100])
    with pytest.raises(ValueError, match="step_00000000.rank0.npz: corrupt"):
        load(cut)


#: A process that captures a synthetic run, each step file written slowly (the parent kills it
#: while it writes). argv: path, "atomic" (the capture's writer) or "direct" (np.savez_compressed
#: straight to the final name, as schema 1 wrote).
_CHILD = r'''
import io, sys, time
import numpy as np, torch
from rlgates.inspect import capture as cap

path, how = sys.argv[1], sys.argv[2]
real = np.savez_compressed

def slow(f, **arrays):
    buf = io.BytesIO()
    real(buf, **arrays)
    data = buf.getvalue()
    fh = open(f, "wb") if isinstance(f, str) else f
    for i in range(0, len(data), 256):
        fh.write(data[i:i + 256])
        fh.flush()
        if i == 256:
            print("writing", flush=True)
        time.sleep(0.02)

np.savez_compressed = slow
if how == "direct":
    def direct(f, settings, step, rank, arrays):
        slow(str(f), format=np.asarray(cap.FORMAT), schema_version=np.asarray(2),
             settings=np.asarray(cap.json.dumps(settings)), step=np.asarray(step),
             rank=np.asarray(rank), **arrays)
    cap.save_step = direct

class Synthetic(cap._Recorder):
    def __init__(self, path):
        self._start(path, 64, 0, 0, {"trainer": "trl", "loss_type": "dapo", "epsilon": 0.2,
                                     "epsilon_high": 0.28})

    def _restore(self):
        pass

rec, g = Synthetic(path), torch.Generator().manual_seed(0)
for step in range(1000):
    if rec.buffer is not None:
        rec._write()
    print("step", step, flush=True)
    for micro in range(2):
        old = -torch.rand(4, 16, generator=g)
        mask = torch.rand(4, 16, generator=g) < 0.8
        per_token = {"logp": old + 0.01 * torch.randn(4, 16, generator=g), "logp_old": old,
                     "advantage": torch.randn(4, 1, generator=g).expand(4, 16),
                     "logp_sampler": torch.full((4, 16), float("nan")),
                     "logp_ref": torch.full((4, 16), float("nan")),
                     "entropy": torch.rand(4, 16, generator=g), "mask": mask}
        rec._buffer(step).add_micro_batch(per_token, mask, torch.tensor(0.1 * step),
                                          float("nan"), [micro] * 4)
'''


def _kill_while_writing(tmp_path, how, at_step):
    """Run _CHILD, SIGKILL it while it writes the file of step `at_step`; the directory."""
    import signal
    import subprocess
    import sys

    out = tmp_path / f"{how}{at_step}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(out), how], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        seen = None
        for line in p.stdout:
            if line.startswith("step"):
                seen = int(line.split()[1])
            elif line.startswith("writing") and seen == at_step:
                os.kill(p.pid, signal.SIGKILL)  # in the middle of step at_step's file
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    return out


def test_a_capture_killed_while_writing_loses_at_most_that_step(tmp_path):
    """P9: a process killed (SIGKILL) in the middle of writing a step file. The capture's writer
    writes a temporary file and renames it: what is left loads, every step before the one being
    written is there, and the half-written file is the hidden temporary one. Negative control:
    writing straight to the final name (as schema 1 did) leaves a truncated step file, which
    load skips with a warning as the rank's last."""
    rng = np.random.default_rng()
    for at in sorted(int(a) for a in rng.choice(np.arange(1, 5), 2, replace=False)):
        out = _kill_while_writing(tmp_path, "atomic", at)
        hidden = [f.name for f in out.iterdir() if f.name.startswith(".")]
        assert len(hidden) == 1 and hidden[0].startswith(f".step_{at:08d}.rank0.npz.")
        assert len(_step_files(out)) == at  # steps 0 to at - 1, whole
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to skip
            got = load(out)
        assert list(got.steps) == list(range(at)), at  # only the step being written is lost
        np.testing.assert_allclose(got.micro["loss"], np.repeat(0.1 * np.arange(at), 2),
                                   rtol=1e-6)
    out = _kill_while_writing(tmp_path, "direct", 3)
    assert len(_step_files(out)) == 4  # steps 0 to 2, and step 3 cut short
    with pytest.warns(UserWarning, match="step_00000003.rank0.npz: corrupt .* skipped"):
        got = load(out)
    assert list(got.steps) == [0, 1, 2]


def test_old_captures_load_with_a_note(tmp_path):
    """A schema 1 capture (no run id, no sums) loads, and says what it lacks."""
    from rlgates.inspect import synthetic

    path = synthetic.write(tmp_path / "old", steps=2, rows=8, length=6, schema_version=1)
    got = load(path)
    assert got.run_id is None and "token_loss_sum" not in got.micro
    assert len(got.notes) == 1 and "capture schema 1" in got.notes[0]
    assert load(synthetic.write(tmp_path / "new", steps=2, rows=8, length=6)).notes == []


# --- the method recorded (P5, P16) ----------------------------------------------------------------
def test_the_drop_in_trainers_method_and_generation_settings_are_recorded():
    """The drop-in RlgatesGRPOTrainer's method (name and hyperparameters) is in the settings,
    and inspect reads the run under exactly that method; TRL's generation_kwargs and vespo_*
    settings are recorded too."""
    from rlgates.inspect.capture import trainer_settings
    from rlgates.inspect.stats import method_for
    from rlgates.trainers.trl import RlgatesGRPOTrainer
    from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

    m = rlgates.get("dapo", eps_low=0.1, eps_high=0.4)
    # GRPOConfig's ε stays 0.2: only the record says what was trained
    with pytest.warns(UserWarning, match="allow_config_mismatch=True"):
        trainer = RlgatesGRPOTrainer(model=tiny_model(), reward_funcs=reward_words,
                                     args=config(), train_dataset=DATA,
                                     processing_class=tiny_tokenizer(), method=m,
                                     allow_config_mismatch=True)
    st = json.loads(json.dumps(trainer_settings(trainer)))  # as a capture file holds them
    assert st["method"] == {"name": "dapo", "hparams": {"eps_low": 0.1, "eps_high": 0.4},
                            "agg": None}
    got, agg, note = method_for(st)
    assert (got.name, got.hparams, agg, note) == ("dapo", m.hparams, st["aggregation"], "")
    # negative control: the same TRL settings without the record read as TRL's own clip
    plain, _, _ = method_for({k: v for k, v in st.items() if k != "method"})
    assert plain.hparams != m.hparams
    assert st["generation_kwargs"] == {"sequence_bias": {"(1,)": 1.0}}
    assert {k for k in st if k.startswith("vespo_")} == {"vespo_k_pos", "vespo_lambda_pos",
                                                           "vespo_k_neg", "vespo_lambda_neg"}
    assert st["trainer"] == "trl"


def test_the_verl_settings_record_an_rlgates_loss_and_the_policy_loss_fields():
    from verl.workers.config import FSDPActorConfig

    from rlgates.inspect.capture_verl import verl_settings
    from rlgates.inspect.stats import method_for
    from rlgates.trainers import verl as rv

    m = rlgates.get("sapo", tau_pos=1.5, tau_neg=2.0)
    name = rv.register(m, agg="seq-mean-token-mean")
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                          policy_loss={"loss_mode": name})
    st = verl_settings(cfg)
    assert st["method"] == {"name": "sapo", "hparams": {"tau_pos": 1.5, "tau_neg": 2.0},
                            "agg": "seq-mean-token-mean"}
    got, agg, note = method_for(st)
    assert (got.hparams, agg, note) == (m.hparams, "seq-mean-token-mean", "")
    # verl's own sapo: tau_pos and tau_neg are settings of the actor, read back from them
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                          policy_loss={"loss_mode": "sapo"}, tau_pos=1.5, tau_neg=2.0)
    st = verl_settings(cfg)
    assert "method" not in st and (st["tau_pos"], st["tau_neg"]) == (1.5, 2.0)
    assert "policy_loss.clip_cov_ratio" in st
    got, _, note = method_for(st)
    assert (got.name, got.hparams, note) == ("sapo", m.hparams, "")


def test_the_mismatch_is_summed_over_every_token(tmp_path):
    """The sampler mismatch of a sampled capture is read from the sums over every token with a
    sampler log-prob, exactly (a token without one, NaN, is not counted)."""
    from rlgates.inspect.capture import _Recorder
    from rlgates.inspect.stats import recorded_mismatch, run_numbers

    class Recorder(_Recorder):
        def _restore(self):
            pass

    rec = Recorder()
    rec._start(tmp_path / "c", 8, 0, 0, {"trainer": "trl", "loss_type": "dapo"})
    g = torch.Generator().manual_seed(1)
    want = {}
    for step in (0, 1):
        if rec.buffer is not None:
            rec._write()
        d = []
        for micro in range(2):
            old = -torch.rand(3, 10, generator=g)
            mask = torch.rand(3, 10, generator=g) < 0.7
            sampler = old - 0.3 * torch.randn(3, 10, generator=g)
            sampler[0] = float("nan")  # one response without the sampler's log-probs
            per_token = {"logp": old.clone(), "logp_old": old, "logp_sampler": sampler,
                         "advantage": torch.ones(3, 10), "mask": mask,
                         "logp_ref": torch.full((3, 10), float("nan")),
                         "entropy": torch.ones(3, 10)}
            rec._buffer(step).add_micro_batch(per_token, mask, torch.tensor(0.0), float("nan"),
                                              [micro] * 3)
            have = mask & sampler.isfinite()
            d.append((old - sampler)[have].double())
        d = torch.cat(d)
        want[step] = (float((d.exp() - 1 - d).mean()), float(d.abs().max()))
    rec.close()
    cap = load(tmp_path / "c")
    assert (np.bincount(cap.tokens["step"]) == 8).all()  # sampled
    x = run_numbers(cap)
    for step in (0, 1):
        got = recorded_mismatch(cap, step)
        assert (got["mismatch_kl"], got["mismatch_absmax"]) == pytest.approx(want[step],
                                                                             rel=1e-6)
        assert x["mismatch_kl"][step] == pytest.approx(want[step][0], rel=1e-6)
