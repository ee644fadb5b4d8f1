"""Any rlgates method as a verl policy loss (tested with verl 0.9.1).

    from rlgates.trainers import verl as rv
    rv.register(rlgates.get("sapo"))          # -> "rlgates_sapo"
    # then run verl with actor_rollout_ref.actor.policy_loss.loss_mode=rlgates_sapo

verl stays the engine. `register` puts a function with verl's policy-loss signature
(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
into verl's registry with `register_policy_loss`, under a name of its own (`rlgates_<name>`), so
that it never shadows verl's built-in losses. Call it in the process that builds the actor: on
Ray, in code the worker imports (for example the module that defines your reward).

The aggregation follows verl's `loss_agg_mode` (and so its global batch information: dp_size,
batch_num_tokens, global_batch_size, loss_scale_factor), as verl's own losses do; pass
`agg=` to `register` to fix one instead (verl's SAPO fixes seq-mean-token-mean). The gate comes
from the method: verl's clip_ratio*, clip_ratio_c and tau_* are not read. Rollout correction
weights (`rollout_is_weights`, off by default) multiply each token's objective, as in verl.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

from .. import _numerics as nx
from . import gate_stats, loss

PREFIX = "rlgates_"


def policy_loss(method, agg=None):
    """A function with verl's policy-loss signature that computes `method`'s loss."""

    def fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
           config=None, rollout_is_weights=None):
        info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
        dp = info.get("dp_size") or 1
        mode = agg or loss_agg_mode
        norm = length = None
        if mode == "token-sum":  # Σ·dp_size
            mode, norm = "token-mean", 1.0 / dp
        elif mode == "token-mean":
            n = info.get("batch_num_tokens")
            if n is None and dp > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            norm = None if n is None else torch.as_tensor(n, dtype=torch.float64) / dp
        else:
            n = info.get("global_batch_size")
            if n is None and dp > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            norm = None if n is None else torch.as_tensor(n, dtype=torch.float64) / dp
            if mode == "seq-mean-token-sum-norm":
                length = info.get("loss_scale_factor")
        out = loss(method, log_prob, old_log_prob, advantages, response_mask, mode,
                   norm=norm, length=length, is_weight=rollout_is_weights)
        stats = gate_stats(method, log_prob, old_log_prob, advantages, response_mask)
        m = nx.check_mask(response_mask, log_prob.shape, log_prob.device)
        kl = -((log_prob - old_log_prob).detach() * m).sum() / m.sum().clamp(min=1)
        metrics = {
            "actor/pg_clipfrac": stats["gate_zero"],
            "actor/ppo_kl": kl.item(),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/rlgates_gate_mean": stats["gate_mean"],
        }
        return out.to(log_prob.dtype), metrics

    fn.__name__ = f"{PREFIX}{method.name}"
    fn.__doc__ = f"rlgates' {method!r} under verl's policy-loss signature."
    return fn


def register(method, name=None, agg=None) -> str:
    """Register `method` in verl's policy-loss registry; return the loss_mode name to use."""
    name = name or f"{PREFIX}{method.name}"
    if not name.startswith(PREFIX):
        raise ValueError(f"use a name of rlgates' own (starting {PREFIX!r}), got {name!r}")
    register_policy_loss(name)(policy_loss(method, agg=agg))
    return name


__all__ = ["POLICY_LOSS_REGISTRY", "PREFIX", "policy_loss", "register"]
