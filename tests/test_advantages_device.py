import numpy as np
import pytest
import torch

import rlgates


def test_group_advantages_match_a_numpy_reference():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.9, 0.5]], dtype=torch.float64)
    r = rewards.numpy()
    expected = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    assert np.allclose(rlgates.group_advantages(rewards).numpy(), expected, rtol=1e-14, atol=0)


def test_dr_grpo_skips_the_std():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert torch.equal(rlgates.group_advantages(rewards, normalize_std=False),
                       torch.tensor([[0.5, -0.5, -0.5, 0.5]]))


def test_equal_rewards_give_zero_advantage_and_integers_are_accepted():
    assert torch.equal(rlgates.group_advantages(torch.ones(3, 4)), torch.zeros(3, 4))
    adv = rlgates.group_advantages(torch.tensor([[1, 0]]))
    assert adv.is_floating_point() and adv[0, 0] > 0 > adv[0, 1]


def test_group_advantages_are_zero_mean_per_group():
    rewards = torch.rand(5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    adv = rlgates.group_advantages(rewards)
    assert torch.allclose(adv.mean(1), torch.zeros(5, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(adv.std(1), torch.ones(5, dtype=torch.float64), rtol=1e-5)


@pytest.mark.parametrize("rewards, match", [
    (torch.ones(4), r"rewards must be \[num_prompts, G\], got shape \(4,\)"),
    (torch.ones(3, 1), "G ≥ 2"),
])
def test_group_advantages_bad_input(rewards, match):
    with pytest.raises(ValueError, match=match):
        rlgates.group_advantages(rewards)


def test_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert rlgates.device() == torch.device("cpu") and not rlgates.on_accelerator()
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert rlgates.device() == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rlgates.device() == torch.device("cuda") and rlgates.on_accelerator()


def test_demo_size_grows_on_an_accelerator():
    small, large = rlgates.demo_size("cpu"), rlgates.demo_size("cuda")
    assert all(large[k] > small[k] for k in small)


def test_tiny_policy_sampled_logp_matches_its_log_probs():
    torch.manual_seed(0)
    policy = rlgates.TinyPolicy(vocab=16, hidden=8)
    g = torch.Generator().manual_seed(1)
    tokens, logp = policy.sample(policy.bos_prompt(5), 7, [g])
    assert tokens.shape == (5, 7) and tokens.max() < 16
    assert torch.allclose(policy.log_probs(tokens), logp, atol=1e-6)
    old = policy.snapshot()
    assert not any(p.requires_grad for p in old.parameters())


def test_lagged_log_ratios_spread_with_the_lag():
    out = rlgates.lagged_log_ratios(lags=(0, 2, 6), vocab=16, hidden=16, prompts=4, group=4,
                                    length=6, lr=1e-2)
    assert out[0][0].abs().max() < 1e-5  # lag 0: the rollout policy is the live one
    spread = [out[k][0].std().item() for k in (0, 2, 6)]
    assert spread[0] < spread[1] < spread[2]


def test_policy_step_moves_the_policy():
    torch.manual_seed(0)
    policy = rlgates.TinyPolicy(vocab=16, hidden=8)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    tokens, logp_old, rewards, adv = rlgates.sample_groups(policy, 2, 4, 5)
    assert rewards.shape == (2, 4) and adv.shape == (8,)
    rlgates.policy_step(policy, opt, rlgates.get("ppo"), tokens, logp_old, adv)
    assert (policy.log_probs(tokens) - logp_old).abs().max() > 1e-4


def test_tail_reward():
    tokens = torch.tensor([[0, 8, 9, 15], [1, 2, 3, 4]])
    assert torch.equal(rlgates.tail_reward(tokens, 16), torch.tensor([0.75, 0.0]))


def test_time_step_and_compare_devices(capsys):
    calls = []
    seconds = rlgates.time_step(lambda: calls.append(1), "cpu", reps=4, warmup=2)
    assert len(calls) == 6 and seconds >= 0
    times = rlgates.compare_devices(lambda d: (lambda: torch.ones(8, device=d).sum()), "cpu",
                                    reps=2, label="demo")
    assert list(times) == ["cpu"] and "demo: cpu:" in capsys.readouterr().out
