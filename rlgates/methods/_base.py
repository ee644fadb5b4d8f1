"""The `Method` base class and the registry.

A method is one class that carries every fact about it: its formulas (`_weight` is f, `_gate` is
f'), defaults, default aggregation and its source, plot range, colour, slider ranges, the
explorer's JavaScript, and the trainers' flags. Decorate the class with `@register` where it is
defined; every per-method table in the library, the book and the tests is derived from here.

A method that reads more than (ρ, A) names the fields in `side_inputs` (see rlgates._side); its
`_weight`, `_gate`, `token_objective` and `grad_coefficient` then take the completed
`SideInfo` as one more, last argument. That is the whole extension: one class still suffices.
"""

from __future__ import annotations

import math

from .. import _numerics as nx
from .. import _side

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
    #: whether `loss` sums `objective_parts` (False when a class changes `token_objective`
    #: and not them: `__init_subclass__`)
    _by_parts = True
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
    def weight(self, ratio, adv, side=None):
        """f(ρ; A): the weight whose product with A is the token objective."""
        ratio, adv, extra = self._lift(ratio, adv, side)
        return self._weight(ratio, adv, *extra)

    def gate(self, ratio, adv, side=None):
        """f'(ρ; A) = ∂f/∂ρ: how much of the shared term ρ·A·∇log π gets through. `side`: the
        fields in `side_inputs`, held fixed (a method without side inputs ignores it)."""
        ratio, adv, extra = self._lift(ratio, adv, side)
        return self._gate(ratio, adv, *extra)

    def signal(self, ratio, adv, side=None):
        """The learning signal f'(ρ; A)·ρ·A: the gradient's coefficient on ∇log π."""
        ratio, adv, extra = self._lift(ratio, adv, side)
        return self._gate(ratio, adv, *extra) * ratio * adv

    def objective(self, ratio, adv, side=None):
        """The token objective J = f(ρ; A)·A."""
        ratio, adv, extra = self._lift(ratio, adv, side)
        return self._weight(ratio, adv, *extra) * adv

    def _lift(self, ratio, adv, side=None):
        """(ratio, adv, extra): the inputs as float tensors of one dtype, and `extra` the
        arguments after them: () for a gate of (ρ, A), (side,) for a method with side inputs."""
        ratio, adv = nx.as_float(ratio, "ratio"), nx.as_float(adv, "adv")
        dtype = nx.compute_dtype(ratio, adv)
        ratio, adv = ratio.to(dtype), adv.to(dtype)
        if not self.side_inputs:
            return ratio, adv, ()
        shape = nx.broadcast_shape(ratio.shape, adv.shape)
        return ratio, adv, (self._require(_side.checked_side(side), ratio, shape),)

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
        checked against the batch's shape. Inputs as `check_loss_inputs` returns them."""
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
    def objective_parts(self, logp, logp_old, adv, mask, *side):
        """J_t as (term, weight), J_t = term·weight: the term [B, T] differentiable in logp, the
        weight a constant [B, 1|T] (here A; CISPO's sg(clip(ρ))·A with log π as the term).
        `loss` sums term·weight with no [B, T] product, and the gradient takes one product of
        the weight. Inputs already checked and lifted; `side`: the completed SideInfo, for a
        method with side inputs only."""
        # Padding may hold NaN or ±inf: `aggregate` drops it from the value, and the log-ratio
        # clamp's backward sends it zero gradient (NaN fails the clamp's range test), so the
        # token path needs no masking pass of its own (tested).
        ratio = nx.ratio_from_log(logp - logp_old)
        return self._weight(ratio, adv, *side), adv

    def token_objective(self, logp, logp_old, adv, mask, *side):
        """[B, T] objective J_t, differentiable in logp: term·weight of `objective_parts`."""
        term, weight = self.objective_parts(logp, logp_old, adv, mask, *side)
        return term * weight

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        defined = [next(i for i, c in enumerate(cls.__mro__) if name in vars(c))
                   for name in ("token_objective", "objective_parts")]
        cls._by_parts = defined[0] >= defined[1]  # token_objective is not newer than the parts

    def loss(self, logp, logp_old, adv, mask=None, agg=None, is_weight=None, side=None):
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
        extra = self._batch_side(logp, logp_old, adv, mask, side)
        if self._by_parts and is_weight is None:
            term, weight = self.objective_parts(logp, logp_old, adv, mask, *extra)
            return -nx.aggregate(term, mask, agg, factor=weight)
        objective = self.token_objective(logp, logp_old, adv, mask, *extra)
        w = None if is_weight is None else nx.check_is_weight(is_weight, mask, objective.dtype)
        return -nx.aggregate(objective, mask, agg, factor=w)

    def _batch_side(self, logp, logp_old, adv, mask, side):
        """() for a gate of (ρ, A); (the completed SideInfo,) for a method with side inputs."""
        if not self.side_inputs:
            return ()
        return (self.side_from_batch(logp, logp_old, adv, mask, side),)

    def grad_coefficient(self, logp, logp_old, adv, mask, *side):
        """[B, T] f'(ρ; A)·ρ·A: the coefficient on ∇log π of each token (eq. 5). ρ is the ratio
        the gate sees (ρ_s for sequence-level methods); where the log-ratio clamp is active the
        gradient is zero. `side`: as in `token_objective`."""
        log_ratio = nx.gate_log_ratio(logp, logp_old, mask, self.level)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        ratio = nx.ratio_from_log(log_ratio)
        return self._gate(ratio, adv, *side) * ratio * adv * inside

    def expected_grad(self, logp, logp_old, adv, mask=None, agg=None, is_weight=None,
                      side=None):
        """Closed-form ∂loss/∂logp = −f'(ρ; A)·ρ·A·w_t (eq. 5), w_t the aggregation weight,
        times `is_weight` when one is given; `side` as in `loss`."""
        agg = self.agg if agg is None else agg
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask, agg)
        extra = self._batch_side(logp, logp_old, adv, mask, side)
        w = nx.aggregation_weight(mask, agg).to(logp.dtype)
        grad = -self.grad_coefficient(logp, logp_old, adv, mask, *extra) * w
        if is_weight is not None:
            grad = grad * nx.check_is_weight(is_weight, mask, grad.dtype)
        return grad

    def token_gate(self, logp, logp_old, adv, mask=None, side=None):
        """[B, T] the gate f' each token of a batch sees, at the ratio its gate sees (ρ_s at
        sequence level), with the side information completed from the batch as `loss` does."""
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask,
                                                         self.agg)
        extra = self._batch_side(logp, logp_old, adv, mask, side)
        ratio = nx.ratio_from_log(nx.gate_log_ratio(logp, logp_old, mask, self.level))
        return self._gate(ratio, adv, *extra).expand(logp.shape)

    def __repr__(self):
        args = ", ".join(f"{k}={v:g}" for k, v in self.hparams.items())
        return f"rlgates.get({self.name!r}{', ' if args else ''}{args})"
