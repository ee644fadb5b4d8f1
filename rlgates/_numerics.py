"""Shared numerics: input checks, the clamped importance ratio and loss aggregation.

Every loss in `rlgates` goes through these few functions, so each rule (the clamp, the masks, the
four aggregation modes) is written once.
"""

from __future__ import annotations

import math

import torch

#: Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp, as verl does (TRL
#: does not clamp; verl's GSPO clamps at +10 on one side only: see the trainer chapter).
#: exp(20) is about 4.9e8: finite in float32, so extreme inputs give finite losses. Where the
#: clamp is active the gradient is zero (torch.clamp's rule).
LOG_RATIO_CLAMP = 20.0

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def as_float(x, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Turn `x` into a floating tensor; bf16/fp16 are lifted to float32 (see `compute_dtype`)."""
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    if dtype is not None:
        return t.to(dtype)
    return t.float() if t.dtype in _LOW_PRECISION else t


def check_loss_inputs(logp, logp_old, adv, mask, agg):
    """Validate `Method.loss` arguments; return (logp, logp_old, adv [B, 1|T], bool mask [B, T])."""
    for name, t in (("logp", logp), ("logp_old", logp_old), ("adv", adv)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if logp_old.shape != logp.shape:
        raise ValueError(
            f"logp_old must have logp's shape {tuple(logp.shape)}, got {tuple(logp_old.shape)}"
        )
    B, T = logp.shape
    if adv.shape == (B,):
        adv = adv[:, None]  # [B, 1]: broadcasts, and per-sequence work stays per sequence
    elif adv.shape != (B, T):
        raise ValueError(f"adv must be [B]=({B},) or [B, T]=({B}, {T}), got {tuple(adv.shape)}")
    mask = check_mask(mask, (B, T), logp.device)
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    dtype = compute_dtype(logp, logp_old, adv)
    return logp.to(dtype), logp_old.detach().to(dtype), adv.detach().to(dtype), mask


def check_mask(mask, shape, device=None):
    """The one mask rule of the library: None (every token is real), or a torch.Tensor of
    `shape` that is bool or holds only 0 and 1 (float or int; NaN, 0.5 or 2 are refused).
    Returns a bool tensor. Every public function that takes a mask calls this, so a bad mask
    gets the same ValueError everywhere (tests/test_inputs.py)."""
    shape = tuple(shape)
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have shape {shape}, got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else _bool_mask(mask)


def positive_number(value, name: str) -> float:
    """`value` as a float; ValueError, naming `name`, unless it is a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def ragged_mask(lengths, T: int | None = None) -> torch.Tensor:
    """The bool mask [B, T] of a ragged batch: row b is True on its first lengths[b] tokens
    (the real ones) and False on the padding after them. T defaults to the longest length;
    the mask lives on lengths' device."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor or list, got dtype "
                         f"{lengths.dtype} and shape {tuple(lengths.shape)}")
    longest = int(lengths.max()) if lengths.numel() else 0
    T = longest if T is None else int(T)
    if lengths.numel() and (int(lengths.min()) < 0 or longest > T):
        raise ValueError(f"lengths must lie in [0, T={T}], got {lengths.tolist()}")
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def _bool_mask(mask):
    """A 0/1 float or int mask as bool; ValueError unless every value is 0 or 1 exactly.

    A float mask: its min and max lie in [0, 1] (NaN fails this), so its int8 cast, which
    truncates, is 1 exactly where the value is 1.0 and 0 elsewhere; the values are all 0 or 1
    when that cast equals the bool mask (non-zero) everywhere (0.5 or a subnormal: non-zero,
    cast to 0; -0.0 counts as 0). Four cheap passes, no `==` or `where`: a trainer's float mask
    is checked on every loss call. The float mask is remembered beside its bool mask, for
    `given_weights` and `mask_count`."""
    nonzero = mask.bool()
    if mask.numel() == 0:
        return nonzero
    if mask.is_complex():
        valid = int(torch.count_nonzero(nonzero)) == int(torch.count_nonzero(mask == 1))
    else:  # integers: 0 and 1 are exactly the values in [0, 1]; floats: see above
        valid = _in_unit_range(mask)
        if valid and mask.is_floating_point():
            cast = mask.to(torch.int8)  # 1 at 1.0, 0 at every value in [0, 1)
            valid = int(cast.sub_(nonzero.view(torch.int8)).amin()) == 0  # -1 where 0 < v < 1
            if valid:  # an attribute of the fresh bool mask: a weak dict costs µs per lookup
                nonzero._rlgates_given = mask.detach()
    if not valid:
        raise ValueError("mask must be bool or hold only 0 and 1")
    return nonzero


#: a float dtype -> (the integer dtype of its size, the bits of 1.0 read as that integer)
_BITS = {dtype: (idtype, int(torch.ones((), dtype=dtype).view(idtype)))
         for dtype, idtype in ((torch.float64, torch.int64), (torch.float32, torch.int32),
                               (torch.float16, torch.int16), (torch.bfloat16, torch.int16))}


def _in_unit_range(mask) -> bool:
    """Whether every value of a mask lies in [0, 1] (NaN does not). A float's bits are read as
    an integer first: with its sign bit clear a float sorts as that integer does, so bits in
    [0, bits of 1.0] mean +0.0 or a value in (0, 1] (NaN and +inf lie above). That integer
    min-max is about twice as fast as the float one on the CPU; a sign bit (-0.0, a negative
    value) leaves it to the float min-max."""
    if mask.dtype in _BITS:
        idtype, one = _BITS[mask.dtype]
        low, high = torch.aminmax(mask.view(idtype))
        if low.item() >= 0 and high.item() <= one:  # Python numbers: no tensor ops to run
            return True
    low, high = torch.aminmax(mask)
    return low.item() >= 0 and high.item() <= 1  # NaN compares False


def given_weights(mask, dtype):
    """The caller's own 0/1 float mask behind a checked bool mask, when it has `dtype` (no new
    [B, T] tensor to make); None otherwise. Never write into it: it is the caller's."""
    given = getattr(mask, "_rlgates_given", None)
    return given if given is not None and given.dtype == dtype else None


def mask_count(mask):
    """The number of real tokens of a checked bool mask, a 0-d tensor: the sum of the caller's
    float mask when that is exact (float32 below 2^24 tokens: every partial sum is an integer it
    holds; float64), several times cheaper than counting the bool mask."""
    given = getattr(mask, "_rlgates_given", None)
    if given is not None and (given.dtype == torch.float64 or
                              (given.dtype == torch.float32 and given.numel() < 2**24)):
        return given.sum()
    return torch.count_nonzero(mask)


def check_is_weight(is_weight, mask, dtype):
    """Validate an importance weight ([B] or [B, T], finite on unmasked tokens) and return it as
    a detached [B, 1|T] tensor of `dtype`, zero on masked tokens (so NaN there cannot leak)."""
    if not isinstance(is_weight, torch.Tensor) or not is_weight.is_floating_point():
        raise ValueError(f"is_weight must be a floating torch.Tensor, got {is_weight!r:.60}")
    B, T = mask.shape
    if is_weight.shape == (B,):
        is_weight = is_weight[:, None].expand(B, T)
    elif is_weight.shape != (B, T):
        raise ValueError(f"is_weight must be [B]=({B},) or [B, T]=({B}, {T}), "
                         f"got {tuple(is_weight.shape)}")
    w = torch.where(mask, is_weight.detach().to(dtype), 0.0)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("is_weight must be finite and non-negative on unmasked tokens")
    return w


def broadcast_shape(a, b) -> torch.Size:
    """The shape that shapes a and b broadcast to; RuntimeError if they do not. The same rule
    as torch.broadcast_shapes, without its per-call cost (tens of µs, on every loss call)."""
    if a == b:
        return torch.Size(a)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        raise RuntimeError(f"shapes {a} and {b} do not broadcast")
    return torch.Size(y if x == 1 else x for x, y in zip(a, b, strict=True))


def row_counts(mask):
    """The real tokens of each row of a bool mask, as int32: a bool `sum` would first widen the
    whole mask to int64, a pass as slow as the sum itself. Divided into a float, the count is
    converted exactly, so every value is as with int64."""
    return mask.sum(-1, dtype=torch.int32)


def token_log_ratio(logp, logp_old, mask):
    """log ρ_t = logp − logp_old, zero on masked tokens (so padding never makes NaN)."""
    # in place on the fresh difference: one [B, T] temporary fewer at the peak
    log_ratio = logp - logp_old
    weights = given_weights(mask, log_ratio.dtype)
    if weights is not None and log_ratio.device.type == "cpu":
        return _ZeroPadding.apply(log_ratio, mask, weights)
    if log_ratio.requires_grad:
        return log_ratio.masked_fill_(~mask, 0.0)
    # no gradient: `where` into itself, faster than masked_fill_ on the CPU (no negated mask)
    return torch.where(mask, log_ratio, log_ratio.new_zeros(()), out=log_ratio)


def zero_padded(x, mask):
    """A new tensor: x with 0 on the padding (NaN or ±inf there included), for values that take
    no gradient. A product with the caller's 0/1 float mask when x is finite (several times
    cheaper on the CPU than `where`), else torch.where(mask, x, 0)."""
    weights = given_weights(mask, x.dtype)
    if weights is not None and x.device.type == "cpu":
        return _zero_padding(x, mask, weights, inplace=False)
    return torch.where(mask, x, 0.0)


def _zero_padding(x, mask, weights, inplace):
    """x with 0 on the padding: x times the 0/1 weights when x is finite (v·1 = v, v·0 = ±0;
    several times cheaper on the CPU than masked_fill or where), else `where` (NaN·0 is NaN)."""
    if math.isfinite(x.sum().item()):  # a NaN or ±inf anywhere makes the sum non-finite
        return x.mul_(weights) if inplace else x * weights
    if inplace:
        return x.masked_fill_(~mask, 0.0)
    return torch.where(mask, x, 0.0)


class _ZeroPadding(torch.autograd.Function):
    """A fresh tensor's padding set to 0 in place, with zero gradient there, by `_zero_padding`
    both ways (a caller's 0/1 float mask as the weights)."""

    @staticmethod
    def forward(ctx, x, mask, weights):
        ctx.mark_dirty(x)
        ctx.save_for_backward(mask, weights)
        return _zero_padding(x, mask, weights, inplace=True)

    @staticmethod
    def backward(ctx, grad):
        mask, weights = ctx.saved_tensors
        return _zero_padding(grad, mask, weights, inplace=False), None, None


def sequence_log_ratio(logp, logp_old, mask):
    """log ρ_s = Σ_t m·(logp − logp_old) / Σ_t m: the log of the geometric mean of token ratios."""
    lengths = row_counts(mask).clamp(min=1)
    return token_log_ratio(logp, logp_old, mask).sum(-1) / lengths


def gate_log_ratio(logp, logp_old, mask, level="token"):
    """[B, T]: the log-ratio each token's gate sees: its own at token level, its sequence's
    (broadcast over the tokens) at sequence level (the log of the geometric mean), or the log
    of the whole response's ratio, the product of its token ratios (VESPO), at
    "sequence-product"."""
    if level == "sequence":
        return sequence_log_ratio(logp, logp_old, mask)[:, None].expand_as(logp)
    if level == "sequence-product":
        return token_log_ratio(logp, logp_old, mask).sum(-1, keepdim=True).expand_as(logp)
    return token_log_ratio(logp, logp_old, mask)


def ratio_from_log(log_ratio, out=None):
    """ρ = exp(clamp(log ρ, ±LOG_RATIO_CLAMP)). exp works in place on the clamp's fresh output:
    one [B, T] temporary fewer, the same values and gradient (exp's backward reads its result).
    out: a tensor to write ρ into (log_ratio itself, if it needs no gradient and is not needed
    again), so that even the clamp makes no temporary."""
    if out is None and log_ratio.requires_grad and log_ratio.device.type == "cpu" \
            and log_ratio.numel():
        return _ClampedExp.apply(log_ratio)
    return torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP, out=out).exp_()


class _ClampedExp(torch.autograd.Function):
    """exp(clamp(log ρ, ±LOG_RATIO_CLAMP)) with torch.clamp's gradient rule: exp's backward, and
    zero where the clamp acts (NaN included). In the usual batch the clamp acts nowhere, which
    one min-max pass tells: then no clamped copy is made and the backward is exp's alone, with
    no range masks and no `where` (slow on the CPU). Values and gradients are torch's, bit for
    bit (tested)."""

    @staticmethod
    def forward(ctx, log_ratio):
        low, high = torch.aminmax(log_ratio)  # NaN makes both NaN: not inside
        ctx.inside = low.item() >= -LOG_RATIO_CLAMP and high.item() <= LOG_RATIO_CLAMP
        if ctx.inside:
            ratio = log_ratio.exp()
        else:
            ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp_()
        ctx.save_for_backward(ratio, None if ctx.inside else log_ratio)
        return ratio

    @staticmethod
    def backward(ctx, grad):
        ratio, log_ratio = ctx.saved_tensors
        grad = grad * ratio
        if ctx.inside:
            return grad
        kept = (log_ratio >= -LOG_RATIO_CLAMP).logical_and_(log_ratio <= LOG_RATIO_CLAMP)
        return torch.where(kept, grad, 0.0)


def aggregate(values, mask, agg, factor=None):
    """Aggregate a [B, T] matrix over the mask, in one of the four modes of `AGG_MODES`.

    - token-mean: Σ v·m / Σ m.
    - seq-mean-token-mean: the mean, over sequences with ≥1 token, of Σ_t v·m / Σ_t m.
    - seq-mean-token-sum: the mean, over sequences with ≥1 token, of Σ_t v·m.
    - seq-mean-token-sum-norm (Dr. GRPO's constant normaliser): the mean, over sequences with
      ≥1 token, of Σ_t v·m / T, T = mask.shape[-1].

    A fully masked batch gives 0. seq-mean-token-sum-norm divides by N × T, as verl 0.9.1 and
    TRL 1.16 do (per-sequence token sums over the padded length T, then the mean over the N
    non-empty sequences; the trainers differ in what N and T count, see chapter 10); older verl
    releases (0.4.1, 0.5.0) divided the total by T alone, which is ours times N.
    Pad to a fixed generation budget so that T, and with it the normaliser, stays constant
    during training.

    factor: a constant (it takes no gradient) that multiplies the values, of their shape or
    [B, 1]: the aggregate of values·factor with no [B, T] product made, and a gradient that
    is one product (a method's J_t as term·weight, `Method.objective_parts`; an importance
    weight).
    """
    try:  # values may broadcast against the mask ([B, 1] at sequence level)
        shape = broadcast_shape(values.shape, mask.shape)
    except (RuntimeError, AttributeError):
        shape = values.shape
    mask = check_mask(mask, shape)
    if agg == "token-mean":
        return _MaskedSum.apply(values, mask, None, factor) / mask_count(mask).clamp(min=1)
    lengths = row_counts(mask)
    per_seq = _MaskedSum.apply(values, mask, -1, factor)
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    elif agg == "seq-mean-token-sum-norm":
        per_seq = per_seq / max(mask.shape[-1], 1)
    return per_seq.sum() / (lengths > 0).sum().clamp(min=1)


#: elements per slice of the masked sum: its product stays in the cache (1 MB in float32)
_SLICE = 2**18


def _weighted_sum(values, weights, dim, factor=None):
    """Σ values·weights over everything (dim None) or over the last dim, `weights` the 0/1 mask
    (float, or bool viewed as uint8). On the CPU the product is made a slice of rows at a time
    into one small buffer and summed there (torch's pairwise sum, as accurate as summing the
    whole product): no [B, T] temporary, whose making costs more than the sum itself. Values
    that broadcast against the weights ([B, 1]) are multiplied out and summed."""
    T = values.shape[-1] if values.dim() else 1
    rows = values.numel() // max(T, 1)
    step = max(1, _SLICE // max(T, 1))
    if values.shape != weights.shape or rows <= step or values.device.type != "cpu":
        product = values * weights if factor is None else values * weights * factor
        return product.sum() if dim is None else product.sum(dim)
    values, weights = values.reshape(rows, T), weights.reshape(rows, T)
    if factor is not None:
        factor = factor.reshape(rows, -1)
    buffer = values.new_empty(step, T)
    starts = range(0, rows, step)
    sums = values.new_empty(len(starts) if dim is None else rows)
    for i, start in enumerate(starts):
        stop = min(start + step, rows)
        product = torch.mul(values[start:stop], weights[start:stop], out=buffer[:stop - start])
        if factor is not None:
            product.mul_(factor[start:stop])
        if dim is None:
            torch.sum(product, (0, 1), out=sums[i])
        else:
            torch.sum(product, -1, out=sums[start:stop])
    return sums.sum() if dim is None else sums.reshape(values.shape[:-1])


class _MaskedSum(torch.autograd.Function):
    """Σ of `values` (times `factor`, a constant, when given) over the real tokens (all of them,
    or each row's with dim=-1); padding, even NaN or ±inf, adds nothing and gets zero gradient.
    Its backward is the 0/1 mask times the incoming gradient (and the factor): cheaper on the
    CPU than the `where` that autograd would run for torch.where(mask, values, 0).sum()."""

    @staticmethod
    def forward(ctx, values, mask, dim, factor=None):
        given = given_weights(mask, values.dtype)  # kept for the backward: it costs no memory
        ctx.save_for_backward(mask, given, factor)
        ctx.shape, ctx.dim, ctx.finite = values.shape, dim, False
        if values.device.type != "cpu":
            cleaned = torch.where(mask, values if factor is None else values * factor, 0.0)
            return cleaned.sum() if dim is None else cleaned.sum(dim)
        # on the CPU a product with the 0/1 weights is several times faster than `where`.
        # Padding adds v·0 = ±0, which leaves a sum that is finite and not 0 unchanged, bit for
        # bit. A NaN or ±inf anywhere (in the factor too) makes it non-finite, and a 0 could
        # carry the other sign: then the padding is zeroed first and the same sum is taken again
        weights = mask.view(torch.uint8) if given is None else given
        out = _weighted_sum(values, weights, dim, factor)
        if out.dim():
            ctx.finite = bool((torch.isfinite(out) & (out != 0)).all())
        else:  # a Python number: no tensor ops to run
            ctx.finite = math.isfinite(total := out.item()) and total != 0
        if ctx.finite:
            return out
        product = values if factor is None else values * factor
        return _weighted_sum(torch.where(mask, product, 0.0), weights, dim)

    @staticmethod
    def backward(ctx, grad):
        mask, given, factor = ctx.saved_tensors
        if ctx.dim is not None:
            grad = grad.unsqueeze(ctx.dim)
        # a bool mask viewed as uint8 multiplies as fast as a float one, with no cast
        weights = mask.view(torch.uint8) if given is None else given
        scaled = grad if factor is None else grad * factor
        if scaled is grad or scaled.shape != mask.shape:  # one product makes the [B, T] result
            grad_values = scaled * weights
        elif ctx.finite:  # our own product; the factor is finite on the padding (see forward)
            grad_values = scaled.mul_(weights)
        else:
            grad_values = torch.where(mask, scaled, 0.0)
        if grad_values.shape != ctx.shape:  # values broadcast against the mask ([B, 1])
            grad_values = grad_values.sum_to_size(ctx.shape)
        return grad_values, None, None, None


class _WithSlope(torch.autograd.Function):
    """`value` (which takes no gradient itself) whose derivative in x is `slope`: a loss term whose
    derivative is known in closed form and cheaper than autograd's graph of it (DRO's square)."""

    @staticmethod
    def forward(ctx, value, x, slope):
        ctx.save_for_backward(slope)
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        (slope,) = ctx.saved_tensors
        return None, grad * slope, None


def with_slope(value, x, slope):
    """`value`, differentiable in x with derivative `slope` (elementwise): both constants."""
    return _WithSlope.apply(value.detach(), x, slope.detach())


def aggregation_weight(mask, agg):
    """The weight w_t with aggregate(v) = Σ_t w_t·v_t: the per-token factor in every gradient."""
    m = check_mask(mask, mask.shape).to(torch.float64)
    if agg == "token-mean":
        return m / m.sum().clamp(min=1)
    lengths = m.sum(-1, keepdim=True)
    n_seq = (lengths > 0).sum().clamp(min=1)
    if agg == "seq-mean-token-mean":
        return m / lengths.clamp(min=1) / n_seq
    if agg == "seq-mean-token-sum-norm":
        return m / max(m.shape[-1], 1) / n_seq
    return m / n_seq


def run_scale(mask, agg):
    """[...]: N / N_r for masks [..., B, T] merged into one batch, with N_r run r's tokens
    (token-mean) or non-empty responses (the seq-mean modes) and N all runs': run r's own
    aggregation weight is the merged batch's times this constant."""
    count = mask.sum((-2, -1)) if agg == "token-mean" else (mask.sum(-1) > 0).sum(-1)
    count = count.to(torch.float64)
    return count.sum() / count.clamp(min=1)


class _StrictClamp(torch.autograd.Function):
    """clamp(x, low, high) whose derivative is 0 at the edges themselves (torch.clamp's is 1)."""

    @staticmethod
    def forward(ctx, x, low, high):
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        inside = (x > ctx.low).logical_and_(x < ctx.high)  # in place: one bool temporary fewer
        if grad.device.type == "cpu":  # times the window as uint8 when finite: no `where`
            return _zero_padding(grad, inside, inside.view(torch.uint8), inplace=False), None, None
        return torch.where(inside, grad, 0.0), None, None


def strict_clamp(x, low, high):
    """The exact clip of x to [low, high], differentiable with slope 1 only strictly inside."""
    return _StrictClamp.apply(x, low, high)
