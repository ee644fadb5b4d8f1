"""Importance weights (TIS, MIS, IcePop) as stop-gradient factors: closed form, an independent
trainer-style reference, autograd, finite differences, the identities, the lab wiring, bad input."""

import math

import pytest
import torch

import rlgates
from rlgates import lab
from rlgates import offpolicy as op
from tests.conftest import make_batch

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
    m = rlgates.get(name)
    if m.level == "sequence":
        logp = logp_old + 3e-4 * torch.randn_like(logp)
    spread = 0.6 if level == "token" else 0.1  # keep some sequences inside the band
    behaviour = logp_old + spread * torch.randn_like(logp_old)
    w = op.importance_weight(logp_old, behaviour, mask, kind, level=level)
    if not per_token_weight:
        w = w.amax(-1)  # a [B] weight
    m = rlgates.get(name)
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
    m = rlgates.get(name)
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


# --- the lab wiring ----------------------------------------------------------------------------
class _FakePolicy:
    def __init__(self, table):
        self.table = table

    def log_probs(self, tokens, prompts):
        return self.table[tokens[:, 0]]


def test_behaviour_rows_follow_a_permuted_minibatch():
    g = torch.Generator().manual_seed(0)
    prox = -torch.rand(6, 4, generator=g, dtype=torch.float64)
    behav = prox + 0.4 * torch.randn(6, 4, generator=g, dtype=torch.float64)
    tokens = torch.arange(6)[:, None].expand(6, 4)
    loss = op.OffPolicyLoss("ppo", "tis")
    loss.hook("update", {"update": 1, "policy": _FakePolicy(prox)})
    loss.hook("rollout", {"step": 3, "tokens": tokens, "prompts": None, "logp_rollout": behav})
    idx = torch.tensor([4, 0, 5])
    mask = torch.ones(3, 4, dtype=torch.bool)
    loss.loss(prox[idx].clone(), prox[idx], torch.ones(3, dtype=torch.float64), mask)
    expected = (prox[idx] - behav[idx]).exp().clamp(max=2.0)
    assert torch.allclose(loss.last_weight, expected, rtol=1e-15)


def test_step_zero_has_no_weight():
    loss = op.OffPolicyLoss("ppo", "mis")
    loss.hook("rollout", {"tokens": None, "prompts": None, "logp_rollout": torch.zeros(2, 3)})
    logp = torch.zeros(2, 3, dtype=torch.float64)
    loss.loss(logp, logp, torch.ones(2, dtype=torch.float64), None)
    assert loss.last_weight is None


def test_lab_at_lag_zero_matches_the_recomputed_anchor():
    cfg = lab.LabConfig(steps=4)
    plain = op.train_arm("ppo", "proximal", cfg, seed=0, lag=0)
    tis = op.train_arm(op.OffPolicyLoss("ppo", "tis"), "proximal", cfg, seed=0, lag=0)
    for key in ("reward", "loss", "gated"):
        assert torch.allclose(torch.tensor(plain[key]), torch.tensor(tis[key]), rtol=1e-5)


def test_lab_under_lag_uses_weights_away_from_one():
    cfg = lab.LabConfig(steps=4)
    seen = []
    m = op.OffPolicyLoss("ppo", "tis")
    inner = m.loss

    def spy(*a, **k):
        out = inner(*a, **k)
        if m.last_weight is not None:
            seen.append(m.last_weight)
        return out

    m.loss = spy
    op.train_arm(m, "proximal", cfg, seed=0, lag=2)
    w = torch.cat([x.flatten() for x in seen])
    assert seen and float(w.max()) <= 2.0 and float((w - 1).abs().max()) > 1e-3


def test_one_object_serves_several_runs():
    cfg = lab.LabConfig(steps=3)
    reused = op.OffPolicyLoss("ppo", "mis")
    first = op.train_arm(reused, "proximal", cfg, seed=0, lag=2)
    second = op.train_arm(reused, "proximal", cfg, seed=1, lag=2)
    fresh = op.train_arm(op.OffPolicyLoss("ppo", "mis"), "proximal", cfg, seed=1, lag=2)
    assert second["loss"] == fresh["loss"] and first["loss"] != second["loss"]


def test_a_rollout_anchor_is_refused():
    """With recompute_old=False the lab hands over the rollout log-probs, not the proximal ones."""
    m = op.OffPolicyLoss("ppo", "tis")
    with pytest.raises(ValueError, match="recompute_old=True"):
        lab.train(m, lab.LabConfig(steps=3), lag=2, hook=m.hook, progress=False)


# --- statistics --------------------------------------------------------------------------------
def test_paired_interval_and_verdict():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    b = a - torch.tensor([0.5, 0.7, 0.6, 0.4], dtype=torch.float64)
    mean, lo, hi = op.paired_interval(a, b)
    d = torch.tensor([0.5, 0.7, 0.6, 0.4], dtype=torch.float64)
    half = 3.182 * float(d.std()) / 2
    assert abs(mean - 0.55) < 1e-12 and abs(hi - lo - 2 * half) < 1e-12
    assert op.verdict(lo, hi) == "higher"
    assert op.verdict(-hi, -lo) == "lower"
    assert op.verdict(-0.1, 0.2) == "no difference detected"
    assert op.t975(9) == 2.262 and abs(op.t975(40) - 2.021) < 0.005


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
    with pytest.raises(ValueError, match="mask must be"):
        op.importance_weight(logp, logp_old, mask[:, :-1])
    with pytest.raises(ValueError, match="not both"):
        op.importance_weight(logp, logp_old, mask, op.Correction("tis"), high=3.0)
    with pytest.raises(ValueError, match="anchor"):
        op.train_arm("ppo", "rollout", lab.LabConfig(steps=1), 0, 0)
    with pytest.raises(ValueError, match="equal length"):
        op.paired_interval([1.0, 2.0], [1.0])
