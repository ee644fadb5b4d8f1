"""One row of the conformance matrix (`rlgates.trainers.conformance`): the data type the
trainer modules build their rows with, apart so that they never import the matrix that reads
them."""

from __future__ import annotations

from dataclasses import dataclass, field

#: verl settings are keys under `actor_rollout_ref.actor.` (e.g. "policy_loss.loss_mode",
#: "clip_ratio_low"), except those that start with "algorithm.".
STATUSES = ("equal", "partial")
#: The trainers a row may name: verl's and TRL's (requirements.txt), then OpenRLHF's and AReaL's
#: (the optional `trainers-extra` install: conformance_openrlhf, conformance_areal).
TRAINERS = ("verl", "trl", "openrlhf", "areal")


@dataclass(frozen=True)
class Row:
    """One trainer loss and the rlgates method that computes it."""

    trainer: str  # one of TRAINERS
    name: str  # verl registry name, TRL loss_type, or the other trainer's loss / option name
    settings: dict  # the trainer flags of this row
    method: str | None  # rlgates method name (None: no method; `note` says why)
    hparams: dict = field(default_factory=dict)  # rlgates hyperparameters
    agg: str = "token-mean"  # rlgates aggregation
    side: tuple[str, ...] = ()  # side inputs the row's loss reads (rlgates.SideInfo fields)
    status: str = "equal"  # "equal": value and gradient, float64; "partial": see `note`
    note: str = ""  # what cannot be matched and what the test does instead ("" if equal)
    #: an off-policy correction the trainer multiplies in: keywords of
    #: rlgates.offpolicy.importance_weight(logp_old, sampler_logp, mask, **correction), the
    #: rlgates weight that equals it ({} where the row has none)
    correction: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.trainer not in TRAINERS:
            raise ValueError(f"Row.trainer must be one of {TRAINERS}, got {self.trainer!r}")
        if self.status not in STATUSES:
            raise ValueError(f"Row.status must be one of {STATUSES}, got {self.status!r}")
        if (self.status == "partial" or self.method is None) and not self.note:
            raise ValueError(f"row {self.trainer}:{self.name} is {self.status} without a note")
