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
  completion length T), `num_items_in_batch` (TRL's global token count; NaN if absent), and sums
  over *every* loss-masked token of the micro-batch, sampled or not, so that the checks that
  need a whole step run on a sampled capture too (`MICRO_SUMS`):
  `token_loss_sum` Σ ℓ_t and `token_loss_abs_sum` Σ |ℓ_t|, where ℓ_t = −J_t is the token
  objective of the gate in the settings' `token_loss_method` (NaN where there is none);
  `approx_kl_sum` Σ (ρ − 1 − log ρ) and `log_ratio_absmax` max |log ρ|; `sampler_tokens` (the
  tokens with a sampler log-prob), `mismatch_kl_sum` Σ (r − 1 − log r) with r = π_old/π_sampler
  over those tokens, and `mismatch_absmax` max |log r| (NaN when there is none).
- sequences, every row of every micro-batch: `length` (Σ loss mask), `advantage` (its mean A over
  the masked tokens; A is per sequence in stock TRL), `prompt` (a CRC-32 of the prompt's token
  ids: TRL shuffles the generation batch's rows and keeps no group index, so this is how a
  group's rows are found again; groups drawn from the same prompt share it too), `micro`, `row`,
  and the row's own `token_loss_sum` and `token_loss_abs_sum` over all its masked tokens.

Steps count from 0: capture step k is the optimiser step the trainer logs as `"step": k + 1`.

A capture is one run. `path` is a directory that must be empty (or not exist): capturing into
a directory that holds anything is refused with a ValueError, unless `overwrite=True`, which
first removes the capture files there (`step_*.npz`; no other file). The run id is a uuid
drawn at the start; when several TRL processes write into one directory they share process 0's
(through torch.distributed), so every process must call `capture` at the start, as each calls
`train`. (A verl capture draws one per process: each rank writes a directory of its own.)

File format (schema_version 2). Each optimiser step is written, when the next step starts or on
`close()`, as `step_<global step, 8 digits>.rank<process>.npz`, so memory holds one step. It is
written to a temporary name in the same directory (`.step_*.tmp`) and renamed, so a file under
its final name is whole and a crash loses at most the step being written. A file is a plain
`numpy.savez_compressed` archive that loads with `numpy.load(f, allow_pickle=False)`: every entry
is a numeric or bool array, or a 0-d unicode string:

    format            "rlgates.capture"     (a file without it is not a capture)
    schema_version    int64, 0-d
    settings          JSON: the trainer's settings (see `SETTINGS`), the versions,
                      tokens_per_step, capture_seed, run_id, "method" (an rlgates loss: its
                      registry name, hyperparameters and aggregation; see `method_record`) and
                      token_loss_method (the gate of the token_loss sums, or null)
    step, rank        int64, 0-d
    token/<field>     [n ≤ tokens_per_step]: the fields above (float32; mask bool; micro, row,
                      position int64)
    micro/<field>     [micro-batches of the step] (the sums float64; counts int64)
    sequence/<field>  [rows of the step]

Schema 1 (rlgates before the run id and the sums) lacks run_id, token_loss_method and the
sums; such files still load, with a note in `Run.notes`.

`load(path)` reads a directory (or one step file) into step-indexed arrays, each table with a
`step` column. It refuses, with a ValueError of one line each, a corrupt file, a foreign file, a
newer schema, and files of two runs (their run ids or settings differ). A corrupt last file of a
rank (a crash of a writer older than schema 2, or a file cut short since) is skipped with a
warning, also kept in `Run.notes`; a corrupt file before it is refused.

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
import os
import re
import uuid
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

#: The file format's version; `load` refuses a file with a newer one. 2: run_id, the method and
#: the per-micro-batch sums over every token (`MICRO_SUMS`).
SCHEMA_VERSION = 2
FORMAT = "rlgates.capture"

#: The GRPOConfig settings a capture records once (those that decide the loss, its normaliser and
#: how stale ρ can be). A setting the installed TRL lacks is recorded as None.
SETTINGS = ("loss_type", "epsilon", "epsilon_high", "delta", "beta", "importance_sampling_level",
            "num_iterations", "gradient_accumulation_steps", "steps_per_generation",
            "per_device_train_batch_size", "num_generations", "max_completion_length",
            "scale_rewards", "temperature", "top_p", "learning_rate", "top_entropy_quantile",
            "off_policy_mask_threshold", "use_vllm", "vllm_importance_sampling_correction",
            "sapo_temperature_pos", "sapo_temperature_neg", "mask_truncated_completions",
            "entropy_coef", "seed", "top_k", "min_p", "generation_kwargs", "vespo_k_pos",
            "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")

TOKEN_FIELDS = ("logp", "logp_old", "logp_sampler", "logp_ref", "entropy", "advantage", "mask",
                "micro", "row", "position")
#: Per micro-batch, over every loss-masked token (not only the sampled ones): see the docstring
MICRO_SUMS = ("token_loss_sum", "token_loss_abs_sum", "approx_kl_sum", "log_ratio_absmax",
              "sampler_tokens", "mismatch_kl_sum", "mismatch_absmax")
MICRO_FIELDS = ("loss", "tokens", "rows", "length", "num_items_in_batch", *MICRO_SUMS)
SEQUENCE_FIELDS = ("length", "advantage", "prompt", "micro", "row", "token_loss_sum",
                   "token_loss_abs_sum")
_INTEGER_FIELDS = ("micro", "row", "rows", "length", "tokens", "prompt", "sampler_tokens")
_FLOAT64_FIELDS = ("token_loss_sum", "token_loss_abs_sum", "approx_kl_sum", "mismatch_kl_sum")
#: A capture file's name (step, rank), and the temporary name it is written under first
_STEP_FILE = re.compile(r"step_(\d+)\.rank(\d+)\.npz")
_CAPTURE_FILE = re.compile(r"step_\d+\.rank\d+\.npz|\.step_\d+\.rank\d+\.npz\.\d+\.tmp")


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):  # e.g. generation_kwargs (keys may be tuples: written as text)
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def method_record(method, agg=None) -> dict:
    """How a capture's settings name an rlgates method (the `method` setting of a run whose loss
    is rlgates', and `token_loss_method`): {"name": registry name, "hparams": {name: value},
    "agg": the aggregation the trainer applies (None: its own setting, `aggregation`)}."""
    return {"name": method.name, "hparams": {k: _jsonable(v) for k, v in method.hparams.items()},
            "agg": agg}


def _loss_method(trainer):
    """The rlgates method a trainer's loss computes (the drop-in `RlgatesGRPOTrainer.method`), or
    None for a stock trainer."""
    from ..methods import Method

    m = getattr(trainer, "method", None)
    return m if isinstance(m, Method) else None


def trainer_settings(trainer) -> dict:
    """The settings a capture records: `SETTINGS` from `trainer.args`, the aggregation rlgates
    maps TRL's loss_type to, the number of processes and the library versions."""
    import transformers
    import trl

    from ..trainers.trl import TRL_AGG

    args = trainer.args
    out = {k: _jsonable(getattr(args, k, None)) for k in SETTINGS}
    out["trainer"] = "trl"
    out["aggregation"] = TRL_AGG.get(args.loss_type)  # None: a loss_type rlgates does not map
    method = _loss_method(trainer)
    if method is not None:  # the drop-in: its gate is the method's, its normaliser loss_type's
        out["method"] = method_record(method)
    out["num_processes"] = trainer.accelerator.num_processes
    out["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__,
                       "torch": torch.__version__}
    return out


class _StepBuffer:
    """One optimiser step's records: the token reservoir (kept to `capacity` by smallest random
    key) and every micro-batch's and sequence's row."""

    def __init__(self, step, capacity, generator, method=None):
        self.step, self.capacity, self.generator = step, capacity, generator
        self.method = method  # the gate of the token_loss sums (None: NaN)
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
        normaliser, NaN if none) into the micro-batch table with the sums over all its tokens
        (`MICRO_SUMS`); each response's length, mean advantage, prompt key (`prompts`, one per
        row) and token-loss sums into the sequence table."""
        micro = len(self.micro["loss"])
        rows, positions = select.nonzero(as_tuple=True)
        new = {k: v[rows, positions] for k, v in per_token.items()}
        new.update(micro=torch.full_like(rows, micro), row=rows, position=positions)
        self.add_tokens(new)
        mask, adv = per_token["mask"], per_token["advantage"]
        B, T = mask.shape
        lengths = mask.sum(-1)
        sums, row_loss, row_size = _micro_sums(per_token, self.method)
        for k, v in (("loss", float(loss.detach().float())), ("tokens", int(lengths.sum())),
                     ("rows", B), ("length", T), ("num_items_in_batch", num_items),
                     *sums.items()):
            self.micro[k].append(v)
        self.sequences["token_loss_sum"] += row_loss.tolist()
        self.sequences["token_loss_abs_sum"] += row_size.tolist()
        self.sequences["length"] += lengths.tolist()
        self.sequences["advantage"] += ((adv * mask).sum(-1) / lengths.clamp(min=1)).tolist()
        self.sequences["prompt"] += list(prompts)
        self.sequences["micro"] += [micro] * B
        self.sequences["row"] += list(range(B))

    def write(self, path: Path, rank: int, settings: dict) -> Path:
        """The step as one npz file (schema SCHEMA_VERSION) under `path`; returns its name."""
        f = path / f"step_{self.step:08d}.rank{rank}.npz"
        save_step(f, settings, self.step, rank, self.arrays())
        return f

    def arrays(self) -> dict:
        out = {}
        for k in TOKEN_FIELDS:
            v = self.tokens[k].numpy()
            out[f"token/{k}"] = v if v.dtype in (np.bool_, np.int64) else v.astype(np.float32)
        for name, table in (("micro", self.micro), ("sequence", self.sequences)):
            for k, v in table.items():
                dtype = (np.int64 if k in _INTEGER_FIELDS else
                         np.float64 if k in _FLOAT64_FIELDS else np.float32)
                out[f"{name}/{k}"] = np.asarray(v, dtype=dtype)
        return out


def save_step(f: Path, settings: dict, step: int, rank: int, arrays: dict):
    """One step file (schema SCHEMA_VERSION) at `f`, written under a temporary name in the same
    directory and renamed: a file under its final name is always whole."""
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, format=np.asarray(FORMAT),
                                schema_version=np.asarray(SCHEMA_VERSION, dtype=np.int64),
                                settings=np.asarray(json.dumps(settings)),
                                step=np.asarray(step, dtype=np.int64),
                                rank=np.asarray(rank, dtype=np.int64), **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, f)
    finally:
        tmp.unlink(missing_ok=True)


def _token_loss(method, logp, old, adv, mask):
    """Each row's Σ ℓ_t and Σ |ℓ_t| (ℓ = −J, the method's token objective) over its masked
    tokens; NaN without a method, for one that reads side information (its draws cannot be
    repeated here), or where the method refuses the batch: a capture never stops a run."""
    nan = torch.full(mask.shape[:1], float("nan"), dtype=torch.float64)
    if method is None or getattr(method, "side_inputs", ()):
        return nan, nan
    try:
        j = method.token_objective(logp, old, adv, mask).double()
    except Exception:  # noqa: BLE001 - the sums are NaN, the training goes on
        return nan, nan
    return torch.where(mask, -j, 0.0).sum(-1), torch.where(mask, j.abs(), 0.0).sum(-1)


def _micro_sums(per_token, method):
    """({MICRO_SUMS field: value}, each row's Σ ℓ_t, each row's Σ |ℓ_t|) over every
    loss-masked token of one micro-batch, in float64."""
    mask = per_token["mask"].bool()
    logp, old = per_token["logp"].double(), per_token["logp_old"].double()
    lr = torch.where(mask, logp - old, 0.0)
    samp = per_token["logp_sampler"].double()
    have = mask & torch.isfinite(samp)
    d = torch.where(have, old - samp, 0.0)  # log π_old/π_sampler
    row_loss, row_size = _token_loss(method, logp, old, per_token["advantage"].double(), mask)
    sums = {"token_loss_sum": float(row_loss.sum()), "token_loss_abs_sum": float(row_size.sum()),
            "approx_kl_sum": float((lr.exp() - 1 - lr).sum()),
            "log_ratio_absmax": float(lr.abs().max()) if lr.numel() else 0.0,
            "sampler_tokens": int(have.sum()),
            "mismatch_kl_sum": float((d.exp() - 1 - d).sum()),
            "mismatch_absmax": float(d.abs().max()) if have.any() else float("nan")}
    return sums, row_loss, row_size


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

    def _start(self, path, tokens_per_step, seed, rank, settings, overwrite=False, method=None,
               share=False):
        """Claim the directory `path` (see `_claim`), draw the run id (`share`: process 0's, for
        processes that all write into `path`; each calls this at the start), and settle the gate
        of the token-loss sums: `method` (the trainer's rlgates method) or the one the settings
        name (`stats.method_for`)."""
        if tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be ≥ 1, not {tokens_per_step}")
        self.path = Path(path)
        _claim(self.path, overwrite)
        self.tokens_per_step = int(tokens_per_step)
        self.generator = torch.Generator().manual_seed(seed)
        self.rank = rank
        self.settings = dict(settings, tokens_per_step=self.tokens_per_step, capture_seed=seed,
                             run_id=_shared(uuid.uuid4().hex) if share else uuid.uuid4().hex)
        self.method = method if method is not None else _settings_method(self.settings)
        self.settings["token_loss_method"] = (None if self.method is None else
                                              method_record(self.method))
        self.files, self.buffer, self.closed = [], None, False

    def _buffer(self, step) -> _StepBuffer:
        """The buffer of optimiser step `step` (a new one after the last was written)."""
        if self.buffer is None:
            self.buffer = _StepBuffer(step, self.tokens_per_step, self.generator, self.method)
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


def _claim(path: Path, overwrite: bool):
    """Make `path` a capture directory of its own: created if absent; refused if it holds
    anything, unless `overwrite`, which removes its capture files (and nothing else) first."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path}: not a directory (a capture is a directory of step files)")
    path.mkdir(parents=True, exist_ok=True)
    held = list(path.iterdir())
    ours = [f for f in held if f.is_file() and _CAPTURE_FILE.fullmatch(f.name)]
    if held and not overwrite:
        raise ValueError(f"{path}: not empty ({len(held)} entries, {len(ours)} of them capture "
                         "files); a capture directory holds one run: capture into a new "
                         "directory, or pass overwrite=True to replace its capture files")
    for f in ours:
        f.unlink(missing_ok=True)  # another process of the same run may have removed it


def _shared(value):
    """`value` as process 0 has it when several processes run (torch.distributed), else
    `value`: every process must call this at the start."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def _settings_method(settings):
    """The rlgates method the settings name (`stats.method_for`), or None."""
    from .stats import method_for

    try:
        return method_for(settings)[0]
    except Exception:  # noqa: BLE001 - no method: the token-loss sums are NaN, the run goes on
        return None


class Capture(_Recorder):
    """The handle `capture` returns: `close()` (or leaving the `with` block) writes the last
    step and restores the trainer's own methods."""

    nothing = "capture recorded nothing: the trainer's compute_loss never called _compute_loss " \
              "in training"

    def __init__(self, trainer, path, tokens_per_step=4096, seed=0, overwrite=False):
        self.trainer = trainer
        self._start(path, tokens_per_step, seed, trainer.accelerator.process_index,
                    trainer_settings(trainer), overwrite, _loss_method(trainer), share=True)
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


def capture(trainer, path, tokens_per_step=4096, seed=0, overwrite=False) -> Capture:
    """Record what `trainer` (a stock TRL GRPOTrainer) feeds its loss, into the directory `path`
    (see the module docstring for what and how). `tokens_per_step`: the most tokens kept per
    optimiser step; `seed`: the sampler's. `path` must be empty or absent (a ValueError says
    so); `overwrite=True` removes the capture files there first. Returns a handle: `close()`
    it, or use it in `with`."""
    return Capture(trainer, path, tokens_per_step, seed, overwrite)


# --- reading ----------------------------------------------------------------------------------
@dataclass
class Run:
    """A loaded capture: the settings (one dict), and three tables of step-indexed arrays,
    each with a `step` (and `rank`) column beside the fields the module docstring lists.
    `notes`: what the reader should know about the files (an old schema, a skipped file)."""

    settings: dict
    tokens: dict = field(default_factory=dict)
    micro: dict = field(default_factory=dict)
    sequences: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def steps(self):
        return np.unique(self.micro["step"])

    @property
    def run_id(self):
        """The run's id (None: a schema 1 capture has none)."""
        return self.settings.get("run_id")


_UNREADABLE = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError)


class _Corrupt(ValueError):
    """A file that is cut short or damaged (as opposed to a foreign or newer one)."""


def _read(f: Path) -> dict:
    def corrupt(e):
        return _Corrupt(f"{f}: corrupt or unreadable capture file ({type(e).__name__})")

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


def _files(path: Path) -> list[Path]:
    """The step files of a capture directory (or the one file given), in step order."""
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("step_*.npz"))
    if not files:
        # a folder of runs (one capture per subdirectory): name them, so the fix is one word
        runs = sorted(d.name for d in path.iterdir() if d.is_dir() and any(d.glob("step_*.npz")))
        hint = (f"; it holds captures in {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}"
                if runs else "")
        raise ValueError(f"{path}: no capture files (step_*.npz) in this directory{hint}")
    return files


def _last_of_each_rank(files) -> set:
    last = {}
    for f in files:  # in step order: the last one seen per rank is its last step
        m = _STEP_FILE.fullmatch(f.name)
        if m:
            last[m.group(2)] = f
    return set(last.values())


def _read_all(files, notes) -> list:
    """[(file, data)]: every file read; a corrupt last file of a rank (a crash while it was
    written) skipped with a warning and a note, any other corrupt file refused."""
    last = _last_of_each_rank(files) if len(files) > 1 else set()
    parts = []
    for f in files:
        try:
            parts.append((f, _read(f)))
        except _Corrupt as e:
            if f not in last:
                raise
            msg = f"{e}: skipped (the last step of its rank, cut short by a crash?)"
            warnings.warn(msg, stacklevel=3)
            notes.append(msg)
    if not parts:
        raise ValueError(f"{files[0].parent}: every capture file is corrupt or unreadable")
    return parts


def _one_run(parts, notes):
    """Refuse files of two runs: their run ids (or, for files without one, settings) differ."""
    f0, s0 = parts[0][0], parts[0][1]["settings"]
    for f, data in parts[1:]:
        s = data["settings"]
        if s.get("run_id") != s0.get("run_id"):
            raise ValueError(f"{f.name} is from run {s.get('run_id')} but {f0.name} from run "
                             f"{s0.get('run_id')}: a capture directory holds one run")
        diff = sorted(k for k in s0.keys() | s.keys() if s0.get(k) != s.get(k))
        if diff:
            raise ValueError(f"{f.name} and {f0.name} were captured with different settings "
                             f"({diff[0]} {s.get(diff[0])!r} against {s0.get(diff[0])!r}"
                             f"{f', and {len(diff) - 1} more' if len(diff) > 1 else ''}): a "
                             "capture directory holds one run")
    old = min(int(data["schema_version"]) for _, data in parts)
    if old < SCHEMA_VERSION:
        notes.append(f"capture schema {old} (this rlgates writes {SCHEMA_VERSION}): no run id, "
                     "so two runs' files cannot be told apart, and no per-micro-batch sums, so "
                     "micro_normaliser needs every token of a step and mismatch reads the "
                     "captured tokens only")


def load(path) -> Run:
    """Read a capture directory (or one of its step files) into a `Run`. Raises ValueError, one
    line, for a corrupt file, a file that is not a capture, one from a newer schema, or files of
    two runs; skips a corrupt last file of a rank with a warning (see the module docstring)."""
    notes = []
    parts = _read_all(_files(Path(path)), notes)
    _one_run(parts, notes)
    run = Run(settings=parts[0][1]["settings"], notes=notes)
    for table, prefix in ((run.tokens, "token/"), (run.micro, "micro/"),
                          (run.sequences, "sequence/")):
        for _, data in parts:
            names = [k for k in data if k.startswith(prefix)]
            n = len(data[names[0]]) if names else 0
            for k in names:
                table.setdefault(k[len(prefix):], []).append(data[k])
            table.setdefault("step", []).append(np.full(n, int(data["step"]), dtype=np.int64))
            table.setdefault("rank", []).append(np.full(n, int(data["rank"]), dtype=np.int64))
        for k in list(table):
            table[k] = np.concatenate(table[k])
    return run


__all__ = ["FORMAT", "MICRO_SUMS", "SCHEMA_VERSION", "SETTINGS", "Capture", "Run", "capture",
           "load", "method_record", "save_step", "trainer_settings"]
