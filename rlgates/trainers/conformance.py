"""The conformance matrix: every policy loss the installed trainers name, and its rlgates method.

One `Row` per name in verl's policy-loss registry (`POLICY_LOSS_REGISTRY`, with one row per
configuration that needs its own method) and per TRL `loss_type`. Each row says which rlgates
method, hyperparameters and aggregation compute that trainer's loss, which side inputs the loss
reads beyond (ρ, A), and whether the two agree in value and gradient (float64) on the hard batch
of the differential tests (tests/test_conformance_verl.py, tests/test_conformance_trl.py); a row
that cannot fully agree says why in `note`, and its test checks what it can.

    matrix()      the rows: verl's (conformance_verl), TRL's (conformance_trl), then the rows of
                  losses that read side information (conformance_side), where those modules exist
    markdown()    the matrix as a Markdown table, for the book

This module imports neither trainer: the rows are data, the tests run the trainers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

#: verl settings are keys under `actor_rollout_ref.actor.` (e.g. "policy_loss.loss_mode",
#: "clip_ratio_low"), except those that start with "algorithm.".
STATUSES = ("equal", "partial")


@dataclass(frozen=True)
class Row:
    """One trainer loss and the rlgates method that computes it."""

    trainer: str  # "verl" or "trl"
    name: str  # verl registry name, or TRL loss_type
    settings: dict  # the trainer flags of this row
    method: str | None  # rlgates method name (None: no method; `note` says why)
    hparams: dict = field(default_factory=dict)  # rlgates hyperparameters
    agg: str = "token-mean"  # rlgates aggregation
    side: tuple[str, ...] = ()  # side inputs the row's loss reads (rlgates.SideInfo fields)
    status: str = "equal"  # "equal": value and gradient, float64; "partial": see `note`
    note: str = ""  # what cannot be matched and what the test does instead ("" if equal)

    def __post_init__(self):
        if self.trainer not in ("verl", "trl"):
            raise ValueError(f"Row.trainer must be 'verl' or 'trl', got {self.trainer!r}")
        if self.status not in STATUSES:
            raise ValueError(f"Row.status must be one of {STATUSES}, got {self.status!r}")
        if (self.status == "partial" or self.method is None) and not self.note:
            raise ValueError(f"row {self.trainer}:{self.name} is {self.status} without a note")


def _rows(module: str, attr: str) -> list[Row]:
    """The rows `attr` of rlgates.trainers.<module>: a function or a list; [] while that module
    does not exist yet (any other import error is raised)."""
    name = f"{__package__}.{module}"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return []
    rows = getattr(mod, attr)
    return list(rows() if callable(rows) else rows)


def matrix() -> list[Row]:
    """Every row: verl's, then TRL's, then those of losses that read side information."""
    return (_rows("conformance_verl", "verl_rows") + _rows("conformance_trl", "trl_rows")
            + _rows("conformance_side", "SIDE_ROWS"))


def _value(v) -> str:
    if v is None:
        return "null"  # as a Hydra override writes it
    if isinstance(v, float):
        return "inf" if v == float("inf") else f"{v:g}"
    return str(v)


def _pairs(d: dict) -> str:
    return "; ".join(f"{k}={_value(v)}" for k, v in d.items()) or "—"


def markdown(rows=None) -> str:
    """The matrix as a Markdown table: trainer, name, settings, method (hyperparameters),
    aggregation, side inputs, status and note."""
    from ..tables import markdown as table

    rows = matrix() if rows is None else rows
    head = ("trainer", "name", "settings", "rlgates method", "agg", "side inputs", "status",
            "note")
    return table(((r.trainer, f"`{r.name}`", _pairs(r.settings),
                   f"`{r.method}` ({_pairs(r.hparams)})" if r.method else "—", f"`{r.agg}`",
                   ", ".join(r.side) or "—", r.status, r.note or "—") for r in rows), head)


__all__ = ["Row", "STATUSES", "markdown", "matrix"]
