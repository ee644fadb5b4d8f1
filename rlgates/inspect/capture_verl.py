"""Capture what verl 0.9.1's actor update feeds its loss, into the file format of
`rlgates.inspect.capture` (its schema), for `python -m rlgates inspect`.

    # in a verl run: add to the module named by actor_rollout_ref.model.external_lib
    from rlgates.inspect.capture_verl import capture_workers
    capture_workers("sapo.capture")  # each actor rank writes sapo.capture/rank<r>/

    # on a TrainingWorker of your own
    from rlgates.inspect.capture_verl import capture_verl
    handle = capture_verl(worker, actor_config, "run.capture")   # worker: a TrainingWorker
    worker.train_mini_batch(batch)                                # as many as you like
    handle.close()

In a verl run. The actor's TrainingWorker lives inside a Ray worker process, where no script of
yours runs but the module named by `actor_rollout_ref.model.external_lib`: verl imports it in each
worker as it builds the model config (`ActorRolloutRefWorker.init_model`), before it builds the
actor and hands it its loss with `self.actor.set_loss_fn(partial(ppo_loss, config=actor_config))`
(verl 0.9.1 verl/workers/engine_workers.py). `capture_workers(path)` in that module wraps
`TrainingWorker.set_loss_fn` in that process (`functools.wraps`, so verl's dispatch still finds
it): the first actor loss set on a worker (`ppo_loss` or `distillation_ppo_loss`, the actor config
read from it; a critic's `value_loss` is left alone) opens `capture_verl(worker, actor_config,
path/rank<r>)`, r being the worker's torch.distributed rank, so that every rank writes a directory
of its own; a later actor loss (the driver's `set_loss_fn`) is wrapped in turn. The handle is
`worker.rlgates_capture`, and `atexit` closes it. Every optimiser step's file is written as the
step ends, so a worker killed without running atexit loses at most the step it was in. Give `path`
on storage every node can write; a relative one is resolved in each worker's working directory.
Read each rank with `python -m rlgates inspect path/rank0`.

What needs CUDA. verl's TrainingWorker runs on CUDA (or Ascend NPU) only: it starts its process
group as "cpu:gloo,<device>:nccl" (verl/utils/distributed.py), its FSDP engines are registered
for cuda and npu (verl/workers/engine/fsdp/transformer_impl.py), and on a CPU it stops with
"Distributed package doesn't have NCCL built in". So a real capture, through Ray and
`capture_workers`, needs GPUs. The CPU path is a test helper, not part of rlgates:
tests/verl_cpu.py (a CPU platform, a gloo group started first, stubs for verl's memory queries)
lets the project's tests run the same `TrainingWorker.train_mini_batch` on a CPU, in one process
or two (tests/engines/verl_runs.py shows the batch layout verl's trainer hands the actor), and
tests/engines/verl_recipe_run.py runs chapter 14's module and `capture_workers` there.

Why this hook. verl's actor worker computes its loss with the function it was given by
`TrainingWorker.set_loss_fn(loss_fn)`: by default `partial(ppo_loss, config=actor_config)`
(verl/workers/engine_workers.py). The engine calls it once per micro-batch as
`loss_fn(model_output=..., data=micro_batch, dp_group=...)`, where `data` is the whole micro-batch
(every field of the rollout, "rollout_log_probs" included when the rollout returned them) and
`model_output` holds the engine's log-probs and, when `calculate_entropy` is set, its entropies.
A wrapper of a *registered policy loss* (`core_algos.register_policy_loss`) sees neither: ppo_loss
hands it log π, log π_old, A, the mask, the aggregation, the config (with the global batch
counts) and only the importance weights derived from the rollout log-probs. So `capture_verl`
installs, through `set_loss_fn`, a wrapper of the loss the worker already has (`worker.loss_fn`:
verl's actor sets `partial(ppo_loss, config=actor_config)`, or `distillation_ppo_loss`), of the
loss you pass (`loss_fn`), or, on a worker with none, of `ppo_loss(config)`; and it wraps the
engine's `optimizer_step` to know where an optimiser step ends. Everything is read
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

import atexit
import functools
import zlib
from pathlib import Path

import numpy as np
import torch

from .capture import _Recorder

#: The actor-config fields a verl capture records (None where the installed verl lacks one)
VERL_SETTINGS = ("loss_agg_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high",
                 "clip_ratio_c", "ppo_epochs", "ppo_mini_batch_size",
                 "ppo_micro_batch_size_per_gpu", "entropy_coeff", "use_kl_loss",
                 "use_dynamic_bsz", "loss_scale_factor", "tau_pos", "tau_neg")


def _registered_method(mode):
    """(method, agg) of the rlgates loss registered in verl under `mode`
    (`rlgates.trainers.verl.register`, whose function holds its method and aggregation), or
    None for any other loss."""
    import inspect

    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from ..methods import Method

    fn = POLICY_LOSS_REGISTRY.get(mode)
    found = getattr(fn, "rlgates_method", None), getattr(fn, "rlgates_agg", None)
    if found[0] is None and inspect.isfunction(fn):
        free = inspect.getclosurevars(fn).nonlocals
        found = free.get("method"), free.get("agg")
    return found if isinstance(found[0], Method) else None


def verl_settings(config) -> dict:
    """The settings a verl capture records: `VERL_SETTINGS` of the actor config, its policy-loss
    fields (loss_mode, and the others as "policy_loss.<field>"), and for an rlgates loss
    (loss_mode rlgates_<name>) the method, its hyperparameters and aggregation ("method",
    `capture.method_record`)."""
    import verl

    from ..trainers.conformance_verl import POLICY_LOSS_KEYS
    from .capture import method_record

    def plain(v):
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

    out = {k: plain(getattr(config, k, None)) for k in VERL_SETTINGS}
    policy = getattr(config, "policy_loss", None) or {}
    out["loss_mode"] = plain(policy.get("loss_mode", "vanilla"))
    for k in POLICY_LOSS_KEYS:
        if k != "loss_mode":
            out[f"policy_loss.{k}"] = plain(policy.get(k, None))
    out["trainer"] = "verl"
    out["aggregation"] = out["loss_agg_mode"]
    found = _registered_method(out["loss_mode"])
    if found is not None:
        out["method"] = method_record(found[0], found[1])
        out["aggregation"] = found[1] or out["loss_agg_mode"]
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
        self.own_loss = getattr(worker, "loss_fn", None)
        # the loss the worker trains with: a capture never swaps it for a fresh ppo_loss
        self.inner = loss_fn or self.own_loss or (
            lambda model_output, data, dp_group=None: ppo_loss(config, model_output, data,
                                                                dp_group))
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
    """Record what verl's actor update feeds its loss into the directory `path`: `loss_fn` if
    given (called as verl calls a loss function), else the worker's own (`worker.loss_fn`), else
    `ppo_loss(config, ...)`. worker: a verl TrainingWorker (anything with `set_loss_fn` and
    `engine.optimizer_step`); config: its actor config (recorded as the settings). Returns the
    handle."""
    return VerlCapture(worker, config, path, tokens_per_step, seed, loss_fn)


#: capture_workers' settings in this process (the latest call's)
_WORKERS = {}
HANDLE_ATTR = "rlgates_capture"  # the worker attribute that holds its handle


def _actor_config(loss_fn):
    """The actor config of verl's actor loss `partial(ppo_loss | distillation_ppo_loss,
    config=...)`, as ActorRolloutRefWorker.init_model sets it; None for any other loss."""
    from verl.workers.utils.losses import ppo_loss

    losses = [ppo_loss]
    try:
        from verl.trainer.distillation import distillation_ppo_loss
        losses.append(distillation_ppo_loss)
    except ImportError:  # a verl without distillation
        pass
    if isinstance(loss_fn, functools.partial) and loss_fn.func in losses:
        return loss_fn.keywords.get("config")
    return None


def _hook(original):
    @functools.wraps(original)  # keeps verl's @register attributes: its dispatch finds it
    def set_loss_fn(self, loss_fn):
        handle = self.__dict__.get(HANDLE_ATTR)
        if handle is None:
            original(self, loss_fn)
            config = _actor_config(loss_fn)
            if config is not None:
                import torch.distributed as dist

                rank = dist.get_rank() if dist.is_initialized() else 0
                handle = VerlCapture(self, config, Path(_WORKERS["path"]) / f"rank{rank}",
                                     _WORKERS["tokens_per_step"], _WORKERS["seed"], rank=rank)
                setattr(self, HANDLE_ATTR, handle)
                atexit.register(handle.close)
            return
        if not handle.closed and loss_fn != handle._loss:  # a new loss: capture it in turn
            handle.inner = handle.own_loss = loss_fn
            loss_fn = handle._loss
        original(self, loss_fn)

    set_loss_fn.rlgates_original = original
    return set_loss_fn


def capture_workers(path, tokens_per_step=4096, seed=0) -> None:
    """Capture every verl actor that this process builds from now on, each rank into
    `path`/rank<r>/, closed at exit (see "In a verl run" above). Call it in the module named by
    `actor_rollout_ref.model.external_lib`. Calling it again changes the settings, not the
    hook."""
    from verl.workers.engine_workers import TrainingWorker

    _WORKERS.update(path=str(path), tokens_per_step=tokens_per_step, seed=seed)
    if not hasattr(TrainingWorker.set_loss_fn, "rlgates_original"):
        TrainingWorker.set_loss_fn = _hook(TrainingWorker.set_loss_fn)


__all__ = ["VERL_SETTINGS", "VerlCapture", "capture_verl", "capture_workers", "verl_settings"]
