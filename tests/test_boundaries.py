"""A hand-worked table: gates and weights at, just inside and just outside every edge, both signs."""

import math

import pytest
import torch

import rlgates

UP, DOWN = math.inf, -math.inf


def nudge(x, direction):
    return math.nextafter(x, direction)


# (method, hparams, ratio, A, expected gate, expected weight or None)
PPO = [
    # A > 0: open below 1+ε (strict), closed at and above it; the lower edge does not apply
    ("ppo", {}, nudge(1.2, DOWN), 1.0, 1.0, nudge(1.2, DOWN)),
    ("ppo", {}, 1.2, 1.0, 0.0, 1.2),
    ("ppo", {}, nudge(1.2, UP), 1.0, 0.0, 1.2),
    ("ppo", {}, 1.5, 1.0, 0.0, 1.2),
    ("ppo", {}, 0.8, 1.0, 1.0, 0.8),
    ("ppo", {}, 0.3, 1.0, 1.0, 0.3),
    # A < 0: open above 1−ε (strict), closed at and below it; the upper edge does not apply
    ("ppo", {}, nudge(0.8, UP), -1.0, 1.0, nudge(0.8, UP)),
    ("ppo", {}, 0.8, -1.0, 0.0, 0.8),
    ("ppo", {}, nudge(0.8, DOWN), -1.0, 0.0, 0.8),
    ("ppo", {}, 0.5, -1.0, 0.0, 0.8),
    ("ppo", {}, 1.2, -1.0, 1.0, 1.2),
    ("ppo", {}, 3.0, -1.0, 1.0, 3.0),
    # A = 0: neither indicator fires; f takes the A ≤ 0 branch
    ("ppo", {}, 1.0, 0.0, 0.0, 1.0),
    ("ppo", {}, 0.5, 0.0, 0.0, 0.8),
    ("grpo", {}, 1.2, 1.0, 0.0, 1.2),
    ("grpo", {}, nudge(0.8, UP), -1.0, 1.0, nudge(0.8, UP)),
]
DAPO = [
    ("dapo", {}, nudge(1.28, DOWN), 1.0, 1.0, nudge(1.28, DOWN)),
    ("dapo", {}, 1.28, 1.0, 0.0, 1.28),
    ("dapo", {}, 1.25, 1.0, 1.0, 1.25),  # inside DAPO's strip, outside PPO's
    ("dapo", {}, nudge(1.28, UP), 1.0, 0.0, 1.28),
    ("dapo", {}, nudge(0.8, UP), -1.0, 1.0, nudge(0.8, UP)),
    ("dapo", {}, 0.8, -1.0, 0.0, 0.8),
    ("dapo", {}, nudge(0.8, DOWN), -1.0, 0.0, 0.8),
    ("gspo", {}, nudge(1.0004, DOWN), 1.0, 1.0, nudge(1.0004, DOWN)),
    ("gspo", {}, 1.0004, 1.0, 0.0, 1.0004),
    ("gspo", {}, nudge(1.0004, UP), 1.0, 0.0, 1.0004),
    ("gspo", {}, nudge(0.9997, UP), -1.0, 1.0, nudge(0.9997, UP)),
    ("gspo", {}, 0.9997, -1.0, 0.0, 0.9997),
    ("gspo", {}, nudge(0.9997, DOWN), -1.0, 0.0, 0.9997),
]
SAO = [  # a top-hat on (0.7, 6.0), whatever the sign of A
    *[("sao", {}, r, a, g, f) for a in (1.0, -1.0, 0.0) for r, g, f in [
        (nudge(0.7, DOWN), 0.0, 0.7), (0.7, 0.0, 0.7), (nudge(0.7, UP), 1.0, nudge(0.7, UP)),
        (1.0, 1.0, 1.0),
        (nudge(6.0, DOWN), 1.0, nudge(6.0, DOWN)), (6.0, 0.0, 6.0), (nudge(6.0, UP), 0.0, 6.0),
    ]],
]
# SAPO: gate = 4σ(x)σ(−x) = sech²(x/2), x = τ(ρ−1); worked by hand with cosh:
#   τ=1,    ρ=3: x=2      → sech²(1)      = 1/cosh(1)²      = 0.41997434161402614
#   τ=1.05, ρ=3: x=2.1    → sech²(1.05)   = 1/cosh(1.05)²   = 0.38877881920250157
#   τ=1.05, ρ=0: x=−1.05  → sech²(−0.525) = 1/cosh(0.525)²  = 0.7681097916952943
# weight f = (4/τ)σ(x): at ρ=1 it is 2/τ.
SAPO = [
    ("sapo", {}, 1.0, 1.0, 1.0, 2.0),
    ("sapo", {}, 1.0, -1.0, 1.0, 2 / 1.05),
    ("sapo", {}, 3.0, 1.0, 0.41997434161402614, 4 / (1 + math.exp(-2.0))),
    ("sapo", {}, 3.0, -1.0, 0.38877881920250157, 4 / 1.05 / (1 + math.exp(-2.1))),
    ("sapo", {}, 0.0, -1.0, 0.7681097916952943, 4 / 1.05 / (1 + math.exp(1.05))),
]

E04 = math.exp(0.4)  # GMPO's window (e^−0.4, e^0.4), on the plane where ρ̄ = f(ρ)
# verl's default loss with DAPO's ratios: (0.8, 1.28) and dual-clip's ceiling c = 3 for A < 0
# GPG: f = 1 + log ρ, gate 1/ρ. DRO (β = 1): f = 1 + log ρ − (log ρ)²/(2A), gate (1 − log ρ/A)/ρ:
#   A = 1,  ρ = e:   gate 0, f = 1 + 1 − 1/2 = 1.5
#   A = 1,  ρ = e²:  gate (1 − 2)/e² = −e^−2, f = 1 + 2 − 2 = 1
#   A = −1, ρ = e^−1: gate 0 (log ρ = A/β), f = 1 − 1 + 1/2 = 0.5
#   A = 0,  ρ = 2:   gate 0 (the convention), f = 1 + log 2
MORE = [
    ("gmpo", {}, nudge(E04, DOWN), 1.0, 1.0, nudge(E04, DOWN)),
    ("gmpo", {}, E04, 1.0, 0.0, E04),
    ("gmpo", {}, 1.2, -1.0, 1.0, 1.2),
    ("gmpo", {}, nudge(1 / E04, UP), -1.0, 1.0, nudge(1 / E04, UP)),
    ("gmpo", {}, 0.5, -1.0, 0.0, math.exp(-0.4)),
    ("dapo_dual_clip", {}, 1.25, 1.0, 1.0, 1.25),
    ("dapo_dual_clip", {}, 1.28, 1.0, 0.0, 1.28),
    ("dapo_dual_clip", {}, nudge(0.8, UP), -1.0, 1.0, nudge(0.8, UP)),
    ("dapo_dual_clip", {}, nudge(3.0, DOWN), -1.0, 1.0, nudge(3.0, DOWN)),
    ("dapo_dual_clip", {}, 3.0, -1.0, 0.0, 3.0),
    ("dapo_dual_clip", {}, 4.0, -1.0, 0.0, 3.0),
    ("dapo_dual_clip", {}, 4.0, 1.0, 0.0, 1.28),
    ("gpg", {}, 1.0, 1.0, 1.0, 1.0),
    ("gpg", {}, 4.0, -1.0, 0.25, 1 + math.log(4.0)),
    ("gpg", {}, 0.5, 1.0, 2.0, 1 - math.log(2.0)),
    ("dro", {}, 1.0, 1.0, 1.0, 1.0),
    ("dro", {}, math.e, 1.0, 0.0, 1.5),
    ("dro", {}, math.exp(2.0), 1.0, -math.exp(-2.0), 1.0),
    ("dro", {}, math.exp(-1.0), -1.0, 0.0, 0.5),
    ("dro", {}, 2.0, 0.0, 0.0, 1 + math.log(2.0)),
]


@pytest.mark.parametrize("name, hparams, ratio, adv, gate, weight",
                         PPO + DAPO + SAO + SAPO + MORE)
def test_boundary_table(name, hparams, ratio, adv, gate, weight):
    m = rlgates.get(name, **hparams)
    r, a = torch.tensor(ratio, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)
    assert float(m.gate(r, a)) == pytest.approx(gate, rel=1e-14, abs=0)
    assert float(m.weight(r, a)) == pytest.approx(weight, rel=1e-14, abs=0)
    assert float(m.signal(r, a)) == pytest.approx(gate * ratio * adv, rel=1e-14, abs=0)
    # the loss differentiates f by autograd: at the edges too, its derivative must be the gate
    leaf = r.clone().requires_grad_(True)
    (dfdr,) = torch.autograd.grad(m.weight(leaf, a), leaf)
    if adv != 0:
        assert float(dfdr) == pytest.approx(gate, rel=1e-14, abs=0)


def test_edges_are_where_the_table_says():
    assert rlgates.get("ppo").high == 1.2 and rlgates.get("ppo").low == 0.8
    assert rlgates.get("dapo").high == 1.28 and rlgates.get("dapo").low == 0.8
    assert rlgates.get("sao").high == 6.0 and rlgates.get("sao").low == 0.7
    assert rlgates.get("gspo").high == 1.0004 and rlgates.get("gspo").low == 0.9997


def test_clip_weights_are_exact_clips():
    """f is the formula itself, bit for bit: no nudged edges."""
    r = torch.linspace(-3, 3, 2001, dtype=torch.float64).exp()
    assert torch.equal(rlgates.get("sao").weight(r, torch.ones(1, dtype=torch.float64)),
                       r.clamp(0.7, 6.0))
    ppo = rlgates.get("ppo")
    assert torch.equal(ppo.weight(r, torch.tensor(1.0, dtype=torch.float64)), r.clamp(max=1.2))
    assert torch.equal(ppo.weight(r, torch.tensor(-1.0, dtype=torch.float64)), r.clamp(min=0.8))


def test_strict_clamp_matches_clamp_and_has_zero_slope_at_the_edges():
    from rlgates._numerics import strict_clamp

    x = torch.tensor([0.5, 0.7, math.nextafter(0.7, 1), 1.0, math.nextafter(6.0, 0), 6.0, 7.0],
                     dtype=torch.float64, requires_grad=True)
    y = strict_clamp(x, 0.7, 6.0)
    assert torch.equal(y, x.detach().clamp(0.7, 6.0))
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    inner = torch.tensor([0.9, 1.3, 4.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: strict_clamp(t, 0.7, 6.0), (inner,))
