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

from . import _numerics as nx

#: field → what it holds and its range (the errors and the API page quote it)
FIELDS = {
    "probs_old": "π_old of each sampled token, in (0, 1]",
    "entropy": "the policy's entropy at each token, ≥ 0",
    "sampler_logp": "the rollout engine's log-prob of each token, ≤ 0",
    "cov": "each token's centred covariance term (log π − mean log π)·(A − mean A), means over "
           "the batch's real tokens",
    "draw": "a random key per token in [0, 1]: where a loss picks tokens at random it takes "
            "those with the smallest keys (a random permutation's law), so a given draw "
            "makes the pick reproducible",
    "picked": "1 (or True) on the tokens a batch-level rule singled out, else 0",
}


@dataclass(frozen=True)
class SideInfo:
    """Per-token inputs of a loss beyond (ρ, A); each optional, each a tensor broadcastable to
    the [B, T] batch (a Python number is taken as a 0-d float64 tensor). Validated when made:
    finite, and in its range; padding must hold a valid value too (0 for `cov`, 1 for
    `probs_old`). An error names the field: "sideinfo.entropy must be ≥ 0, got -0.1".

    - probs_old: π_old of each sampled token, in (0, 1] (DPPO). The loss derives it as
      exp(logp_old); on the plane ρ alone does not give it.
    - entropy: the policy's entropy at each token, ≥ 0 (an entropy mask).
    - sampler_logp: the rollout engine's log-prob of each token, ≤ 0 (off-policy masks).
    - cov: (log π − mean log π)·(A − mean A), means over the batch's real tokens (Clip-Cov,
      KL-Cov). The loss derives it (`batch_cov`).
    - draw: a uniform key per token in [0, 1]; a loss that picks tokens at random takes those
      with the smallest keys (Clip-Cov), so a given draw makes the pick reproducible.
    - picked: bool, the tokens a batch-level rule singled out (Clip-Cov drops them, KL-Cov
      pulls them back); the method derives it from `cov` (and `draw`) unless it is given.

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
                    nx.broadcast_shape(value.shape, tuple(shape))
                except RuntimeError:
                    raise ValueError(f"sideinfo.{name} has shape {tuple(value.shape)}, which "
                                     f"does not broadcast to the batch's {tuple(shape)}") from None
            dtype = like.dtype if value.dtype != torch.bool else torch.bool
            out[name] = value.to(device=like.device, dtype=dtype)
        return self._with(out) if out else self

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
    if t.numel() and _in_range(name, t):
        return t
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"sideinfo.{name} must be finite, got {_sample(t[~torch.isfinite(t)])}")
    bad = {"probs_old": (t <= 0) | (t > 1), "entropy": t < 0, "sampler_logp": t > 0,
           "draw": (t < 0) | (t > 1)}.get(name)
    if bad is not None and bool(bad.any()):
        raise ValueError(f"sideinfo.{name} must be {_RANGE[name]}, got {_sample(t[bad])}")
    return t


def _in_range(name, t):
    """Whether every value of `t` is finite and in the field's range: one pass (aminmax, whose
    min and max are NaN if any value is); on False the caller finds what is wrong."""
    low, high = torch.aminmax(t)
    low_ok = {"probs_old": low > 0, "entropy": low >= 0, "draw": low >= 0}.get(
        name, low > -torch.inf)
    high_ok = {"probs_old": high <= 1, "sampler_logp": high <= 0, "draw": high <= 1}.get(
        name, high < torch.inf)
    return bool(low_ok & high_ok)


_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_RANGE = {"probs_old": "in (0, 1]", "entropy": "≥ 0", "sampler_logp": "≤ 0",
          "draw": "in [0, 1]"}


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
        derived["probs_old"] = nx.zero_padded(logp_old.detach(), mask).exp_()
    if "cov" in needed and side.cov is None:
        derived["cov"] = batch_cov(logp, adv, mask)
    return side.replace(**derived) if derived else side


def checked_side(side) -> SideInfo | None:
    """`side` if it is None or a SideInfo; a clear error otherwise (no dicts, no kwargs)."""
    if side is None or isinstance(side, SideInfo):
        return side
    raise ValueError(f"side must be an rlgates.SideInfo or None, got {type(side).__name__}")


__all__ = ["FIELDS", "MissingSide", "SideInfo", "batch_cov", "from_batch"]
