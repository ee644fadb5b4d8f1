"""GSPO's measurement of routing drift on the lab (chapter 20): how many experts change after
each update of a rollout. It lives in the lab (it trains), so `rlgates.moe` never imports the
lab and the lab imports `moe` one way."""

from __future__ import annotations

import torch

from ..moe import changed_experts, tokens_rerouted
from .loop import train


def drift_after_updates(config, seeds=range(10), steps=None, method="ppo"):
    """GSPO's measurement on the lab: train `method` (one arm, every seed batched) and, after
    each optimiser step, route the step's whole rollout batch again with the updated policy.

    Returns (changed, rerouted), each [runs, steps, updates per step] float64: after j updates
    (j = 1 … minibatches·epochs) on a rollout, the share of the activated experts that differ
    from π_old's (the trainer's policy when the step began) for the same tokens
    (`changed_experts`), and the share of tokens rerouted in at least one layer
    (`tokens_rerouted`), real tokens only. Needs `config.moe`; its engine and replay are used
    as set (replay changes what the updates see, not what is measured here).
    """
    if config.moe is None:
        raise ValueError("drift_after_updates needs a LabConfig with moe=MoEConfig(...)")
    task, seen, rows = config.task(), {}, []

    def runs_dim(t):
        return t[None] if t.dim() == 2 else t

    def hook(event, info):
        pol = info["policy"]
        if event == "rollout":
            seen.update(prompts=runs_dim(info["prompts"]), tokens=runs_dim(info["tokens"]))
            seen["mask"] = task.mask(seen["tokens"])
            seen["old"] = pol.routing(seen["prompts"], seen["tokens"])
            rows.append([])
            return
        now = pol.routing(seen["prompts"], seen["tokens"])
        rows[-1].append((changed_experts(now, seen["old"], seen["mask"]),
                         tokens_rerouted(now, seen["old"], seen["mask"])))

    train(method, config, seeds, steps, progress=False, hook=hook)
    changed = torch.stack([torch.stack([c for c, _ in r], 1) for r in rows], 1)
    rerouted = torch.stack([torch.stack([t for _, t in r], 1) for r in rows], 1)
    return changed.cpu(), rerouted.cpu()


__all__ = ["drift_after_updates"]
