"""verl's rows of the conformance matrix (rlgates.trainers.conformance), for verl 0.9.1.

A row whose method has verl flags (`rlgates.trainers.flags(m)["verl"]`) takes its settings from
there, so a flag is written once, on the method class. Settings are keys under
`actor_rollout_ref.actor.` (verl's actor config), or under `algorithm.` where they start so.
tests/test_conformance_verl.py runs each row's verl function from `get_policy_loss_fn` against
the method on the hard batch (tests/conformance_batch.py), value and gradient in float64, and
fails when verl's registry has a name no row covers.
"""

from __future__ import annotations

from ..methods import get
from . import flags
from .conformance import Row


def method_row(method: str, status="equal", note="", side=(), **hparams) -> Row:
    """The row of `method` at `hparams`, its verl settings read from its trainer flags."""
    m = get(method, **hparams)
    f = dict(flags(m)["verl"])
    loss_mode = f.pop("loss_mode")
    return Row(trainer="verl", name=loss_mode, settings={"policy_loss.loss_mode": loss_mode, **f},
               method=method, hparams=dict(m.hparams), agg=f.get("loss_agg_mode", m.agg),
               side=tuple(side), status=status, note=note)


def verl_rows() -> list[Row]:
    """verl 0.9.1's policy losses, one row per configuration that maps to its own method."""
    return [
        method_row("ppo"),
        method_row("grpo"),
        method_row("dapo"),
        method_row("dual_clip"),
        method_row("gspo"),
        method_row("sapo"),
        method_row("cispo"),
    ]


__all__ = ["method_row", "verl_rows"]
