"""The hard float64 batch every conformance test runs on (tests/test_conformance_*.py).

One fixed batch, built from the edges it must straddle rather than drawn at random, so that a
trainer's loss and an rlgates method are compared where they could differ:

- ragged lengths, an empty row, and padding that holds a ratio and an advantage of its own (a
  loss that forgot the mask would count it);
- rows with A = 0, and A = 0 tokens inside other rows of the [B, T] advantages;
- every edge in `EDGES` (the methods' default ε, dual-clip's c, CISPO's and SAO's windows, the
  truncation caps) with a ratio 1 % below it and one 1 % above it, in a row with A > 0 and in a
  row with A < 0; so an A < 0 token sits past dual-clip's c = 3;
- near-on-policy rows whose sequence ratio ρ_s lies inside GSPO's window (3e-4, 4e-4) and rows
  just outside it on each side, for each sign of A, so sequence gates both open and shut;
- π_old far from uniform (from 0.95 down to 1e-3), so that masks on π − π_old (DPPO) trigger;
  π = ρ·π_old stays ≤ 1 on every real token.

    from tests.conformance_batch import hard_batch
    b = hard_batch()
    logp = b.logp.clone().requires_grad_(True)
    loss = method.loss(logp, b.logp_old, b.adv, b.mask)          # adv [B]; b.adv_tokens: [B, T]

`check(b)` asserts each of these properties, so a change that loses one fails its test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

#: Ratio edges the batch straddles: (ρ, what it is). Each appears at ρ·0.99 and ρ·1.01 in an
#: A > 0 row and in an A < 0 row.
EDGES = (
    (0.8, "1 − ε (ppo, grpo, dapo, dual_clip: ε = 0.2)"),
    (1.2, "1 + ε (ppo, grpo, dual_clip)"),
    (1.28, "1 + ε_h (dapo)"),
    (math.exp(-0.2), "e^−ε (geo_mean at verl's clip_ratio 0.2)"),
    (math.exp(0.2), "e^ε (geo_mean at verl's clip_ratio 0.2)"),
    (math.exp(-0.4), "e^−ε (GMPO's paper ε = 0.4)"),
    (math.exp(0.4), "e^ε (GMPO's paper ε = 0.4)"),
    (0.7, "1 − ε_l (sao)"),
    (6.0, "1 + ε_h (sao)"),
    (5.0, "1 + ε_h (cispo; TRL's cispo epsilon_high)"),
    (3.0, "dual_clip's c; TRL's vLLM IS cap"),
    (2.0, "verl's rollout_is_threshold"),
    (0.5, "a lower truncation bound (IcePop's 0.5)"),
)
#: GSPO's default window on ρ_s, in log space: (−ε_l, ε_h).
GSPO_WINDOW = (-3e-4, 4e-4)
#: π_old of the edge tokens, cycled (capped so that π = ρ·π_old ≤ 0.95).
PROBS_OLD = (0.95, 0.6, 0.02, 0.3, 0.85, 0.001, 0.45, 0.1, 0.7, 0.005)
#: Padding's log π_old and log-ratio: finite (verl multiplies the mask in, so NaN would leak)
#: but far from 0, so a loss that read padding would change.
PAD_LOGP_OLD, PAD_LOG_RATIO, PAD_ADV = -1.0, 0.7, 2.5
T = 8


@dataclass(frozen=True)
class HardBatch:
    """The batch, float64. adv is one advantage per row [B]; adv_tokens is [B, T] (adv on every
    token, with some A = 0 tokens and a changed value on padding); lengths: real tokens per row;
    kind: what each row is for."""

    logp: torch.Tensor
    logp_old: torch.Tensor
    adv: torch.Tensor
    adv_tokens: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    kind: tuple[str, ...]

    def leaf(self) -> torch.Tensor:
        """A fresh copy of logp that requires grad."""
        return self.logp.detach().clone().requires_grad_(True)

    @property
    def log_ratio(self) -> torch.Tensor:
        return self.logp - self.logp_old

    def seq_log_ratio(self) -> torch.Tensor:
        """[B] log ρ_s, the mean log-ratio of each row's real tokens (0 for the empty row)."""
        m = self.mask.to(self.logp.dtype)
        return (self.log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)


def _edge_ratios():
    """Every edge's two sides, sorted: 2·len(EDGES) ratios."""
    return sorted(e * s for e, _ in EDGES for s in (0.99, 1.01))


def _near_rows():
    """(kind, A, log-ratios) of the near-on-policy rows: ρ_s inside GSPO's window, and just past
    each edge, for each sign of A; the tokens vary around their row's mean."""
    wiggle = (1.5e-4, -1e-4, 0.5e-4, -0.5e-4, 0.0)  # sums to 0: the row's mean is exact
    rows = []
    for adv in (1.0, -1.0):
        for kind, mean in (("inside", 0.5e-4), ("above", 8e-4), ("below", -8e-4)):
            rows.append((f"near-{kind}", adv, [mean + w for w in wiggle]))
    return rows


def hard_batch() -> HardBatch:
    """Build the batch (about 20 rows of up to T = 8 tokens); see the module docstring."""
    ratios = _edge_ratios()
    rows = []  # (kind, A, log-ratios, probs_old)
    chunks = [ratios[i:i + T - 1] for i in range(0, len(ratios), T - 1)]  # ragged: 7, 7, 7, 5
    k = 0
    for adv in (1.3, -0.9):
        for chunk in chunks:
            probs = []
            for r in chunk:
                probs.append(min(PROBS_OLD[k % len(PROBS_OLD)], 0.95 / r))
                k += 1
            rows.append(("edges", adv, [math.log(r) for r in chunk], probs))
    for kind, adv, lr in _near_rows():
        rows.append((kind, adv, lr, [0.5] * len(lr)))
    rows.append(("zero-adv", 0.0, [math.log(r) for r in (0.5, 1.5, 3.5, 0.9)], [0.2] * 4))
    rows.append(("empty", 0.7, [], []))
    rows.append(("full", -0.4, [math.log(r) for r in (1.1, 0.95, 1.3, 0.75, 1.05, 2.5, 0.6, 1.0)],
                 [0.3, 0.9, 0.4, 0.95, 0.5, 0.2, 0.9, 0.05]))
    B = len(rows)
    logp_old = torch.full((B, T), PAD_LOGP_OLD, dtype=torch.float64)
    log_ratio = torch.full((B, T), PAD_LOG_RATIO, dtype=torch.float64)
    adv = torch.tensor([a for _, a, _, _ in rows], dtype=torch.float64)
    lengths = torch.tensor([len(lr) for _, _, lr, _ in rows])
    for i, (_, _, lr, probs) in enumerate(rows):
        n = len(lr)
        log_ratio[i, :n] = torch.tensor(lr, dtype=torch.float64)
        logp_old[i, :n] = torch.tensor(probs, dtype=torch.float64).log()
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv_tokens = adv[:, None].expand(B, T).clone()
    adv_tokens[0, 1] = adv_tokens[B - 1, 3] = 0.0  # A = 0 tokens inside rows with A ≠ 0
    adv_tokens[B - 1, 0] = 0.8  # a token whose sign differs from its row's
    adv_tokens[~mask] = PAD_ADV
    return HardBatch(logp=logp_old + log_ratio, logp_old=logp_old, adv=adv,
                     adv_tokens=adv_tokens, mask=mask, lengths=lengths,
                     kind=tuple(kind for kind, _, _, _ in rows))


def check(b: HardBatch) -> None:
    """Assert every property the module docstring promises (tests/test_conformance_verl.py)."""
    m, ratio = b.mask, b.log_ratio.exp()
    assert b.logp.dtype == b.logp_old.dtype == b.adv.dtype == torch.float64
    assert (b.lengths == 0).sum() == 1 and len(set(b.lengths.tolist())) > 3  # empty, ragged
    assert (b.adv == 0).any() and ((b.adv_tokens == 0) & m & (b.adv[:, None] != 0)).any()
    assert torch.isfinite(b.logp).all() and (b.logp[m] <= 0).all()  # π ≤ 1 on real tokens
    assert (b.log_ratio[~m] != 0).all() and (b.adv_tokens[~m] != 0).all()  # padding is loud
    for edge, what in EDGES:
        for sign in (1, -1):
            near = m & (b.adv[:, None] * sign > 0) & ((ratio / edge).log().abs() < 0.02)
            r = ratio[near]
            assert (r < edge).any() and (r > edge).any(), (edge, what, sign)
    s = b.seq_log_ratio()
    low, high = GSPO_WINDOW
    for sign in (1, -1):
        row = (b.adv * sign > 0) & (b.lengths > 0)
        assert ((s > low) & (s < high) & row).any()  # inside GSPO's window
        assert ((s > high) & row).any() and ((s < low) & row).any()  # outside, each side
    dprob = (b.logp.exp() - b.logp_old.exp())[m]
    assert (dprob > 0.2).any() and (dprob < -0.2).any() and (dprob.abs() < 0.2).any()
    assert b.logp_old[m].exp().min() < 0.01 and b.logp_old[m].exp().max() > 0.9


def advantages(b: HardBatch, per_token: bool):
    """[B, T] advantages for the trainer, and what rlgates is given: [B] per row, or the same
    [B, T]."""
    if per_token:
        return b.adv_tokens, b.adv_tokens
    return b.adv[:, None].expand_as(b.logp).contiguous(), b.adv


def assert_equal(ours, ref, rel=1e-12):
    """(value, gradient) pairs equal to `rel`, the conformance tests' float64 tolerance."""
    (v, g), (v_ref, g_ref) = ours, ref
    assert float(v) == pytest.approx(float(v_ref), rel=rel, abs=1e-15)
    torch.testing.assert_close(g, g_ref, rtol=rel, atol=1e-15)
