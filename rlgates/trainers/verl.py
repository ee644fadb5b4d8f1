"""Any rlgates method as a verl policy loss (tested with verl 0.9.1).

    # my_losses.py: a module of yours, importable in every worker
    import rlgates
    from rlgates.trainers import verl as rv
    rv.patch_environment()  # else verl 0.9.1 builds no model next to TRL 1.16
    rv.register(rlgates.get("sapo"), agg="seq-mean-token-mean")  # -> "rlgates_sapo"

    # then run verl with
    #   actor_rollout_ref.model.external_lib=my_losses
    #   actor_rollout_ref.actor.policy_loss.loss_mode=rlgates_sapo

verl stays the engine. `register` puts a function with verl's policy-loss signature
(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
into verl's registry with `register_policy_loss`, under a name of its own (`rlgates_<name>`), so
that it never shadows verl's built-in losses.

Where to register. verl's registry is a dict in each process, and the loss is looked up in the
workers (verl/workers/utils/losses.py `ppo_loss` calls `get_policy_loss_fn(loss_mode)` there): a
`register` call in the Ray driver does not reach them, and an unregistered name raises verl's
"Unsupported loss mode". Put the call in a module and name it with
`actor_rollout_ref.model.external_lib=<module>`: verl imports it in each worker when it builds
the model config (`HFModelConfig.__post_init__` calls `import_external_libs(external_lib)`,
verl/workers/config/model.py). (verl also imports the comma-separated modules of the environment
variable VERL_USE_EXTERNAL_MODULES wherever `verl` itself is imported, if that variable reaches
the workers.) The module must be importable there and in the driver (installed, or on
PYTHONPATH): `check_config` imports it too.

Advantages. verl passes them as [B, T], one per token (its estimators write GRPO's constant
along each row, GAE's varying), and the adapter uses them per token, in its loss and in its
metrics, as verl's own losses do. A [B] tensor (one per row) is taken too, and gives the same
loss as the same A on every token (tests/engines/test_verl_engine.py, with GAE advantages in
verl's actor update).

The aggregation follows verl's `loss_agg_mode` (and so its global batch information: dp_size,
batch_num_tokens, global_batch_size, loss_scale_factor), as verl's own losses do. Under
seq-mean-token-sum-norm without loss_scale_factor that divisor is the width of the tensors the
loss is given: on verl's padding-free batches (the v1 trainer) each micro-batch's longest
response, which the micro-batch split changes (chapter 14 measures it). Pass
`agg=` to `register` to fix one instead (verl's SAPO fixes seq-mean-token-mean, hence the
module above). Without `agg=`, where verl's loss_agg_mode (token-mean unless set) is not the
method's own aggregation (`method.agg`: seq-mean-token-mean for grpo, sapo, gspo, gmpo), the loss
trains under verl's and warns once per loss_mode in each process (`AggregationWarning`): SAPO at
token-mean is neither verl's sapo nor rlgates' SAPO. `agg=` says which you mean and silences it.
The gate comes from the method: verl's clip_ratio*, clip_ratio_c and tau_* are not read.
Rollout correction weights (`rollout_is_weights`, off by default) multiply each token's
objective, as in verl.

Metrics. verl's built-in losses each define actor/pg_clipfrac, actor/pg_clipfrac_lower and
actor/ppo_kl in their own way (`VERL_METRICS`). A method with a built-in of the same family
(`rlgates.trainers.flags(m)["verl"]`: vanilla for ppo/grpo/dapo/dual_clip, gspo, sapo, cispo)
logs under those names exactly what that built-in logs on the same micro-batch, at the method's
own clip settings. A method without one (sao, reinforce, your own) logs nothing under verl's
names. Every method also logs rlgates' own `actor/rlgates_gate_mean` and
`actor/rlgates_gate_zero` (`rlgates.trainers.gate_stats`: over the A ≠ 0 tokens). Nothing is
logged under `entropy`: verl's actor/entropy comes from its trainer's π_old pass, not the loss.

Bypass mode. verl's `algorithm.rollout_correction.bypass_mode=True` does not run your loss as
you configured it. On the legacy trainer (`trainer.use_v1=false`, ray_trainer.py)
`apply_bypass_mode` (verl/trainer/ppo/rollout_corr_helper.py) overwrites
`policy_loss.loss_mode` with "bypass_mode", so an rlgates loss never runs. On the v1 trainer
(verl 0.9.1's default) the loss runs, but with old_log_prob = the rollout's log-probs and without
the rollout correction (IS weights, rejection sampling) that bypass mode's settings ask for.
The loss cannot see this: it receives only the actor's config, and
`algorithm.rollout_correction` is not in it (on the legacy trainer it is not called at all).

The entry point. `check_config(config)` reads verl's full trainer config in the driver, before
verl starts Ray, for what no worker can see. For an rlgates loss_mode it raises ValueError where
the run would not train that loss: bypass mode on; no `actor_rollout_ref.model.external_lib`
(nor VERL_USE_EXTERNAL_MODULES), so the workers stop with "Unsupported loss mode"; a module that
does not import, or does not register that loss_mode (it imports them here, as each worker
will). It warns (AggregationWarning) where loss_agg_mode is not the method's aggregation and
`register` had no `agg=`, and returns the warnings' texts. Around verl's Hydra entry point:

    # train.py: verl's main_ppo with the check first. Run it as verl's:
    #   python train.py actor_rollout_ref.model.external_lib=my_losses ...
    import hydra
    from verl.trainer import main_ppo

    from rlgates.trainers import verl as rv


    @hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer",
                version_base=None)
    def main(config):
        rv.check_config(config)  # raises before Ray starts
        main_ppo.main(config)    # verl's own main: validate_config, then run_ppo


    if __name__ == "__main__":
        main()

Capturing a run for `python -m rlgates inspect`: `rlgates.inspect.capture_verl.capture_workers`,
called in the same module (each actor rank writes a directory of its own).

`patch_environment()` (explicit; importing this module does not call it): verl 0.9.1 imports
TRL's value-head model, which TRL 1.16.0 removed, on every model build; this provides a stand-in
where verl looks, only if TRL lacks it (rlgates.trainers._verl_compat says why and what). Call it
before verl builds its engine, in that process: on Ray, in the external_lib module above (verl
imports it in the worker before the engine is built).
"""

from __future__ import annotations

import os
import warnings

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.utils import torch_functional as verl_F

from .. import _numerics as nx
from .._side import SideInfo
from . import VERL_PREFIX, _detached_inputs, flags, gate_stats, loss
from ._verl_compat import patch_environment

PREFIX = VERL_PREFIX  # the names `register` gives


class AggregationWarning(UserWarning):
    """An rlgates loss registered without `agg=` runs under a verl loss_agg_mode that is not its
    method's own aggregation."""


_WARNED = set()  # the loss_modes that warned in this process


def _agg_note(name, method, mode):
    return (f"{name}: verl's loss_agg_mode={mode!r} is not {method.name}'s own aggregation "
            f"{method.agg!r}, and the loss follows verl's. To train {method.name} as rlgates "
            f"defines it, register it with agg={method.agg!r} (or set "
            f"actor_rollout_ref.actor.loss_agg_mode={method.agg}); to keep verl's, register it "
            f"with agg={mode!r}, which also silences this warning.")


def _mean(x, m):  # verl's own masked_mean: Σ/(n + 1e-8); counts as float32, as verl's .float()
    return verl_F.masked_mean(x, m).item()


def _kl(lr, m):  # the ±20-clamped log-ratio, as vanilla, sapo and cispo log it
    return _mean(-lr.clamp(-nx.LOG_RATIO_CLAMP, nx.LOG_RATIO_CLAMP), m)


def _vanilla(lp, old, a, m, f):  # compute_policy_loss_vanilla (dual-clip with clip_ratio_c)
    lr = nx.gate_log_ratio(lp, old, m)
    r = nx.ratio_from_log(lr)
    l1, l2 = -a * r, -a * r.clamp(1 - f["clip_ratio_low"], 1 + f["clip_ratio_high"])
    lower = (torch.maximum(l1, l2) > -a * f["clip_ratio_c"]) & (a < 0)  # only here: ρ > c, A < 0
    return {"actor/pg_clipfrac": _mean((l2 > l1).float(), m), "actor/ppo_kl": _kl(lr, m),
            "actor/pg_clipfrac_lower": _mean(lower.float(), m)}


def _gspo(lp, old, a, m, f):  # compute_policy_loss_gspo: a token share of the sequence clip
    lr = nx.gate_log_ratio(lp, old, m)
    s = torch.exp(nx.gate_log_ratio(lp, old, m, "sequence").clamp(max=10.0))  # verl: +10 only
    l1, l2 = -a * s, -a * s.clamp(1 - f["clip_ratio_low"], 1 + f["clip_ratio_high"])
    return {"actor/pg_clipfrac": _mean((l2 > l1).float(), m),
            "actor/ppo_kl": _mean(-lr, m),  # verl's gspo does not clamp the log-ratio here
            "actor/pg_clipfrac_lower": 0.0}


def _sapo(lp, old, a, m, f):  # compute_policy_loss_sapo: no clip, so both fractions are 0
    return {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": _kl(nx.gate_log_ratio(lp, old, m), m),
            "actor/pg_clipfrac_lower": 0.0}


def _cispo(lp, old, a, m, f):  # compute_policy_loss_cispo: a clipped weight, either side, any A
    lr = nx.gate_log_ratio(lp, old, m)
    r = nx.ratio_from_log(lr)
    clipped = r != r.clamp(1 - f["clip_ratio_low"], 1 + f["clip_ratio_high"])
    return {"actor/pg_clipfrac": _mean(clipped.float(), m), "actor/ppo_kl": _kl(lr, m),
            "actor/pg_clipfrac_lower": 0.0}


#: verl loss_mode -> (log π, log π_old, A [B, T], bool mask, the method's verl flags) -> the
#: metrics verl's built-in of that name returns (verl 0.9.1, trainer/ppo/core_algos.py).
VERL_METRICS = {"vanilla": _vanilla, "gspo": _gspo, "sapo": _sapo, "cispo": _cispo}


def metrics(method, log_prob, old_log_prob, advantages, response_mask, side=None) -> dict:
    """The adapter's metrics for one micro-batch: verl's names and definitions where `method`
    has a verl built-in of its family, rlgates' gate statistics always (a side-input method's
    at `side`)."""
    with torch.no_grad():
        lp, old, a, m = _detached_inputs(log_prob, old_log_prob, advantages, response_mask)
    out = {f"actor/rlgates_{k}": v for k, v in
           gate_stats(method, log_prob, old_log_prob, advantages, m, side).items()}
    f = flags(method)["verl"]
    if f is None or f["loss_mode"] not in VERL_METRICS:
        return out
    with torch.no_grad():
        return {**VERL_METRICS[f["loss_mode"]](lp, old, a, m, f), **out}


def draw_side(method, log_prob):
    """The side information verl's loss call can give a method that reads some (None for one
    without): a random `draw` per token from torch's global generator, as verl's clip_cov draws
    its torch.randperm. π_old and the covariance the loss derives from the batch itself; an
    entropy or a sampler's log-probs verl's policy-loss call does not pass, so a method that
    reads them raises an error that names the field."""
    if not getattr(method, "side_inputs", ()):
        return None
    return SideInfo(draw=torch.rand(log_prob.shape, device=log_prob.device))


def policy_loss(method, agg=None):
    """A function with verl's policy-loss signature that computes `method`'s loss."""

    def fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
           config=None, rollout_is_weights=None):
        if agg is None and loss_agg_mode != method.agg and fn.__name__ not in _WARNED:
            _WARNED.add(fn.__name__)
            warnings.warn(_agg_note(fn.__name__, method, loss_agg_mode), AggregationWarning,
                          stacklevel=2)
        info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
        dp = info.get("dp_size") or 1
        mode = agg or loss_agg_mode
        response_mask = nx.check_mask(response_mask, log_prob.shape, log_prob.device)  # once
        norm = length = None
        if mode == "token-sum":  # Σ·dp_size
            mode, norm = "token-mean", 1.0 / dp
        else:  # verl's global count: tokens for token-mean, sequences for the seq-mean modes
            key = "batch_num_tokens" if mode == "token-mean" else "global_batch_size"
            n = info.get(key)
            if n is None and dp > 1:
                raise ValueError(f"(global) {key} is required when dp_size > 1")
            norm = None if n is None else torch.as_tensor(n, dtype=torch.float64) / dp
            if mode == "seq-mean-token-sum-norm":
                length = info.get("loss_scale_factor")
        side = draw_side(method, log_prob)
        out = loss(method, log_prob, old_log_prob, advantages, response_mask, mode,
                   norm=norm, length=length, is_weight=rollout_is_weights, side=side)
        return out.to(log_prob.dtype), metrics(method, log_prob, old_log_prob, advantages,
                                               response_mask, side)

    fn.__name__ = f"{PREFIX}{method.name}"
    fn.__doc__ = f"rlgates' {method!r} under verl's policy-loss signature."
    fn.rlgates_method, fn.rlgates_agg = method, agg  # what check_config reads
    return fn


def register(method, name=None, agg=None) -> str:
    """Register `method` in verl's policy-loss registry; return the loss_mode name to use."""
    name = name or f"{PREFIX}{method.name}"
    if not name.startswith(PREFIX):
        raise ValueError(f"use a name of rlgates' own (starting {PREFIX!r}), got {name!r}")
    fn = policy_loss(method, agg=agg)
    fn.__name__ = name  # the loss_mode its warning names
    register_policy_loss(name)(fn)
    return name


def _get(cfg, path):
    for key in path.split("."):
        if cfg is None:
            return None
        cfg = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return cfg


def _modules(config):
    """The modules verl imports in each worker: external_lib, then VERL_USE_EXTERNAL_MODULES."""
    libs = _get(config, "actor_rollout_ref.model.external_lib")
    libs = [] if not libs else [str(libs)] if isinstance(libs, str) else [str(m) for m in libs]
    return libs + [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]


def check_config(config) -> list:
    """Check verl's full trainer `config` (a DictConfig or a dict) for an rlgates loss_mode, in
    the driver before verl starts (see the module docstring). Raises ValueError where the run
    would not train that loss: rollout_correction.bypass_mode on; no external_lib (nor
    VERL_USE_EXTERNAL_MODULES) to register it in the workers; a module that does not import or
    does not register the loss_mode (imported here, as each worker imports it). Warns
    (AggregationWarning) where loss_agg_mode is not the method's aggregation and `register` had
    no `agg=`. Returns the warnings' texts ([] when there are none, and for verl's own losses)."""
    mode = str(_get(config, "actor_rollout_ref.actor.policy_loss.loss_mode") or "")
    if not mode.startswith(PREFIX):
        return []
    if _get(config, "algorithm.rollout_correction.bypass_mode"):
        raise ValueError(
            f"loss_mode={mode!r} with algorithm.rollout_correction.bypass_mode=True: verl's "
            "legacy trainer replaces the loss with its 'bypass_mode' loss, and the v1 trainer "
            "runs it against the rollout's log-probs without the rollout correction you set. "
            "Set bypass_mode=False to train with the rlgates loss.")
    modules = _modules(config)
    if not modules:
        raise ValueError(
            f"loss_mode={mode!r}, but no module registers it in verl's workers: verl looks the "
            "loss up in each worker, which a register call in the driver does not reach, and the "
            "workers would stop with 'Unsupported loss mode'. Name the module that calls "
            "rlgates.trainers.verl.register in actor_rollout_ref.model.external_lib=<module> "
            "(or in the environment variable VERL_USE_EXTERNAL_MODULES, if it reaches them).")
    from verl.utils.import_utils import import_external_libs

    try:
        import_external_libs(modules)
    except ImportError as e:
        raise ValueError(f"loss_mode={mode!r}: cannot import {modules} ({e}); each worker "
                         "imports them the same way, so make them importable (installed, or "
                         "on PYTHONPATH).") from e
    fn = POLICY_LOSS_REGISTRY.get(mode)
    if fn is None:
        ours = sorted(k for k in POLICY_LOSS_REGISTRY if k.startswith(PREFIX))
        raise ValueError(f"loss_mode={mode!r} is not registered by {modules}; the rlgates "
                         f"losses registered are {ours}.")
    method = getattr(fn, "rlgates_method", None)
    agg_mode = str(_get(config, "actor_rollout_ref.actor.loss_agg_mode") or "token-mean")
    notes = []
    if method is not None and fn.rlgates_agg is None and agg_mode != method.agg:
        notes.append(_agg_note(mode, method, agg_mode))
        warnings.warn(notes[-1], AggregationWarning, stacklevel=2)
    return notes


__all__ = ["POLICY_LOSS_REGISTRY", "PREFIX", "VERL_METRICS", "AggregationWarning",
           "check_config", "metrics", "patch_environment", "policy_loss", "register"]
