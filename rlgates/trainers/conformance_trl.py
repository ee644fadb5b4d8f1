"""TRL's rows of the conformance matrix (rlgates.trainers.conformance), for TRL 1.16.0.

One row per `GRPOConfig.loss_type`, and one per knob of TRL's `_compute_loss` that acts like a
gate. A row whose method has TRL flags (`rlgates.trainers.flags(m)["trl"]`) takes its settings
from there, so a flag is written once, on the method class; `loss_type` is the row's own where
the loss type is an aggregation (bnpo, dr_grpo). Each row's `agg` is the rlgates aggregation of
TRL's normaliser for that loss type (`TRL_AGG`); TRL's counts differ from rlgates' own in ways
`rlgates.trainers.trl.trl_loss` applies exactly (all rows of the micro-batch, empty ones too;
dr_grpo's max_completion_length), so a row can be "equal" with them.

tests/test_conformance_trl.py runs TRL's own `_compute_loss` at given log-probs
(`rlgates.trainers.trl.builtin_loss`) for each row against the row's method on the hard batch
(tests/conformance_batch.py), value and gradient in float64, and fails when the installed TRL has
a loss type that no row covers (`loss_types()` reads them from TRL, not from a list).

This module does not import TRL until `loss_types` is called: the rows are data.
"""

from __future__ import annotations

import re

from ..methods import get
from . import flags
from ._row import Row

#: TRL loss_type -> the rlgates aggregation of its normaliser (TRL 1.16.0, `_compute_loss`):
#: grpo, sapo: each response's token mean, then the mean over the micro-batch's rows; bnpo: the
#: micro-batch's token mean; dr_grpo: Σ / (rows × max_completion_length); dapo, cispo, vespo: Σ /
#: the global token count; luspo: each response's token sum, then the mean over rows.
TRL_AGG = {
    "grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean", "cispo": "token-mean",
    "luspo": "seq-mean-token-sum", "vespo": "token-mean",
}

#: The settings that tell rows apart, at GRPOConfig's defaults (TRL 1.16.0): a knob at its
#: default is off, and a row that does not set a knob needs it off (`conformance.find`). Also
#: what a capture that lacks one of them is taken to have.
SETTING_DEFAULTS = {"delta": None, "off_policy_mask_threshold": None, "top_entropy_quantile": 1.0,
                    "importance_sampling_level": "token"}

_EMPTY_ROWS = ("TRL's mean over responses counts empty rows too; rlgates' skips them "
               "(trl_loss applies TRL's count).")


def trl_row(loss_type, method, status="equal", note="", side=(), settings=None,
            **hparams) -> Row:
    """The row of `method` at `hparams` under TRL's `loss_type`, its settings read from the
    method's TRL flags (`settings` adds to them or overrides)."""
    m = get(method, **hparams)
    f = flags(m)["trl"]
    if f is None:
        raise ValueError(f"{method} at {m.hparams} has no TRL flags")
    settings = {**f, "loss_type": loss_type, **(settings or {})}
    return Row(trainer="trl", name=loss_type, settings=settings, method=method,
               hparams=dict(m.hparams), agg=TRL_AGG[settings["loss_type"]], side=tuple(side),
               status=status, note=note)


def knob_row(knob, method, side, note, **hparams) -> Row:
    """The row of a TRL knob that acts like a gate: `method` (the knob on DAPO, TRL's default
    loss type) with its TRL flags, which set the knob."""
    row = trl_row("dapo", method, side=side, note=note, **hparams)
    return Row(trainer="trl", name=knob, settings=row.settings, method=method,
               hparams=row.hparams, agg=row.agg, side=row.side, status=row.status, note=note)


def trl_rows() -> list[Row]:
    """TRL 1.16.0's loss types, then its gate-like knobs (on DAPO; on another loss type the
    knob is one more class, see rlgates.methods.masks)."""
    return [
        trl_row("grpo", "grpo", note=_EMPTY_ROWS),
        trl_row("dapo", "dapo"),
        # bnpo and dr_grpo are normalisers: TRL's clip at its default ε = 0.2 on both sides
        trl_row("bnpo", "grpo"),
        trl_row("dr_grpo", "grpo", settings={"max_completion_length": 8},
                note="TRL divides by rows × max_completion_length (8 here, the batch's T); "
                     + _EMPTY_ROWS),
        trl_row("cispo", "cispo"),
        trl_row("cispo", "cispo", eps_high=-0.8,
                note="TRL's default CISPO: epsilon_high unset is epsilon = 0.2, an absolute cap "
                     "below 1, so every token with ρ > 0.2 is weighted 0.2 (ε_h = −0.8)."),
        trl_row("sapo", "sapo", status="partial",
                note="TRL picks τ with torch.where on Python floats, which rounds τ to float32 "
                     "(1.05 → 1.0499999523), so in float64 the two agree to ~2e-7 relative; "
                     "at τ rounded to float32 they are equal (tested). " + _EMPTY_ROWS),
        trl_row("luspo", "luspo", status="partial",
                note="Equal with one advantage per response. With [B, T] advantages the values "
                     "agree, and TRL's gradient is rlgates' averaged over each response's tokens "
                     "(TRL differentiates through the sequence mean; GSPO-token's form gives "
                     "each token its own A) (tested). " + _EMPTY_ROWS),
        trl_row("vespo", "vespo",
                note="Without vLLM (the sampler is π_old). With use_vllm, TRL folds its "
                     "per-token correction π_old/π_sampler (truncated or masked at its caps) into "
                     "w: pass logp_old − log(correction) as the old log-probs (tested). TRL holds "
                     "k and λ in float32, exact at the defaults."),
        knob_row("off_policy_mask_threshold", "opsm", ("sampler_logp",), delta=0.1,
                 note="TRL's sampler is vLLM's log-probs (sampling_per_token_logps), else "
                      "π_old; rlgates' sampler_logp defaults to logp_old. The mask leaves the "
                      "normaliser alone: a dropped response still counts."),
        knob_row("top_entropy_quantile", "top_entropy", ("entropy",),
                 note="TRL takes the quantile over every process's real tokens, in float32; "
                      "rlgates over the batch it is given, in its dtype (equal here: the "
                      "entropies are multiples of 1/64). Masked tokens still count in the "
                      "normaliser."),
    ]


def loss_types() -> list[str]:
    """The loss types the installed TRL documents: the quoted names of the "Supported values are
    ..." sentence in `GRPOConfig.loss_type`'s help. Imports TRL."""
    from trl import GRPOConfig

    text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    sentence = re.search(r"Supported values are (.*?)\.\s", text)
    if sentence is None:
        raise ValueError("GRPOConfig.loss_type's help no longer lists its supported values")
    return re.findall(r"'([a-z_]+)'", sentence.group(1))


def branch_loss_types() -> list[str]:
    """The loss types `GRPOTrainer._compute_loss` branches on (`self.loss_type == "x"` or
    `in [...]`), in order of first appearance. Imports TRL."""
    import inspect

    from trl import GRPOTrainer

    code = inspect.getsource(GRPOTrainer._compute_loss)
    found = []
    for eq, many in re.findall(r'self\.loss_type (?:== "([a-z_]+)"|in \[([^\]]*)\])', code):
        for name in [eq] if eq else re.findall(r'"([a-z_]+)"', many):
            if name not in found:
                found.append(name)
    return found


__all__ = ["SETTING_DEFAULTS", "TRL_AGG", "branch_loss_types", "knob_row", "loss_types", "trl_row",
           "trl_rows"]
