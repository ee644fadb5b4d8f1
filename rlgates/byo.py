"""Bring your own gate: write a weight f(ρ; A), get its gate, figures, checks and a lab run.

    >>> from rlgates import byo
    >>> soft = byo.make(lambda r, a, w=0.5: ..., name="soft")   # f(ρ; A) in torch
    >>> soft.gate(ratio, adv)             # f'(ρ; A), derived from f by autograd
    >>> print(byo.verify(soft))           # eq. 5 for every agg; f' vs finite differences
    >>> rlgates.plot_gate_signal(soft)    # the gate | signal panels of Part I
    >>> byo.plot_profiles(soft, "ppo")    # f and f' against log ρ, for A > 0 and A < 0
    >>> runs = lab.run_many({"soft": soft, "ppo": "ppo"}, seeds=(0, 1))   # train the lab's policy

The weight function takes the ratio ρ and the advantage A as tensors of one shape (plus any
hyperparameters as keyword arguments) and must be elementwise and differentiable in ρ almost
everywhere: torch.where, clamp, exp, log, sigmoid ... The loss is J = f(ρ; A)·A aggregated as in
every other method, so autograd gives the gradient f'(ρ; A)·ρ·A·∇log π of eq. 5.

Notes on the derived gate: where f has a kink (a torch.where or clamp edge), autograd picks one
side (torch.where: the branch selected at that point; clamp: 1 at the bound). At A = 0 the gate
is whatever f's A ≤ 0 branch gives (the built-in methods report 0 there); the signal is 0 anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import _numerics as nx
from .check import check_gradient
from .figures import plot_profiles
from .methods import get
from .methods._base import REGISTRY, Method, _hparam, unregister
from .methods._base import register as _register


class CustomMethod(Method):
    """A Method built from a user's weight function; the gate is f's autograd derivative in ρ.

    Subclasses are made by `make`; each sets `weight_fn` (and optionally `bounds_fn`, `check_fn`).
    """

    name, title, date = "custom", "Custom gate", "your own"
    paper = "your own gate (rlgates.byo)"
    weight_fn = None
    bounds_fn = None
    check_fn = None

    def _validate(self):
        for k, v in self.hparams.items():
            self.hparams[k] = _hparam(self.name, k, v)
        if self.check_fn is not None:
            self.check_fn(**self.hparams)  # raises ValueError on a bad combination

    def _weight(self, ratio, adv, side=None):
        shape = torch.broadcast_shapes(ratio.shape, adv.shape)
        f = type(self).weight_fn(ratio.expand(shape), adv.expand(shape), **self.hparams)
        f = torch.as_tensor(f, dtype=ratio.dtype, device=ratio.device)
        if f.shape != shape:
            raise ValueError(f"{self.name}: the weight function must be elementwise; it returned "
                             f"shape {tuple(f.shape)} for inputs of shape {tuple(shape)}")
        return f

    def _gate(self, ratio, adv, side=None):
        shape = torch.broadcast_shapes(ratio.shape, adv.shape)
        with torch.enable_grad():
            r = ratio.detach().expand(shape).clone().requires_grad_(True)
            f = self._weight(r, adv.detach().expand(shape))
            if not f.requires_grad:  # f does not depend on ρ at all
                return torch.zeros(shape, dtype=ratio.dtype, device=ratio.device)
            (g,) = torch.autograd.grad(f.sum(), r, allow_unused=True)
        if g is None:
            return torch.zeros(shape, dtype=ratio.dtype, device=ratio.device)
        return g

    def bounds(self):
        fn = type(self).bounds_fn
        if fn is None:
            return []
        return list(fn(**self.hparams)) if callable(fn) else list(fn)


def make(weight, name="custom", *, title=None, bounds=None, check=None, f_latex="",
         gate_latex="", insight="", register=False, **defaults) -> CustomMethod:
    """A Method-like object from a weight function f(ρ, A, **hparams).

    weight: elementwise torch function of (ratio, adv) and the hyperparameters.
    name, title: labels in figures, lab runs and `repr`.
    bounds: hard gate edges to draw, [(ratio, side)] with side +1 (A>0), −1 (A<0), 0 (both), or a
        function of the hyperparameters that returns them. Smooth gates leave it out (the figures
        then draw the contour where the gate has halved).
    check: optional function of the hyperparameters that raises ValueError on bad values.
    register: also add it to the registry under `name`, so that rlgates.get(name, ...) and the
        small-multiples and slider helpers work with it (a built-in name cannot be replaced).
    defaults: the hyperparameters and their default values (numbers).
    """
    if not callable(weight):
        raise ValueError(f"weight must be a function f(ratio, adv, **hparams), got {weight!r}")
    key = str(name).lower()
    attrs = {
        "name": key, "title": title or name, "defaults": dict(defaults),
        "weight_fn": staticmethod(weight), "bounds_fn": bounds,
        "check_fn": staticmethod(check) if check is not None else None,
        "f_latex": f_latex, "gate_latex": gate_latex, "insight": insight,
    }
    cls = type(f"Custom_{key}", (CustomMethod,), attrs)
    method = cls()
    if register:
        old = REGISTRY.get(key)
        if old is not None and not issubclass(old, CustomMethod):
            raise ValueError(f"{key!r} is a built-in method; pick another name")
        if old is not None:
            unregister(key)
        _register(cls)
    return method


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
@dataclass
class Verification:
    """What `verify` measured. `ok` is True when eq. 5 holds, f' matches finite differences of f
    (away from a few kink points) and the gate is never negative."""

    name: str
    eq5: dict  # agg -> max |autograd − gate·ρ·A·w| over the test batches
    fd_max: float  # max |f' − finite difference of f| over grid points away from kinks
    fd_kinks: float  # share of grid points where they disagree (kinks): should be tiny
    gate_at_one: tuple  # (min, max) of f'(1; A) over A: 1 means "REINFORCE when on-policy"
    gate_range: tuple  # (min, max) of f' on the grid
    signal_max: float  # max |f'·ρ·A| on the grid (|A| ≤ 1, |log ρ| ≤ grid_lim)
    grid_lim: float
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (max(self.eq5.values()) < 1e-12 and self.fd_kinks < 0.01 and self.fd_max < 1e-5
                and self.gate_range[0] >= 0)

    def __str__(self):
        lines = [f"{self.name}: {'all checks pass' if self.ok else 'CHECK FAILED'}"]
        worst = max(self.eq5.values())
        lines.append(f"  eq. 5 (autograd = gate·ρ·A·w), worst over {len(self.eq5)} aggregations: "
                     f"{worst:.1e}")
        lines.append(f"  gate vs finite differences of f: max error {self.fd_max:.1e} away from "
                     f"kinks; {100 * self.fd_kinks:.2f}% of grid points at kinks")
        lo, hi = self.gate_at_one
        lines.append(f"  gate at ρ = 1: {lo:.3g} to {hi:.3g}   gate range: "
                     f"[{self.gate_range[0]:.3g}, {self.gate_range[1]:.3g}]   "
                     f"max |signal| for |log ρ| ≤ {self.grid_lim:g}: {self.signal_max:.3g}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _ragged_batch(seed, scale, B=6, T=9, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = logp_old + scale * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0  # one fully masked sequence
    return logp, logp_old, adv, nx.ragged_mask(lengths, T)


def verify(method, seeds=(0, 1, 2), scales=(0.3, 1.0), grid_lim=2.0, n=401) -> Verification:
    """Check a method (built-in or `make`'s) the way the test suite checks the built-in ones.

    1. eq. 5 (as rlgates.check_gradient): autograd's gradient of `loss` equals
       gate·ρ·A·(aggregation weight), for every
       aggregation, on ragged float64 batches (small and large ratio spreads).
    2. The gate against central finite differences of `weight`, on a grid of log ρ ∈ ±grid_lim
       and A ∈ {±0.5, ±1}. Isolated disagreements are kinks; many mean f is not what autograd
       differentiates (a .detach() inside f, say).
    3. Properties worth knowing: the gate at ρ = 1, its range (a negative gate flips the update's
       sign), and how large the learning signal can get.
    """
    method = get(method) if isinstance(method, str) else method
    eq5 = {agg: max(check_gradient(method, *_ragged_batch(seed, scale), agg)[2]
                    for seed in seeds for scale in scales) for agg in nx.AGG_MODES}

    log_ratio = torch.linspace(-grid_lim, grid_lim, n, dtype=torch.float64)[:, None]
    adv = torch.tensor([-1.0, -0.5, 0.5, 1.0], dtype=torch.float64)[None, :]
    ratio = log_ratio.exp()
    h = 1e-6
    fd = (method.weight(ratio + h * ratio, adv) - method.weight(ratio - h * ratio, adv)) / (
        2 * h * ratio)
    gate = method.gate(ratio, adv)
    err = (fd - gate).abs() / gate.abs().clamp(min=1.0)
    kinks = err > 1e-4
    fd_max = float(err[~kinks].max()) if (~kinks).any() else math.inf

    a_line = torch.linspace(-1, 1, 9, dtype=torch.float64)
    a_line = a_line[a_line != 0]
    at_one = method.gate(torch.ones_like(a_line), a_line)
    signal = method.signal(ratio, adv)
    notes = []
    if float(gate.min()) < 0:
        notes.append("the gate is negative somewhere: there the update pushes the wrong way")
    if not torch.allclose(at_one, torch.ones_like(at_one)):
        notes.append("the gate is not 1 at ρ = 1: even on-policy, this is not plain REINFORCE")
    return Verification(
        name=getattr(method, "name", type(method).__name__), eq5=eq5, fd_max=fd_max,
        fd_kinks=float(kinks.double().mean()), gate_at_one=(float(at_one.min()),
                                                             float(at_one.max())),
        gate_range=(float(gate.min()), float(gate.max())),
        signal_max=float(signal.abs().max()), grid_lim=grid_lim, notes=notes)


__all__ = ["CustomMethod", "Verification", "make", "plot_profiles", "verify"]
