"""A synthetic capture in the file format of `rlgates.inspect.capture` (schema 2), with no trainer:
for tests of the reader and the report, and to time `inspect` on a large capture.

    synthetic.write(path, steps=10, rows=64, length=32)   # a healthy-looking DAPO run

Per step: `rows` responses of up to `length` tokens in `micro` micro-batches, groups of
`group` responses with A = the group-normalised reward, log π_old ~ −Exp(1), log ρ ~ N(0, σ²)
with σ = `log_ratio_sd` on the steps after the first of each batch (num_iterations = 2), and a
loss per micro-batch that is exactly DAPO's token sum over the step's token count
(`normaliser="step"`) or over the micro-batch's own count (`"micro-batch"`). The per-micro-batch
sums over every token (`capture.MICRO_SUMS`) are written as a capture writes them;
`schema_version=1` writes a capture as rlgates wrote them before (no run id, no sums).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import torch

from .. import get
from .capture import _FLOAT64_FIELDS, FORMAT, MICRO_SUMS, SCHEMA_VERSION, method_record

SETTINGS = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "delta": None,
            "beta": 0.0, "importance_sampling_level": "token", "num_iterations": 2,
            "gradient_accumulation_steps": 2, "steps_per_generation": 2,
            "per_device_train_batch_size": 8, "num_generations": 4,
            "max_completion_length": 32, "scale_rewards": "group", "temperature": 1.0,
            "top_p": 1.0, "learning_rate": 1e-6, "aggregation": "token-mean",
            "num_processes": 1, "synthetic": True}


def write(path, steps=10, rows=64, length=32, micro=2, group=4, log_ratio_sd=0.02, seed=0,
          normaliser="step", tokens_per_step=None, schema_version=SCHEMA_VERSION) -> Path:
    """Write the capture into directory `path` (see the module docstring); returns the path."""
    if normaliser not in ("step", "micro-batch"):
        raise ValueError(f"normaliser must be 'step' or 'micro-batch', not {normaliser!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    method = get("dapo")
    settings = dict(SETTINGS, max_completion_length=length,
                    tokens_per_step=tokens_per_step or rows * length, capture_seed=seed)
    if schema_version >= 2:
        settings.update(run_id=uuid.uuid4().hex, token_loss_method=method_record(method))
    for step in range(steps):
        arrays = _step_arrays(rng, method, step, rows, length, micro, group, log_ratio_sd,
                              normaliser, tokens_per_step, schema_version)
        np.savez_compressed(path / f"step_{step:08d}.rank0.npz", format=np.asarray(FORMAT),
                            schema_version=np.asarray(schema_version, dtype=np.int64),
                            settings=np.asarray(json.dumps(settings)),
                            step=np.asarray(step, dtype=np.int64),
                            rank=np.asarray(0, dtype=np.int64), **arrays)
    return path


def _step_arrays(rng, method, step, rows, length, micro, group, log_ratio_sd, normaliser,
                 tokens_per_step, schema_version) -> dict:
    """One step's arrays, as a capture writes them (their dtypes included)."""
    per_micro = rows // micro
    lengths = rng.integers(1, length + 1, rows)
    reward = rng.random(rows).reshape(-1, group)
    adv = ((reward - reward.mean(1, keepdims=True))
           / (reward.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
    mask = np.arange(length)[None] < lengths[:, None]
    old = -rng.exponential(1.0, (rows, length))
    sd = log_ratio_sd if step % 2 else 0.0
    logp = old + rng.normal(0, 1, (rows, length)) * sd
    entropy = rng.uniform(0.5, 1.5, (rows, length))
    j = method.token_objective(torch.from_numpy(logp), torch.from_numpy(old),
                               torch.from_numpy(adv)[:, None].expand(rows, length),
                               torch.from_numpy(mask)).numpy()
    micro_of_row = np.arange(rows) // per_micro
    counts = np.array([mask[micro_of_row == k].sum() for k in range(micro)])
    sums = np.array([-(j * mask)[micro_of_row == k].sum() for k in range(micro)])
    row_loss, row_size = -(j * mask).sum(1), (np.abs(j) * mask).sum(1)
    lr = np.where(mask, logp - old, 0.0)
    k3 = np.exp(lr) - 1 - lr
    losses = sums / (counts if normaliser == "micro-batch" else counts.sum())
    r, p = np.nonzero(mask)
    keep = np.arange(len(r))
    if tokens_per_step and len(r) > tokens_per_step:
        keep = np.sort(rng.choice(len(r), tokens_per_step, replace=False))
    r, p = r[keep], p[keep]
    prompt = np.repeat(rng.integers(0, 2**31, rows // group), group)
    arrays = {
        "token/logp": logp[r, p], "token/logp_old": old[r, p],
        "token/logp_sampler": np.full(len(r), np.nan), "token/logp_ref": np.full(len(r), np.nan),
        "token/entropy": entropy[r, p], "token/advantage": adv[r],
        "token/mask": np.ones(len(r), bool), "token/micro": micro_of_row[r],
        "token/row": r % per_micro, "token/position": p,
        "micro/loss": losses, "micro/tokens": counts, "micro/rows": np.full(micro, per_micro),
        "micro/length": np.full(micro, length),
        "micro/num_items_in_batch": np.full(micro, float(counts.sum())),
        "sequence/length": lengths, "sequence/advantage": adv, "sequence/prompt": prompt,
        "sequence/micro": micro_of_row, "sequence/row": np.arange(rows) % per_micro}
    if schema_version >= 2:
        per = [micro_of_row == k for k in range(micro)]
        arrays.update({
            "micro/token_loss_sum": sums,
            "micro/token_loss_abs_sum": np.array([row_size[m].sum() for m in per]),
            "micro/approx_kl_sum": np.array([k3[m].sum() for m in per]),
            "micro/log_ratio_absmax": np.array([np.abs(lr[m]).max() for m in per]),
            "micro/sampler_tokens": np.zeros(micro, np.int64),
            "micro/mismatch_kl_sum": np.zeros(micro),
            "micro/mismatch_absmax": np.full(micro, np.nan),
            "sequence/token_loss_sum": row_loss, "sequence/token_loss_abs_sum": row_size})
        assert {f"micro/{k}" for k in MICRO_SUMS} <= set(arrays)
    return {k: _as_captured(k, v) for k, v in arrays.items()}


def _as_captured(key, v):
    """An array in the dtype a capture writes: the sums float64, other floats float32, every
    other non-bool int64."""
    if key.split("/")[1] in _FLOAT64_FIELDS:
        return v
    if v.dtype == np.float64:
        return v.astype(np.float32)
    return v if v.dtype == bool else v.astype(np.int64)
