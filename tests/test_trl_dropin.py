"""The TRL drop-in (`rlgates.trainers.trl.RlgatesGRPOTrainer`) honest about its config, and
CISPO's cap below 1, which TRL's default CISPO needs.

- CISPO with −1 < ε_h < 0 (the cap 1 + ε_h below 1): gate, weight and loss gradient three ways
  (closed form, autograd, finite difference); its TRL flags and back; its explorer JavaScript
  (run in node) against `gate` and `bounds`; TRL's own default cispo loss against it.
- GRPOConfig's gate settings against the method's TRL flags: a ValueError naming each setting,
  both values and the fixes (and each fix checked to be one), a warning with
  `allow_config_mismatch=True`, nothing for a method with no TRL built-in.
- REFUSED entries that read GRPOConfig alone raise before `GRPOTrainer.__init__` loads a model;
  the MoE one after it.
- ρ ≡ 1 by configuration: the condition against TRL's source and against real runs, and the
  warning.
- `rlgates.inspect.capture` records a drop-in run, as it records the stock trainer's.

TRL runs use tests/trl_run.py's tiny model (2 optimiser steps, well under a second each).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import rlgates
from rlgates.trainers import flags

pytestmark = pytest.mark.xdist_group("trainers")  # one worker imports TRL (see test_trainers)

F64 = torch.float64

#: CISPO windows with the cap below 1: TRL's default (cap 0.2, no lower bound), a window inside
#: (0, 1), the degenerate window of one point, a cap near 0; and the default (cap 5) as control.
LOW_CAPS = [{"eps_low": 1.0, "eps_high": -0.8}, {"eps_low": 0.9, "eps_high": -0.5},
            {"eps_low": 0.5, "eps_high": -0.5}, {"eps_low": 1.0, "eps_high": -0.999}]
WINDOWS = [*LOW_CAPS, {"eps_low": 1.0, "eps_high": 4.0}, {"eps_low": 0.2, "eps_high": 0.28}]


def t(x):
    return torch.as_tensor(x, dtype=F64)


def clip(r, lo, hi):
    return min(max(r, lo), hi)


def integral(a, b, lo, hi):
    """∫_a^b clip(u, lo, hi)/u du, piece by piece (an independent closed form of f's change)."""
    if b < a:
        return -integral(b, a, lo, hi)
    edges = sorted({a, b, *(e for e in (lo, hi) if a < e < b)})
    total = 0.0
    for u, v in zip(edges, edges[1:], strict=False):
        mid = 0.5 * (u + v)
        if mid > hi:
            total += hi * math.log(v / u)
        elif mid < lo:
            total += lo * math.log(v / u)
        else:
            total += v - u
    return total


def grid(m):
    """Ratios across every edge of the window, with each edge and its neighbours, and 1."""
    r = [math.exp(x) for x in np.linspace(-8, 4, 97)]
    for e, _ in m.bounds():
        r += [e, e * (1 - 1e-9), e * (1 + 1e-9)]
    return sorted({*r, 1.0})


# --- CISPO's cap below 1 --------------------------------------------------------------------
@pytest.mark.parametrize("hp", WINDOWS, ids=str)
def test_cispo_gate_and_weight_closed_form(hp):
    m = rlgates.get("cispo", **hp)
    lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
    assert (m.low, m.high) == (lo, hi)
    assert float(m.weight(t(1.0), t(1.0))) == 1.0  # f(1) = 1 for every window
    for r in grid(m):
        for a in (-1.3, 0.7):
            assert float(m.gate(t(r), t(a))) == pytest.approx(clip(r, lo, hi) / r, rel=1e-14)
            assert float(m.signal(t(r), t(a))) == pytest.approx(clip(r, lo, hi) * a, rel=1e-14)
            f = 1 + integral(1.0, r, lo, hi)
            assert float(m.weight(t(r), t(a))) == pytest.approx(f, rel=1e-12, abs=1e-13)
    # never 0, and continuous across each edge
    for e, side in m.bounds():
        assert side == 0
        below, above = m.weight(t(e * (1 - 1e-12)), t(1.0)), m.weight(t(e * (1 + 1e-12)), t(1.0))
        assert float((above - below).abs()) < 1e-10
    assert (m.gate(t(grid(m)), t(1.0)) > 0).all()


@pytest.mark.parametrize("hp", LOW_CAPS, ids=str)
def test_cispo_low_cap_closed_form_on_policy(hp):
    """With the cap H below 1, ρ = 1 lies above the window: f = 1 + H·log ρ there, and on policy
    every token's gradient is H·A·∇log π."""
    m = rlgates.get("cispo", **hp)
    h = 1 + hp["eps_high"]
    for r in (h * 1.5, 1.0, 3.0, 100.0):
        assert float(m.weight(t(r), t(1.0))) == pytest.approx(1 + h * math.log(r), rel=1e-14)
    assert float(m.gate(t(1.0), t(1.0))) == pytest.approx(h, rel=1e-15)
    assert m.bounds()[0] == (h, 0)


@pytest.mark.parametrize("hp", WINDOWS, ids=str)
def test_cispo_gate_is_the_derivative_of_the_weight_autograd_and_finite_difference(hp):
    m = rlgates.get("cispo", **hp)
    r = t(grid(m)).requires_grad_(True)
    (auto,) = torch.autograd.grad(m.weight(r, t(1.0)).sum(), r)
    gate = m.gate(r.detach(), t(1.0))
    torch.testing.assert_close(auto, gate, rtol=1e-12, atol=0)
    # central differences, away from the kinks
    edges = [e for e, _ in m.bounds()]
    x = t([v for v in grid(m) if all(abs(math.log(v / e)) > 1e-3 for e in edges)])
    h = 1e-6 * x
    fd = (m.weight(x + h, t(1.0)) - m.weight(x - h, t(1.0))) / (2 * h)
    torch.testing.assert_close(fd, m.gate(x, t(1.0)), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("hp", WINDOWS, ids=str)
def test_cispo_loss_gradient_three_ways(hp):
    """The loss's autograd gradient in log π equals the closed form −clip(ρ)·A (per token, under
    token-sum) and the finite difference of the objective f(ρ)·A in log π."""
    m = rlgates.get("cispo", **hp)
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    logp_old = -3 * torch.rand(B, T, generator=g, dtype=F64)
    log_ratio = torch.linspace(-4, 2.5, B * T, dtype=F64).reshape(B, T)
    logp = logp_old + log_ratio
    adv = t([1.2, -0.7, 0.4, -1.5, 0.9])
    mask = torch.ones(B, T, dtype=torch.bool)
    leaf = logp.clone().requires_grad_(True)
    m.loss(leaf, logp_old, adv, mask, "seq-mean-token-sum").backward()
    ratio = log_ratio.exp()
    closed = -m.clipped(ratio) * adv[:, None] / B
    torch.testing.assert_close(leaf.grad, closed, rtol=1e-13, atol=1e-15)
    for agg in rlgates.AGG_MODES:
        assert rlgates.check_gradient(m, logp, logp_old, adv, mask, agg=agg)[2] < 1e-14
    # finite difference of the objective f(ρ)·A, whose gradient CISPO's loss shares
    eps = 1e-6
    fd = (m.objective((log_ratio + eps).exp(), adv[:, None])
          - m.objective((log_ratio - eps).exp(), adv[:, None])) / (2 * eps)
    kink = torch.zeros_like(ratio, dtype=torch.bool)
    for e, _ in m.bounds():
        kink |= (ratio.log() - math.log(e)).abs() < 1e-4
    torch.testing.assert_close(fd[~kink], (-closed * B)[~kink], rtol=1e-6, atol=1e-9)
    assert (m.clipped(ratio) != ratio).any()  # the cap acts on this batch


def test_cispo_refuses_a_cap_at_or_below_zero_and_an_empty_window():
    for hp, text in (({"eps_high": -1.0}, "eps_high must be > -1, got -1.0"),
                     ({"eps_high": -1.5}, "eps_high must be > -1"),
                     ({"eps_low": 0.2, "eps_high": -0.5},
                      "the window (1 − eps_low, 1 + eps_high) = (0.8, 0.5) is empty: eps_high must "
                      "be ≥ -eps_low = -0.2, got -0.5")):
        with pytest.raises(ValueError) as e:
            rlgates.get("cispo", **hp)
        assert text in str(e.value)
    rlgates.get("cispo", eps_low=0.5, eps_high=-0.5)  # a window of one point is allowed


def test_cispo_trl_flags_round_trip_to_trls_default():
    """TRL's default cispo (epsilon_high unset: epsilon = 0.2, an absolute cap) is
    rlgates.get("cispo", eps_low=1.0, eps_high=-0.8), and back."""
    m = rlgates.get("cispo", eps_low=1.0, eps_high=-0.8)
    assert flags(m)["trl"] == {"loss_type": "cispo", "epsilon_high": 0.2,
                               "importance_sampling_level": "token"}
    back = rlgates.get("cispo", eps_high=flags(m)["trl"]["epsilon_high"] - 1)
    assert back.hparams == {"eps_low": 1.0, "eps_high": -0.8}
    assert flags(rlgates.get("cispo"))["trl"]["epsilon_high"] == 5.0  # the default: unchanged
    assert flags(rlgates.get("cispo", eps_high=0.2))["trl"]["epsilon_high"] == 1.2
    assert flags(rlgates.get("cispo", eps_low=0.9, eps_high=-0.5))["trl"] is None  # lower clip


def _node_eval(js_expr_by_case):
    script = ("const cases = JSON.parse(process.argv[1]); const out = cases.map(c => {"
              " const p = c.p; const f = new Function('r', 'a', 'p', 'return (' + c.gate + ');');"
              " const b = new Function('p', 'return (' + c.bounds + ');');"
              " return {gate: c.r.map(r => f(r, 1, p)), bounds: b(p)}; });"
              " console.log(JSON.stringify(out));")
    res = subprocess.run(["node", "-e", script, json.dumps(js_expr_by_case)],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(res.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the explorer's JS")
def test_cispo_explorer_js_for_a_cap_below_1():
    js = rlgates.REGISTRY["cispo"].explorer
    cases = []
    for hp in WINDOWS:
        m = rlgates.get("cispo", **hp)
        cases.append({"p": hp, "r": grid(m), **js})
    # an empty window the sliders can set and rlgates refuses: drawn as torch.clamp computes it
    cases.append({"p": {"eps_low": 0.2, "eps_high": -0.5}, "r": [0.1, 0.5, 0.8, 2.0], **js})
    out = _node_eval(cases)
    for c, got in zip(cases[:-1], out[:-1], strict=True):
        m = rlgates.get("cispo", **c["p"])
        np.testing.assert_allclose(got["gate"], m.gate(t(c["r"]), t(1.0)).tolist(), rtol=1e-12)
        assert sorted(map(tuple, got["bounds"])) == sorted(m.bounds())
    clamp = torch.clamp(t(cases[-1]["r"]), 0.8, 0.5) / t(cases[-1]["r"])
    np.testing.assert_allclose(out[-1]["gate"], clamp.tolist(), rtol=1e-12)
    assert out[-1]["bounds"] == [[0.5, 0]]
    lo, hi, _ = rlgates.REGISTRY["cispo"].slider_range("eps_high")
    assert -1 < lo < -0.8 < 4 < hi  # the slider reaches TRL's default cap


# --- TRL -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl():
    """TRL, the adapter and the tiny setup, imported when a test here first runs."""
    from trl import GRPOConfig, GRPOTrainer

    from rlgates.inspect.capture import capture, load
    from rlgates.trainers import trl as rtrl
    from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

    return SimpleNamespace(GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer, rtrl=rtrl,
                           capture=capture, load=load, DATA=DATA, config=config,
                           reward_words=reward_words, tiny_model=tiny_model,
                           tokenizer=tiny_tokenizer())


def build(trl, args, method=None, cls=None, model=None, **kw):
    cls = cls or (trl.GRPOTrainer if method is None else trl.rtrl.RlgatesGRPOTrainer)
    extra = {} if method is None else {"method": method}
    return cls(model=trl.tiny_model() if model is None else model,
               reward_funcs=trl.reward_words, args=args, train_dataset=trl.DATA,
               processing_class=trl.tokenizer, **extra, **kw)


def low_cap_batch():
    """Float64 log-probs with ratios on both sides of 0.2 (and far past it), A of both signs, a
    ragged mask with an empty row."""
    ratios = [[0.05, 0.198, 0.202, 0.5, 1.0, 3.0], [0.1, 0.19, 0.21, 1.0, 0.0, 0.0],
              [2.0, 0.2 * 0.99, 0.2 * 1.01, 0.0, 0.0, 0.0], [0.0] * 6]
    lengths = torch.tensor([6, 4, 3, 0])
    mask = torch.arange(6)[None] < lengths[:, None]
    r = torch.where(mask, t(ratios), t(1.0))
    logp_old = torch.full((4, 6), -1.0, dtype=F64) + 0.1 * torch.arange(6, dtype=F64)
    logp_old = torch.minimum(logp_old, -torch.log(r) - 1e-3)  # π = ρ·π_old < 1
    return logp_old + r.log(), logp_old, t([1.0, -0.6, 0.8, 0.5]), mask


def test_trls_default_cispo_is_cispo_with_a_cap_of_0_2(trl):
    """TRL's cispo at GRPOConfig's defaults (epsilon_high unset) against rlgates' CISPO at
    eps_high = −0.8: value, gradient (float64) and TRL's cispo_clip_ratio."""
    logp, old, adv, mask = low_cap_batch()
    args = trl.config(loss_type="cispo", gradient_accumulation_steps=1, steps_per_generation=1)
    assert args.epsilon_high is None and args.epsilon == 0.2  # TRL's defaults, read from TRL
    stock = build(trl, args)
    stock.current_gradient_accumulation_steps = 1
    leaf = logp.clone().requires_grad_(True)
    theirs = trl.rtrl.builtin_loss(stock, leaf, old, adv, mask)
    theirs.backward()
    m = rlgates.get("cispo", eps_low=1.0, eps_high=-0.8)
    ours_leaf = logp.clone().requires_grad_(True)
    ours = trl.rtrl.trl_loss(m, ours_leaf, old, adv, mask, "cispo")
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-12)
    torch.testing.assert_close(ours_leaf.grad, leaf.grad, rtol=1e-12, atol=1e-15)
    ref = stock._metrics["train"]["cispo_clip_ratio"][-1]
    got = trl.rtrl.metrics(m, logp, old, adv, mask)["cispo_clip_ratio"]
    assert got == pytest.approx(ref, rel=1e-12) and 0 < ref < 1
    # negative control: rlgates' default CISPO (cap 5) is another loss here
    other = logp.clone().requires_grad_(True)
    trl.rtrl.trl_loss(rlgates.get("cispo"), other, old, adv, mask, "cispo").backward()
    assert (other.grad - leaf.grad).abs().max() > 0.1


def test_config_mismatch_is_a_valueerror_before_anything_loads(trl):
    """A string model that does not exist: had GRPOTrainer.__init__ run, it would fail loading."""
    args = trl.config(loss_type="dapo")  # epsilon_high unset: TRL's clip at 0.2, DAPO's at 0.28
    with pytest.raises(ValueError) as e:
        build(trl, args, method="dapo", model="/nonexistent/rlgates-model")
    msg = str(e.value)
    assert msg == (
        "RlgatesGRPOTrainer: GRPOConfig's gate settings differ from rlgates.get('dapo', "
        "eps_low=0.2, eps_high=0.28), whose values are the ones trained (TRL's dapo loss reads "
        "them): epsilon_high is 0.2 in GRPOConfig (unset, so epsilon's) but 0.28 for dapo. Fix: "
        "set GRPOConfig(epsilon_high=0.28) (rlgates.trainers.flags(method)['trl']), or pass "
        "method=rlgates.get('dapo', eps_low=0.2, eps_high=0.2) to train GRPOConfig's values, or "
        "pass allow_config_mismatch=True to train the method's values anyway.")


@pytest.mark.parametrize("method, settings, named, fixed", [
    ("dapo", {"epsilon": 0.1, "epsilon_high": 0.1}, ["epsilon is 0.1", "epsilon_high is 0.1"],
     {"eps_low": 0.1, "eps_high": 0.1}),
    ("cispo", {"loss_type": "cispo"}, ["epsilon_high is 0.2 in GRPOConfig (unset, so "
                                       "epsilon's) but 5.0"], {"eps_low": 1.0, "eps_high": -0.8}),
    ("cispo", {"loss_type": "cispo", "epsilon_high": 1.2}, ["epsilon_high is 1.2"],
     {"eps_low": 1.0, "eps_high": 0.2}),
    ("sapo", {"loss_type": "sapo", "sapo_temperature_neg": 2.0},
     ["sapo_temperature_neg is 2.0 in GRPOConfig but 1.05"], {"tau_pos": 1.0, "tau_neg": 2.0}),
    ("vespo", {"loss_type": "vespo", "vespo_k_pos": 3.0, "vespo_lambda_neg": 1.5},
     ["vespo_k_pos is 3.0", "vespo_lambda_neg is 1.5"],
     {"k_pos": 3.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 1.5}),
    ("gspo", {"loss_type": "grpo", "importance_sampling_level": "sequence"},
     ["epsilon is 0.2 in GRPOConfig but 0.0003", "epsilon_high is 0.2"],
     {"eps_low": 0.2, "eps_high": 0.2}),
    ("dapo", {"epsilon_high": 0.28, "delta": 2.0}, ["delta is 2.0 in GRPOConfig but None"], None),
    ("dual_clip", {"epsilon_high": 0.2, "delta": 4.0}, ["delta is 4.0 in GRPOConfig but 3.0"],
     {"eps": 0.2, "c": 4.0}),
])
def test_config_mismatch_names_each_setting_and_fixes(trl, method, settings, named, fixed):
    m = rlgates.get(method)
    args = trl.config(**settings)
    msg = trl.rtrl.config_mismatch(args, m)
    for text in named:
        assert text in msg, (text, msg)
    assert "allow_config_mismatch=True" in msg
    # the config fix, as the message spells it, fixes
    fix = eval("dict(" + msg.split("Fix: set GRPOConfig(")[1].split(") (rlgates")[0] + ")")
    assert set(fix) <= set(flags(m)["trl"]) | {"delta"}
    assert trl.rtrl.config_mismatch(trl.config(**{**settings, **fix}), m) is None
    if fixed is None:
        assert f"no {method} hyperparameters give GRPOConfig's values" in msg
        return
    assert f"method={trl.rtrl._spelled(rlgates.get(method, **fixed))}" in msg
    assert trl.rtrl.config_mismatch(args, rlgates.get(method, **fixed)) is None  # the fix fixes


def test_config_agreeing_or_without_a_trl_builtin_is_not_checked(trl):
    rtrl = trl.rtrl
    for name in ("ppo", "grpo", "dapo", "sapo", "cispo", "gspo", "dual_clip", "luspo", "vespo"):
        m = rlgates.get(name)
        assert rtrl.config_mismatch(trl.config(**flags(m)["trl"]), m) is None, name
    # the clip's loss types share its settings: grpo under bnpo reads the same ε
    assert rtrl.config_mismatch(trl.config(loss_type="bnpo"), rlgates.get("grpo")) is None
    # no TRL built-in: nothing to compare (sao, reinforce, a byo gate)
    for m in (rlgates.get("sao"), rlgates.get("reinforce"),
              rlgates.byo.make(lambda r, a: r, name="plain_test")):
        assert flags(m)["trl"] is None
        assert rtrl.config_mismatch(trl.config(epsilon=0.5, delta=2.0), m) is None
    # another loss type's settings are not the method's: sapo's gate under TRL's dapo normaliser
    sapo = rlgates.get("sapo")
    assert rtrl.config_mismatch(trl.config(loss_type="dapo", epsilon=0.1), sapo) is None
    assert "sapo_temperature_pos" in rtrl.config_mismatch(
        trl.config(loss_type="dapo", sapo_temperature_pos=2.0), sapo)


def test_allow_config_mismatch_warns_and_trains_the_methods_values(trl):
    args = trl.config(loss_type="dapo", max_steps=1)
    with pytest.warns(UserWarning, match=r"^RlgatesGRPOTrainer \(allow_config_mismatch=True\): "
                                         r"GRPOConfig's gate settings differ") as w:
        trainer = build(trl, args, method="dapo", allow_config_mismatch=True)
    assert len([x for x in w if "allow_config_mismatch" in str(x.message)]) == 1
    assert trainer.method.hparams == {"eps_low": 0.2, "eps_high": 0.28}
    trainer.train()  # the method's values: a token at ρ = 1.25 is inside DAPO's window
    seen = trl.rtrl.metrics(trainer.method, t([[math.log(1.25)]]), t([[0.0]]), t([1.0]),
                            torch.ones(1, 1, dtype=torch.bool))
    assert seen["clip_ratio/high_mean"] == 0.0 and seen["rlgates/gate_zero"] == 0.0


def test_args_only_refusals_come_before_grpotrainer_init(trl):
    """beta ≠ 0 makes TRL load a reference model in __init__; the refusal comes first (a model
    path that does not exist would fail the load)."""
    nowhere = "/nonexistent/rlgates-model"
    for settings, text in (({"beta": 0.04}, "beta != 0"),
                           ({"top_entropy_quantile": 0.5}, "top_entropy_quantile < 1"),
                           ({"entropy_coef": 0.01}, "entropy_coef != 0 or use_adaptive_entropy"),
                           ({"off_policy_mask_threshold": 0.5}, "off_policy_mask_threshold"),
                           ({"importance_sampling_level": "sequence"},
                            "importance_sampling_level != the method's level ('sequence' while "
                            "grpo works at the token level)")):
        with pytest.raises(ValueError, match="RlgatesGRPOTrainer does not carry") as e:
            build(trl, trl.config(loss_type="grpo", **settings), method="grpo", model=nowhere)
        assert text in str(e.value)
    # the refusals come before the config check: a refused run is told what it cannot carry
    with pytest.raises(ValueError, match="does not carry: beta != 0"):
        build(trl, trl.config(beta=0.04), method="dapo", model=nowhere)


def test_the_moe_refusal_comes_after_init(trl):
    from transformers import MixtralConfig, MixtralForCausalLM

    rtrl = trl.rtrl
    entry = next(e for e in rtrl.REFUSED if e[0].startswith("router_aux_loss_coef"))
    assert not entry[2](SimpleNamespace(args=trl.config(), method=None, trainer=None))
    torch.manual_seed(0)
    moe = MixtralForCausalLM(MixtralConfig(
        vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
        bos_token_id=None))
    args = trl.config(**flags(rlgates.get("dapo"))["trl"])
    with pytest.raises(ValueError, match=r"does not carry: router_aux_loss_coef != 0 \(MoE"):
        build(trl, args, method="dapo", model=moe)


def test_rho_is_one_is_trls_condition(trl):
    """The condition, as TRL 1.16's `_generate_and_score_completions` computes old log-probs."""
    import inspect

    src = " ".join(inspect.getsource(trl.GRPOTrainer._generate_and_score_completions).split())
    for line in ("generate_every = self.args.steps_per_generation * self.num_iterations",
                 "if self.args.gradient_accumulation_steps % generate_every != 0 or ( "
                 "self.use_vllm and self.vllm_importance_sampling_correction ):",
                 "old_per_token_logps = None"):
        assert line in src, line


class _OldSeen:
    """Records, per micro-batch, whether TRL handed the loss old log-probs."""

    def _compute_loss(self, model, inputs):
        self.old_seen.append(inputs.get("old_per_token_logps") is not None)
        return super()._compute_loss(model, inputs)


@pytest.mark.parametrize("mu, ga, spg, one", [(1, 2, 2, True), (2, 4, 1, True), (2, 2, 2, False),
                                              (1, 2, 4, False), (2, 1, 1, False)])
def test_rho_is_one_warning_matches_real_runs(trl, mu, ga, spg, one):
    m = rlgates.get("dapo")
    args = trl.config(**flags(m)["trl"], num_iterations=mu, gradient_accumulation_steps=ga,
                      steps_per_generation=spg, max_steps=1)
    assert trl.rtrl.rho_is_one(args) is one
    cls = type("OldSeen", (_OldSeen, trl.rtrl.RlgatesGRPOTrainer), {})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        trainer = build(trl, args, method=m, cls=cls)
    said = [str(x.message) for x in w if "ρ ≡ 1" in str(x.message)]
    if one:
        assert said == [
            f"RlgatesGRPOTrainer: ρ ≡ 1 on every token, so dapo's gate never acts: "
            f"gradient_accumulation_steps={ga} is a multiple of steps_per_generation × "
            f"num_iterations = {spg} × {mu}, so every pass over a batch falls in one optimiser "
            "step and TRL keeps no old log-probs. For a gate to act, set num_iterations=2 with "
            "steps_per_generation = gradient_accumulation_steps, or steps_per_generation > "
            "gradient_accumulation_steps."]
    else:
        assert said == []
    trainer.old_seen = []
    trainer.train()
    assert trainer.old_seen == [not one] * ga  # TRL's own loss inputs agree


# --- capture ---------------------------------------------------------------------------------
def test_a_drop_in_run_is_captured_as_a_stock_one(trl, tmp_path):
    """Stock TRL's dapo and the drop-in with DAPO, same seed and settings: the two captures hold
    the same steps, micro-batches, tokens and sequences, to float32 rounding."""
    m = rlgates.get("dapo")
    caps = {}
    for name, method in (("stock", None), ("dropin", m)):
        trainer = build(trl, trl.config(**flags(m)["trl"]), method=method)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # "capture recorded nothing" would fail
            with trl.capture(trainer, tmp_path / name):
                trainer.train()
        assert "_compute_loss" not in trainer.__dict__  # the class's own hook again
        caps[name] = trl.load(tmp_path / name)
    stock, ours = caps["stock"], caps["dropin"]
    assert list(ours.steps) == list(stock.steps) == [0, 1]
    own = ("run_id", "method")  # a run's own id; the drop-in's method, where it is recorded
    assert ({k: v for k, v in ours.settings.items() if k not in own}
            == {k: v for k, v in stock.settings.items() if k not in own})
    if "method" in ours.settings:
        assert ours.settings["method"]["name"] == "dapo"
    for table in ("tokens", "micro", "sequences"):
        a, b = getattr(stock, table), getattr(ours, table)
        assert sorted(a) == sorted(b), table
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=2e-5, atol=1e-6, err_msg=f"{table}/{k}")
    # not vacuous: the second step's ratios move and its loss is not the first's
    second = ours.tokens["step"] == 1
    assert np.abs(ours.tokens["logp"] - ours.tokens["logp_old"])[second].max() > 1e-3
    assert np.isfinite(ours.tokens["entropy"]).all() and len(ours.micro["loss"]) == 4
