"""Importance weights (TIS, MIS, IcePop) as stop-gradient factors: closed form, an independent
trainer-style reference, autograd, finite differences, the identities, the lab's corrections under lag, bad input."""

import math

import pytest
import torch

import rlgates
from rlgates import lab
from rlgates import offpolicy as op
from tests.conftest import held, make_batch

KINDS = ["tis", "mis", "icepop"]
LEVELS = ["token", "sequence"]


def reference_weight(logp_target, logp_behaviour, mask, kind, level, low, high):
    """Written the way the trainers write it, one token (or one sequence) at a time."""
    B, T = logp_target.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        diffs = [float(logp_target[b, t] - logp_behaviour[b, t]) for t in range(T) if mask[b, t]]
        if level == "sequence":
            s = max(-20.0, min(20.0, sum(diffs)))
            ws = [math.exp(s)] * len(diffs)
        else:
            ws = [math.exp(max(-20.0, min(20.0, d))) for d in diffs]
        lo = -math.inf if low is None else low
        hi = math.inf if high is None else high
        k = 0
        for t in range(T):
            if not mask[b, t]:
                continue
            w = ws[k]
            k += 1
            if kind == "tis":
                w = min(max(w, lo), hi)
            elif not lo <= w <= hi:
                w = 0.0
            out[b, t] = w
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("seed", [0, 1])
def test_weight_equals_the_reference(kind, level, seed):
    logp, logp_old, _, mask = make_batch(seed=seed, scale=0.8)
    c = op.Correction(kind, level=level)
    w = c.weight(logp, logp_old, mask)
    ref = reference_weight(logp, logp_old, mask, kind, level, c.low, c.high)
    assert torch.allclose(w, ref, rtol=1e-14, atol=0)
    assert w[~mask].abs().max() == 0
    inside = (w > 0) & (w < (c.high or math.inf))  # the check is not vacuous
    assert inside.any()
    if kind != "tis":
        assert ((w == 0) & mask).any()  # something was masked


def test_closed_forms_at_chosen_ratios():
    ratios = torch.tensor([[0.1, 0.4, 0.5, 1.0, 1.9, 2.0, 2.5, 5.0, 7.0]], dtype=torch.float64)
    lb = torch.zeros_like(ratios)
    lt = ratios.log()
    tis = op.importance_weight(lt, lb, correction="tis")
    mis = op.importance_weight(lt, lb, correction="mis")
    ice = op.importance_weight(lt, lb, correction="icepop")
    r = ratios[0]
    assert torch.allclose(tis[0], r.clamp(max=2.0), rtol=1e-15)
    assert torch.allclose(mis[0], torch.where(r <= 2.0, r, 0.0), rtol=1e-15)
    assert torch.allclose(ice[0], torch.where((r >= 0.5) & (r <= 5.0), r, 0.0), rtol=1e-15)
    # sequence level: one product per response, broadcast
    seq = op.importance_weight(lt[:, :3], lb[:, :3], correction="tis", level="sequence", high=1e9)
    assert torch.allclose(seq, torch.full_like(seq, 0.1 * 0.4 * 0.5), rtol=1e-14)


def test_defaults_are_the_sources():
    assert (op.Correction("tis").high, op.Correction("tis").low) == (2.0, None)
    assert (op.Correction("mis").high, op.Correction("mis").mode) == (2.0, "mask")
    ice = op.Correction("icepop")
    assert (ice.low, ice.high, ice.mode, ice.level) == (0.5, 5.0, "mask", "token")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", LEVELS)
def test_on_policy_weight_is_one(kind, level):
    logp, _, _, mask = make_batch(seed=2)
    w = op.importance_weight(logp, logp, mask, kind, level=level)
    assert torch.equal(w[mask], torch.ones_like(w[mask]))


def test_unweighted_is_one_on_real_tokens():
    logp, logp_old, _, mask = make_batch(seed=9, scale=0.8)
    w = op.Unweighted().weight(logp, logp_old, mask)
    assert torch.equal(w, mask.to(w.dtype)) and w.dtype == logp.dtype
    with pytest.raises(ValueError, match="must both be"):
        op.Unweighted().weight(logp, logp_old[:, :-1])


def test_weight_carries_no_gradient():
    logp, logp_old, adv, mask = make_batch(seed=3)
    leaf = logp.clone().requires_grad_(True)
    w = op.importance_weight(leaf, logp_old, mask, "tis")
    assert not w.requires_grad


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("per_token_weight", [True, False])
def test_autograd_equals_closed_form_with_weight(name, agg, kind, level, per_token_weight):
    logp, logp_old, adv, mask = make_batch(seed=4, scale=0.5)
    m = held(name)
    if m.level == "sequence":
        logp = logp_old + 3e-4 * torch.randn_like(logp)
    spread = 0.6 if level == "token" else 0.1  # keep some sequences inside the band
    behaviour = logp_old + spread * torch.randn_like(logp_old)
    w = op.importance_weight(logp_old, behaviour, mask, kind, level=level)
    if not per_token_weight:
        w = w.amax(-1)  # a [B] weight
    m = held(name)
    leaf = logp.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg, is_weight=w), leaf)
    closed = m.expected_grad(logp, logp_old, adv, mask, agg, is_weight=w)
    assert (auto - closed).abs().max() < 1e-14
    assert rlgates.check_gradient(m, logp, logp_old, adv, mask, agg, is_weight=w)[2] < 1e-14
    # the weight is a factor outside the gate: w × the unweighted gradient
    (plain,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, agg), leaf)
    wf = w if w.dim() == 2 else w[:, None]
    assert torch.allclose(auto, plain * wf, rtol=1e-13, atol=1e-300)
    assert (auto != 0).any()


@pytest.mark.parametrize("name_", ["ppo", "sao", "sapo"])
def test_finite_differences_of_the_weighted_loss(name_):
    logp, logp_old, adv, mask = make_batch(B=4, T=5, seed=6, scale=0.3)
    behaviour = logp_old + 0.5 * torch.randn_like(logp_old)
    w = op.importance_weight(logp_old, behaviour, mask, "icepop")
    m = rlgates.get(name_)
    leaf = logp.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(m.loss(leaf, logp_old, adv, mask, is_weight=w), leaf)
    h = 1e-6
    fd = torch.zeros_like(logp)
    for idx in zip(*torch.nonzero(mask, as_tuple=True), strict=True):
        up, dn = logp.clone(), logp.clone()
        up[idx] += h
        dn[idx] -= h
        fd[idx] = (m.loss(up, logp_old, adv, mask, is_weight=w)
                   - m.loss(dn, logp_old, adv, mask, is_weight=w)) / (2 * h)
    assert torch.allclose(auto, fd, rtol=1e-6, atol=1e-8)


def test_unit_weight_is_the_method_loss(name):
    logp, logp_old, adv, mask = make_batch(seed=7)
    m = held(name)
    ones = op.importance_weight(logp, logp, mask, "tis")
    assert torch.allclose(m.loss(logp, logp_old, adv, mask, is_weight=ones),
                          m.loss(logp, logp_old, adv, mask), rtol=1e-15, atol=0)


def test_identities_by_enumeration():
    """E_old[ρ] = 1 and E_old[log ρ] = −KL(π_old ‖ π) ≤ 0, summed over a vocabulary."""
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        p_old = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), 0)
        p_new = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), 0)
        rho = p_new / p_old
        kl = float((p_old * (p_old / p_new).log()).sum())
        assert abs(float((p_old * rho).sum()) - 1) < 1e-14
        assert abs(float((p_old * rho.log()).sum()) + kl) < 1e-14
        assert kl > 0


# --- the lab wiring: LabConfig(anchor="proximal", correction=...) -----------------------------
def _lab(method="ppo", seeds=(0,), lag=2, steps=4, **cfg):
    config = lab.LabConfig(steps=steps, anchor="proximal").replace(**cfg)
    return lab.train(method, config, seeds=list(seeds), lag=lag, agg="token-mean",
                     progress=False)


def _same(a, b, keys=("reward", "entropy", "ppo_kl", "log_ratio_absmax", "is_weight_mean")):
    return all(torch.allclose(torch.tensor(a[k]), torch.tensor(b[k]), rtol=1e-5, atol=1e-7)
               for k in keys)


class _Spy:
    """A correction that records what the lab hands it and what it returns."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def weight(self, logp_target, logp_behaviour, mask):
        w = self.inner.weight(logp_target, logp_behaviour, mask)
        self.calls.append((logp_target, logp_behaviour, mask, w))
        return w


def test_lab_token_tis_is_the_labs_decoupled_ppo():
    """The lab's native weight min(π_prox/π_behav, 2) is token-level TIS at C = 2."""
    native = _lab(seeds=(0, 1), lag=3, steps=5, is_cap=2.0)
    tis = _lab(seeds=(0, 1), lag=3, steps=5, correction=op.Correction("tis"))
    assert all(_same(a, b) for a, b in zip(native, tis, strict=True))
    assert abs(native[0].final("is_weight_mean", 5) - 1) > 1e-4  # the weight did something


def test_lab_hands_the_correction_proximal_and_behaviour_rows():
    spy, rollouts = _Spy(op.Correction("mis", high=1.02)), []
    config = lab.LabConfig(steps=3, anchor="proximal", correction=spy)
    lab.train("ppo", config, seeds=[0, 1], lag=4, progress=False,
              hook=lambda ev, info: ev == "rollout" and rollouts.append(info))
    assert len(spy.calls) == 3
    for (target, behav, mask, _), info in zip(spy.calls, rollouts, strict=True):
        assert target.shape == behav.shape == mask.shape == (2 * 64, 8)  # [R·B, T] rows
        assert torch.equal(behav, info["logp_behaviour"].flatten(0, 1))
        assert torch.equal(mask, lab.PatternTask().mask(info["tokens"]).flatten(0, 1))
    target, behav, mask, w = spy.calls[-1]  # after 8 updates at lag 4: π_prox ≠ μ
    assert (target - behav)[mask].abs().max() > 1e-3
    assert ((w == 0) & mask).any() and (w[mask] > 0).any()  # the mask dropped some, kept some


def test_lab_passes_the_corrected_weight_to_the_loss():
    """One run (so no per-run aggregation constant): the loss sees the correction's rows."""
    spy, seen = _Spy(op.Correction("icepop", level="sequence", low=0.97, high=1.03)), []
    ppo = rlgates.get("ppo")

    class Recorder:
        name, level, agg, gate = "ppo", ppo.level, ppo.agg, ppo.gate

        def loss(self, logp, logp_old, adv, mask, agg, is_weight=None):
            seen.append((len(spy.calls), is_weight))
            return ppo.loss(logp, logp_old, adv, mask, agg, is_weight=is_weight)

    lab.train(Recorder(), lab.LabConfig(steps=3, anchor="proximal", correction=spy),
              seeds=[5], lag=4, progress=False)
    for call, w in seen:
        full = spy.calls[call - 1][3]
        for row in w:  # every minibatch row is one of the rollout's weight rows
            assert (full == row).all(-1).any()
    last = spy.calls[-1]
    mask, w = last[2], last[3]
    # sequence level: one weight per response, on its real tokens
    assert torch.equal(torch.where(mask, w, 0), torch.where(mask, w.amax(-1, keepdim=True), 0))
    assert ((w == 0) & mask).any()


@pytest.mark.parametrize("correction", [op.Correction("mis", level="sequence"),
                                        op.Correction("icepop"), op.Unweighted()])
def test_lab_at_lag_zero_every_correction_is_decoupled_ppo(correction):
    """With fresh rollouts π_prox = μ, so every weight is 1 and the runs coincide."""
    base = _lab(lag=0, steps=4)
    other = _lab(lag=0, steps=4, correction=correction)
    assert _same(base[0], other[0])
    assert max(abs(v - 1) for v in other[0]["is_weight_mean"]) < 1e-5


def test_unweighted_keeps_the_anchor_and_drops_the_weight():
    runs = _lab(lag=4, steps=4, correction=op.Unweighted())
    assert runs[0]["is_weight_mean"] == [1.0] * 4
    native = _lab(lag=4, steps=4)
    assert not _same(runs[0], native[0], keys=("reward", "ppo_kl"))


def test_lab_batched_run_equals_the_run_alone_with_a_correction():
    c = op.Correction("tis", level="sequence")
    together = _lab(seeds=(0, 1, 2), lag=3, steps=4, correction=c)
    alone = _lab(seeds=(1,), lag=3, steps=4, correction=c)
    assert _same(together[1], alone[0])


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"kind": "nope"}, "kind must be one of"),
    ({"kind": "tis", "level": "batch"}, "level must be one of"),
    ({"kind": "tis", "high": -1.0}, "high must be finite and > 0"),
    ({"kind": "mis", "high": float("nan")}, "high must be finite"),
    ({"kind": "icepop", "low": 5.0, "high": 0.5}, "low must be < high"),
    ({"kind": "tis", "high": "x"}, "must be a number"),
])
def test_bad_corrections(kw, match):
    with pytest.raises(ValueError, match=match):
        op.Correction(**kw)


def test_bad_weights_and_shapes():
    logp, logp_old, adv, mask = make_batch(seed=8)
    m = rlgates.get("ppo")
    B, T = logp.shape
    for bad in (torch.ones(B + 1, dtype=logp.dtype), -torch.ones(B, dtype=logp.dtype),
                torch.full((B, T), math.nan, dtype=logp.dtype)):
        with pytest.raises(ValueError, match="is_weight must be"):
            m.loss(logp, logp_old, adv, mask, is_weight=bad)
    with pytest.raises(ValueError, match="must both be"):
        op.importance_weight(logp, logp_old[:, :-1], None)
    with pytest.raises(ValueError, match=r"mask must have shape \(6, 9\), got \(6, 8\)"):
        op.importance_weight(logp, logp_old, mask[:, :-1])
    with pytest.raises(ValueError, match="not both"):
        op.importance_weight(logp, logp_old, mask, op.Correction("tis"), high=3.0)
    with pytest.raises(ValueError, match="anchor='proximal'"):
        lab.train("ppo", lab.LabConfig(steps=1, correction=op.Correction("tis")), progress=False)
    with pytest.raises(ValueError, match="weight"):
        lab.train("ppo", lab.LabConfig(steps=1, anchor="proximal", correction="tis"),
                  progress=False)
