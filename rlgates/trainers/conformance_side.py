"""The rows of the conformance matrix whose verl losses read more than (ρ, A), for verl 0.9.1:
DPPO (π_old itself) and Clip-Cov / KL-Cov (the batch's covariance of log π and A, and for
Clip-Cov a random draw). `rlgates.trainers.conformance.matrix()` adds them after verl's own
rows; tests/test_conformance_side.py runs each against verl's function from
`get_policy_loss_fn`, value and gradient in float64, on the hard batch."""

from __future__ import annotations

from .conformance_verl import method_row

CLIP_COV_DRAW = (
    "verl picks among the candidates with an unseeded torch.randperm (one token below 5,000). "
    "The test seeds torch and gives rlgates the same permutation as side.draw, and checks the "
    "selection rule apart from the draw with cov_ratio = 1 (every candidate dropped). verl's "
    "means add 1e-8 to the token count: a token within ~1e-8 of the band's edges could differ.")

NO_CLAMP = (
    "Equal for |log ρ| ≤ 20: verl does not clamp this loss's log-ratio (ratio = "
    "torch.exp(log_prob − old_log_prob)), where rlgates clamps it at ±20 as verl's vanilla, "
    "dppo, sapo and cispo do; past the clamp verl's gradient grows as ρ and rlgates' is 0 "
    "(tested at log ρ = 22).")

SIDE_ROWS = [
    method_row("dppo_tv", side=("probs_old",)),
    method_row("dppo_kl", side=("probs_old",)),
    method_row("clip_cov", side=("cov", "draw"), status="partial",
               note=NO_CLAMP + " " + CLIP_COV_DRAW),
    method_row("kl_cov", side=("cov",), status="partial", note=NO_CLAMP),
]

__all__ = ["CLIP_COV_DRAW", "NO_CLAMP", "SIDE_ROWS"]
