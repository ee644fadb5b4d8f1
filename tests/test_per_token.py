"""Advantages per token ([B, T]) through GSPO, against verl's and TRL's own GSPO (chapter 19).

rlgates gates each token of a response at (ρ_s, A_t) and gives token t the gradient
−w_t·f'(ρ_s; A_t)·ρ_s·A_t (GSPO-token, verl's gspo). TRL's sequence level has the same loss
value and spreads each response's mean gradient over its tokens. The batch is multi-turn: tool
tokens (mask 0) inside responses hold loud log-ratios and advantages, so a loss that read them,
or a ρ_s taken over them, would differ. Also: verl's advantage estimators read from its file.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import rlgates
from rlgates import advantages as ra
from rlgates._book import facts

pytestmark = pytest.mark.xdist_group("trainers")  # one worker imports TRL and verl

GSPO = rlgates.get("gspo")
EPS_LOW, EPS_HIGH = GSPO.hparams["eps_low"], GSPO.hparams["eps_high"]


def multi_turn_batch():
    """4 responses of 10 positions. Rows 0 and 1 have a tool span (mask 0) inside; row 3 ends
    early (padding). Each row's A changes sign inside it; row 0's ρ_s lies above 1 + ε_h, row
    1's below 1 − ε_l, rows 2 and 3 inside the window. Tool and padding positions hold a
    log-ratio of 0.7 and A = 2.5."""
    T = 10
    mask = torch.ones(4, T, dtype=torch.bool)
    mask[0, 3:6] = mask[1, 4:7] = False  # tool tokens
    mask[3, 7:] = False  # padding
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0],
                        dtype=torch.float64)
    adv = torch.stack([0.5 * sign, -0.8 * sign, 0.3 * sign.roll(1), 1.1 * sign.roll(2)])
    g = torch.Generator().manual_seed(0)
    noise = 1e-4 * torch.randn(4, T, generator=g, dtype=torch.float64)
    drift = torch.tensor([2e-3, -2e-3, 1e-4, -1e-4], dtype=torch.float64)[:, None]
    log_ratio = torch.where(mask, drift + noise - noise.mean(-1, keepdim=True), 0.7)
    adv = torch.where(mask, adv, 2.5)
    logp_old = -1.0 - torch.rand(4, T, generator=g, dtype=torch.float64)
    return SimpleNamespace(logp=logp_old + log_ratio, logp_old=logp_old, adv=adv, mask=mask)


def gradient(loss_fn, b):
    leaf = b.logp.clone().requires_grad_(True)
    value = loss_fn(leaf)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def response_mean(grad, mask):
    """Each response's mean gradient over its real tokens, on each real token."""
    m = mask.to(grad.dtype)
    return (grad * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True) * m


def test_the_batch_straddles_gspos_window():
    b = multi_turn_batch()
    seq = rlgates._numerics.sequence_log_ratio(b.logp, b.logp_old, b.mask).exp()
    assert seq[0] > 1 + EPS_HIGH and seq[1] < 1 - EPS_LOW
    assert ((seq[2:] > 1 - EPS_LOW) & (seq[2:] < 1 + EPS_HIGH)).all()
    for row in range(4):
        real = b.adv[row][b.mask[row]]
        assert (real > 0).any() and (real < 0).any()
    # with the tool tokens in the mask, ρ_s would be far from all of these
    full = rlgates._numerics.sequence_log_ratio(b.logp, b.logp_old, b.logp == b.logp)
    assert (full[:2] - seq[:2].log()).abs().min() > 0.1


def test_gspo_gates_each_token_at_rho_s_and_its_own_a():
    b = multi_turn_batch()
    gate = GSPO.token_gate(b.logp, b.logp_old, b.adv, b.mask)
    real_pos, real_neg = b.mask & (b.adv > 0), b.mask & (b.adv < 0)
    # row 0, ρ_s above 1 + ε_h: its A > 0 tokens shut, its A < 0 tokens open
    assert (gate[0][real_pos[0]] == 0).all() and (gate[0][real_neg[0]] == 1).all()
    # row 1, ρ_s below 1 − ε_l: the other way round
    assert (gate[1][real_pos[1]] == 1).all() and (gate[1][real_neg[1]] == 0).all()
    # inside the window every real token is open
    assert (gate[2:][b.mask[2:]] == 1).all()
    # negative control: one A per response (its mean) gates each row as a whole
    row_adv = torch.where(b.mask, b.adv, 0.0).sum(-1) / b.mask.sum(-1)
    whole = GSPO.token_gate(b.logp, b.logp_old, row_adv, b.mask)
    for row in range(4):
        assert whole[row][b.mask[row]].unique().numel() == 1


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gspo_with_per_token_a_is_verls_gspo(agg):
    from verl.trainer.ppo import core_algos
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    b = multi_turn_batch()
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                          clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, loss_agg_mode=agg,
                          policy_loss=PolicyLossConfig(loss_mode="gspo"))
    theirs = gradient(lambda lp: core_algos.get_policy_loss_fn("gspo")(
        old_log_prob=b.logp_old, log_prob=lp, advantages=b.adv, response_mask=b.mask,
        loss_agg_mode=agg, config=cfg)[0], b)
    ours = gradient(lambda lp: GSPO.loss(lp, b.logp_old, b.adv, b.mask, agg=agg), b)
    assert float(ours[0]) == pytest.approx(float(theirs[0]), rel=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-12, atol=1e-15)
    # the closed form: token t's own gate and A
    closed = GSPO.expected_grad(b.logp, b.logp_old, b.adv, b.mask, agg)
    torch.testing.assert_close(ours[1], closed, rtol=1e-12, atol=1e-15)
    # not vacuous: the gradient varies inside a response (both signs, shut tokens)
    assert ours[1][~b.mask].abs().max() == 0
    assert (ours[1][0][b.mask[0]] == 0).any() and (ours[1][0][b.mask[0]] != 0).any()


@pytest.fixture(scope="module")
def trl_trainer():
    from trl import GRPOTrainer

    from rlgates.trainers import trl as rtrl
    from tests.trl_run import DATA, config, reward_words, tiny_model, tiny_tokenizer

    flags = rlgates.trainers.flags(GSPO)["trl"]
    assert flags["importance_sampling_level"] == "sequence" and flags["loss_type"] == "grpo"
    args = config(gradient_accumulation_steps=1, steps_per_generation=1, **flags)
    t = GRPOTrainer(model=tiny_model(), reward_funcs=reward_words, args=args,
                    train_dataset=DATA, processing_class=tiny_tokenizer())
    t.current_gradient_accumulation_steps = 1
    t.model.train()
    return SimpleNamespace(trainer=t, rtrl=rtrl)


def trl_gspo(trl, b, adv):
    """TRL's own loss with GSPO's flags; the tool span goes in as TRL's `tool_mask` (0 on tool
    tokens), padding as its completion_mask."""
    completion = b.mask.clone()
    completion[3, 7:] = False
    tool = (b.mask | ~completion).long()
    assert ((completion & tool.bool()) == b.mask).all()
    return gradient(lambda lp: trl.rtrl.builtin_loss(
        trl.trainer, lp, b.logp_old, adv, completion, extra_inputs={"tool_mask": tool}), b)


def test_trls_sequence_level_spreads_each_responses_mean_gradient(trl_trainer):
    b = multi_turn_batch()
    theirs = trl_gspo(trl_trainer, b, b.adv)
    ours = gradient(lambda lp: trl_trainer.rtrl.trl_loss(GSPO, lp, b.logp_old, b.adv, b.mask,
                                                         "grpo"), b)
    # the same loss value (ρ_s over the model's tokens only, in both)
    assert float(ours[0]) == pytest.approx(float(theirs[0]), rel=1e-12)
    # TRL's gradient is rlgates' (verl's) averaged over each response's real tokens
    torch.testing.assert_close(response_mean(ours[1], b.mask), theirs[1], rtol=1e-12,
                               atol=1e-15)
    assert (ours[1] - theirs[1]).abs().max() > 1e-3  # and the two do differ
    # TRL pushes a token against its own A: row 0's A > 0 tokens are shut in rlgates and
    # get the response's mean (from its open A < 0 tokens) in TRL
    shut_pos = b.mask[0] & (b.adv[0] > 0)
    assert (ours[1][0][shut_pos] == 0).all() and (theirs[1][0][shut_pos] != 0).all()
    # negative control: with one A per response the two gradients are equal
    row_adv = torch.where(b.mask, b.adv, 0.0).sum(-1) / b.mask.sum(-1)
    theirs_row = trl_gspo(trl_trainer, b, row_adv)
    ours_row = gradient(lambda lp: trl_trainer.rtrl.trl_loss(GSPO, lp, b.logp_old, row_adv,
                                                             b.mask, "grpo"), b)
    torch.testing.assert_close(ours_row[1], theirs_row[1], rtol=1e-12, atol=1e-15)


def test_the_conventions_page_states_the_rule():
    page = " ".join((Path(__file__).resolve().parents[1] / "conventions.md").read_text().split())
    assert ("gates token $t$ at $(\\rho_s, A_t)$ and gives it the gradient of its own $A_t$ "
            "(GSPO-token), as verl's `gspo` does.") in page
    assert "gives every token of a response that response's mean gradient" in page


def test_trl_multiplies_its_tool_mask_into_the_loss_mask():
    facts.says("trl/trainer/grpo_trainer.py",
               'mask = completion_mask if "tool_mask" not in inputs else '
               'completion_mask * inputs["tool_mask"]', name="GRPOTrainer._compute_loss")


# --- verl's advantage estimators, read from its file ------------------------------------------
def test_registered_reads_verls_estimators_by_their_enum():
    names = facts.registered("verl/trainer/ppo/core_algos.py", "register_adv_est")
    # tests/test_advantages_trainers.py asserts VERL_ESTIMATORS == the imported registry
    assert len(names) == len(set(names)) == 14
    assert set(names) == set(ra.VERL_ESTIMATORS)


def test_registered_names_an_unknown_enum_member(monkeypatch):
    source = ('class E:\n    A = "a"\n@reg(E.A)\ndef f(): pass\n@reg("b")\ndef g(): pass\n'
              '@reg(E.MISSING)\ndef h(): pass\n')
    monkeypatch.setattr(facts, "_tree", lambda relative: ast.parse(source))
    with pytest.raises(LookupError, match="E.MISSING"):
        facts.registered("x.py", "reg")
    monkeypatch.setattr(facts, "_tree", lambda relative: ast.parse(source.rsplit("@", 1)[0]))
    assert facts.registered("x.py", "reg") == ["a", "b"]
