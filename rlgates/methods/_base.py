"""The `Method` base class and the registry.

A method is one class that carries every fact about it: its formulas (`_weight` is f, `_gate` is
f'), defaults, default aggregation and its source, plot range, colour, slider ranges, the
explorer's JavaScript, and the trainers' flags. Decorate the class with `@register` where it is
defined; every per-method table in the library, the book and the tests is derived from here.

Every elementwise function takes `side=None`: a method that reads more than (ρ, A) names the
fields in `side_inputs` (see rlgates._side) and reads them from the completed `SideInfo` that
`_weight`, `_gate`, `token_objective` and `grad_coefficient` receive; the others ignore it. One
loss path: `loss` = −aggregate(token_objective·is_weight, mask, agg).
"""

from __future__ import annotations

import math

import torch

from .. import _numerics as nx
from .. import _side
from .._side import SideInfo

#: name -> class, filled by `@register` in the family modules (clip, window, smooth, ...).
REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: add a Method subclass to the registry under `cls.name`."""
    key = cls.name
    if not key or key != key.lower():
        raise ValueError(f"a registered method needs a lowercase name, got {key!r}")
    if key in REGISTRY and REGISTRY[key] is not cls:
        raise ValueError(f"a method named {key!r} is already registered; unregister it first")
    REGISTRY[key] = cls
    return cls


def unregister(name: str) -> type[Method]:
    """Remove a method from the registry (tests that register one undo it with this)."""
    try:
        return REGISTRY.pop(str(name).lower())
    except KeyError:
        raise ValueError(f"no registered method {name!r}") from None


def names(chapter: int | None = None) -> list[str]:
    """The registered method names: the article's methods in its order, then the others.

    chapter None: all of them. A number: the methods a reader has met by that chapter (those
    whose `chapter` is None, i.e. from the start, or at most that number), so that a page's
    loops keep their content when a later chapter adds methods."""
    keys = sorted(REGISTRY, key=lambda k: REGISTRY[k].order)
    if chapter is None:
        return keys
    return [k for k in keys if (REGISTRY[k].chapter or 0) <= chapter]


def get(name: str, **hparams) -> Method:
    """Build a method by name: rlgates.get("dapo", eps_high=0.3)."""
    key = str(name).lower()
    if key not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(names())}")
    return REGISTRY[key](**hparams)


def _hparam(method, name, value, *, low=None, low_open=False, below=None):
    """Validate one hyperparameter: a finite real number within the stated range."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{method}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{method}: {name} must be finite, got {value!r}")
    if low is not None and (v <= low if low_open else v < low):
        op = ">" if low_open else "≥"
        raise ValueError(f"{method}: {name} must be {op} {low}, got {value!r}")
    if below is not None and v >= below:
        raise ValueError(f"{method}: {name} must be < {below}, got {value!r}")
    return v


def _window(method):
    """Validate `eps_low` ≥ 0 and `eps_high` ≥ 0; return the window (1 − ε_l, 1 + ε_h).

    ε_l ≥ 1 puts the lower edge at or below 0, where no ratio lies: no lower clip. verl accepts
    such a `clip_ratio_low` and computes exactly that, so the methods do too (`bounds` then
    leaves the lower edge out)."""
    h = method.hparams
    h["eps_low"] = _hparam(method.name, "eps_low", h["eps_low"], low=0)
    h["eps_high"] = _hparam(method.name, "eps_high", h["eps_high"], low=0)
    return 1 - h["eps_low"], 1 + h["eps_high"]


def _shape(ratio, adv):
    """The shape (ρ, A) broadcast to: every elementwise result has it."""
    return torch.broadcast_shapes(ratio.shape, adv.shape)


class Method:
    """Base class: a token objective J = f(ρ; A)·A and everything derived from it.

    Subclasses set the class attributes below and implement `_weight` (f) and `_gate` (f') on
    float tensors; `@register` makes them available to `rlgates.get`.
    """

    # --- identity -----------------------------------------------------------------------------
    name = ""  # registry name, lowercase
    title = ""  # display name
    date = ""  # when the paper appeared
    paper = ""  # citation with arXiv id
    order = 100.0  # position in `names()`: the article's methods first, in its order
    article_row: int | None = None  # its row in the article's Table 1 (None: not in it)
    level = "token"  # "token", "sequence" (geometric mean) or "sequence-product": the gate's ratio
    hard = False  # True: the gate is 0 or 1 everywhere
    #: the chapter that introduces the method (None: from the start); `names(chapter=n)` keeps
    #: a page's loops to the methods met by chapter n
    chapter: int | None = None
    #: the `SideInfo` fields the method reads beyond (ρ, A) (empty: a gate of (ρ, A) alone)
    side_inputs: tuple[str, ...] = ()
    # --- defaults -----------------------------------------------------------------------------
    defaults: dict = {}
    agg = "token-mean"  # the default aggregation of `loss`: the paper's convention
    agg_source = ""  # where that default comes from, and where a trainer differs
    # --- figures, sliders, explorer ------------------------------------------------------------
    color = "0.35"  # line colour in learning curves (red and blue stay reserved for the sign of A)
    log_ratio_lim = 0.6  # half-height of the log ρ axis, so that the gate's edges are visible
    slider_ranges: dict = {}  # hyperparameter -> (min, max, step) of its slider
    param_labels = {"eps": "ε", "eps_low": "ε<sub>l</sub>", "eps_high": "ε<sub>h</sub>",
                    "tau_pos": "τ<sub>pos</sub>", "tau_neg": "τ<sub>neg</sub>", "c": "c"}
    #: The gate in JavaScript for the web explorer: {"gate": expression in r (ρ), a (A) and p
    #: (the hyperparameters), "bounds": expression giving [[ratio, side], ...]}; None: the
    #: explorer does not offer this method. The browser test checks it against `gate`.
    explorer: dict | None = None
    #: How the big trainers spell this loss: {"verl": settings, "trl": settings}, each a dict
    #: (a str value that names a hyperparameter stands for its value; a callable gets the
    #: hyperparameters), a callable of the hyperparameters, or None (no built-in equivalent).
    #: Resolved by rlgates.trainers.flags; tested against TRL and verl in tests/test_trainers.py.
    trainer_flags: dict = {}
    # --- Table 1 --------------------------------------------------------------------------------
    f_latex = ""
    gate_latex = ""
    gate_text = ""  # f' in plain text, for the README's table (empty: gate_latex is shown)
    insight = ""

    def __init__(self, **hparams):
        unknown = sorted(set(hparams) - set(self.defaults))
        if unknown:
            known = ", ".join(self.defaults) or "no hyperparameters"
            raise ValueError(f"{self.name}: unknown hyperparameter(s) {unknown}; it takes {known}")
        self.hparams = {**self.defaults, **hparams}
        self._validate()

    def _validate(self):
        pass

    @classmethod
    def slider_range(cls, key: str) -> tuple[float, float, float]:
        """(min, max, step) of the slider for hyperparameter `key`."""
        if key in cls.slider_ranges:
            return cls.slider_ranges[key]
        return (0.0, max(2 * float(cls.defaults.get(key, 0.5)), 1.0), 0.01)

    # --- the elementwise functions of (ρ, A), and of the side information if any -------------
    def weight(self, ratio: torch.Tensor | float, adv: torch.Tensor | float,
               side: SideInfo | None = None) -> torch.Tensor:
        """f(ρ; A): the weight whose product with A is the token objective."""
        ratio, adv, side = self._lift(ratio, adv, side)
        return self._weight(ratio, adv, side).expand(_shape(ratio, adv))

    def gate(self, ratio: torch.Tensor | float, adv: torch.Tensor | float,
             side: SideInfo | None = None) -> torch.Tensor:
        """f'(ρ; A) = ∂f/∂ρ: how much of the shared term ρ·A·∇log π gets through. `side`: the
        fields in `side_inputs`, held fixed (a method without side inputs ignores it)."""
        ratio, adv, side = self._lift(ratio, adv, side)
        return self._gate(ratio, adv, side).expand(_shape(ratio, adv))

    def signal(self, ratio: torch.Tensor | float, adv: torch.Tensor | float,
               side: SideInfo | None = None) -> torch.Tensor:
        """The learning signal f'(ρ; A)·ρ·A: the gradient's coefficient on ∇log π."""
        ratio, adv, side = self._lift(ratio, adv, side)
        return self._gate(ratio, adv, side) * ratio * adv

    def objective(self, ratio: torch.Tensor | float, adv: torch.Tensor | float,
                  side: SideInfo | None = None) -> torch.Tensor:
        """The token objective J = f(ρ; A)·A."""
        ratio, adv, side = self._lift(ratio, adv, side)
        return self._weight(ratio, adv, side) * adv

    def _weight(self, ratio, adv, side=None):
        """f(ρ; A) on float tensors of one dtype (each method writes its own)."""
        raise NotImplementedError(f"{type(self).__name__} defines no _weight")

    def _gate(self, ratio, adv, side=None):
        """f'(ρ; A), the closed form (each method writes its own)."""
        raise NotImplementedError(f"{type(self).__name__} defines no _gate")

    def _lift(self, ratio, adv, side=None):
        """(ratio, adv, side): the inputs as float tensors of one dtype, and `side` checked
        (None for a gate of (ρ, A) alone)."""
        ratio, adv = nx.as_float(ratio, "ratio"), nx.as_float(adv, "adv")
        dtype = nx.compute_dtype(ratio, adv)
        ratio, adv = ratio.to(dtype), adv.to(dtype)
        if not self.side_inputs:
            return ratio, adv, None
        return ratio, adv, self._require(_side.checked_side(side), ratio, _shape(ratio, adv))

    def _require(self, side, like, shape):
        """`side` in `like`'s dtype, each field checked to broadcast to `shape`; a ValueError
        naming the method and the field if one it reads is missing."""
        missing = [f for f in self.side_inputs if side is None or getattr(side, f) is None]
        if missing:
            what = "; ".join(f"sideinfo.{f}: {_side.FIELDS[f]}" for f in missing)
            raise _side.MissingSide(
                self.name, missing[0], f"{self.name} reads side information that was not given: "
                f"{what}. Pass side=rlgates.SideInfo({missing[0]}=...)")
        return side.to(like, shape)

    def side_from_batch(self, logp, logp_old, adv, mask, side=None):
        """The `SideInfo` the loss of this batch reads (None for a gate of (ρ, A) alone): `side`
        completed with what the batch gives (`rlgates._side.from_batch`, then `_derive_side`),
        checked against the batch's shape. Inputs as `check_loss_inputs` returns them. The one
        place where side inputs are completed."""
        if not self.side_inputs:
            return None
        side = _side.from_batch(_side.checked_side(side), logp, logp_old, adv, mask,
                                self.side_inputs)
        side = self._derive_side(logp, logp_old, adv, mask, side)
        return self._require(side, logp, logp.shape)

    def _derive_side(self, logp, logp_old, adv, mask, side):
        """A method's own batch-level fields (e.g. the tokens a covariance rule picks), from the
        batch and the fields given; by default none."""
        return side

    def bounds(self):
        """Hard gate edges for plots: [(ratio, side)], side +1 (A>0), -1 (A<0) or 0 (both)."""
        return []

    # --- the loss -------------------------------------------------------------------------------
    def token_objective(self, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                        mask: torch.Tensor, side: SideInfo | None = None) -> torch.Tensor:
        """[B, T] the objective J_t = f(ρ_t; A_t)·A_t, differentiable in logp. Inputs already
        checked (`check_loss_inputs`); `side`: the completed SideInfo, or None. A loss that
        trainers write in another form with the same gradient (CISPO, DRO) overrides this."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp, logp_old, mask))
        return self._weight(ratio, adv, side) * adv

    def loss(self, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
             mask: torch.Tensor | None = None, agg: str | None = None,
             is_weight: torch.Tensor | None = None,
             side: SideInfo | None = None) -> torch.Tensor:
        """Minus the aggregated objective: a scalar whose gradient flows into `logp` only.

        logp, logp_old, mask: [B, T]; adv: [B] or [B, T]; agg: one of rlgates.AGG_MODES, or None
        for this method's own default `self.agg`. is_weight: an optional importance weight,
        [B] or [B, T], taken as a constant (no gradient) and multiplied into each token's
        objective: an off-policy correction outside the gate (rlgates.offpolicy). side: an
        rlgates.SideInfo with the fields in `side_inputs` the batch does not give (ignored by a
        method without side inputs).
        """
        agg = self.agg if agg is None else agg
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp, logp_old, adv, mask, agg)
        side = self.side_from_batch(logp, logp_old, adv, mask, side)
        objective = self.token_objective(logp, logp_old, adv, mask, side)
        if is_weight is not None:
            objective = objective * nx.check_is_weight(is_weight, mask, objective.dtype)
        return -nx.aggregate(objective, mask, agg)

    def grad_coefficient(self, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                         mask: torch.Tensor, side: SideInfo | None = None) -> torch.Tensor:
        """[B, T] f'(ρ; A)·ρ·A: the coefficient on ∇log π of each token (eq. 5). ρ is the ratio
        the gate sees (ρ_s for sequence-level methods); where the log-ratio clamp is active the
        gradient is zero. `side`: as in `token_objective`."""
        log_ratio = nx.gate_log_ratio(logp, logp_old, mask, self.level)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        ratio = nx.ratio_from_log(log_ratio)
        return self._gate(ratio, adv, side) * ratio * adv * inside

    def expected_grad(self, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                      mask: torch.Tensor | None = None, agg: str | None = None,
                      is_weight: torch.Tensor | None = None,
                      side: SideInfo | None = None) -> torch.Tensor:
        """Closed-form ∂loss/∂logp = −f'(ρ; A)·ρ·A·w_t (eq. 5), w_t the aggregation weight,
        times `is_weight` when one is given; `side` as in `loss`."""
        agg = self.agg if agg is None else agg
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask, agg)
        side = self.side_from_batch(logp, logp_old, adv, mask, side)
        w = nx.aggregation_weight(mask, agg).to(logp.dtype)
        grad = -self.grad_coefficient(logp, logp_old, adv, mask, side) * w
        if is_weight is not None:
            grad = grad * nx.check_is_weight(is_weight, mask, grad.dtype)
        return grad

    def token_gate(self, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                   mask: torch.Tensor | None = None, side: SideInfo | None = None) -> torch.Tensor:
        """[B, T] the gate f' each token of a batch sees, at the ratio its gate sees (ρ_s at
        sequence level), with the side information completed from the batch as `loss` does."""
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask,
                                                         self.agg)
        side = self.side_from_batch(logp, logp_old, adv, mask, side)
        ratio = nx.ratio_from_log(nx.gate_log_ratio(logp, logp_old, mask, self.level))
        return self._gate(ratio, adv, side).expand(logp.shape)

    def __repr__(self):
        args = ", ".join(f"{k}={v:g}" for k, v in self.hparams.items())
        return f"rlgates.get({self.name!r}{', ' if args else ''}{args})"
