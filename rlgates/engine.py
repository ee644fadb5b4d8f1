"""The rollout engine's own numbers: what truncated sampling and low precision do to ρ.

The trainer's ratio against the engine, ρ_t = π_trainer(y_t)/π_engine(y_t), is 1 for an
on-policy run only if the engine reports the log-probability of the distribution the trainer
computes. Two common engine settings break that without any lag:

* **top-p or top-k sampling.** The engine draws from the kept tokens K_t alone and, if it reports
  the log-probabilities it sampled from, renormalises over them:
  log π_engine(y) = log π(y) − log m_t with the kept mass m_t = Σ_{k ∈ K_t} π(k). Every sampled
  token is kept, so per token ρ_t = m_t exactly, and the batch mean of ρ is the mean kept mass.
  Adding log m_t back (or letting the engine report the untruncated log π) gives ρ ≡ 1 again.
* **a low-precision forward pass.** The engine runs the policy in bfloat16; the trainer in
  float32. MiniMax-M1 (arXiv:2506.13585) found the LM head's precision the main cause of the
  gap and computes the head in float32: `mixed_precision_log_probs` runs a `LabPolicy`'s body in
  one precision and its head in another.

A third is arithmetic: at sequence level the weight is w = Π_t w_t = exp(Σ_t log w_t), so a
small mean per-token log difference d over L tokens gives exp(L·d), which passes a fixed cap C
once L > log C / d (`sequence_log_weight_crossing`).
"""

from __future__ import annotations

import copy
import math

import torch

from . import _numerics as nx


def truncated_logp(logits, top_p=None, top_k=None):
    """The log-probabilities an engine reports after top-p and top-k truncation.

    With π = softmax(logits) and the kept set K (the top_k largest tokens, then the smallest
    prefix of them, by descending π, whose mass reaches top_p; the most likely token is always
    kept), returns (logp_engine [..., V], log_kept_mass [...]):

        log π_engine(k) = log π(k) − log m   for k ∈ K,   −inf otherwise,
        m = Σ_{k ∈ K} π(k).

    For any kept token, log π(k) − log π_engine(k) = log m: the ratio ρ = π/π_engine is the
    kept mass. top_p=None (or 1) and top_k=None keep every token, so m = 1.
    """
    logits = nx.as_float(logits, "logits")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    logp = torch.log_softmax(logits, dim=-1)
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    keep_sorted = torch.ones_like(sorted_logp, dtype=torch.bool)
    if top_k is not None:
        keep_sorted[..., int(top_k):] = False
    if top_p is not None and top_p < 1:
        probs = sorted_logp.exp().masked_fill(~keep_sorted, 0.0)
        mass_before = probs.cumsum(-1) - probs  # a token is kept while the mass before it < p
        keep_sorted &= mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    log_kept_mass = logp.masked_fill(~keep, -math.inf).logsumexp(-1)
    # nothing cut: m = 1 exactly, so the engine reports log π itself, not log π − rounding
    log_kept_mass = log_kept_mass.masked_fill(keep.all(-1), 0.0)
    logp_engine = torch.where(keep, logp - log_kept_mass[..., None], -math.inf)
    return logp_engine, log_kept_mass


@torch.no_grad()
def sample_truncated(policy, prompt, length, generator, top_p=None, top_k=None):
    """Sample from a single-run `LabPolicy` as an engine with top-p/top-k truncation would.

    prompt [B, motif] → (tokens [B, length], logp_engine [B, length], log_kept_mass
    [B, length]): the engine's renormalised log-probability of each sampled token and the log
    of the mass it kept at that step (see `truncated_logp`). The policy is scored on the whole
    prefix at every step (the lab's responses are short), in the policy's own dtype.
    """
    B = prompt.shape[0]
    tokens = prompt.new_zeros(B, length)
    logps, log_masses = [], []
    for t in range(length):
        logits = policy.logits(prompt, tokens[:, : t + 1])[:, t]
        logp_engine, log_kept_mass = truncated_logp(logits, top_p, top_k)
        tok = torch.multinomial(logp_engine.exp(), 1, generator=generator)[:, 0]
        tokens[:, t] = tok
        logps.append(logp_engine.gather(-1, tok[:, None])[:, 0])
        log_masses.append(log_kept_mass)
    return tokens, torch.stack(logps, -1), torch.stack(log_masses, -1)


@torch.no_grad()
def mixed_precision_log_probs(policy, response, prompt, dtype=torch.bfloat16,
                              head_dtype=torch.float32):
    """log π(y_t) from an engine copy of a `LabPolicy` whose body runs in `dtype` and whose LM
    head runs in `head_dtype`: [R, B, T] (or [B, T], as `LabPolicy.log_probs`).

    The body's weights are rounded to `dtype`; a float32 head keeps the trainer's float32 head
    weights and reads the body's hidden state cast up (MiniMax-M1's fix). The logits are cast to
    float32 before the softmax, as engines sample in float32. With dtype = head_dtype = float32
    this is the trainer's own computation, so log ρ = 0 exactly.
    """
    engine = copy.deepcopy(policy).to(dtype)
    hidden = engine.features(prompt, response).to(head_dtype)
    w_head, b_head = policy.w_head.to(head_dtype), policy.b_head.to(head_dtype)
    if response.dim() == 2:  # a single run, as LabPolicy.logits
        logits = engine._linear(hidden[None], w_head, b_head)[0]
    else:
        logits = engine._linear(hidden, w_head, b_head)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, response[..., None]).squeeze(-1)


def log_ratio_summary(log_ratio, quantiles=(0.5, 0.9, 0.99)) -> dict:
    """|log ρ| over a batch: {"mean", "max", "q50", "q90", "q99"} as floats."""
    a = log_ratio.detach().abs().flatten().double()
    out = {"mean": float(a.mean()), "max": float(a.max())}
    for q in quantiles:
        out[f"q{round(100 * q)}"] = float(a.quantile(q))
    return out


def sequence_log_weight_crossing(mean_token_log_weight, cap):
    """The response length past which exp(L·d) exceeds `cap`: L* = log C / d (d > 0).

    A sequence-level mask with upper bound C drops every response longer than L* whose tokens
    carry a mean log weight d, however small d is; a token-level mask with the same C keeps
    each token while d ≤ log C.
    """
    d, cap = float(mean_token_log_weight), float(cap)
    if d <= 0 or cap <= 1:
        raise ValueError(f"need d > 0 and cap > 1, got d={d!r}, cap={cap!r}")
    return math.log(cap) / d


__all__ = ["log_ratio_summary", "mixed_precision_log_probs", "sample_truncated",
           "sequence_log_weight_crossing", "truncated_logp"]
