"""Shared numerics: input checks, the clamped importance ratio and loss aggregation.

Every loss in `rlgates` goes through these few functions, so each rule (the clamp, the masks, the
four aggregation modes) is written once, in plain torch: the code a CPU runs is the code a GPU
runs.
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


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def as_float(x, name: str) -> torch.Tensor:
    """`x` as a floating tensor (bf16/fp16 lifted to float32); ValueError naming `name` if `x`
    is not numeric."""
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name} must be a number or a tensor of numbers, got {x!r:.60}") from None
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be real numbers, got dtype {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def check_loss_inputs(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask,
                      agg: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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


def check_mask(mask: torch.Tensor | None, shape, device=None) -> torch.Tensor:
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
    if mask.dtype == torch.bool:
        return mask
    real = mask.bool()
    if not torch.equal(mask, real.to(mask.dtype)):  # 0.5, 2 or NaN differ from their 0/1 cast
        raise ValueError("mask must be bool or hold only 0 and 1")
    return real


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


def check_is_weight(is_weight: torch.Tensor, mask: torch.Tensor,
                    dtype: torch.dtype) -> torch.Tensor:
    """Validate an importance weight ([B] or [B, T], finite and ≥ 0 on real tokens) and return
    it as a detached [B, T] tensor of `dtype`, zero on the padding (so NaN there cannot leak)."""
    if not isinstance(is_weight, torch.Tensor) or not is_weight.is_floating_point():
        raise ValueError(f"is_weight must be a floating torch.Tensor, got {is_weight!r:.60}")
    B, T = mask.shape
    if is_weight.shape == (B,):
        is_weight = is_weight[:, None]
    elif is_weight.shape != (B, T):
        raise ValueError(f"is_weight must be [B]=({B},) or [B, T]=({B}, {T}), "
                         f"got {tuple(is_weight.shape)}")
    w = torch.where(mask, is_weight.detach().to(dtype), 0.0)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("is_weight must be finite and non-negative on unmasked tokens")
    return w


def token_log_ratio(logp: torch.Tensor, logp_old: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """log ρ_t = logp − logp_old, zero on masked tokens (so padding never makes NaN)."""
    return torch.where(mask, logp - logp_old, 0.0)


def sequence_log_ratio(logp: torch.Tensor, logp_old: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """log ρ_s = Σ_t m·(logp − logp_old) / Σ_t m: the log of the geometric mean of token ratios."""
    return token_log_ratio(logp, logp_old, mask).sum(-1) / mask.sum(-1).clamp(min=1)


def gate_log_ratio(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor,
                   level: str = "token") -> torch.Tensor:
    """[B, T]: the log-ratio each token's gate sees: its own at token level, its sequence's
    (broadcast over the tokens) at sequence level (the log of the geometric mean), or the log
    of the whole response's ratio, the product of its token ratios (VESPO), at
    "sequence-product"."""
    if level == "sequence":
        return sequence_log_ratio(logp, logp_old, mask)[:, None].expand_as(logp)
    if level == "sequence-product":
        return token_log_ratio(logp, logp_old, mask).sum(-1, keepdim=True).expand_as(logp)
    return token_log_ratio(logp, logp_old, mask)


def ratio_from_log(log_ratio: torch.Tensor) -> torch.Tensor:
    """ρ = exp(clamp(log ρ, ±LOG_RATIO_CLAMP)); zero gradient where the clamp acts."""
    return torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def aggregate(values: torch.Tensor, mask: torch.Tensor | None, agg: str) -> torch.Tensor:
    """Aggregate a [B, T] matrix over the mask, in one of the four modes of `AGG_MODES`.

    - token-mean: Σ v·m / Σ m.
    - seq-mean-token-mean: the mean, over sequences with ≥1 token, of Σ_t v·m / Σ_t m.
    - seq-mean-token-sum: the mean, over sequences with ≥1 token, of Σ_t v·m.
    - seq-mean-token-sum-norm (Dr. GRPO's constant normaliser): the mean, over sequences with
      ≥1 token, of Σ_t v·m / T, T = mask.shape[-1].

    Padding (NaN or ±inf there included) adds nothing and gets zero gradient; a fully masked
    batch gives 0. seq-mean-token-sum-norm divides by N × T, as verl 0.9.1 and TRL 1.16 do
    (per-sequence token sums over the padded length T, then the mean over the N non-empty
    sequences; the trainers differ in what N and T count, see chapter 10); older verl releases
    (0.4.1, 0.5.0) divided the total by T alone, which is ours times N. Pad to a fixed
    generation budget so that T, and with it the normaliser, stays constant during training.
    """
    shape = values.shape
    if isinstance(mask, torch.Tensor) and mask.shape != shape:
        try:  # values may broadcast against the mask ([B, 1] at sequence level)
            shape = torch.broadcast_shapes(shape, mask.shape)
        except RuntimeError:  # check_mask names the shapes
            pass
    mask = check_mask(mask, shape, values.device)
    values = torch.where(mask, values, 0.0)
    if agg == "token-mean":
        return values.sum() / mask.sum().clamp(min=1)
    lengths = mask.sum(-1)
    per_seq = values.sum(-1)
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    elif agg == "seq-mean-token-sum-norm":
        per_seq = per_seq / max(mask.shape[-1], 1)
    elif agg != "seq-mean-token-sum":
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    return per_seq.sum() / (lengths > 0).sum().clamp(min=1)


def aggregation_weight(mask: torch.Tensor, agg: str) -> torch.Tensor:
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


def run_scale(mask: torch.Tensor, agg: str) -> torch.Tensor:
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
        inside = (x > ctx.low) & (x < ctx.high)
        return torch.where(inside, grad, 0.0), None, None


def strict_clamp(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """The exact clip of x to [low, high], differentiable with slope 1 only strictly inside."""
    return _StrictClamp.apply(x, low, high)
