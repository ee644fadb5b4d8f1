"""One row of the conformance matrix (`rlgates.trainers.conformance`): the data type the
trainer modules build their rows with, apart so that they never import the matrix that reads
them."""

from __future__ import annotations

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
