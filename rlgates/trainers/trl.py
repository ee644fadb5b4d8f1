"""Any rlgates method as the policy loss of TRL's `GRPOTrainer` (tested with TRL 1.16.0).

    from rlgates.trainers.trl import RlgatesGRPOTrainer
    trainer = RlgatesGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(
        loss_type="grpo", num_iterations=2, ...), train_dataset=..., method=rlgates.get("sapo"))
    trainer.train()        # logs rlgates/gate_mean and rlgates/gate_zero beside TRL's metrics

TRL stays the engine: it samples, scores, computes the advantages and the old log-probs, splits
the batch and steps the optimiser. The subclass overrides the one public hook for this,
`compute_loss`: it asks TRL for the current log-probs (the trainer's own helper), takes the old
ones and the advantages TRL stored in `inputs`, and returns the rlgates method's loss under the
normaliser TRL's `loss_type` prescribes (see `trl_loss`). The gate comes from `method`; TRL's
`epsilon`, `epsilon_high`, `delta` and SAPO temperatures are not read.

Features of TRL's own loss that the adapter does not carry raise ValueError at construction: a KL
term (`beta`), the entropy bonus and mask, the off-policy mask, vLLM importance correction, the
MoE aux loss and `loss_type` values outside `TRL_AGG` (all listed in `REFUSED`); image inputs
raise in `compute_loss`. With TRL's default `num_iterations=1` (and no mini-batching) the old
log-probs equal the current ones, ρ = 1 and no gate ever acts: use num_iterations ≥ 2 or
steps_per_generation > gradient_accumulation_steps.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from .. import _numerics as nx
from . import gate_stats, loss

#: TRL loss_type -> the rlgates aggregation it uses (its normaliser: see `trl_loss`). These are
#: the types tests/test_trainers.py compares with TRL's own loss; luspo and vespo are not mapped.
TRL_AGG = {
    "grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean", "cispo": "token-mean",
}


def _level_mismatch(t):
    level = getattr(t.method, "level", "token")
    return t.args.importance_sampling_level != level and (
        f"{t.args.importance_sampling_level!r} while {t.method.name} works at the {level} level")


#: What RlgatesGRPOTrainer refuses at construction: (the TRL setting, the feature of TRL's own
#: loss it turns on, a test on the trainer: true, or a string that details it, when it is on).
#: `_check_supported` raises ValueError for every entry that holds; the book's chapter 14 renders
#: this tuple as its table. Image inputs (pixel_values) are refused later, in `compute_loss`.
REFUSED = (
    ("beta != 0", "a KL term to the reference model", lambda t: t.beta != 0.0),
    ("top_entropy_quantile < 1", "the entropy mask (only the highest-entropy tokens learn)",
     lambda t: t.top_entropy_quantile < 1.0),
    ("off_policy_mask_threshold", "the off-policy sequence mask",
     lambda t: t.off_policy_mask_threshold is not None),
    ("vllm_importance_sampling_correction", "vLLM's sampler-trainer correction (use_vllm)",
     lambda t: t.use_vllm and t.vllm_importance_sampling_correction),
    ("entropy_coef != 0 or use_adaptive_entropy", "an entropy bonus",
     lambda t: t._entropy_bonus_enabled),
    ("router_aux_loss_coef != 0 (MoE model)", "the MoE router's aux loss",
     lambda t: t.aux_loss_enabled),
    ("loss_type outside TRL_AGG", "a normaliser with no rlgates mapping",
     lambda t: t.loss_type not in TRL_AGG and f"{t.loss_type!r}; mapped: {sorted(TRL_AGG)}"),
    ("importance_sampling_level != the method's level", "a ratio at another level",
     _level_mismatch),
)


def trl_loss(method, logp, logp_old, adv, mask, loss_type, *, max_completion_length=None,
             num_items_in_batch=None, num_processes=1, grad_accum=1, steps_per_generation=1):
    """The rlgates method's loss, normalised as TRL 1.16 normalises `loss_type`.

    grpo, sapo: the mean over *every* row of the micro-batch, fully masked rows included
        (rlgates' own mean skips them), divided by the gradient-accumulation steps;
    bnpo: this micro-batch's token-mean, divided by the accumulation steps;
    dr_grpo: Σ over tokens / (rows × max_completion_length), divided by the accumulation steps;
    dapo, cispo: Σ over tokens / (num_items_in_batch / num_processes × grad_accum /
        steps_per_generation): the generation batch's global token count, scaled to one step.
    """
    if loss_type not in TRL_AGG:
        raise ValueError(f"loss_type {loss_type!r} has no rlgates mapping; use one of "
                         f"{sorted(TRL_AGG)}")
    agg = TRL_AGG[loss_type]
    if loss_type in ("dapo", "cispo"):
        n = num_items_in_batch
        if n is None:
            n = nx.check_mask(mask, logp.shape, logp.device).sum()
        norm = (torch.as_tensor(n).clamp(min=1.0) / num_processes
                * grad_accum / steps_per_generation)
        return loss(method, logp, logp_old, adv, mask, agg, norm=norm)
    norm = None if loss_type == "bnpo" else logp.shape[0]
    length = None
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length (TRL's constant normaliser)")
        length = max_completion_length
    return loss(method, logp, logp_old, adv, mask, agg, norm=norm, length=length) / grad_accum


def builtin_loss(trainer, logp, logp_old, adv, mask, num_items_in_batch=None):
    """TRL's own policy loss (`GRPOTrainer._compute_loss`, with `trainer`'s settings) at the given
    log-probs, instead of the model's: a scalar differentiable in `logp`, so that TRL's gradient
    with respect to each token's log-prob can be read and compared (the book's chapter 14).

    logp, logp_old, mask: [B, T]; adv: [B]. num_items_in_batch: TRL's global token count (dapo,
    cispo); None: this batch's tokens.
    """
    B, T = logp.shape
    mask = mask.long()
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "old_per_token_logps": logp_old,
        "num_items_in_batch": mask.sum() if num_items_in_batch is None
        else torch.as_tensor(num_items_in_batch),
    }

    def given(*args, **kwargs):  # stands in for the model's forward pass
        return logp, torch.zeros_like(logp), None

    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by train()
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer._get_per_token_logps_and_entropies = given
    try:
        return GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies


class RlgatesGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with an rlgates method (built-in, registered or `rlgates.byo.make`) as
    its policy loss. Takes GRPOTrainer's arguments plus `method`: a Method or a registry name."""

    def __init__(self, *args, method, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(method, str):
            import rlgates

            method = rlgates.get(method)
        self.method = method
        self._check_supported()

    def _check_supported(self):
        bad = []
        for setting, _, holds in REFUSED:
            found = holds(self)
            if found:
                bad.append(setting + (f" ({found})" if isinstance(found, str) else ""))
        if bad:
            raise ValueError("RlgatesGRPOTrainer does not carry: " + "; ".join(bad))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        if inputs.get("pixel_values") is not None:
            raise ValueError("RlgatesGRPOTrainer handles text-only inputs")
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask
        if "tool_mask" in inputs:
            mask = completion_mask * inputs["tool_mask"]
        logp, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1))
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old  # num_iterations=1: ρ ≡ 1
        adv = inputs["advantages"]
        train = self.model.training
        out = trl_loss(
            self.method, logp, old, adv, mask, self.loss_type,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=inputs.get("num_items_in_batch"),
            num_processes=self.accelerator.num_processes,
            grad_accum=self.current_gradient_accumulation_steps if train else 1,
            steps_per_generation=self.args.steps_per_generation if train else 1,
        )
        mode = "train" if train else "eval"
        for k, v in gate_stats(self.method, logp, old, adv, mask).items():
            v = self.accelerator.gather(torch.tensor([v], device=logp.device)).mean().item()
            self._metrics[mode][f"rlgates/{k}"].append(v)
        return out.to(logp.dtype)


__all__ = ["REFUSED", "TRL_AGG", "RlgatesGRPOTrainer", "builtin_loss", "trl_loss"]
