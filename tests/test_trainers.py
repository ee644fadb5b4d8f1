"""rlgates inside the real trainers: TRL 1.16's GRPOTrainer and verl 0.9.1's policy losses.

Everything runs on the CPU with a model and a tokenizer built here (no hub, no downloads). The
comparisons are built so that each could fail:
- ρ ≠ 1: TRL runs with num_iterations=2, and the step compared is the second pass over a batch,
  after an optimiser step (asserted: |log ρ| > 0);
- ragged lengths: the end token's logit is biased at sampling, and the lengths are asserted to
  differ (so the aggregation modes give different numbers, also asserted);
- contrast: each case's hyperparameters are set from the captured ratios so that its gate is open
  on some tokens and shut (or clipped) on others, and both are asserted;
- no resampling: one step's inputs and weights are captured, and TRL's own loss and the adapter's
  are evaluated on exactly those, value and gradient, for every loss type that maps;
- verl: `get_policy_loss_fn(mode)` (verl's own code) against the adapter registered under a name of
  its own, on fixed tensors with an A < 0 token at ρ = 4, where dual-clip and PPO differ.
- verl's metrics: each mapped loss's actor/pg_clipfrac, pg_clipfrac_lower and ppo_kl from the
  adapter equal verl's own on two ragged micro-batches, where the old definitions do not.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import rlgates
from rlgates import diagnostics
from rlgates import trainers as rt

# Under xdist one worker runs this group (pyproject.toml: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("trainers")


@pytest.fixture(scope="module", autouse=True)
def trainers():
    """TRL and verl, imported when the first test here runs rather than when pytest collects the
    module: every xdist worker collects every module, and these imports cost ~20 s of CPU."""
    global GRPOTrainer, get_policy_loss_fn, FSDPActorConfig, rtrl, rverl
    global DATA, MAX_LEN, config, reward_words, tiny_model, tiny_tokenizer
    from trl import GRPOTrainer
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig

    from rlgates.trainers import trl as rtrl
    from rlgates.trainers import verl as rverl
    from tests.trl_run import DATA, MAX_LEN, config, reward_words, tiny_model, tiny_tokenizer


def byo_soft():
    """A bring-your-own gate: a Gaussian bump around ρ = 1 (f' = exp(−(ρ−1)²/2w²))."""
    def weight(r, a, w=0.1):
        return 1 + w * math.sqrt(math.pi / 2) * torch.erf((r - 1) / (w * math.sqrt(2)))
    return rlgates.byo.make(weight, name="bump_test", w=0.1)


@pytest.fixture(scope="module")
def run():
    """Two optimiser steps of a real GRPOTrainer with the rlgates adapter and a BYO gate; capture
    the two micro-batches of the second step (the second pass over the batch: ρ ≠ 1)."""
    calls, grabbed = [], {}

    class Capture(rtrl.RlgatesGRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            calls.append(1)
            if len(calls) == 3:
                grabbed["state"] = copy.deepcopy(model.state_dict())
            if len(calls) >= 3:
                grabbed.setdefault("inputs", []).append(
                    {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    model = tiny_model()
    trainer = Capture(model=model, reward_funcs=reward_words, args=config(loss_type="grpo"),
                      train_dataset=DATA, processing_class=tiny_tokenizer(), method=byo_soft())
    trainer.train()
    assert len(calls) == 4  # 2 steps × 2 micro-batches
    model.load_state_dict(grabbed["state"])
    return model, grabbed["inputs"], trainer.state.log_history


def logps(trainer, model, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    out, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att,
                                                            inputs["completion_ids"].size(1))
    return out


def loss_and_grads(trainer, model, batches, fn=None):
    model.zero_grad()
    total = 0.0
    for inputs in batches:
        loss = (fn or trainer.compute_loss)(model, inputs)
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


def rel_dist(g, h):
    """‖g − h‖ / ‖h‖ over all parameters' gradients."""
    num = sum(float((a - b).pow(2).sum()) for a, b in zip(g, h, strict=True))
    return math.sqrt(num / sum(float(b.pow(2).sum()) for b in h))


def make_trainer(cls, model, args, **kw):
    t = cls(model=model, reward_funcs=reward_words, args=args, train_dataset=DATA,
            processing_class=tiny_tokenizer(), **kw)
    t.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by train()
    model.train()
    return t


# --- the real run -----------------------------------------------------------------------------
def test_run_has_stale_ratios_ragged_lengths_and_logs_the_gate(run):
    model, batches, log = run
    lengths = torch.cat([b["completion_mask"].sum(-1) for b in batches])
    assert lengths.min() < lengths.max() and lengths.min() < MAX_LEN  # ragged, some ended early
    t = make_trainer(GRPOTrainer, model, config(loss_type="grpo"))
    with torch.no_grad():
        for b in batches:
            lr = (logps(t, model, b) - b["old_per_token_logps"])[b["completion_mask"].bool()]
            assert lr.abs().max() > 1e-3  # ρ ≠ 1: the gates can act
    steps = [e for e in log if "rlgates/gate_mean" in e]
    assert len(steps) == 2 and all(math.isfinite(e["loss"]) for e in steps)
    assert steps[0]["rlgates/gate_mean"] == pytest.approx(1.0, abs=1e-5)  # first pass: ρ = 1
    assert steps[1]["rlgates/gate_mean"] < 0.9  # second pass: the bump gate has narrowed


# --- TRL's loss against the adapter's, on the captured inputs --------------------------------
def _ratios(model, batches):
    t = make_trainer(GRPOTrainer, model, config(loss_type="grpo"))
    out = []
    with torch.no_grad():
        for b in batches:
            m = b["completion_mask"].bool()
            lr = logps(t, model, b) - b["old_per_token_logps"]
            seq = (lr * m).sum(-1) / m.sum(-1).clamp(min=1)
            adv = b["advantages"][:, None].expand_as(lr)
            out.append((lr[m & (adv != 0)].exp(), adv[m & (adv != 0)],
                        seq.exp()[b["advantages"] != 0]))
    tok = torch.cat([o[0] for o in out])
    adv = torch.cat([o[1] for o in out])
    seq = torch.cat([o[2] for o in out])
    return tok, adv, seq


def _between(x, q):
    """A bound at quantile q of x, half-way between two observed values: no ratio sits exactly
    on it (at an edge the trainers pass the gradient and rlgates does not)."""
    x = x.double().sort().values
    i = min(max(int(q * (len(x) - 1)), 0), len(x) - 2)
    return float((x[i] + x[i + 1]) / 2)


def _case(name, tok, adv, seq):
    """(loss_type override, method) with bounds placed inside the observed ratios."""
    d = (tok - 1).abs()
    eps = _between(d, 0.5)
    if name == "grpo":
        return None, rlgates.get("grpo", eps=eps)
    if name == "bnpo":
        return "bnpo", rlgates.get("dapo", eps_low=eps, eps_high=eps * 0.8)
    if name == "dr_grpo":
        return "dr_grpo", rlgates.get("grpo", eps=eps)
    if name == "dapo":
        return None, rlgates.get("dapo", eps_low=eps, eps_high=eps * 1.4)
    if name == "sapo":
        tau = 2.0 / eps  # sech²(1) ≈ 0.42 at the median |ρ − 1|
        return None, rlgates.get("sapo", tau_pos=tau, tau_neg=1.05 * tau)
    if name == "cispo":
        return None, rlgates.get("cispo", eps_low=1.0, eps_high=_between(tok[tok > 1] - 1, 0.5))
    if name in ("gspo", "luspo"):
        e = _between((seq - 1).abs(), 0.5)
        return None, rlgates.get(name, eps_low=e, eps_high=e)
    if name == "vespo":  # a narrower bump (peak at w = 1): stale responses weigh less
        return None, rlgates.get("vespo", k_pos=10.0, lambda_pos=10.0, k_neg=10.0,
                                 lambda_neg=10.0)
    if name == "dual_clip":
        e = _between(d, 0.1)
        neg = tok[(adv < 0) & (tok > 1 + e)]  # A < 0 tokens the update has pushed up
        return None, rlgates.get("dual_clip", eps=e, c=_between(neg, 0.5))
    raise KeyError(name)


def _assert_contrast(m, tok, adv, seq):
    if m.level == "sequence":
        # one advantage per sequence: the gate sees ρ_s and the sign of A_s
        g = torch.stack([m.gate(s, torch.tensor(1.0, dtype=s.dtype)) for s in seq] +
                        [m.gate(s, torch.tensor(-1.0, dtype=s.dtype)) for s in seq])
    else:
        g = m.gate(tok, adv)
    if m.level == "sequence-product":  # its ratio is the product: see TRL's logged φ instead
        return
    if m.name == "dual_clip":  # some A < 0 tokens past c: shut here, open under PPO
        assert ((adv < 0) & (tok > m.hparams["c"])).any()
    if m.name == "sapo":
        assert (g < 0.5).any() and (g > 0.9).any()
    elif m.name == "cispo":
        assert (g < 1).any() and (g == 1).any()  # clipped weights and unclipped ones
    else:
        assert (g == 0).any() and (g == 1).any()


TRL_CASES = ["grpo", "bnpo", "dr_grpo", "dapo", "sapo", "cispo", "gspo", "dual_clip", "luspo",
             "vespo"]


@pytest.mark.parametrize("case", TRL_CASES)
def test_trl_loss_equals_adapter(run, case):
    model, batches, _ = run
    tok, adv, seq = _ratios(model, batches)
    loss_type, m = _case(case, tok, adv, seq)
    _assert_contrast(m, tok, adv, seq)
    flags = rt.flags(m)["trl"]
    assert flags is not None
    if loss_type:
        flags = {**flags, "loss_type": loss_type}
    args = config(**flags)
    ref = make_trainer(GRPOTrainer, model, args)
    ours = make_trainer(rtrl.RlgatesGRPOTrainer, model, args, method=m)
    v_ref, g_ref = loss_and_grads(ref, model, batches)
    v_ours, g_ours = loss_and_grads(ours, model, batches)
    assert abs(v_ref) > 1e-6
    # TRL's fused head gives float32 log-probs: agreement to float32 rounding (a gate or
    # normaliser difference would show at order 1)
    assert v_ours == pytest.approx(v_ref, rel=1e-6)
    assert rel_dist(g_ours, g_ref) < 1e-6
    assert max(float(g.abs().max()) for g in g_ref) > 1e-6
    if m.name == "vespo":  # φ(w) acts on the real product ratios: TRL's own mean of it
        phi = ref._metrics["train"]["vespo/phi_seq_mean"]
        assert phi and all(0.05 < p < 0.95 for p in phi), phi
        assert ours._metrics["train"]["vespo/phi_seq_mean"] == pytest.approx(phi, rel=1e-6)


def test_aggregations_differ_on_these_lengths(run):
    """Equal lengths would make every aggregation mode equal: here they are not."""
    model, batches, _ = run
    t = make_trainer(GRPOTrainer, model, config())
    b = batches[0]
    with torch.no_grad():
        lp = logps(t, model, b)
    m = rlgates.get("grpo")
    args = (lp, b["old_per_token_logps"], b["advantages"], b["completion_mask"])
    vals = [float(m.loss(*args, agg=a)) for a in ("token-mean", "seq-mean-token-mean")]
    assert abs(vals[0] - vals[1]) > 1e-4


# --- the global normaliser across micro-batches ------------------------------------------------
def test_global_token_mean_over_micro_batches(run):
    """Two micro-batches, one optimiser step: TRL's dapo (global token count), the adapter, and
    rlgates' token-mean of the whole batch give one gradient; a per-micro-batch mean does not."""
    model, batches, _ = run
    counts = [int(b["completion_mask"].sum()) for b in batches]
    assert counts[0] != counts[1]  # otherwise local and global means coincide
    m = rlgates.get("dapo")
    args = config(**rt.flags(m)["trl"])
    ref = make_trainer(GRPOTrainer, model, args)
    ours = make_trainer(rtrl.RlgatesGRPOTrainer, model, args, method=m)
    v_ref, g_ref = loss_and_grads(ref, model, batches)
    v_ours, g_ours = loss_and_grads(ours, model, batches)

    def whole(model, _):
        full = {k: torch.cat([b[k] for b in batches]) for k in
                ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                 "old_per_token_logps", "advantages")}
        return m.loss(logps(ours, model, full), full["old_per_token_logps"], full["advantages"],
                      full["completion_mask"], agg="token-mean")

    v_full, g_full = loss_and_grads(ours, model, [None], fn=whole)
    n = sum(counts)

    def micro(model, b):  # the per-micro-batch token-mean, averaged over the accumulation steps
        return rt.loss(m, logps(ours, model, b), b["old_per_token_logps"], b["advantages"],
                       b["completion_mask"], "token-mean") / 2

    v_local, g_local = loss_and_grads(ours, model, batches, fn=micro)

    assert v_ours == pytest.approx(v_ref, rel=1e-6) and v_full == pytest.approx(v_ref, rel=1e-6)
    assert rel_dist(g_ours, g_ref) < 1e-6 and rel_dist(g_full, g_ref) < 1e-6
    assert abs(v_local - v_full) > 1e-3 and rel_dist(g_local, g_full) > 1e-2
    assert int(batches[0]["num_items_in_batch"]) == n  # TRL's global count: both micro-batches


def test_loss_norm_is_a_pure_rescale():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64)
    old = logp + 0.2 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    mask = torch.arange(6)[None] < torch.tensor([6, 2, 0, 4, 5])[:, None]
    m = rlgates.get("dapo")
    n = int(mask.sum())
    assert float(rt.loss(m, logp, old, adv, mask, "token-mean", norm=n)) == pytest.approx(
        float(m.loss(logp, old, adv, mask, agg="token-mean")), rel=1e-14)
    halves = [rt.loss(m, logp[s], old[s], adv[s], mask[s], "token-mean", norm=n)
              for s in (slice(0, 2), slice(2, 5))]
    assert float(sum(halves)) == pytest.approx(
        float(m.loss(logp, old, adv, mask, agg="token-mean")), rel=1e-13)
    with pytest.raises(ValueError):
        rt.loss(m, logp, old, adv, mask, "token-mean", length=8)


def test_adapter_refuses_what_it_does_not_carry():
    model = tiny_model()
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        make_trainer(rtrl.RlgatesGRPOTrainer, model, config(top_entropy_quantile=0.5),
                     method="grpo")
    with pytest.raises(ValueError, match="sequence level"):
        make_trainer(rtrl.RlgatesGRPOTrainer, model, config(), method="gspo")


# --- verl ----------------------------------------------------------------------------------------
def verl_batch():
    """Fixed float64 tensors: ragged rows (one empty), A of both signs and 0, an A < 0 token at
    ρ = 4 (dual-clip shuts it, PPO does not), and ratios on both sides of every bound used."""
    log_ratio = torch.tensor([
        [0.05, -0.30, 0.40, 0.10, 0.00, 0.0],
        [math.log(4.0), 0.10, -0.05, 0.35, 0.0, 0.0],
        [0.02, -0.01, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.40, 0.25, 0.15, -0.10, 0.30, -0.20],
        [0.0004, 0.0001, -0.0002, 0.0003, 0.0, 0.0],
    ], dtype=torch.float64)
    lengths = torch.tensor([5, 4, 2, 0, 6, 4])
    mask = torch.arange(6)[None] < lengths[:, None]
    old = -torch.linspace(0.5, 2.5, 36, dtype=torch.float64).reshape(6, 6)
    adv = torch.tensor([1.0, -1.5, 0.0, 0.3, -0.8, 1.2], dtype=torch.float64)[:, None]
    return old + log_ratio, old, adv.expand(6, 6).clone(), mask


def actor(**kw):
    c = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4, **kw)
    return c


def verl_vs_adapter(mode, m, cfg, agg):
    logp, old, adv, mask = verl_batch()
    name = rverl.register(m)
    assert name == f"rlgates_{m.name}" and name != mode
    results = []
    for fn in (get_policy_loss_fn(mode), get_policy_loss_fn(name)):
        lp = logp.clone().requires_grad_(True)
        loss, metrics = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                           loss_agg_mode=agg, config=cfg)
        loss.backward()
        results.append((loss.detach(), lp.grad, metrics))
    return results


def _verl_config(m, **extra):
    f = rt.flags(m)["verl"]
    keys = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "tau_pos", "tau_neg")
    kw = {k: f[k] for k in keys if k in f}
    if "clip_ratio_low" in kw:
        kw["clip_ratio"] = kw["clip_ratio_low"]
    return f["loss_mode"], f["loss_agg_mode"], actor(**kw, **extra)


VERL_CASES = {
    "dual_clip": rlgates.get("dual_clip"),
    "ppo": rlgates.get("ppo"),
    "grpo": rlgates.get("grpo"),
    "dapo": rlgates.get("dapo", eps_low=0.2, eps_high=0.3),
    "gspo": rlgates.get("gspo", eps_low=3e-4, eps_high=4e-4),
    "sapo": rlgates.get("sapo"),
    "cispo": rlgates.get("cispo", eps_low=0.2, eps_high=0.28),
    "luspo": rlgates.get("luspo"),  # verl's gspo under seq-mean-token-sum
}


@pytest.mark.parametrize("case", list(VERL_CASES))
def test_verl_loss_equals_adapter(case):
    m = VERL_CASES[case]
    mode, agg, cfg = _verl_config(m)
    (v_ref, g_ref, _), (v_ours, g_ours, metrics) = verl_vs_adapter(mode, m, cfg, agg)
    rel = 1e-7 if mode in ("gspo", "sapo") or agg == "seq-mean-token-mean" else 1e-12  # +1e-8
    assert float(v_ours) == pytest.approx(float(v_ref), rel=rel)
    torch.testing.assert_close(g_ours, g_ref, rtol=rel, atol=1e-12)
    assert g_ref.abs().max() > 1e-3
    # contrast: the gate is shut (or clipped) on some real A ≠ 0 tokens and open on others
    logp, old, adv, mask = verl_batch()
    if m.level == "sequence":
        lr = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        g = m.gate(lr.exp()[:, None].expand_as(adv), adv)
    else:
        g = m.gate((logp - old).exp(), adv)
    g = g[mask & (adv != 0)]
    shut = (g < 0.9) if m.name in ("sapo", "cispo") else (g == 0)
    assert shut.any() and (g == 1).any() if m.name != "sapo" else shut.any() and (g > 0.99).any()
    assert 0 <= metrics["actor/pg_clipfrac"] <= 1


def test_verl_default_is_dual_clip_not_ppo():
    """verl's vanilla loss at its default clip_ratio_c = 3 is rlgates' dual_clip; with the
    A < 0 token at ρ = 4 it differs from rlgates' ppo."""
    logp, old, adv, mask = verl_batch()
    cfg = actor(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert cfg.clip_ratio_c == 3.0
    lp = logp.clone().requires_grad_(True)
    v, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=lp, advantages=adv,
                                         response_mask=mask, loss_agg_mode="token-mean",
                                         config=cfg)
    ppo = rlgates.get("ppo").loss(logp, old, adv, mask, agg="token-mean")
    dual = rlgates.get("dual_clip").loss(logp, old, adv, mask, agg="token-mean")
    assert float(v.detach()) == pytest.approx(float(dual), rel=1e-13)
    assert abs(float(v.detach()) - float(ppo)) > 1e-3


def test_verl_global_batch_info():
    """verl's global normalisers (dp_size, batch_num_tokens, global_batch_size,
    loss_scale_factor) reach the adapter: each aggregation mode against verl's."""
    m = rlgates.get("dapo")
    _, _, cfg = _verl_config(m)
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=43, global_batch_size=11,
                                 loss_scale_factor=16)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm", "token-sum"):
        (v_ref, g_ref, _), (v_ours, g_ours, _) = verl_vs_adapter("vanilla", m, cfg, agg)
        assert float(v_ours) == pytest.approx(float(v_ref), rel=1e-7), agg
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-7, atol=1e-12)


def test_verl_rollout_correction_weights():
    """verl's rollout_is_weights multiply each token's loss before aggregation: so in the adapter."""
    m = rlgates.get("dapo")
    mode, agg, cfg = _verl_config(m)
    logp, old, adv, mask = verl_batch()
    w = torch.linspace(0.5, 2.0, 36, dtype=torch.float64).reshape(6, 6)
    out = []
    for fn in (get_policy_loss_fn(mode), get_policy_loss_fn(rverl.register(m))):
        lp = logp.clone().requires_grad_(True)
        v, _ = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask,
                  loss_agg_mode=agg, config=cfg, rollout_is_weights=w)
        v.backward()
        out.append((float(v.detach()), lp.grad))
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-12)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-12, atol=1e-14)
    plain = float(m.loss(logp, old, adv, mask, agg=agg))
    assert abs(plain - out[0][0]) > 1e-3  # the weights changed the loss


def test_verl_conventions_that_differ():
    """The documented differences, each measured: the edge, GSPO's one-sided +10 clamp."""
    # edge: ρ = 1.25 exactly, ε = 0.25, A > 0: verl passes the gradient, rlgates does not
    old = torch.zeros(1, 1, dtype=torch.float64)
    lp = torch.full((1, 1), math.log(1.25), dtype=torch.float64, requires_grad=True)
    adv = torch.ones(1, 1, dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    cfg = actor(clip_ratio=0.25, clip_ratio_low=0.25, clip_ratio_high=0.25, clip_ratio_c=10.0)
    v, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=lp, advantages=adv,
                                         response_mask=mask, loss_agg_mode="token-mean",
                                         config=cfg)
    v.backward()
    assert float(lp.grad) == pytest.approx(-1.25)
    ours = rlgates.get("ppo", eps=0.25).expected_grad(lp.detach(), old, adv[:, 0], mask)
    assert float(ours) == 0.0
    # GSPO at log ρ_s = 12, A < 0: verl's clamp at +10 stops the gradient, rlgates' ±20 does not
    lp = torch.full((1, 4), 12.0, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = -torch.ones(1, 4, dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    v, _ = get_policy_loss_fn("gspo")(old_log_prob=old, log_prob=lp, advantages=adv,
                                      response_mask=mask, loss_agg_mode="seq-mean-token-mean",
                                      config=actor(clip_ratio_low=3e-4, clip_ratio_high=4e-4))
    v.backward()
    assert float(lp.grad.abs().max()) == 0.0
    g = rlgates.get("gspo").expected_grad(lp.detach(), old, adv[:, 0], mask,
                                          agg="seq-mean-token-mean")
    assert float(g[0, 0]) == pytest.approx(math.exp(12) / 4, rel=1e-12)


# --- verl's metrics, per loss ----------------------------------------------------------------------
def metrics_batch():
    """Two micro-batches (12 and 17 real tokens) in float64: ragged rows (one empty), an A = 0 row
    outside every window on both sides, an A < 0 token at ρ = 4 (past c = 3), a token at
    log ρ = 25 (past verl's ±20 clamp), a sequence inside GSPO's window and ones outside it."""
    log_ratio = torch.tensor([
        [0.05, -0.30, 0.40, 0.10, 0.00, 0.0],
        [math.log(4.0), 0.10, -0.05, 0.35, 0.0, 0.0],
        [0.50, -0.50, 0.02, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.40, 0.25, 0.15, -0.10, 0.30, -0.20],
        [0.0004, 0.0001, -0.0002, 0.0003, 0.0, 0.0],
        [-0.01, -0.02, 0.0, 0.0, 0.0, 0.0],
        [25.0, -1.0, 0.30, -0.25, 0.15, 0.0],
    ], dtype=torch.float64)
    lengths = torch.tensor([5, 4, 3, 0, 6, 4, 2, 5])
    mask = torch.arange(6)[None] < lengths[:, None]
    old = -torch.linspace(0.5, 2.5, 48, dtype=torch.float64).reshape(8, 6)
    adv = torch.tensor([1.0, -1.5, 0.0, 0.3, -0.8, 1.2, -0.5, 0.7], dtype=torch.float64)
    adv = adv[:, None].expand(8, 6).clone()
    logp = old + log_ratio
    return [(logp[s], old[s], adv[s], mask[s]) for s in (slice(0, 4), slice(4, 8))]


def old_adapter_metrics(m, logp, old, adv, mask):
    """What the adapter logged under verl's names before: gate_zero over A ≠ 0 tokens, an
    unclamped KL, a hard-coded 0."""
    kl = -((logp - old) * mask).sum() / mask.sum().clamp(min=1)
    return {"actor/pg_clipfrac": rt.gate_stats(m, logp, old, adv, mask)["gate_zero"],
            "actor/ppo_kl": float(kl), "actor/pg_clipfrac_lower": 0.0}


def verl_logged():
    """What the verl adapter logs of rlgates' own: every diagnostic registered with log=True,
    read when called (a new one is picked up here, as the adapters pick it up)."""
    return {f"actor/rlgates_{k}" for k in diagnostics.keys(logged=True)}


def trl_logged():
    """What the TRL adapter logs of rlgates' own (see `verl_logged`)."""
    return {f"rlgates/{k}" for k in diagnostics.keys(logged=True)}


METRIC_CASES = {  # name -> (method, verl's loss_mode, clip_ratio_c)
    "dual_clip": (rlgates.get("dual_clip"), "vanilla", 3.0),
    "ppo": (rlgates.get("ppo"), "vanilla", math.inf),
    "grpo": (rlgates.get("grpo"), "vanilla", math.inf),
    "dapo": (rlgates.get("dapo", eps_low=0.2, eps_high=0.3), "vanilla", math.inf),
    "gspo": (rlgates.get("gspo", eps_low=3e-4, eps_high=4e-4), "gspo", None),
    "sapo": (rlgates.get("sapo"), "sapo", None),
    "cispo": (rlgates.get("cispo", eps_low=0.2, eps_high=0.28), "cispo", None),
}


def metrics_pairs(m):
    """verl's own loss and the adapter's, on each micro-batch: [(verl's, the adapter's), ...]."""
    mode, agg, cfg = _verl_config(m)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=29, global_batch_size=7)
    out = []
    for logp, old, adv, mask in metrics_batch():
        pair = [fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                   loss_agg_mode=agg, config=cfg)[1]
                for fn in (get_policy_loss_fn(mode), get_policy_loss_fn(rverl.register(m)))]
        out.append((*pair, (logp, old, adv, mask)))
    return mode, cfg, out


@pytest.mark.parametrize("case", list(METRIC_CASES))
def test_verl_metrics_are_verls_own(case):
    m, mode, c = METRIC_CASES[case]
    got_mode, cfg, pairs = metrics_pairs(m)
    assert got_mode == mode and (c is None or cfg.clip_ratio_c == c)
    counts = [int(b[3].sum()) for *_, b in pairs]
    assert len(counts) == 2 and counts[0] != counts[1]
    for ref, ours, _ in pairs:
        assert set(ref) == {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
        for k, v in ref.items():
            assert ours[k] == v, (k, ours[k], v)  # the same floats: verl's definition, exactly
        assert {k for k in ours if k not in ref} == verl_logged()
    frac = [ref["actor/pg_clipfrac"] for ref, _, _ in pairs]
    old = [old_adapter_metrics(m, *b) for *_, b in pairs]
    if mode == "sapo":  # verl's SAPO logs no clip fraction; its KL is clamped at ±20
        assert frac == [0.0, 0.0]
        assert old[1]["actor/pg_clipfrac"] > 0  # the old gate_zero: sech² underflows at ρ = e^20
        assert old[1]["actor/ppo_kl"] != pytest.approx(pairs[1][0]["actor/ppo_kl"], rel=1e-3)
    else:  # not vacuous: tokens clipped and tokens not; the old definition is not verl's
        assert all(0 < f < 1 for f in frac), frac
        assert any(o["actor/pg_clipfrac"] != pytest.approx(f, rel=1e-3)
                   for o, f in zip(old, frac, strict=True))
    if c == 3.0:  # the A < 0 token at ρ = 4: only in pg_clipfrac_lower
        assert pairs[0][0]["actor/pg_clipfrac_lower"] > 0


def test_verl_metrics_not_under_verls_names_without_a_builtin():
    for m in (rlgates.get("sao"), rlgates.get("reinforce"), byo_soft()):
        assert rt.flags(m)["verl"] is None
        name = rverl.register(m)
        for logp, old, adv, mask in metrics_batch():
            _, got = get_policy_loss_fn(name)(old_log_prob=old, log_prob=logp, advantages=adv,
                                              response_mask=mask, config=actor())
            assert set(got) == verl_logged()


def test_verl_unregistered_name_raises():
    with pytest.raises(ValueError, match="Unsupported loss mode"):
        get_policy_loss_fn("rlgates_never_registered")


def test_verl_bypass_mode_replaces_the_loss_and_is_refused():
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    name = rverl.register(rlgates.get("dapo"))
    # verl's legacy trainer: bypass mode overwrites the loss_mode, so an rlgates loss never runs
    policy_loss = OmegaConf.create({"loss_mode": name})
    batch = DataProto.from_dict(tensors={"rollout_log_probs": torch.zeros(2, 3)})
    apply_bypass_mode(batch, RolloutCorrectionConfig.bypass_ppo_clip(), policy_loss)
    assert policy_loss.loss_mode == "bypass_mode"

    trainer_yaml = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"

    def cfg(loss_mode, bypass):  # verl's own full trainer config, two fields set
        c = OmegaConf.load(trainer_yaml)
        c.algorithm.rollout_correction.bypass_mode = bypass
        c.actor_rollout_ref.actor.policy_loss.loss_mode = loss_mode
        return c

    with pytest.raises(ValueError, match="bypass_mode"):
        rverl.check_config(cfg(name, True))
    # verl's own losses: not the adapter's business
    assert rverl.check_config(cfg("vanilla", True)) == []


def test_verl_check_config_needs_a_module_that_registers_the_loss(tmp_path, monkeypatch):
    """An rlgates loss_mode needs a module verl imports in its workers (external_lib or
    VERL_USE_EXTERNAL_MODULES) that registers it; check_config imports it, as a worker does,
    and warns where loss_agg_mode is not the method's aggregation and no agg= was given."""
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf

    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    c = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    c.actor_rollout_ref.actor.policy_loss.loss_mode = "rlgates_ppo"
    with pytest.raises(ValueError, match="no module registers it.*external_lib"):
        rverl.check_config(c)
    c.actor_rollout_ref.model.external_lib = "tests.engines.verl_register"  # rlgates_ppo
    assert rverl.check_config(c) == []
    c.actor_rollout_ref.actor.policy_loss.loss_mode = "rlgates_ppo_typo"
    with pytest.raises(ValueError, match="is not registered by"):
        rverl.check_config(c)
    c.actor_rollout_ref.model.external_lib = "rlgates_no_such_module"
    with pytest.raises(ValueError, match="cannot import"):
        rverl.check_config(c)
    c.actor_rollout_ref.model.external_lib = None
    c.actor_rollout_ref.actor.policy_loss.loss_mode = "rlgates_ppo"
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "tests.engines.verl_register")
    assert rverl.check_config(c) == []
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES")
    # a module that registers GRPO without agg=, at verl's default token-mean
    (tmp_path / "rlgates_loose_grpo.py").write_text(
        "import rlgates\nfrom rlgates.trainers import verl as rv\n"
        "rv.register(rlgates.get('grpo'), name='rlgates_grpo_loose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c.actor_rollout_ref.model.external_lib = "rlgates_loose_grpo"
    c.actor_rollout_ref.actor.policy_loss.loss_mode = "rlgates_grpo_loose"
    with pytest.warns(rverl.AggregationWarning, match="agg='seq-mean-token-mean'"):
        notes = rverl.check_config(c)
    assert len(notes) == 1 and "loss_agg_mode='token-mean'" in notes[0]
    c.actor_rollout_ref.actor.loss_agg_mode = "seq-mean-token-mean"
    assert rverl.check_config(c) == []


def test_verl_loss_warns_once_where_verls_aggregation_is_not_the_methods():
    import warnings

    sapo = rlgates.get("sapo")
    loose = rverl.register(sapo, name="rlgates_sapo_warns_once")
    fixed = rverl.register(sapo, name="rlgates_sapo_agg_given", agg="seq-mean-token-mean")
    logp, old, adv, mask = verl_batch()

    def call(n, agg):
        return get_policy_loss_fn(n)(old_log_prob=old, log_prob=logp, advantages=adv,
                                     response_mask=mask, loss_agg_mode=agg, config=actor())[0]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = {(n, a): call(n, a) for _ in range(2) for n in (loose, fixed)
                  for a in ("token-mean", "seq-mean-token-mean")}
    assert [w.category for w in caught] == [rverl.AggregationWarning]  # once, the loose one
    msg = str(caught[0].message)
    assert msg.startswith(f"{loose}: verl's loss_agg_mode='token-mean'") and "agg=" in msg
    # what the warning is about: the loose loss trains token-mean SAPO
    assert not torch.isclose(values[loose, "token-mean"], values[fixed, "token-mean"])
    assert values[fixed, "token-mean"] == values[loose, "seq-mean-token-mean"]


def test_flag_table_names_every_method():
    rows = rt.flag_rows()
    assert [r[0] for r in rows] == rlgates.names()
    f = rt.flags(rlgates.get("cispo"))
    assert f["trl"]["epsilon_high"] == 5.0 and f["verl"]["clip_ratio_high"] == 4.0
    assert rt.flags(rlgates.get("cispo", eps_low=0.2))["trl"] is None  # TRL has no lower clip
    assert rt.flags(rlgates.get("dual_clip"))["verl"]["clip_ratio_c"] == 3.0


# --- TRL's own loss on fixed tensors: the conventions that differ ---------------------------------
@pytest.fixture(scope="module")
def probe_model():
    return tiny_model()


def trl_grad(model, logp, old, adv, mask, **flags):
    """TRL's built-in loss and its gradient with respect to each token's log-prob."""
    args = config(gradient_accumulation_steps=1, steps_per_generation=1, **flags)
    t = make_trainer(GRPOTrainer, model, args)
    leaf = logp.clone().requires_grad_(True)
    v = rtrl.builtin_loss(t, leaf, old, adv, mask)
    v.backward()
    return float(v.detach()), leaf.grad


def assert_adapter_is_trls_dapo(probe_model, m, batch):
    """TRL's own loss under `m`'s flags equals the adapter's (loss type dapo), value and
    gradient; returns TRL's value."""
    logp, old, adv, mask = batch
    v, g = trl_grad(probe_model, logp, old, adv, mask, **rt.flags(m)["trl"])
    leaf = logp.clone().requires_grad_(True)
    ours = rtrl.trl_loss(m, leaf, old, adv, mask, "dapo")
    ours.backward()
    assert float(ours.detach()) == pytest.approx(v, rel=1e-12)
    torch.testing.assert_close(leaf.grad, g, rtol=1e-12, atol=1e-14)
    return v


def test_trl_builtin_loss_matches_the_adapter_on_fixed_tensors(probe_model):
    logp, old, adv, mask = verl_batch()
    assert_adapter_is_trls_dapo(probe_model, rlgates.get("dapo", eps_low=0.2, eps_high=0.3),
                                (logp, old, adv[:, 0], mask))


def test_flags_reach_every_trl_loss_type(probe_model):
    """`flags(m, agg=..., normaliser=...)` reaches each loss type the installed TRL documents
    (bnpo and dr_grpo are aggregations of TRL's clip); each clip-family setting is TRL's own loss
    of the method at that aggregation, value and gradient; a loss that fixes its aggregation
    refuses another."""
    from rlgates.trainers import conformance_trl

    reached = {}
    for name in rlgates.names():
        m = rlgates.get(name)
        for agg in rlgates.AGG_MODES:
            for scope in rt.NORMALISERS:
                f = rt.flags(m, agg=agg, normaliser=scope)["trl"]
                if f:
                    reached.setdefault(f["loss_type"], (name, agg))
    assert set(reached) == set(conformance_trl.loss_types())
    logp, old, adv, mask = verl_batch()
    adv = adv[:, 0]
    m = rlgates.get("dapo", eps_low=0.2, eps_high=0.3)
    step_tokens = 2 * int(mask.sum())  # as if the step held a second micro-batch like this one
    values = {}
    for (agg, scope), loss_type in rt.TRL_LOSS_TYPE_FOR_AGG.items():
        f = rt.flags(m, agg=agg, normaliser=scope)["trl"]
        assert f["loss_type"] == loss_type and conformance_trl.TRL_AGG[loss_type] == agg
        t = make_trainer(GRPOTrainer, probe_model, config(gradient_accumulation_steps=1,
                                                          steps_per_generation=1, **f))
        leaf = logp.clone().requires_grad_(True)
        v = rtrl.builtin_loss(t, leaf, old, adv, mask, num_items_in_batch=step_tokens)
        v.backward()
        ref = leaf.grad
        leaf = logp.clone().requires_grad_(True)
        ours = rtrl.trl_loss(m, leaf, old, adv, mask, loss_type, max_completion_length=MAX_LEN,
                             num_items_in_batch=step_tokens)
        ours.backward()
        assert float(ours.detach()) == pytest.approx(float(v.detach()), rel=1e-12), loss_type
        torch.testing.assert_close(leaf.grad, ref, rtol=1e-12, atol=1e-14)
        values[loss_type] = float(v.detach())
    assert len(set(values.values())) == 5  # five aggregations, five losses on this batch
    assert values["bnpo"] == pytest.approx(2 * values["dapo"], rel=1e-12)  # its own count
    assert rt.flags(rlgates.get("sapo"), agg="token-mean")["trl"] is None
    assert rt.flags(rlgates.get("cispo"), agg="token-mean", normaliser="micro-batch")["trl"] is None
    for name in rlgates.names():  # a method's own aggregation changes nothing
        m = rlgates.get(name)
        assert rt.flags(m, agg=m.agg) == rt.flags(m), name


def test_trl_flags_of_dapo_dual_clip(probe_model):
    """TRL's dapo loss with delta = c is dual-clip on DAPO's window (c > 1 + ε_h): the A < 0
    token at ρ = 4 is capped at c = 3; DAPO's flags alone do not cap it."""
    logp, old, adv, mask = verl_batch()
    adv = adv[:, 0]
    m = rlgates.get("dapo_dual_clip", eps_low=0.2, eps_high=0.3)
    v = assert_adapter_is_trls_dapo(probe_model, m, (logp, old, adv, mask))
    v_dapo, _ = trl_grad(probe_model, logp, old, adv, mask,
                         **rt.flags(rlgates.get("dapo", eps_low=0.2, eps_high=0.3))["trl"])
    assert abs(v - v_dapo) > 1e-3
    assert rt.flags(rlgates.get("dapo_dual_clip", c=1.25))["trl"] is None  # δ would cap A > 0


def test_trl_conventions_that_differ(probe_model):
    one = torch.ones(1, 1, dtype=torch.bool)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    # edges: ρ = 1.25 with ε = 0.25 (exact in binary): TRL passes the gradient, rlgates does not
    for lr, a in ((math.log(1.25), 1.0), (math.log(0.75), -1.0)):
        logp = torch.full((1, 1), lr, dtype=torch.float64)
        adv = torch.tensor([a], dtype=torch.float64)
        _, g = trl_grad(probe_model, logp, zero, adv, one, loss_type="dapo", epsilon=0.25)
        assert float(g) == pytest.approx(-math.exp(lr) * a)
        assert float(rlgates.get("ppo", eps=0.25).expected_grad(logp, zero, adv, one)) == 0.0
    # no clamp in TRL: an A < 0 token at log ρ = 25 keeps its gradient e^25; rlgates' is 0
    logp = torch.full((1, 1), 25.0, dtype=torch.float64)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    _, g = trl_grad(probe_model, logp, zero, adv, one, loss_type="dapo")
    assert float(g) == pytest.approx(math.exp(25), rel=1e-12)
    assert float(rlgates.get("ppo").expected_grad(logp, zero, adv, one)) == 0.0
    # empty rows: TRL's grpo divides by all 6 rows, rlgates by the 5 with tokens
    logp, old, adv, mask = verl_batch()
    adv = adv[:, 0]
    m = rlgates.get("grpo")
    v, _ = trl_grad(probe_model, logp, old, adv, mask, **rt.flags(m)["trl"])
    assert v / float(m.loss(logp, old, adv, mask)) == pytest.approx(5 / 6, rel=1e-12)
    # dr_grpo: TRL divides by max_completion_length (8), rlgates' mode by the padded width (6)
    v, _ = trl_grad(probe_model, logp, old, adv, mask, loss_type="dr_grpo", epsilon=0.2)
    ours = float(m.loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm"))
    assert v / ours == pytest.approx(5 / 6 * 6 / MAX_LEN, rel=1e-12)
    assert float(rtrl.trl_loss(m, logp, old, adv, mask, "dr_grpo",
                               max_completion_length=MAX_LEN)) == pytest.approx(v, rel=1e-12)
    # CISPO: TRL's epsilon_high=5 is rlgates' eps_high=4 (cap 1 + ε_h); epsilon_high=4 is not
    logp = torch.tensor([[math.log(8.0), math.log(4.5), 0.1, -2.0]], dtype=torch.float64)
    old, adv, mask = torch.zeros_like(logp), torch.tensor([1.0], dtype=torch.float64), None
    mask = torch.ones_like(logp, dtype=torch.bool)
    c = rlgates.get("cispo")
    ours = c.expected_grad(logp, old, adv, mask)
    _, g5 = trl_grad(probe_model, logp, old, adv, mask, loss_type="cispo", epsilon_high=5.0)
    _, g4 = trl_grad(probe_model, logp, old, adv, mask, loss_type="cispo", epsilon_high=4.0)
    torch.testing.assert_close(g5, ours, rtol=1e-12, atol=1e-14)
    assert float((g4 - ours).abs().max()) > 0.1


# --- TRL's metrics, per loss ----------------------------------------------------------------------
TRL_METRIC_CASES = {  # name -> (method, the TRL metric names its built-in logs besides entropy)
    "dapo": (rlgates.get("dapo", eps_low=0.2, eps_high=0.28), "clip"),
    "grpo": (rlgates.get("grpo"), "clip"),
    "dual_clip": (rlgates.get("dual_clip", eps=0.2, c=1.5), "clip"),  # δ > 1 + ε: dual-clip
    "gspo": (rlgates.get("gspo", eps_low=3e-4, eps_high=4e-4), "clip"),  # sequence level
    "cispo": (rlgates.get("cispo", eps_high=0.2), "cispo"),
    "sapo": (rlgates.get("sapo"), "sapo"),
}
CLIP_KEYS = {"clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
             "clip_ratio/low_min", "clip_ratio/high_max"}


def trl_metric_batches():
    """metrics_batch in float32 (TRL's dtype), with per-token entropies: two micro-batches, ragged
    rows (one empty), A = 0 rows, tokens past both clip bounds and past log ρ = 20."""
    g = torch.Generator().manual_seed(1)
    out = []
    for logp, old, adv, mask in metrics_batch():
        ent = torch.rand(logp.shape, generator=g, dtype=torch.float64) * 2
        out.append((logp.float(), old.float(), adv[:, 0].float(), mask, ent.float()))
    return out


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("case", list(TRL_METRIC_CASES))
def test_trl_metrics_are_trls_own(probe_model, case):
    m, family = TRL_METRIC_CASES[case]
    t = make_trainer(GRPOTrainer, probe_model, config(**rt.flags(m)["trl"]))
    batches = trl_metric_batches()
    counts = [int(b[3].sum()) for b in batches]
    assert len(batches) == 2 and counts[0] != counts[1]
    regions, old_zero = [], []
    for logp, old, adv, mask, ent in batches:
        t._metrics["train"].clear()
        rtrl.builtin_loss(t, logp, old, adv, mask, num_items_in_batch=sum(counts), entropy=ent)
        ref = {k: v[-1] for k, v in t._metrics["train"].items()}
        ours = rtrl.metrics(m, logp, old, adv, mask, ent, t.accelerator)
        expected = {"entropy"} | {"clip": CLIP_KEYS, "cispo": {"cispo_clip_ratio"},
                                  "sapo": set()}[family]
        assert set(ref) == expected
        assert set(ours) == expected | trl_logged()
        for k, v in ref.items():
            assert same(ours[k], v), (k, ours[k], v)  # TRL's definition, exactly
        regions.append(ref.get("clip_ratio/region_mean", ref.get("cispo_clip_ratio")))
        old_zero.append(ours["rlgates/gate_zero"])  # what the adapter logged before
    if family == "sapo":
        assert not any(k.startswith("clip") for k in ref)
        return
    # not vacuous: tokens clipped and not; the old number (gate_zero) is not TRL's
    assert all(r < 1 for r in regions) and any(r > 0 for r in regions), regions
    assert any(abs(z - r) > 1e-3 for z, r in zip(old_zero, regions, strict=True))
    if case == "dual_clip":  # δ = c caps A > 0 tokens too: not dual-clip at c ≤ 1 + ε
        assert rt.flags(rlgates.get("dual_clip", eps=0.2, c=1.1))["trl"] is None


def test_trl_metrics_without_a_builtin_are_rlgates_own(probe_model):
    for m in (rlgates.get("sao"), rlgates.get("reinforce"), byo_soft(),
              rlgates.get("cispo", eps_low=0.2), rlgates.get("dual_clip", c=1.1)):
        assert rt.flags(m)["trl"] is None
        logp, old, adv, mask, ent = trl_metric_batches()[0]
        assert set(rtrl.metrics(m, logp, old, adv, mask, ent)) == {"entropy"} | trl_logged()
