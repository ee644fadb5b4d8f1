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
from ._row import Row

#: The fields of verl's PolicyLossConfig (actor.policy_loss.*) a method's verl flags may set;
#: the others are the actor's own (tests/test_conformance_verl.py checks both against verl).
POLICY_LOSS_KEYS = ("loss_mode", "dro_beta", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                    "kl_cov_ratio", "ppo_kl_coef")


def verl_settings(flags_verl: dict) -> dict:
    """A method's verl flags as row settings: policy-loss fields under "policy_loss."."""
    return {f"policy_loss.{k}" if k in POLICY_LOSS_KEYS else k: v for k, v in flags_verl.items()}


def method_row(method: str, status="equal", note="", side=(), **hparams) -> Row:
    """The row of `method` at `hparams`, its verl settings read from its trainer flags."""
    m = get(method, **hparams)
    settings = verl_settings(flags(m)["verl"])
    return Row(trainer="verl", name=settings["policy_loss.loss_mode"], settings=settings,
               method=method, hparams=dict(m.hparams),
               agg=settings.get("loss_agg_mode", m.agg), side=tuple(side), status=status,
               note=note)


#: The settings that turn on bypass mode (verl's legacy trainer then swaps the actor's loss_mode
#: for "bypass_mode"; see the rows' notes).
BYPASS = "algorithm.rollout_correction."

#: The settings that tell rows apart, at verl's defaults: a row that does not set one needs it
#: at its default (`conformance.find`); also what a capture that lacks one is taken to have.
SETTING_DEFAULTS = {f"{BYPASS}bypass_mode": False}


def bypass_row(method, loss_type, rollout_is=None, status="equal", note="", **hparams) -> Row:
    """A bypass-mode row: `loss_type` (ppo_clip, reinforce) and `rollout_is` (None, token,
    sequence; TIS at verl's default threshold 2) with the method that computes that loss. For
    ppo_clip the actor's clip settings are the method's verl flags."""
    m = get(method, **hparams)
    settings = {f"{BYPASS}bypass_mode": True, f"{BYPASS}loss_type": loss_type,
                f"{BYPASS}rollout_is": rollout_is}
    if rollout_is is not None:
        settings[f"{BYPASS}rollout_is_threshold"] = 2.0
    f = dict(flags(m)["verl"] or {})
    f.pop("loss_mode", None)
    if loss_type == "reinforce":  # the reinforce loss reads no clip setting
        f = {"loss_agg_mode": f.get("loss_agg_mode", m.agg)}
    settings.update(f)
    return Row(trainer="verl", name="bypass_mode", settings=settings, method=method,
               hparams=dict(m.hparams), agg=settings["loss_agg_mode"], status=status,
               note=note)


WHERE_BYPASS_RUNS = (
    "Runs on verl's legacy trainer (trainer.use_v1=false), whose apply_bypass_mode sets "
    "policy_loss.loss_mode=bypass_mode and π_old = π_rollout. The v1 trainer (the default) "
    "only sets π_old = π_rollout and runs the actor's own loss_mode, reading neither loss_type "
    "nor rollout_is. rollout_rs (rejection sampling) is off in these rows.")


def verl_rows() -> list[Row]:
    """verl 0.9.1's policy losses, one row per configuration that maps to its own method."""
    return [
        method_row("ppo"),
        method_row("grpo"),
        method_row("dapo"),
        method_row("dapo", eps_low=1.5),  # clip_ratio_low above 1: no lower clip
        method_row("dual_clip"),
        method_row("dapo_dual_clip"),
        method_row("gspo"),
        method_row("gspo", eps_low=1.5),  # no lower edge on the sequence ratio
        method_row("sapo"),
        method_row("cispo"),
        method_row("cispo", eps_low=1.5),  # clip_ratio_low above 1: no lower bound, as at 1
        method_row("gpg"),
        method_row("gmpo", status="partial", note=(
            "verl's geo_mean ignores loss_agg_mode and the global batch sizes: it divides by "
            "the micro-batch's row count B, an empty row counted, where seq-mean-token-mean "
            "counts the non-empty rows; equal with rlgates.trainers.loss(..., norm=B). With "
            "per-token advantages verl's gradient carries the row's mean A (it supports one A "
            "per response) and a token with A = 0 leaves its log-ratio out of the geometric "
            "mean (rlgates counts it on the A ≤ 0 side); equal on rows whose A is constant. "
            "Equal for |log ρ| ≤ 20: geo_mean does not clamp the token log-ratio (its clamp is "
            "commented out), where rlgates clamps it at ±20 (tested at log ρ = ±22).")),
        method_row("dro"),
        bypass_row("dual_clip", "ppo_clip", note=WHERE_BYPASS_RUNS),
        bypass_row("gpg", "reinforce", note=WHERE_BYPASS_RUNS),
        bypass_row("cispo", "reinforce", "token", eps_low=1.0, eps_high=1.0, note=(
            "Token TIS at 2: the weight sg(min(ρ, 2)) times A·log π is CISPO's window (0, 2]. "
            + WHERE_BYPASS_RUNS)),
        bypass_row("gpg", "reinforce", "sequence", status="partial", note=(
            "Sequence TIS at 2: each response's weight is its own detached product ratio, "
            "min(Π_t ρ_t, 2): not a gate of (ρ_t, A). Equal with gpg and is_weight = "
            "rlgates.offpolicy.importance_weight(logp, logp_old, mask, 'tis', level='sequence', "
            "high=2). " + WHERE_BYPASS_RUNS)),
    ]


__all__ = ["BYPASS", "POLICY_LOSS_KEYS", "SETTING_DEFAULTS", "bypass_row", "method_row",
           "verl_rows", "verl_settings"]
