"""Capture what verl 0.9.1's actor update feeds its loss, into the file format of
`rlgates.inspect.capture` (schema 1), for `python -m rlgates inspect`.

    from rlgates.inspect.capture_verl import capture_verl
    handle = capture_verl(worker, actor_config, "run.capture")   # worker: a TrainingWorker
    worker.train_mini_batch(batch)                                # as many as you like
    handle.close()

Why this hook. verl's actor worker computes its loss with the function it was given by
`TrainingWorker.set_loss_fn(loss_fn)`: by default `partial(ppo_loss, config=actor_config)`
(verl/workers/engine_workers.py). The engine calls it once per micro-batch as
`loss_fn(model_output=..., data=micro_batch, dp_group=...)`, where `data` is the whole micro-batch
(every field of the rollout, "rollout_log_probs" included when the rollout returned them) and
`model_output` holds the engine's log-probs and, when `calculate_entropy` is set, its entropies.
A wrapper of a *registered policy loss* (`core_algos.register_policy_loss`) sees neither: ppo_loss
hands it log π, log π_old, A, the mask, the aggregation, the config (with the global batch
counts) and only the importance weights derived from the rollout log-probs. So `capture_verl`
installs, through `set_loss_fn`, a wrapper of `ppo_loss` itself (or of the loss you pass), and
wraps the engine's `optimizer_step` to know where an optimiser step ends. Everything is read
detached, after the loss returns; the loss and its gradient are unchanged.

What it records per optimiser step: the tokens as in `rlgates.inspect.capture` (log π, log π_old,
`logp_sampler` = the rollout's "rollout_log_probs" where the batch holds them, `logp_ref` =
"ref_log_prob", the entropy where the engine computed it, A, the mask; reservoir-sampled);
per micro-batch the returned loss, its token count, rows, padded length, and verl's global
token count `batch_num_tokens` in `num_items_in_batch`; per response its length, mean A and
a CRC-32 of its prompt tokens when the batch holds "prompts". Settings: the actor config's
loss_mode, clip ratios (low, high, c), loss_agg_mode, ppo_epochs, the mini- and micro-batch
sizes, entropy_coeff, and `trainer = "verl"`.

What a verl capture lacks, against TRL's: the entropy unless `calculate_entropy` is set on the
batch (verl's trainer sets it only where entropy enters the loss or the metrics); the sampler's
log-probs unless the rollout returned them; and, under dynamic batch sizes or sequence
packing (use_remove_padding), each response's row within its micro-batch is the engine's
order after its own rebalancing.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from .capture import _Recorder

#: The actor-config fields a verl capture records (None where the installed verl lacks one)
VERL_SETTINGS = ("loss_agg_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high",
                 "clip_ratio_c", "ppo_epochs", "ppo_mini_batch_size",
                 "ppo_micro_batch_size_per_gpu", "entropy_coeff", "use_kl_loss",
                 "use_dynamic_bsz", "loss_scale_factor")


def verl_settings(config) -> dict:
    import verl

    def plain(v):
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

    out = {k: plain(getattr(config, k, None)) for k in VERL_SETTINGS}
    policy = getattr(config, "policy_loss", None) or {}
    out["loss_mode"] = plain(policy.get("loss_mode", "vanilla"))
    out["trainer"] = "verl"
    out["aggregation"] = out["loss_agg_mode"]
    out["num_iterations"] = out["ppo_epochs"]
    out["versions"] = {"verl": verl.__version__, "torch": torch.__version__}
    return out


class VerlCapture(_Recorder):
    """The handle `capture_verl` returns; `close()` writes the last step and restores the
    worker's loss and optimiser step."""

    nothing = "capture_verl recorded nothing: the worker's loss was never called"

    def __init__(self, worker, config, path, tokens_per_step=4096, seed=0, loss_fn=None,
                 rank=None):
        from verl.workers.utils.losses import ppo_loss

        self.worker, self.config = worker, config
        self._start(path, tokens_per_step, seed,
                    torch.distributed.get_rank() if rank is None and
                    torch.distributed.is_initialized() else int(rank or 0),
                    verl_settings(config))
        optimizer = getattr(worker.engine, "optimizer", None)
        if optimizer is not None and optimizer.param_groups:
            self.settings["learning_rate"] = float(optimizer.param_groups[0]["lr"])
        self.inner = loss_fn or (lambda model_output, data, dp_group=None:
                                 ppo_loss(config, model_output, data, dp_group))
        self.own_loss = getattr(worker, "loss_fn", None)
        self.step = 0
        engine = worker.engine
        self._had_step = "optimizer_step" in engine.__dict__
        self._step_fn = engine.optimizer_step

        def optimizer_step(*a, **k):
            out = self._step_fn(*a, **k)
            if self.buffer is not None:
                self._write()
            self.step += 1
            return out

        engine.optimizer_step = optimizer_step
        worker.set_loss_fn(self._loss)

    def _loss(self, model_output, data, dp_group=None):
        loss, metrics = self.inner(model_output=model_output, data=data, dp_group=dp_group)
        with torch.no_grad():
            self._record(model_output, data, loss)
        return loss, metrics

    def _record(self, model_output, data, loss):
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        logp = no_padding_2_padding(model_output["log_probs"], data).detach().float().cpu()
        ent = model_output.get("entropy", None)
        ent = None if ent is None else no_padding_2_padding(ent, data).detach().float().cpu()
        fields = ["response_mask", "old_log_probs", "advantages"]
        fields += [k for k in ("rollout_log_probs", "ref_log_prob", "prompts") if k in data]
        d = data.select(*fields).to_padded_tensor()
        mask = d["response_mask"].bool().cpu()
        B, T = mask.shape
        logp = logp[:, :T]
        nan = torch.full((B, T), float("nan"))

        def opt(x):
            return nan if x is None else x.detach().float().cpu()[:, :T]

        adv = d["advantages"].detach().float().cpu()
        adv = (adv[:, None] if adv.dim() == 1 else adv).expand(B, T)
        per_token = {"logp": logp, "logp_old": opt(d["old_log_probs"]), "advantage": adv,
                     "logp_sampler": opt(d.get("rollout_log_probs", None)),
                     "logp_ref": opt(d.get("ref_log_prob", None)),
                     "entropy": nan if ent is None else ent[:, :T], "mask": mask}
        total = tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None)
        if "prompts" in d.keys():
            p = d["prompts"].detach().cpu().numpy().astype(np.int64)
            prompts = [zlib.crc32(r.tobytes()) for r in p]
        else:
            prompts = [0] * B
        self._buffer(self.step).add_micro_batch(
            per_token, mask, loss, float("nan") if total is None else float(total), prompts)

    def _restore(self):
        """The worker's own loss and optimiser step back."""
        engine = self.worker.engine
        if self._had_step:
            engine.optimizer_step = self._step_fn
        else:
            del engine.optimizer_step
        if self.own_loss is not None:
            self.worker.set_loss_fn(self.own_loss)


def capture_verl(worker, config, path, tokens_per_step=4096, seed=0, loss_fn=None):
    """Record what verl's actor update feeds `ppo_loss(config, ...)` (or `loss_fn`, called as
    verl calls a loss function) into the directory `path`. worker: a verl TrainingWorker
    (anything with `set_loss_fn` and `engine.optimizer_step`). Returns the handle."""
    return VerlCapture(worker, config, path, tokens_per_step, seed, loss_fn)


__all__ = ["VERL_SETTINGS", "VerlCapture", "capture_verl", "verl_settings"]
