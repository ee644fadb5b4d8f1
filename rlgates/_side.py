"""Side information: what a loss reads beyond the ratio ρ and the advantage A.

Most methods are a gate f'(ρ; A). Some read more: DPPO's mask reads π_old itself, Clip-Cov and
KL-Cov pick tokens by a batch covariance, an entropy mask reads each token's entropy. Such a
method names the fields it reads in `Method.side_inputs`, and every function of a method
(`loss`, `gate`, `weight`, `signal`, `objective`, `grad_coefficient`, `expected_grad`,
`rlgates.check_gradient`) takes them alike, as one typed argument `side=SideInfo(...)`.

    >>> side = rlgates.SideInfo(probs_old=torch.full((4, 8), 0.9))
    >>> rlgates.get("dppo_tv").gate(ratio, adv, side)     # the gate at these π_old

In `loss` and `expected_grad` the fields the batch itself gives are derived when not passed
(`from_batch`): `probs_old` = exp(logp_old) and `cov` from (logp, adv, mask). The caller
supplies the rest; a field a method needs and nobody gave raises a ValueError that names the
method and the field. A method with no `side_inputs` ignores `side`.

On the plane (`gate(ratio, adv, side)`, the figures) the side information is held fixed while
ρ and A vary: each figure of such a method says which values it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass(frozen=True)
class Field:
    """One SideInfo field: what it holds, and its range (None: unbounded on that side; an open
    end excludes its bound). The checker, its error message and `FIELDS`' text all read it."""

    holds: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # said after the range

    @property
    def range(self) -> str:
        """The range in words: "in (0, 1]", "≥ 0", "≤ 0" ("" when unbounded)."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{lo:g}, {hi:g}{right}"
        if lo is not None:
            return f"{'>' if self.low_open else '≥'} {lo:g}"
        if hi is not None:
            return f"{'<' if self.high_open else '≤'} {hi:g}"
        return ""

    def ok(self, low, high) -> torch.Tensor:
        """Whether a tensor's min `low` and max `high` are finite and in range (NaN fails)."""
        ok = (low > -torch.inf) & (high < torch.inf)
        if self.low is not None:
            ok = ok & ((low > self.low) if self.low_open else (low >= self.low))
        if self.high is not None:
            ok = ok & ((high < self.high) if self.high_open else (high <= self.high))
        return ok

    def outside(self, t) -> torch.Tensor:
        """Where the (finite) values of `t` are out of range."""
        out = torch.zeros_like(t, dtype=torch.bool)
        if self.low is not None:
            out |= (t <= self.low) if self.low_open else (t < self.low)
        if self.high is not None:
            out |= (t >= self.high) if self.high_open else (t > self.high)
        return out

    def __str__(self):
        """What the field holds and its range, as the errors and the API page quote it."""
        return ", ".join(x for x in (self.holds, self.range) if x) + self.note


#: field → what it holds and its range: the one place each range is written (`str(FIELDS[f])`
#: is the text the errors and the API page quote)
FIELDS = {
    "probs_old": Field("π_old of each sampled token", low=0, low_open=True, high=1),
    "entropy": Field("the policy's entropy at each token", low=0),
    "sampler_logp": Field("the rollout engine's log-prob of each token", high=0),
    "cov": Field("each token's centred covariance term (log π − mean log π)·(A − mean A), means "
                 "over the batch's real tokens"),
    "draw": Field("a random key per token", low=0, high=1,
                  note=": where a loss picks tokens at random it takes those with the smallest "
                       "keys (a random permutation's law), so a given draw makes the pick "
                       "reproducible"),
    "picked": Field("1 (or True) on the tokens a batch-level rule singled out, else 0"),
}


@dataclass(frozen=True)
class SideInfo:
    """Per-token inputs of a loss beyond (ρ, A); each optional, each a tensor broadcastable to
    the [B, T] batch (a Python number is taken as a 0-d float64 tensor). Validated when made:
    finite, and in its range; padding must hold a valid value too (0 for `cov`, 1 for
    `probs_old`). An error names the field: "sideinfo.entropy must be ≥ 0, got -0.1".

    What each field holds and its range: `FIELDS`. Who reads them:

    - probs_old: DPPO. The loss derives it as exp(logp_old); on the plane ρ alone does not
      give it.
    - entropy: an entropy mask.
    - sampler_logp: off-policy masks.
    - cov: Clip-Cov, KL-Cov. The loss derives it (`batch_cov`).
    - draw: a loss that picks tokens at random (Clip-Cov).
    - picked: Clip-Cov drops them, KL-Cov pulls them back; the method derives it from `cov`
      (and `draw`) unless it is given.

    `index(r, shape)` takes one run's (or some rows') part of a batched SideInfo.

        >>> side = rlgates.SideInfo(probs_old=0.3)           # held fixed on the plane
        >>> rlgates.get("dppo_tv").gate(ratio, adv, side)
        >>> rlgates.get("clip_cov").loss(logp, logp_old, adv, mask,
        ...                              side=rlgates.SideInfo(draw=torch.rand(logp.shape)))
    """

    probs_old: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    cov: torch.Tensor | None = None
    draw: torch.Tensor | None = None
    picked: torch.Tensor | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, _checked(f.name, value))

    def _with(self, values) -> SideInfo:
        """A copy with `values` set, checking only the values that are not already this
        object's (checked) tensors: a loss completes its side information several times per
        call, and each check is a pass over a [B, T] tensor."""
        out = object.__new__(SideInfo)
        for f in fields(self):
            value = values.get(f.name, getattr(self, f.name))
            if value is not None and value is not getattr(self, f.name):
                value = _checked(f.name, value)
            object.__setattr__(out, f.name, value)
        return out

    def given(self) -> tuple[str, ...]:
        """The names of the fields that hold a value."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)

    def replace(self, **values) -> SideInfo:
        """A copy with some fields set (validated like the constructor's)."""
        unknown = set(values) - {f.name for f in fields(self)}
        if unknown:
            return replace(self, **values)  # dataclasses' own error names the field
        return self._with(values)

    def to(self, like: torch.Tensor, shape=None) -> SideInfo:
        """Every field in `like`'s dtype and device; with `shape`, each checked to broadcast to
        it (the error names the field)."""
        out = {}
        for name in self.given():
            value = getattr(self, name)
            if shape is not None:
                try:
                    torch.broadcast_shapes(value.shape, tuple(shape))
                except RuntimeError:
                    raise ValueError(f"sideinfo.{name} has shape {tuple(value.shape)}, which "
                                     f"does not broadcast to the batch's {tuple(shape)}") from None
            dtype = like.dtype if value.dtype != torch.bool else torch.bool
            out[name] = value.to(device=like.device, dtype=dtype)
        return self._with(out) if out else self

    def index(self, r, shape=None) -> SideInfo:
        """The part of a batched SideInfo that belongs to run (or rows) `r`: every field indexed
        by `r` along its first dimension (`r` any index torch takes: an int, a slice, a tensor
        of rows). shape: the batch's [..., B, T]; each field is first broadcast to it and its
        leading dimensions flattened into one, so `r` counts runs even where a field was given
        once for all of them (over [B, T], or a number). None stays None.

            side.index(r, logp.shape)      # run r of a [R, B, T] batch
            side.index(rows)               # some rows of fields given over [N, T]
        """
        out = object.__new__(SideInfo)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                if shape is not None:
                    value = value.expand(tuple(shape)).reshape(-1, *tuple(shape)[-2:])
                value = value[r]  # a part of a checked tensor: in range, not checked again
            object.__setattr__(out, f.name, value)
        return out

    def __repr__(self):
        given = ", ".join(f"{n}=<{tuple(getattr(self, n).shape)}>" for n in self.given())
        return f"rlgates.SideInfo({given})"


def _checked(name, value):
    # a Python number is kept in float64 (torch's default float32 would round π_old = 0.9);
    # `to` casts each field to the batch's dtype when it is used
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(
        value, dtype=None if isinstance(value, bool) else torch.float64)
    if name == "picked":
        if t.dtype != torch.bool:
            bad = (t != 0) & (t != 1)
            if bool(bad.any()):
                raise ValueError(f"sideinfo.picked must be bool or hold only 0 and 1, got "
                                 f"{_sample(t[bad])}")
            t = t == 1
        return t.detach()
    if t.dtype == torch.bool or not (t.is_floating_point() or t.dtype in _INTS):
        raise ValueError(f"sideinfo.{name} must be a real tensor or number, got dtype {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    t = t.detach()
    field = FIELDS[name]
    if not t.numel() or bool(field.ok(*torch.aminmax(t))):  # one pass (NaN fails it)
        return t
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"sideinfo.{name} must be finite, got {_sample(t[~torch.isfinite(t)])}")
    bad = field.outside(t)
    raise ValueError(f"sideinfo.{name} must be {field.range}, got {_sample(t[bad])}")


_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _sample(t):
    """A short account of offending values for an error message."""
    vals = t.flatten()[:3].tolist()
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vals) + (
        ", …" if t.numel() > 3 else "")


def batch_cov(logp, adv, mask, real=None):
    """[B, T] the centred covariance term (log π − mean log π)·(A − mean A) of each token, the
    means over the real tokens (Clip-Cov and KL-Cov, Cui et al. 2025, arXiv:2505.22617),
    computed as verl's kl_cov does, on the flat list of real tokens; 0 on padding. No gradient:
    it only picks tokens. `real`: `real_cov`'s result, when the caller has it."""
    real, values = real_cov(logp, adv, mask) if real is None else real
    cov = torch.zeros_like(logp.detach())
    cov.view(-1)[real] = values
    return cov


def real_cov(logp, adv, mask):
    """(real, values): the flat indices of the real tokens, in order, and the covariance term of
    each (`batch_cov` on the real tokens alone, verl's flat list)."""
    logp, adv = logp.detach(), adv.detach().expand_as(logp)
    # the real tokens' flat indices, found once (a bool index finds them again on each use);
    # the values and their order are those of logp[mask], so the means are bit for bit verl's
    real = mask.reshape(-1).nonzero().squeeze(-1)
    if not real.numel():
        return real, logp.new_zeros(0)
    real_logp, real_adv = logp.reshape(-1)[real], adv.reshape(-1)[real]
    return real, (real_adv - real_adv.mean()) * (real_logp - real_logp.mean())


class MissingSide(ValueError):
    """A method reads a side field nobody gave (a ValueError; `.field` names it)."""

    def __init__(self, method: str, field: str, message: str):
        super().__init__(message)
        self.method, self.field = method, field


def from_batch(side, logp, logp_old, adv, mask, needed) -> SideInfo:
    """`side` with the fields in `needed` that the batch gives filled in where not passed:
    `probs_old` = exp(logp_old) (1 on padding) and `cov` (`batch_cov`)."""
    side = SideInfo() if side is None else side
    derived = {}
    if "probs_old" in needed and side.probs_old is None:
        derived["probs_old"] = torch.where(mask, logp_old.detach(), 0.0).exp()
    if "cov" in needed and side.cov is None:
        derived["cov"] = batch_cov(logp, adv, mask)
    return side.replace(**derived) if derived else side


def checked_side(side) -> SideInfo | None:
    """`side` if it is None or a SideInfo; a clear error otherwise (no dicts, no kwargs)."""
    if side is None or isinstance(side, SideInfo):
        return side
    raise ValueError(f"side must be an rlgates.SideInfo or None, got {type(side).__name__}")


__all__ = ["FIELDS", "Field", "MissingSide", "SideInfo", "batch_cov", "from_batch"]
