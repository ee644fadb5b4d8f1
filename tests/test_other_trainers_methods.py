"""The losses other trainers register, through the gate lens: TOPR (ROLL), GLM-5's rollout_is
(SkyRL), IPO (prime-rl) as methods; OpenRLHF's seq-mask-tis and AReaL's M2PO as corrections.

Hand-worked edges in the style of tests/test_boundaries.py, each trainer's formula as its
source writes it (rlgates/reference.py), and, where the trainer is installed (OpenRLHF, AReaL:
`trainers-extra`), its own function."""

import ast
import math

import pytest
import torch

import rlgates
from rlgates import offpolicy as op
from rlgates import reference
from tests.conftest import make_batch

F64 = torch.float64
UP, DOWN = math.inf, -math.inf


def t(x):
    return torch.as_tensor(x, dtype=F64)


def nudge(x, direction):
    return math.nextafter(x, direction)


# --- TOPR ---------------------------------------------------------------------------------------
# A > 0: gate 1/ρ, f = 1 + log ρ. A ≤ 0: gate min(1, 1/ρ), f = ρ up to 1, then 1 + log ρ.
TOPR = [
    (1.0, 1.0, 1.0, 1.0),
    (2.0, 1.0, 0.5, 1 + math.log(2.0)),
    (0.5, 1.0, 2.0, 1 - math.log(2.0)),
    (0.5, -1.0, 1.0, 0.5),
    (1.0, -1.0, 1.0, 1.0),
    (4.0, -1.0, 0.25, 1 + math.log(4.0)),
    (0.25, 0.0, 1.0, 0.25),  # A = 0 takes the A ≤ 0 branch, as ROLL's `scores <= 0`
    (4.0, 0.0, 0.25, 1 + math.log(4.0)),
]


@pytest.mark.parametrize("ratio, adv, gate, weight", TOPR)
def test_topr_table(ratio, adv, gate, weight):
    m = rlgates.get("topr")
    assert float(m.gate(t(ratio), t(adv))) == pytest.approx(gate, rel=1e-14, abs=0)
    assert float(m.weight(t(ratio), t(adv))) == pytest.approx(weight, rel=1e-14, abs=1e-300)


def test_topr_weights_scale_each_side():
    m = rlgates.get("topr", pos_weight=0.5, neg_weight=2.0)
    assert float(m.gate(t(2.0), t(1.0))) == 0.25 and float(m.gate(t(0.5), t(-1.0))) == 2.0
    assert float(m.weight(t(1.0), t(1.0))) == 0.5 and float(m.weight(t(1.0), t(-1.0))) == 2.0
    for bad in ({"pos_weight": -0.1}, {"neg_weight": float("nan")}, {"eps": 0.2}):
        with pytest.raises(ValueError):
            rlgates.get("topr", **bad)


def test_topr_is_roll_when_scores_have_the_advantages_sign():
    """ROLL splits by the response's score; with scores of A's sign its loss is rlgates'; with a
    score whose sign differs (a baseline), ROLL's branch is the other one."""
    logp, logp_old, adv, mask = make_batch(seed=11, scale=0.8)
    m = rlgates.get("topr")
    scores = adv * 3.0  # same sign
    for agg in rlgates.AGG_MODES:
        a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        ours = m.loss(a, logp_old, adv, mask, agg)
        theirs = reference.topr_loss(b, logp_old, adv[:, None].expand_as(logp), mask, agg,
                                     scores=scores)
        ours.backward()
        theirs.backward()
        assert torch.allclose(ours, theirs, rtol=1e-13) and torch.allclose(a.grad, b.grad)
    flipped = torch.where(adv > 0, -1.0, 1.0).to(F64)  # every score's sign opposite to A's
    b = logp.clone().requires_grad_(True)
    reference.topr_loss(b, logp_old, adv[:, None].expand_as(logp), mask, m.agg,
                        scores=flipped).backward()
    a = logp.clone().requires_grad_(True)
    m.loss(a, logp_old, adv, mask).backward()
    assert not torch.allclose(a.grad, b.grad)


def test_topr_on_policy_is_the_policy_gradient():
    """At ρ = 1 both branches weigh the gradient 1: REINFORCE's A·∇log π."""
    logp, _, adv, mask = make_batch(seed=12)
    m, r = rlgates.get("topr"), rlgates.get("reinforce")
    for agg in rlgates.AGG_MODES:
        assert torch.allclose(m.expected_grad(logp, logp, adv, mask, agg),
                              r.expected_grad(logp, logp, adv, mask, agg), rtol=1e-15, atol=0)


# --- GLM-5's rollout_is (SkyRL) -------------------------------------------------------------------
GLM5 = [  # an open band (0.8, 1.2) whatever the sign of A: SAO's gate with ε = 0.2
    *[(r, a, g) for a in (1.0, -1.0, 0.0) for r, g in [
        (nudge(0.8, DOWN), 0.0), (0.8, 0.0), (nudge(0.8, UP), 1.0), (1.0, 1.0),
        (nudge(1.2, DOWN), 1.0), (1.2, 0.0), (nudge(1.2, UP), 0.0), (3.0, 0.0)]],
]


@pytest.mark.parametrize("ratio, adv, gate", GLM5)
def test_glm5_rollout_is_table(ratio, adv, gate):
    m = rlgates.get("glm5_rollout_is")
    assert float(m.gate(t(ratio), t(adv))) == gate
    assert float(m.gate(t(ratio), t(adv))) == float(
        rlgates.get("sao", eps_low=0.2, eps_high=0.2).gate(t(ratio), t(adv)))


def test_glm5_rollout_is_is_saos_gradient_in_cispos_form():
    """Same gradient as SAO at the same band; the value carries log π (SkyRL's form)."""
    logp, logp_old, adv, mask = make_batch(seed=13, scale=0.3)
    glm5, sao = rlgates.get("glm5_rollout_is"), rlgates.get("sao", eps_low=0.2, eps_high=0.2)
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    va, vb = glm5.loss(a, logp_old, adv, mask), sao.loss(b, logp_old, adv, mask)
    va.backward()
    vb.backward()
    assert torch.allclose(a.grad, b.grad, rtol=1e-14, atol=1e-300)
    assert not torch.allclose(va, vb)
    ratio = (logp - logp_old).exp()
    assert (((ratio <= 0.8) | (ratio >= 1.2)) & mask).any()  # the band dropped some tokens
    assert (a.grad[((ratio <= 0.8) | (ratio >= 1.2))] == 0).all()


# --- IPO (prime-rl) -------------------------------------------------------------------------------
# μ = 0.5, ε = 0.25: the band in ρ is [0.5, 1.5], edges kept (prime-rl drops |π − μ| > ε). With
# τ = 0 the gate is the band's indicator and f = clip(ρ, 0.5, 1.5). With τ = 0.1 and ρ = e
# (outside the band, indicator 0): A = 1 gives gate −2·0.1·1/(e·1) = −0.2/e, f = 1.5 − 0.1;
# A = −2 gives gate 0.1/e, f = 1.5 + 0.05.
IPO = [
    (0.0, 1.5, 1.0, 1.0, 1.5),
    (0.0, nudge(1.5, UP), 1.0, 0.0, 1.5),
    (0.0, 0.5, -1.0, 1.0, 0.5),
    (0.0, 0.4999, -1.0, 0.0, 0.5),  # π = 0.24995: |π − μ| > ε
    (0.0, 1.2, -1.0, 1.0, 1.2),  # whatever the sign of A
    (0.0, 3.0, -1.0, 0.0, 1.5),
    (0.1, 1.0, 1.0, 1.0, 1.0),
    (0.1, math.e, 1.0, -0.2 / math.e, 1.4),
    (0.1, math.e, -2.0, 0.1 / math.e, 1.55),
    (0.1, 1.2, 0.0, 1.0, 1.2),  # A = 0: f is the band alone, the gate its derivative
    (0.1, 3.0, 0.0, 0.0, 1.5),
]


@pytest.mark.parametrize("tau, ratio, adv, gate, weight", IPO)
def test_ipo_table(tau, ratio, adv, gate, weight):
    m = rlgates.get("ipo", eps=0.25, tau=tau)
    side = rlgates.SideInfo(probs_old=0.5)
    assert float(m.gate(t(ratio), t(adv), side)) == pytest.approx(gate, rel=1e-14, abs=1e-16)
    assert float(m.weight(t(ratio), t(adv), side)) == pytest.approx(weight, rel=1e-14, abs=0)


def test_ipo_band_moves_with_mu_and_is_dppo_tv_without_the_sign():
    m = rlgates.get("ipo")
    low, high = m.edges(torch.tensor([0.9, 0.1], dtype=F64))
    assert torch.allclose(high, t([1 + 0.1 / 0.9, 2.0])) and float(low[1]) == 0.0
    # τ = 0 and c large: IPO's gate is DPPO-TV's on the side A pushes, and also the other side
    ipo, dppo = rlgates.get("ipo", tau=0.0), rlgates.get("dppo_tv", delta_low=0.1,
                                                          delta_high=0.1, c=1e9)
    side = rlgates.SideInfo(probs_old=0.4)
    r = torch.linspace(-1, 1, 201, dtype=F64).exp()
    up = r >= 1
    assert torch.equal(ipo.gate(r[up], t(1.0), side), dppo.gate(r[up], t(1.0), side))
    assert torch.equal(ipo.gate(r[~up], t(-1.0), side), dppo.gate(r[~up], t(-1.0), side))
    # DPPO keeps a falling token with A > 0 however far it falls; IPO drops it
    assert float(dppo.gate(t(0.5), t(1.0), side)) == 1.0
    assert float(ipo.gate(t(0.5), t(1.0), side)) == 0.0


def test_ipo_pulls_at_a_zero_and_matches_prime_rl():
    logp, logp_old, adv, mask = make_batch(seed=14, scale=0.6)
    m = rlgates.get("ipo")
    zero = torch.zeros_like(adv)
    leaf = logp.clone().requires_grad_(True)
    m.loss(leaf, logp_old, zero, mask).backward()
    n = mask.sum()
    expected = torch.where(mask, 2 * 1e-3 * (logp - logp_old) / n, 0.0)  # d/dlogπ of τ(log ρ)²
    assert torch.allclose(leaf.grad, expected, rtol=1e-13, atol=1e-300)
    # the mask acted on this batch: some real tokens moved more than ε in probability
    moved = ((logp.exp() - logp_old.exp()).abs() > 0.1) & mask
    assert moved.any() and (~moved & mask).any()
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours, theirs = m.loss(a, logp_old, adv, mask), reference.ipo_loss(
        b, logp_old, adv[:, None].expand_as(logp), mask, "token-mean")
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=1e-13) and torch.allclose(a.grad, b.grad, rtol=1e-13)


def test_ipo_needs_mu():
    with pytest.raises(ValueError, match="probs_old"):
        rlgates.get("ipo").gate(t(1.0), t(1.0))
    for bad in ({"eps": -0.1}, {"tau": -1.0}, {"eps": "wide"}):
        with pytest.raises(ValueError):
            rlgates.get("ipo", **bad)


def test_each_class_cites_its_source():
    for name, repo in (("topr", "alibaba/ROLL"), ("glm5_rollout_is", "NovaSky-AI/SkyRL"),
                       ("ipo", "PrimeIntellect-ai/prime-rl")):
        cls = rlgates.REGISTRY[name]
        assert cls.source.startswith(repo) and repo in (cls.__doc__ or "").replace("\n", " ")
        assert cls.chapter in (13, 18) and cls.paper


# --- seq-mask-tis (OpenRLHF) ----------------------------------------------------------------------

def test_seq_mask_tis_by_hand():
    """One response with token weights (0.5, 2, 4): geometric mean 4^(1/3) ≈ 1.587, inside
    [0.5, 5]: every token keeps its own, untruncated weight. A second whose mean is 8
    is dropped whole. Padding is 0 and does not enter the mean."""
    w = t([[0.5, 2.0, 4.0, 1e6], [8.0, 8.0, 8.0, 8.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    out = op.importance_weight(w.log(), torch.zeros_like(w), mask, "seq_mask_tis")
    assert torch.allclose(out, t([[0.5, 2.0, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), rtol=1e-15)
    c = op.Correction("seq_mask_tis")
    assert (c.low, c.high, c.level) == (0.5, 5.0, "sequence")
    with pytest.raises(ValueError, match="sequence"):
        op.Correction("seq_mask_tis", level="token")
    # the band's edges are kept (OpenRLHF: stat >= low & stat <= high)
    edge = op.importance_weight(t([[math.log(5.0)]]), t([[0.0]]), None, "seq_mask_tis")
    assert float(edge) == pytest.approx(5.0, rel=1e-15)


def _openrlhf():
    conf = pytest.importorskip("rlgates.trainers.conformance_openrlhf")
    if not conf.installed():
        pytest.skip("OpenRLHF is not installed (trainers-extra)")
    return conf


@pytest.mark.parametrize("seed", [0, 1])
def test_seq_mask_tis_is_openrlhfs_policy_loss(seed):
    """OpenRLHF's PolicyLoss with the seq-mask-tis settings = rlgates' PPO with the correction's
    weight as `is_weight`, value and gradient, token mean."""
    conf = _openrlhf()
    policy_loss = conf.load().loss.PolicyLoss(
        clip_eps_low=0.2, clip_eps_high=0.2, is_correction_level="seq",
        is_correction_mode="mask", is_correction_gating="ratio",
        is_correction_threshold=[0.5, 5.0])
    logp, logp_old, adv, mask = make_batch(B=8, T=12, seed=seed, scale=0.4)
    g = torch.Generator().manual_seed(seed)
    spread = torch.tensor([0.05, 0.3, 1.5, 2.5, 0.05, 0.3, 1.5, 2.5], dtype=F64)[:, None]
    rollout = logp_old + spread * torch.randn(logp.shape, generator=g, dtype=F64)
    w = op.importance_weight(logp_old, rollout, mask, "seq_mask_tis")
    assert ((w == 0) & mask).any() and ((w > 0) & mask).any()  # some responses dropped, some kept
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours = rlgates.get("ppo").loss(a, logp_old, adv, mask, "token-mean", is_weight=w)
    adv_t = adv[:, None].expand_as(logp).clone()
    theirs = policy_loss(b, logp_old, adv_t, action_mask=mask.to(F64), rollout_log_probs=rollout)[0]
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-15)
    assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-300)


def test_openrlhfs_default_threshold_is_the_corrections():
    conf = _openrlhf()
    defaults = conf.cli_defaults()
    key = next(k for k in defaults if k.endswith("is_correction_threshold"))
    assert list(defaults[key]) == [op.Correction("seq_mask_tis").low,
                                   op.Correction("seq_mask_tis").high]


# --- M2PO (AReaL) ---------------------------------------------------------------------------------

def test_m2po_by_hand():
    """log w = (0.5, −0.3, 0.1, 0): M2 = (0.25, 0.09, 0.01, 0). Means of the suffixes of the
    sorted list: 0.0875, 0.0333…, 0.005, 0. τ = 0.04: drop one (0.25); τ = 0.1: drop none;
    τ = 0.003: drop three; τ = 1e-9: no suffix mean is below, so all but the smallest go."""
    lw = t([[0.5, -0.3, 0.1, 0.0]])
    for tau, keep in ((0.04, [0, 1, 1, 1]), (0.1, [1, 1, 1, 1]), (0.003, [0, 0, 0, 1]),
                      (1e-9, [0, 0, 0, 1])):
        w = op.importance_weight(lw, torch.zeros_like(lw), None, op.Correction("m2po", high=tau))
        assert w.tolist() == [[float(k) for k in keep]], tau
    assert op.Correction("m2po").high == 0.04
    with pytest.raises(ValueError):
        op.Correction("m2po", level="sequence")
    with pytest.raises(ValueError):
        op.Correction("m2po", low=0.01)


def test_m2po_reads_only_real_tokens_and_the_whole_batch():
    """M2 = (0.25, pad, 0.09, 0.01), τ = 0.1: the real tokens' suffix means are 0.1167, 0.05, so
    the 0.25 goes, across rows. Counting the padding's M2 = 0 would give a first mean of 0.0875
    and keep every token."""
    lw = t([[0.5, 0.0], [-0.3, 0.1]])
    mask = torch.tensor([[True, False], [True, True]])
    tau = op.Correction("m2po", high=0.1)
    w = op.importance_weight(lw, torch.zeros_like(lw), mask, tau)
    assert w.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert tau.apply(lw).tolist() == [[1.0, 1.0], [1.0, 1.0]]  # the padding counted


def _areal_functions(relative, names, **namespace):
    """AReaL's functions `names`, compiled from the installed file `relative` (importing AReaL's
    modules needs its full dependency set; its loss code needs only torch)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("areal")
    if spec is None:
        pytest.skip("AReaL is not installed (trainers-extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == set(names)
    ns = {"torch": torch, **namespace}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    return ns


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_m2po_is_areals_mask(seed, dtype):
    ns = _areal_functions("trainer/ppo/actor.py", ("_apply_m2po_masking", "_get_m2po_loss_mask"))
    _, prox, _, mask = make_batch(B=8, T=16, seed=seed, scale=0.1, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    behave = prox + 0.3 * torch.randn(prox.shape, generator=g, dtype=dtype)
    behave[0, :4] = prox[0, :4] + 0.25  # ties in M2
    dropped = {}
    for tau in (0.04, 0.01, 1.0):
        theirs = ns["_apply_m2po_masking"](behave, prox, mask, tau)
        ours = op.importance_weight(prox, behave, mask, op.Correction("m2po", high=tau))
        assert torch.equal(ours.bool(), theirs), tau
        dropped[tau] = int((~theirs & mask).sum())
    assert dropped[0.01] > dropped[0.04] > 0 and dropped[1.0] == 0


def test_m2po_with_areals_ppo_loss_differs_only_by_the_kept_share():
    """AReaL applies the pick to the loss mask before its PPO loss counts the tokens, so its
    token mean divides by the kept tokens; `is_weight` keeps rlgates' normaliser, so AReaL's loss
    and gradient are rlgates' times N_real/N_kept, one constant per micro-batch."""

    class RejectionSamplingConfig:  # the annotation ppo_actor_loss_fn's signature names
        pass

    ns = _areal_functions("utils/functional/functional.py", ("ppo_actor_loss_fn",),
                          RejectionSamplingConfig=RejectionSamplingConfig)
    ns_m2 = _areal_functions("trainer/ppo/actor.py", ("_apply_m2po_masking",
                                                      "_get_m2po_loss_mask"))
    logp, prox, adv, mask = make_batch(B=8, T=16, seed=3, scale=0.3)
    g = torch.Generator().manual_seed(3)
    behave = prox + 0.3 * torch.randn(prox.shape, generator=g, dtype=F64)
    kept = ns_m2["_apply_m2po_masking"](behave, prox, mask, 0.04)
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    adv_t = adv[:, None].expand_as(logp).clone()
    theirs, _ = ns["ppo_actor_loss_fn"](logprobs=b, proximal_logprobs=prox, old_logprobs=behave,
                                        advantages=adv_t, eps_clip=0.2, loss_mask=kept)
    w = op.importance_weight(prox, behave, mask, "m2po")
    ours = rlgates.get("ppo").loss(a, prox, adv, mask, "token-mean", is_weight=w)
    theirs.backward()
    ours.backward()
    share = mask.sum().to(F64) / kept.sum().to(F64)
    assert 1 < share < mask.sum()
    assert torch.allclose(theirs, ours * share, rtol=1e-13)
    assert torch.allclose(b.grad, a.grad * share, rtol=1e-13, atol=1e-300)
