"""rlgates.advantages against the installed trainers' own code, in float64 on ragged batches.

verl: the estimators of `ADV_ESTIMATOR_REGISTRY` (verl/trainer/ppo/core_algos.py, imported) and
`apply_kl_penalty` (verl/trainer/ppo/ray_trainer.py, whose module needs Ray's extras: its source
is run here on verl's own kl_penalty and masked_mean). TRL: the advantage lines of
GRPOTrainer and RLOOTrainer sit inside `_generate_and_score_completions`, so their installed
source is cut out and run (importing TRL is not needed for that). Every batch has ragged
lengths, a response with mask zeros inside it (a tool call), rewards that differ within and
across groups, and γ, λ strictly inside (0, 1) where they apply.
"""

from __future__ import annotations

import ast
import functools
import textwrap
import types

import numpy as np
import pytest
import torch

from rlgates import advantages as ra
from rlgates._book import facts
from rlgates._numerics import ragged_mask

# Under xdist one worker runs this group (pyproject.toml: --dist loadgroup): verl is imported once.
pytestmark = pytest.mark.xdist_group("trainers")

TRL_GRPO = "trl/trainer/grpo_trainer.py"
TRL_RLOO = "trl/trainer/rloo_trainer.py"
P, G, T = 3, 4, 9
GAMMA, LAM = 0.9, 0.8
#: float64 results: the trainers' loops and ours round differently in the last bits.
TOL = dict(rtol=1e-12, atol=1e-12)
#: Where the trainer computes one factor in float32 from an integer count (verl's gpg α = B/m,
#: TRL's nanstd Bessel factor n/(n − 1)): that factor's rounding, ~6e-8 relative at most.
FACTOR32_TOL = dict(rtol=1e-7, atol=1e-12)


@pytest.fixture(scope="module", autouse=True)
def trainers():
    """verl's core_algos, imported when the first test here runs (not at collection)."""
    global core_algos, verl_F, AlgoConfig
    pytest.importorskip("verl")
    import verl.utils.torch_functional as verl_F
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos


@functools.cache
def parsed(relative):
    """The text of an installed file and its syntax tree (parsed once: the files are long)."""
    text = facts.path(relative).read_text()
    return text, ast.parse(text)


def installed_function(relative, name, **scope):
    """The installed definition `name` of `relative` (a package file), run from its source."""
    text, tree = parsed(relative)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"torch": torch, **scope}
    exec(compile(ast.get_source_segment(text, node), f"<installed {name}>", "exec"), namespace)
    return namespace[name]


def installed_lines(relative, method, first, last):
    """The lines of the installed `method` from the one starting with `first` to the one
    starting with `last`, dedented: straight-line code to exec."""
    text, tree = parsed(relative)
    cls, name = method.split(".")
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = ast.get_source_segment(text, fn, padded=True).splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip().startswith(first))
    stop = next(i for i, s in enumerate(lines) if i > start and s.strip().startswith(last))
    return textwrap.dedent("\n".join(lines[start:stop + 1]))


def batch(seed=0):
    """Rewards [P·G] (some exactly 0, a tie in one group), a ragged mask with a gap inside row 2,
    values, log-probs, uids."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(P * G, generator=g, dtype=torch.float64)
    rewards[[1, 5]] = 0.0
    rewards[9] = rewards[8:12].max()  # a tie at the top of the last group
    mask = ragged_mask(torch.tensor([9, 3, 7, 5, 1, 8, 6, 9, 2, 4, 9, 7]), T)
    mask[2, 3:5] = False  # a tool call inside the response: two environment tokens
    values = torch.randn(P * G, T, generator=g, dtype=torch.float64)
    logp_old = -torch.rand(P * G, T, generator=g, dtype=torch.float64) * 2
    logp_ref = logp_old + 0.3 * torch.randn(P * G, T, generator=g, dtype=torch.float64)
    uid = np.array([f"prompt{i // G}" for i in range(P * G)], dtype=object)
    return rewards, mask, values, logp_old, logp_ref, uid


def token_rewards(seed=1):
    """Process rewards on several tokens, masked ones included (both sides must drop them)."""
    rewards, mask, values, *_ = batch()
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(P * G, T, generator=g, dtype=torch.float64)
    r[torch.rand(P * G, T, generator=g) < 0.5] = 0.0
    return r, mask, values


def on_mask(x, mask):
    return x[mask]


# --- verl's registry -----------------------------------------------------------------------------
def test_the_table_names_every_verl_estimator():
    """A name verl registers and rlgates.advantages.VERL_ESTIMATORS lacks fails here."""
    installed = set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert installed == set(ra.VERL_ESTIMATORS), installed ^ set(ra.VERL_ESTIMATORS)
    assert len(installed) == 14
    for name, entry in ra.VERL_ESTIMATORS.items():
        assert callable(entry.function) or entry.note.startswith("out of scope: "), name


def test_the_defaults_the_docstrings_state():
    """verl's PPO defaults: GAE with γ = λ = 1, KL in the reward (when on) by k1 ("kl"), the
    critic's cliprange_value 0.5 and its loss_agg_mode the actor's (token-mean); the group eps:
    verl 1e-6, TRL 1e-4 (both divide by std + eps)."""
    assert facts.verl("algorithm.adv_estimator") == "gae"
    assert facts.verl("algorithm.gamma") == facts.verl("algorithm.lam") == 1.0
    assert facts.verl("algorithm.kl_penalty") == "kl"
    assert facts.verl("algorithm.norm_adv_by_std_in_grpo") is True
    assert facts.verl("critic.cliprange_value") == 0.5
    assert facts.verl("critic.loss_agg_mode") == \
        "${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}"
    assert facts.verl("actor_rollout_ref.actor.loss_agg_mode") == "token-mean"
    assert ra.STD_EPS == 1e-6
    facts.says("verl/trainer/ppo/core_algos.py", "epsilon: float = 1e-6,",
               name="compute_grpo_outcome_advantage")
    facts.says(TRL_GRPO, "advantages = advantages / (std_rewards + 1e-4)")
    facts.says(TRL_RLOO, "(nanstd(advantages) + 1e-4)")
    facts.says("verl/utils/torch_functional.py", "torch.rsqrt(var + 1e-8)", name="masked_whiten")
    assert ra.WHITEN_EPS == 1e-8


# --- GAE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma, lam", [(GAMMA, LAM), (1.0, 1.0), (0.99, 0.0)])
def test_gae_equals_verls(gamma, lam):
    """Whitened: verl's compute_gae_advantage_return on the real tokens; raw: its advantages
    before the whitening (returns = A + V, which verl computes before whitening)."""
    rewards, mask, values = token_rewards()
    verl_adv, verl_ret = core_algos.compute_gae_advantage_return(
        rewards, values, mask.double(), gamma, lam)
    adv, ret = ra.gae(rewards, values, mask, gamma, lam, whiten=True)
    raw, ret_raw = ra.gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(on_mask(adv, mask), on_mask(verl_adv, mask), **TOL)
    assert torch.allclose(on_mask(ret, mask), on_mask(verl_ret, mask), **TOL)
    assert torch.equal(ret, ret_raw)
    assert torch.allclose(on_mask(raw, mask), on_mask(verl_ret - values, mask), **TOL)
    # whitening changed the numbers (the comparison of raw A is not the whitened one again)
    assert (on_mask(adv - raw, mask)).abs().max() > 0.1
    assert torch.all(adv[~mask] == 0) and torch.all(ret[~mask] == 0)


def test_verl_gae_on_masked_tokens():
    """What verl leaves on masked tokens (none of it reaches a loss): inside a response, the
    next real token's raw advantage; on padding, −μ/σ after the whitening."""
    rewards, mask, values = token_rewards()
    verl_adv, verl_ret = core_algos.compute_gae_advantage_return(
        rewards, values, mask.double(), GAMMA, LAM)
    raw, _ = ra.gae(rewards, values, mask, GAMMA, LAM)
    raw_verl = verl_ret - values
    assert torch.allclose(raw_verl[2, 3:5], raw[2, 5].expand(2), **TOL)  # the tool call
    m = mask.double()
    n = m.sum()
    mu = (raw * m).sum() / (n + 1e-8)
    var = ((raw - mu).square() * m).sum() / (n + 1e-8) * n / (n - 1)
    padding = ~mask
    padding[2] = False
    assert mu.abs() > 1e-3 and torch.allclose(
        verl_adv[padding], (-mu * torch.rsqrt(var + 1e-8)).expand(int(padding.sum())), **TOL)


def test_gae_across_a_tool_call_uses_the_next_real_token():
    """verl applies γ once across the gap: the last token before the tool call bootstraps from
    V at the first token after it, and a reward on the tool tokens is dropped."""
    rewards, mask, values = token_rewards()
    rewards[2, 3] = 5.0  # on a tool token: dropped
    raw, _ = ra.gae(rewards, values, mask, GAMMA, LAM)
    delta_2 = rewards[2, 2] + GAMMA * values[2, 5] - values[2, 2]
    assert torch.allclose(raw[2, 2], delta_2 + GAMMA * LAM * raw[2, 5], **TOL)
    verl_adv, verl_ret = core_algos.compute_gae_advantage_return(
        rewards, values, mask.double(), GAMMA, LAM)
    assert torch.allclose(verl_ret[2, 2] - values[2, 2], raw[2, 2], **TOL)


def test_kl_in_the_reward_then_gae_as_verl_composes_them():
    """apply_kl_penalty (use_kl_in_reward, kl_penalty "kl" and "low_var_kl"), then GAE."""
    rewards, mask, values, logp_old, logp_ref, _ = batch()
    scores = ra.outcome_rewards(rewards, mask)
    for verl_name, ours in (("kl", "k1"), ("low_var_kl", "k3"), ("abs", "abs"), ("mse", "k2")):
        data = verl_data(scores, mask, logp_old, logp_ref)
        data, _ = apply_kl_penalty()(data, core_algos.FixedKLController(0.05), verl_name)
        shaped = ra.kl_penalised_rewards(scores, logp_old, logp_ref, mask, 0.05, ours)
        assert torch.allclose(shaped, data.batch["token_level_rewards"], **TOL), verl_name
        assert (shaped - scores).abs().max() > 1e-3  # the penalty is not vacuous
        verl_adv, _ = core_algos.compute_gae_advantage_return(
            data.batch["token_level_rewards"], values, mask.double(), GAMMA, LAM)
        adv, _ = ra.gae(shaped, values, mask, GAMMA, LAM, whiten=True)
        assert torch.allclose(on_mask(adv, mask), on_mask(verl_adv, mask), **TOL)


def verl_data(scores, mask, logp_old, logp_ref):
    """The DataProto fields apply_kl_penalty reads."""
    fields = {"response_mask": mask.double(), "token_level_scores": scores,
              "old_log_probs": logp_old, "ref_log_prob": logp_ref}
    tensors = type("Batch", (dict,), {"batch_size": (scores.shape[0],)})(fields)
    return types.SimpleNamespace(batch=tensors)


def apply_kl_penalty():
    return installed_function("verl/trainer/ppo/ray_trainer.py", "apply_kl_penalty",
                              core_algos=core_algos, masked_mean=verl_F.masked_mean,
                              DataProto=object)


# --- sequence-level estimators -------------------------------------------------------------
def verl_outcome(name, rewards, mask, uid, **kwargs):
    fn = core_algos.get_adv_estimator_fn(name)
    adv, _ = fn(token_level_rewards=ra.outcome_rewards(rewards, mask),
                response_mask=mask.double(), index=uid, **kwargs)
    return adv


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_equals_verls(normalize_std):
    rewards, mask, _, _, _, uid = batch()
    ours = ra.group_advantages(rewards, normalize_std, group_size=G)
    for name in ("grpo", "grpo_vectorized"):
        theirs = verl_outcome(name, rewards, mask, uid, norm_adv_by_std_in_grpo=normalize_std)
        # grpo_vectorized computes in float32 (verl.utils.group_mean_std)
        tol = TOL if name == "grpo" else dict(rtol=1e-5, atol=1e-6)
        assert torch.allclose(ours[:, None] * mask, theirs.double(), **tol), name
    other = ra.group_advantages(rewards, not normalize_std, group_size=G)
    assert (ours - other).abs().max() > 0.1  # the std matters on this batch


def test_rloo_equals_verls_and_trls():
    rewards, mask, _, _, _, uid = batch()
    ours = ra.rloo_advantages(rewards, group_size=G)
    for name in ("rloo", "rloo_vectorized"):
        assert torch.allclose(ours[:, None] * mask, verl_outcome(name, rewards, mask, uid),
                              **TOL), name
    trl = trl_rloo(rewards, normalize=False)
    assert torch.allclose(ours, trl, **TOL)
    assert (ours - ra.group_advantages(rewards, False, group_size=G)).abs().max() > 0.1


@pytest.mark.parametrize("normalize_std", [True, False])
def test_passk_equals_verls(normalize_std):
    rewards, mask, _, _, _, uid = batch()
    config = AlgoConfig(norm_adv_by_std_in_grpo=normalize_std)
    theirs = verl_outcome("grpo_passk", rewards, mask, uid, config=config)
    ours = ra.passk_advantages(rewards, normalize_std, group_size=G)
    assert torch.allclose(ours[:, None] * mask, theirs, **TOL)
    assert (ours != 0).sum() == P - 1  # the group with a tie at the top learns nothing


def test_gpg_and_opo_equal_verls():
    rewards, mask, _, _, _, uid = batch()
    gpg = ra.gpg_advantages(rewards, group_size=G)
    theirs = verl_outcome("gpg", rewards, mask, uid)
    assert torch.allclose(gpg[:, None] * mask, theirs, **FACTOR32_TOL)
    assert torch.count_nonzero(rewards) < rewards.numel()  # α ≠ 1
    opo = ra.opo_advantages(rewards, mask, group_size=G)
    assert torch.allclose(opo[:, None] * mask, verl_outcome("opo", rewards, mask, uid), **TOL)
    assert (opo - ra.group_advantages(rewards, False, group_size=G)).abs().max() > 1e-2


def test_reinforce_plus_plus_baseline_and_gdpo_equal_verls():
    rewards, mask, _, _, _, uid = batch()
    ours = ra.reinforce_plus_plus_baseline(rewards, mask, group_size=G)
    theirs = verl_outcome("reinforce_plus_plus_baseline", rewards, mask, uid)
    assert torch.allclose(ours, theirs, **TOL)
    gdpo = ra.gdpo_advantages(rewards[:, None], mask, group_size=G)
    assert torch.allclose(gdpo, verl_outcome("gdpo", rewards, mask, uid), **TOL)


def test_reinforce_plus_plus_with_kl_in_the_reward_as_verl_composes_them():
    """use_kl_in_reward: apply_kl_penalty first, then the estimator (γ inside (0, 1))."""
    rewards, mask, _, logp_old, logp_ref, _ = batch()
    scores = ra.outcome_rewards(rewards, mask)
    data, _ = apply_kl_penalty()(verl_data(scores, mask, logp_old, logp_ref),
                                 core_algos.FixedKLController(0.05), "kl")
    fn = core_algos.get_adv_estimator_fn("reinforce_plus_plus")
    theirs, their_returns = fn(token_level_rewards=data.batch["token_level_rewards"],
                               response_mask=mask.double(), config=AlgoConfig(gamma=GAMMA))
    shaped = ra.kl_penalised_rewards(scores, logp_old, logp_ref, mask, 0.05)
    ours, returns = ra.reinforce_plus_plus(shaped, mask, GAMMA)
    assert torch.allclose(ours, theirs, **TOL)
    assert torch.allclose(on_mask(returns, mask), on_mask(their_returns, mask), **TOL)
    without, _ = ra.reinforce_plus_plus(scores, mask, GAMMA)
    assert (ours - without)[mask].abs().max() > 1e-2  # the KL moved A


def test_remax_equals_verls():
    r, mask, _ = token_rewards()
    baselines = torch.linspace(-1, 1, P * G, dtype=torch.float64)
    fn = core_algos.get_adv_estimator_fn("remax")
    theirs, their_returns = fn(token_level_rewards=r, reward_baselines=baselines,
                               response_mask=mask.double())
    ours, returns = ra.remax_advantages(r, baselines, mask)
    assert torch.allclose(on_mask(ours, mask), on_mask(theirs, mask), **TOL)
    assert torch.allclose(on_mask(returns, mask), on_mask(their_returns, mask), **TOL)


# --- TRL ---------------------------------------------------------------------------------------


def nanstd():
    return installed_function("trl/trainer/utils.py", "nanstd")


def trl_grpo(rewards, scale_rewards):
    """TRL's advantage lines (sum_then_normalize, the default), run on one reward function."""
    code = installed_lines(TRL_GRPO, "GRPOTrainer._generate_and_score_completions",
                           "rewards = (rewards_per_func * self.reward_weights",
                           "is_std_zero = torch.isclose(std_rewards")
    scope = {"torch": torch, "nanstd": nanstd(), "rewards_per_func": rewards[:, None].clone(),
             "unscorable_mask": torch.zeros(len(rewards), dtype=torch.bool), "device": "cpu",
             "num_generations": G, "self": types.SimpleNamespace(
                 scale_rewards=scale_rewards, reward_weights=torch.ones(1, dtype=rewards.dtype))}
    exec(compile(code, "<TRL GRPO advantages>", "exec"), scope)
    return scope["advantages"]


def trl_rloo(rewards, normalize):
    code = installed_lines(TRL_RLOO, "RLOOTrainer._generate_and_score_completions",
                           "grouped_rewards = rewards.view(-1, num_generations)",
                           "advantages = torch.nan_to_num(advantages, nan=0.0)")
    scope = {"torch": torch, "nanstd": nanstd(), "rewards": rewards.clone(),
             "num_generations": G, "self": types.SimpleNamespace(normalize_advantages=normalize)}
    exec(compile(code, "<TRL RLOO advantages>", "exec"), scope)
    return scope["advantages"]


def test_trl_scale_rewards_group_none_and_batch():
    rewards = batch()[0]
    group = ra.group_advantages(rewards, eps=1e-4, group_size=G)
    assert torch.allclose(trl_grpo(rewards, "group"), group, **FACTOR32_TOL)
    assert torch.allclose(trl_grpo(rewards, "none"),
                          ra.group_advantages(rewards, False, group_size=G), **TOL)
    scaled = ra.batch_scaled_advantages(rewards, eps=1e-4, group_size=G)
    assert torch.allclose(trl_grpo(rewards, "batch"), scaled, **FACTOR32_TOL)
    assert (scaled - group).abs().max() > 0.1  # batch and group scaling differ here


def test_trl_rloo_normalised():
    """normalize_advantages=True: TRL whitens RLOO's A over the batch (std + 1e-4)."""
    rewards = batch()[0]
    a = ra.rloo_advantages(rewards, group_size=G)
    expected = (a - a.mean()) / (a.std() + 1e-4)
    assert torch.allclose(trl_rloo(rewards, normalize=True), expected, **FACTOR32_TOL)


# --- the critic ----------------------------------------------------------------------------------
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                 "seq-mean-token-mean"])
def test_value_loss_equals_verls(agg):
    """compute_value_loss (cliprange_value 0.5, verl's default): loss, gradient, vf_clipfrac."""
    _, mask, values_old, *_ = batch()
    g = torch.Generator().manual_seed(5)
    values = values_old + torch.randn(values_old.shape, generator=g, dtype=torch.float64)
    returns = values_old + torch.randn(values_old.shape, generator=g, dtype=torch.float64)
    mine, theirs = values.clone().requires_grad_(True), values.clone().requires_grad_(True)
    loss = ra.value_loss(mine, values_old, returns, mask, 0.5, agg)
    verl_loss, verl_clipfrac = core_algos.compute_value_loss(
        theirs, returns, values_old, mask.double(), 0.5, loss_agg_mode=agg)
    loss.backward()
    verl_loss.backward()
    # seq-mean-token-mean: verl divides each response by (its count + 1e-8)
    tol = TOL if agg != "seq-mean-token-mean" else dict(rtol=1e-7, atol=0)
    assert torch.allclose(loss, verl_loss, **tol)
    assert torch.allclose(mine.grad, theirs.grad, **tol)
    fraction = ra.value_clip_fraction(values, values_old, returns, mask, 0.5)
    assert torch.allclose(fraction, verl_clipfrac, rtol=1e-9, atol=0)  # verl: count + 1e-8
    assert 0.05 < fraction < 0.9  # the gate is shut on some tokens, open on others


# --- the optimal token baseline --------------------------------------------------------------------
def otb_batch(seed=7):
    """Four groups of four: a unique longest response (zero tail), a tie for the longest, empty
    responses, one response alone among empty ones, and a tool call inside a response."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 3, 7, 5, 1, 9, 6, 9, 0, 0, 9, 4, 0, 6, 0, 0])
    mask = ragged_mask(lengths, T)
    mask[2, 3:5] = False
    mask[10, 1:3] = False
    rewards = torch.randn(16, T, generator=g, dtype=torch.float64)
    logp_old = -3 * torch.rand(16, T, generator=g, dtype=torch.float64)
    pi = logp_old.exp()
    sum_pi_squared = pi.square() + (1 - pi).square() * torch.rand(16, T, generator=g,
                                                                  dtype=torch.float64)
    is_weights = 0.5 + torch.rand(16, T, generator=g, dtype=torch.float64)
    return rewards, mask, logp_old, sum_pi_squared, is_weights


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
@pytest.mark.parametrize("with_is", [False, True])
def test_optimal_token_baseline_equals_verls(name, with_is):
    rewards, mask, logp_old, sum_pi_squared, is_weights = otb_batch()
    uid = np.array([f"prompt{i // 4}" for i in range(16)], dtype=object)
    fn = core_algos.get_adv_estimator_fn(name)
    weights = is_weights if with_is else None
    theirs, their_returns = fn(token_level_rewards=rewards, response_mask=mask.double(),
                               index=uid, old_log_probs=logp_old,
                               sum_pi_squared=sum_pi_squared, rollout_is_weights=weights)
    by_position = name == "optimal_token_baseline"
    ours, returns = ra.optimal_token_baseline(rewards, mask, logp_old, sum_pi_squared, 4,
                                              weights, by_position=by_position)
    assert torch.allclose(ours, theirs * mask, **TOL)
    assert torch.allclose(on_mask(returns, mask), on_mask(their_returns, mask), **TOL)
    other, _ = ra.optimal_token_baseline(rewards, mask, logp_old, sum_pi_squared, 4, weights,
                                         by_position=not by_position)
    assert (other - ours).abs().max() > 1e-3  # position and real-token alignment differ here
    plain, _ = ra.optimal_token_baseline(rewards, mask, logp_old, sum_pi_squared, 4, weights,
                                         by_position=by_position, handle_zero_tail=False)
    assert (plain - ours).abs().max() > 1e-3  # the zero tail is exercised
    if not by_position:  # row 13 is alone among empty responses: no baseline
        assert torch.equal(ours[13], returns[13]) and returns[13].abs().max() > 0


# --- several reward components: GDPO -------------------------------------------------------------
def two_components():
    """Two reward components on a grid of eighths: exact in float32, where verl's gdpo reads them."""
    g = torch.Generator().manual_seed(11)
    return torch.randint(-8, 9, (P * G, 2), generator=g).double() / 8


def test_gdpo_with_reward_keys_equals_verls():
    """gdpo_reward_keys: verl reads each component from non_tensor_batch as float32, puts it on
    the response's last token and runs GRPO per component (float32 arithmetic, hence the tol)."""
    _, mask, _, _, _, uid = batch()
    parts = two_components()
    config = AlgoConfig(gdpo_reward_keys=["format", "answer"], gdpo_reward_weights=[1.0, 0.5])
    non_tensor = {"uid": uid, "format": parts[:, 0].numpy(), "answer": parts[:, 1].numpy()}
    prompts = torch.zeros(P * G, 2, dtype=torch.long)
    attention = torch.cat([torch.ones(P * G, 2, dtype=torch.long), mask.long()], 1)
    fn = core_algos.get_adv_estimator_fn("gdpo")
    theirs, _ = fn(token_level_rewards=torch.zeros(P * G, T, dtype=torch.float64),
                   response_mask=mask.double(), index=uid, config=config,
                   non_tensor_batch=non_tensor,
                   batch={"prompts": prompts, "attention_mask": attention})
    ours = ra.gdpo_advantages(parts, mask, weights=[1.0, 0.5], group_size=G)
    assert torch.allclose(ours, theirs.double(), rtol=1e-5, atol=1e-6)
    summed = ra.group_advantages(parts @ torch.tensor([1.0, 0.5], dtype=torch.float64),
                                 group_size=G)
    grpo = ra.masked_whiten(summed[:, None].expand(mask.shape), mask)
    assert (ours - grpo).abs().max() > 1e-2  # normalise-then-sum is not sum-then-normalise


def test_trl_normalize_then_sum():
    parts = two_components()
    code = installed_lines(TRL_GRPO, "GRPOTrainer._generate_and_score_completions",
                           "grouped = rewards_per_func.view(-1, num_generations",
                           "is_std_zero = torch.isclose(std_rewards")
    scope = {"torch": torch, "nanstd": nanstd(), "rewards_per_func": parts.clone(),
             "unscorable_mask": torch.zeros(P * G, dtype=torch.bool), "device": "cpu",
             "num_generations": G, "self": types.SimpleNamespace(
                 reward_funcs=[None, None],
                 reward_weights=torch.tensor([1.0, 0.5], dtype=torch.float64))}
    exec(compile(code, "<TRL normalize_then_sum>", "exec"), scope)
    ours = ra.gdpo_advantages(parts, weights=[1.0, 0.5], eps=1e-4, group_size=G)
    assert torch.allclose(ours, scope["advantages"], **FACTOR32_TOL)


def test_trl_rloo_with_its_kl_in_the_reward():
    """TRL's RLOO subtracts β·Σ_t m·(logp_old − logp_ref) from each reward (k1 summed over the
    response), then takes the leave-one-out baseline: kl_penalised_rewards summed, then RLOO."""
    rewards, mask, _, logp_old, logp_ref, _ = batch()
    code = installed_lines(TRL_RLOO, "RLOOTrainer._generate_and_score_completions",
                           "rewards = (rewards_per_func * self.reward_weights",
                           "advantages = torch.nan_to_num(advantages, nan=0.0)")
    scope = {"torch": torch, "nanstd": nanstd(), "gather": lambda x: x, "device": "cpu",
             "rewards_per_func": rewards[:, None].clone(), "num_generations": G,
             "unscorable_mask": torch.zeros(P * G, dtype=torch.bool),
             "old_per_token_logps": logp_old, "ref_per_token_logps": logp_ref,
             "completion_mask": mask.long(),
             "self": types.SimpleNamespace(reward_weights=torch.ones(1, dtype=torch.float64),
                                           reward_clip_range=None, beta=0.05,
                                           normalize_advantages=False)}
    exec(compile(code, "<TRL RLOO with KL>", "exec"), scope)
    shaped = ra.kl_penalised_rewards(ra.outcome_rewards(rewards, mask), logp_old, logp_ref,
                                     mask, 0.05).sum(-1)
    ours = ra.rloo_advantages(shaped, group_size=G)
    assert torch.allclose(ours, scope["advantages"], **TOL)
    assert (ours - ra.rloo_advantages(rewards, group_size=G)).abs().max() > 1e-3
