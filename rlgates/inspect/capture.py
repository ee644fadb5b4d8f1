"""Capture what a stock TRL `GRPOTrainer` feeds its policy loss, token by token, to inspect later.

    from rlgates.inspect.capture import capture, load
    with capture(trainer, "run.capture"):      # or: handle = capture(...); ...; handle.close()
        trainer.train()
    run = load("run.capture")                  # run.settings, run.tokens, run.micro, run.sequences

Why this hook. A `TrainerCallback` sees logs and states, never the batch. The loss does: TRL 1.16's
`GRPOTrainer.compute_loss` calls `self._compute_loss(model, inputs)`, and `inputs` holds the
completion mask, the advantages, `old_per_token_logps` (absent when ρ ≡ 1), the sampler's
`sampling_per_token_logps` (vLLM only), `ref_per_token_logps` (beta ≠ 0) and `num_items_in_batch`.
`capture` replaces `_compute_loss` on the *instance* (the class is untouched; `close()` restores
it) and, for the length of each call, also wraps the instance's `_get_per_token_logps_and_entropies`
to read log π and the entropies the loss is computed from. Everything is read detached, under
`torch.no_grad()`, after the trainer's own call: the loss, its gradient and the trainer's logs are
the same with and without a capture (tests/test_capture.py checks it). Only training calls are
recorded (the model in train mode); evaluation batches are not. A subclass that overrides
`compute_loss` without calling `_compute_loss` (such as `rlgates.trainers.trl.RlgatesGRPOTrainer`)
is not seen: `close()` then warns that nothing was recorded.

What one optimiser step records (the step is `trainer.state.global_step` during the call):

- tokens: a uniform sample without replacement of at most `tokens_per_step` of the step's
  completion tokens (those with completion_mask = 1, over all its micro-batches), by reservoir
  sampling with random keys (each token draws a key; the smallest keys are kept), so memory is
  bounded whatever the batch. Per token: `logp` (log π), `logp_old` (log π_old; where TRL has
  none, ρ ≡ 1 and it is log π detached, which is exactly what TRL's loss uses), `logp_sampler`,
  `logp_ref`, `entropy` (NaN where absent), `advantage` (A at that token), `mask` (the loss mask:
  completion_mask × tool_mask), and where it came from: `micro` (micro-batch index within the
  step), `row`, `position`.
- micro-batches, every one: `loss` (the value `_compute_loss` returned, already divided by the
  accumulation steps where TRL divides), `tokens` (Σ loss mask), `rows`, `length` (the padded
  completion length T), `num_items_in_batch` (TRL's global token count; NaN if absent).
- sequences, every row of every micro-batch: `length` (Σ loss mask), `advantage` (its mean A over
  the masked tokens; A is per sequence in stock TRL), `prompt` (a CRC-32 of the prompt's token
  ids: TRL shuffles the generation batch's rows and keeps no group index, so this is how a
  group's rows are found again; groups drawn from the same prompt share it too), `micro`, `row`.

Steps count from 0: capture step k is the optimiser step the trainer logs as `"step": k + 1`.

File format (schema_version 1). `path` is a directory; each optimiser step is written, when the
next step starts or on `close()`, as `step_<global step, 8 digits>.rank<process>.npz`, so memory
holds one step and a crash loses at most one. A file is a plain `numpy.savez_compressed` archive
that loads with `numpy.load(f, allow_pickle=False)`: every entry is a numeric or bool array, or a
0-d unicode string:

    format            "rlgates.capture"     (a file without it is not a capture)
    schema_version    int64, 0-d
    settings          JSON: the trainer's settings (see `SETTINGS`), the versions,
                      tokens_per_step and capture_seed
    step, rank        int64, 0-d
    token/<field>     [n ≤ tokens_per_step]: the fields above (float32; mask bool; micro, row,
                      position int64)
    micro/<field>     [micro-batches of the step]
    sequence/<field>  [rows of the step]

`load(path)` reads a directory (or one step file) into step-indexed arrays, each table with a
`step` column; it refuses a corrupt file, a foreign file and a newer schema with a ValueError of
one line each.

verl (0.9.1): `rlgates.inspect.capture_verl.capture_verl` writes this format from verl's actor
update. A wrapper of a registered loss would not do: `verl.workers.utils.losses.ppo_loss(config,
model_output, data)` calls the registered policy loss (`core_algos.get_policy_loss_fn(loss_mode)`)
with keywords `old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights`, so such a wrapper sees log π, log π_old, A, the mask, the aggregation and
the global batch counts (`config.global_batch_info`), but no entropy (`ppo_loss` reads it from
`model_output` for its own entropy term) and no rollout log-probs (only the correction weights
derived from them, when rollout correction is on). `capture_verl` wraps `ppo_loss` itself,
through the worker's loss hook `TrainingWorker.set_loss_fn`.
"""

from __future__ import annotations

import json
import math
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

#: The file format's version; `load` refuses a file with a newer one.
SCHEMA_VERSION = 1
FORMAT = "rlgates.capture"

#: The GRPOConfig settings a capture records once (those that decide the loss, its normaliser and
#: how stale ρ can be). A setting the installed TRL lacks is recorded as None.
SETTINGS = ("loss_type", "epsilon", "epsilon_high", "delta", "beta", "importance_sampling_level",
            "num_iterations", "gradient_accumulation_steps", "steps_per_generation",
            "per_device_train_batch_size", "num_generations", "max_completion_length",
            "scale_rewards", "temperature", "top_p", "learning_rate", "top_entropy_quantile",
            "off_policy_mask_threshold", "use_vllm", "vllm_importance_sampling_correction",
            "sapo_temperature_pos", "sapo_temperature_neg", "mask_truncated_completions",
            "entropy_coef", "seed")

TOKEN_FIELDS = ("logp", "logp_old", "logp_sampler", "logp_ref", "entropy", "advantage", "mask",
                "micro", "row", "position")
MICRO_FIELDS = ("loss", "tokens", "rows", "length", "num_items_in_batch")
SEQUENCE_FIELDS = ("length", "advantage", "prompt", "micro", "row")
_INTEGER_FIELDS = ("micro", "row", "rows", "length", "tokens", "prompt")


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    return str(v)


def trainer_settings(trainer) -> dict:
    """The settings a capture records: `SETTINGS` from `trainer.args`, the aggregation rlgates
    maps TRL's loss_type to, the number of processes and the library versions."""
    import transformers
    import trl

    from ..trainers.trl import TRL_AGG

    args = trainer.args
    out = {k: _jsonable(getattr(args, k, None)) for k in SETTINGS}
    out["aggregation"] = TRL_AGG.get(args.loss_type)  # None: a loss_type rlgates does not map
    out["num_processes"] = trainer.accelerator.num_processes
    out["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__,
                       "torch": torch.__version__}
    return out


class _StepBuffer:
    """One optimiser step's records: the token reservoir (kept to `capacity` by smallest random
    key) and every micro-batch's and sequence's row."""

    def __init__(self, step, capacity, generator):
        self.step, self.capacity, self.generator = step, capacity, generator
        self.keys = torch.empty(0)
        self.tokens = {k: torch.empty(0) for k in TOKEN_FIELDS}
        self.micro = {k: [] for k in MICRO_FIELDS}
        self.sequences = {k: [] for k in SEQUENCE_FIELDS}

    def add_tokens(self, new):
        n = len(new["logp"])
        keys = torch.rand(n, generator=self.generator)
        keys = torch.cat([self.keys, keys])
        merged = {k: torch.cat([self.tokens[k].to(new[k].dtype), new[k]]) for k in TOKEN_FIELDS}
        if len(keys) > self.capacity:  # keep the smallest keys: a uniform sample of all seen
            keep = torch.topk(keys, self.capacity, largest=False).indices.sort().values
            keys = keys[keep]
            merged = {k: v[keep] for k, v in merged.items()}
        self.keys, self.tokens = keys, merged

    def add_micro_batch(self, per_token, select, loss, num_items, prompts):
        """One micro-batch, as the TRL and the verl capture both record it. per_token:
        {field: [B, T]} with the loss's "mask" and the "advantage"; its tokens where `select`
        is True go into the reservoir; its loss, counts and `num_items` (the trainer's
        normaliser, NaN if none) into the micro-batch table; each response's length, mean
        advantage and prompt key (`prompts`, one per row) into the sequence table."""
        micro = len(self.micro["loss"])
        rows, positions = select.nonzero(as_tuple=True)
        new = {k: v[rows, positions] for k, v in per_token.items()}
        new.update(micro=torch.full_like(rows, micro), row=rows, position=positions)
        self.add_tokens(new)
        mask, adv = per_token["mask"], per_token["advantage"]
        B, T = mask.shape
        lengths = mask.sum(-1)
        for k, v in (("loss", float(loss.detach().float())), ("tokens", int(lengths.sum())),
                     ("rows", B), ("length", T), ("num_items_in_batch", num_items)):
            self.micro[k].append(v)
        self.sequences["length"] += lengths.tolist()
        self.sequences["advantage"] += ((adv * mask).sum(-1) / lengths.clamp(min=1)).tolist()
        self.sequences["prompt"] += list(prompts)
        self.sequences["micro"] += [micro] * B
        self.sequences["row"] += list(range(B))

    def write(self, path: Path, rank: int, settings: dict) -> Path:
        """The step as one npz file (schema SCHEMA_VERSION) under `path`; returns its name."""
        f = path / f"step_{self.step:08d}.rank{rank}.npz"
        np.savez_compressed(f, format=np.asarray(FORMAT),
                            schema_version=np.asarray(SCHEMA_VERSION, dtype=np.int64),
                            settings=np.asarray(json.dumps(settings)),
                            step=np.asarray(self.step, dtype=np.int64),
                            rank=np.asarray(rank, dtype=np.int64), **self.arrays())
        return f

    def arrays(self) -> dict:
        out = {}
        for k in TOKEN_FIELDS:
            v = self.tokens[k].numpy()
            out[f"token/{k}"] = v if v.dtype in (np.bool_, np.int64) else v.astype(np.float32)
        for name, table in (("micro", self.micro), ("sequence", self.sequences)):
            for k, v in table.items():
                dtype = np.int64 if k in _INTEGER_FIELDS else np.float32
                out[f"{name}/{k}"] = np.asarray(v, dtype=dtype)
        return out


def _prompt_hashes(inputs):
    ids, mask = inputs["prompt_ids"].detach().cpu(), inputs["prompt_mask"].detach().cpu().bool()
    return [zlib.crc32(row[m].numpy().astype(np.int64).tobytes())
            for row, m in zip(ids, mask, strict=True)]


def _float(x):
    return float("nan") if x is None else float(torch.as_tensor(x).float().sum())


class _Recorder:
    """What the TRL and the verl capture share: the settings, one step's buffer at a time, the
    files written, and the handle (`close`, `with`). A subclass hooks its trainer, records
    through `_buffer(step).add_micro_batch`, and gives `_restore` and `nothing` (the warning
    when no step was written)."""

    nothing = "the capture recorded nothing"

    def _start(self, path, tokens_per_step, seed, rank, settings):
        if tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be ≥ 1, not {tokens_per_step}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.tokens_per_step = int(tokens_per_step)
        self.generator = torch.Generator().manual_seed(seed)
        self.rank = rank
        self.settings = dict(settings, tokens_per_step=self.tokens_per_step, capture_seed=seed)
        self.files, self.buffer, self.closed = [], None, False

    def _buffer(self, step) -> _StepBuffer:
        """The buffer of optimiser step `step` (a new one after the last was written)."""
        if self.buffer is None:
            self.buffer = _StepBuffer(step, self.tokens_per_step, self.generator)
        return self.buffer

    def _write(self):
        buf, self.buffer = self.buffer, None
        self.files.append(buf.write(self.path, self.rank, self.settings))

    def _restore(self):
        raise NotImplementedError

    def close(self):
        """Write the last step and give the trainer back its own methods. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._restore()
        if self.buffer is not None:
            self._write()
        if not self.files:
            warnings.warn(self.nothing, stacklevel=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Capture(_Recorder):
    """The handle `capture` returns: `close()` (or leaving the `with` block) writes the last
    step and restores the trainer's own methods."""

    nothing = "capture recorded nothing: the trainer's compute_loss never called _compute_loss " \
              "in training"

    def __init__(self, trainer, path, tokens_per_step=4096, seed=0):
        self.trainer = trainer
        self._start(path, tokens_per_step, seed, trainer.accelerator.process_index,
                    trainer_settings(trainer))
        self._own = trainer.__dict__.get("_compute_loss")  # an instance override, if any
        self._inner = trainer._compute_loss
        trainer._compute_loss = self._compute_loss

    # -- the hook ----------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        t = self.trainer
        if not t.model.training:
            return self._inner(model, inputs)
        seen = {}
        forward = t._get_per_token_logps_and_entropies
        had_own = "_get_per_token_logps_and_entropies" in t.__dict__

        def reading(*args, **kwargs):  # the loss's own forward pass; its outputs pass unchanged
            out = forward(*args, **kwargs)
            seen["logp"], seen["entropy"] = out[0], out[1]
            return out

        t._get_per_token_logps_and_entropies = reading
        try:
            loss = self._inner(model, inputs)
        finally:
            if had_own:
                t._get_per_token_logps_and_entropies = forward
            else:
                del t._get_per_token_logps_and_entropies
        with torch.no_grad():
            self._record(inputs, seen, loss)
        return loss

    def _record(self, inputs, seen, loss):
        step = int(self.trainer.state.global_step)
        if self.buffer is not None and self.buffer.step != step:
            self._write()
        completion = inputs["completion_mask"].detach().cpu().bool()
        mask = completion
        if "tool_mask" in inputs:
            mask = mask & inputs["tool_mask"].detach().cpu().bool()
        logp = seen["logp"].detach().float().cpu()
        old = inputs.get("old_per_token_logps")
        old = logp if old is None else old.detach().float().cpu()  # TRL's own fallback: ρ ≡ 1
        adv = inputs["advantages"].detach().float().cpu()
        adv = (adv[:, None] if adv.dim() == 1 else adv).expand_as(logp)
        nan = torch.full_like(logp, float("nan"))

        def optional(x):
            return nan if x is None else x.detach().float().cpu()

        per_token = {"logp": logp, "logp_old": old, "advantage": adv,
                     "logp_sampler": optional(inputs.get("sampling_per_token_logps")),
                     "logp_ref": optional(inputs.get("ref_per_token_logps")),
                     "entropy": optional(seen.get("entropy")), "mask": mask}
        self._buffer(step).add_micro_batch(per_token, completion, loss,
                                           _float(inputs.get("num_items_in_batch")),
                                           _prompt_hashes(inputs))

    # -- the handle ----------------------------------------------------------------------------
    def _restore(self):
        if self._own is None:
            del self.trainer._compute_loss
        else:
            self.trainer._compute_loss = self._own


def capture(trainer, path, tokens_per_step=4096, seed=0) -> Capture:
    """Record what `trainer` (a stock TRL GRPOTrainer) feeds its loss, into the directory `path`
    (see the module docstring for what and how). `tokens_per_step`: the most tokens kept per
    optimiser step; `seed`: the sampler's. Returns a handle: `close()` it, or use it in `with`."""
    return Capture(trainer, path, tokens_per_step, seed)


# --- reading ----------------------------------------------------------------------------------
@dataclass
class Run:
    """A loaded capture: the settings (one dict), and three tables of step-indexed arrays,
    each with a `step` (and `rank`) column beside the fields the module docstring lists."""

    settings: dict
    tokens: dict = field(default_factory=dict)
    micro: dict = field(default_factory=dict)
    sequences: dict = field(default_factory=dict)

    @property
    def steps(self):
        return np.unique(self.micro["step"])


_UNREADABLE = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError)


def _read(f: Path) -> dict:
    def corrupt(e):
        return ValueError(f"{f}: corrupt or unreadable capture file ({type(e).__name__})")

    try:
        z = np.load(f, allow_pickle=False)
    except _UNREADABLE as e:
        raise corrupt(e) from None
    if not isinstance(z, np.lib.npyio.NpzFile):  # a plain .npy array
        raise ValueError(f"{f}: not an rlgates capture file")
    try:
        with z:
            data = {k: z[k] for k in z.files}
    except _UNREADABLE as e:  # a member cut short or damaged
        raise corrupt(e) from None
    if "format" not in data or str(data["format"]) != FORMAT or "schema_version" not in data:
        raise ValueError(f"{f}: not an rlgates capture file")
    version = int(data["schema_version"])
    if version > SCHEMA_VERSION:
        raise ValueError(f"{f}: capture schema {version} is newer than this rlgates reads "
                         f"({SCHEMA_VERSION}); upgrade rlgates")
    try:
        data["settings"] = json.loads(str(data["settings"]))
    except (KeyError, ValueError) as e:
        raise corrupt(e) from None
    return data


def load(path) -> Run:
    """Read a capture directory (or one of its step files) into a `Run`. Raises ValueError, one
    line, for a corrupt file, a file that is not a capture, or one from a newer schema."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    files = sorted(path.glob("step_*.npz")) if path.is_dir() else [path]
    if not files:
        # a folder of runs (one capture per subdirectory): name them, so the fix is one word
        runs = sorted(d.name for d in path.iterdir() if d.is_dir() and any(d.glob("step_*.npz")))
        hint = (f"; it holds captures in {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}"
                if runs else "")
        raise ValueError(f"{path}: no capture files (step_*.npz) in this directory{hint}")
    parts = [_read(f) for f in files]
    run = Run(settings=parts[0]["settings"])
    for table, prefix in ((run.tokens, "token/"), (run.micro, "micro/"),
                          (run.sequences, "sequence/")):
        for data in parts:
            names = [k for k in data if k.startswith(prefix)]
            n = len(data[names[0]]) if names else 0
            for k in names:
                table.setdefault(k[len(prefix):], []).append(data[k])
            table.setdefault("step", []).append(np.full(n, int(data["step"]), dtype=np.int64))
            table.setdefault("rank", []).append(np.full(n, int(data["rank"]), dtype=np.int64))
        for k in list(table):
            table[k] = np.concatenate(table[k])
    return run


__all__ = ["FORMAT", "SCHEMA_VERSION", "SETTINGS", "Capture", "Run", "capture", "load",
           "trainer_settings"]
