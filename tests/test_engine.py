"""The engine's numbers on the lab policy: top-p/top-k makes ρ the kept mass (an identity, to
float64 precision), a float32 LM head shrinks the bf16 gap, and a long response's sequence weight
passes TRL's cap."""

import math

import pytest
import torch

from rlgates import LabPolicy, engine
from rlgates import offpolicy as op
from rlgates._book import facts
from rlgates.lab.task import PatternTask

VOCAB, HIDDEN, LENGTH, BATCH = 16, 32, 8, 64


def lab_batch(seed=0, dtype=torch.float32):
    task = PatternTask(vocab=VOCAB, length=LENGTH)
    policy = LabPolicy([seed], VOCAB, HIDDEN, LENGTH).to(dtype).requires_grad_(False)
    return policy, task.prompts(BATCH, torch.Generator().manual_seed(seed))


def reference_kept_mass(probs, top_p, top_k):
    """One row at a time, in plain Python: the engine's nucleus over the top_k tokens."""
    ranked = sorted(probs.tolist(), reverse=True)[: top_k or len(probs)]
    kept, mass = [], 0.0
    for p in ranked:
        if top_p is not None and mass >= top_p:
            break
        kept.append(p)
        mass += p
    return math.fsum(kept), len(kept)


@pytest.mark.parametrize("top_p, top_k", [(0.5, None), (0.8, None), (0.95, None), (None, 4),
                                          (0.9, 5)])
def test_ratio_is_the_kept_mass_per_token(top_p, top_k):
    policy, prompts = lab_batch(dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    tokens, logp_engine, log_kept = engine.sample_truncated(policy, prompts, LENGTH, g,
                                                            top_p, top_k)
    log_rho = policy.log_probs(tokens, prompts) - logp_engine
    assert (log_rho - log_kept).abs().max() < 1e-14  # per token: ρ_t = m_t
    assert abs(log_rho.exp().mean() - log_kept.exp().mean()) < 1e-14  # mean ρ = mean kept mass
    if top_k is None:  # a nucleus holds at least top_p of the mass
        assert bool((log_kept.exp() >= top_p).all())
    assert bool((log_kept < 0).all())  # truncation cut mass at every step of this policy
    # the correction: add back the log kept mass, and the on-policy ratio is 1 again
    assert (policy.log_probs(tokens, prompts) - (logp_engine + log_kept)).abs().max() < 1e-14


def test_kept_mass_matches_a_reference_nucleus():
    logits = torch.randn(200, VOCAB, generator=torch.Generator().manual_seed(2),
                         dtype=torch.float64)
    for top_p, top_k in [(0.3, None), (0.8, None), (0.8, 3), (None, 1)]:
        logp_engine, log_kept = engine.truncated_logp(logits, top_p, top_k)
        for row in range(len(logits)):
            mass, n = reference_kept_mass(logits[row].softmax(-1), top_p, top_k)
            assert abs(float(log_kept[row].exp()) - mass) < 1e-14
            assert int(torch.isfinite(logp_engine[row]).sum()) == n
        assert torch.allclose(logp_engine.exp().sum(-1), torch.ones(200, dtype=torch.float64))


def test_no_truncation_gives_ratio_one():
    """Negative control: top_p = 1 keeps every token, so ρ ≡ 1 and the engine reports log π."""
    policy, prompts = lab_batch(dtype=torch.float64)
    tokens, logp_engine, log_kept = engine.sample_truncated(
        policy, prompts, LENGTH, torch.Generator().manual_seed(1), top_p=1.0)
    assert log_kept.abs().max() < 1e-15
    assert (policy.log_probs(tokens, prompts) - logp_engine).abs().max() < 1e-14


def test_truncated_logp_rejects_bad_settings():
    with pytest.raises(ValueError, match="top_p"):
        engine.truncated_logp(torch.zeros(4), top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        engine.truncated_logp(torch.zeros(4), top_k=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_head_shrinks_the_bf16_gap(seed):
    policy, prompts = lab_batch(seed)
    tokens, logp = policy.sample(prompts[None], LENGTH, [torch.Generator().manual_seed(seed)])
    tokens = tokens[0]
    logp_trainer = policy.log_probs(tokens, prompts)
    gap = {name: engine.log_ratio_summary(
               logp_trainer - engine.mixed_precision_log_probs(policy, tokens, prompts,
                                                               torch.bfloat16, head))
           for name, head in [("bf16", torch.bfloat16), ("fp32", torch.float32)]}
    # measured: the float32 head cuts the mean |log ρ| about eightfold on this policy
    assert gap["fp32"]["mean"] < gap["bf16"]["mean"] / 3
    assert gap["fp32"]["q99"] < gap["bf16"]["q99"] / 3
    assert gap["fp32"]["mean"] > 0  # the body still runs in bf16
    # negative control: an all-float32 engine is the trainer's own computation
    all_fp32 = engine.mixed_precision_log_probs(policy, tokens, prompts, torch.float32)
    assert bool((all_fp32 == logp_trainer).all())
    # and the trainer's log-probs agree with the sampler's to float rounding
    assert (logp[0] - logp_trainer).abs().max() < 1e-5


def test_long_response_passes_the_sequence_cap():
    d, L = 0.012, 100
    cap = facts.trl("vllm_importance_sampling_clip_max") if facts.installed() else 3.0
    if facts.installed():  # TRL's default under vLLM: sequence-level masking
        assert facts.trl("vllm_importance_sampling_mode") == "sequence_mask"
    log_w = torch.full((1, L), d, dtype=torch.float64)
    assert math.exp(L * d) > cap
    seq = op.importance_weight(log_w, torch.zeros_like(log_w), None, "mis", level="sequence",
                               high=cap)
    tok = op.importance_weight(log_w, torch.zeros_like(log_w), None, "mis", level="token",
                               high=cap)
    assert bool((seq == 0).all())  # the whole response is masked
    assert torch.allclose(tok, torch.full_like(tok, math.exp(d)))  # every token kept
    crossing = engine.sequence_log_weight_crossing(d, cap)
    assert 91 < crossing < 92
    shorter = log_w[:, :91]
    assert bool((op.importance_weight(shorter, torch.zeros_like(shorter), None, "mis",
                                      level="sequence", high=cap) > 0).all())
    with pytest.raises(ValueError):
        engine.sequence_log_weight_crossing(-d, cap)
