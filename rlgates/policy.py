"""A tiny autoregressive policy over a vocabulary: real log-probs for the book's gradient demos."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .devices import on_accelerator


def demo_size(dev) -> dict:
    """Sizes for the gradient demos: small on the CPU, larger on an accelerator."""
    if on_accelerator(dev):
        return {"vocab": 512, "hidden": 256, "batch": 256, "length": 64}
    return {"vocab": 64, "hidden": 64, "batch": 32, "length": 16}


def zipf_head(hidden, vocab, zipf=1.0) -> nn.Linear:
    """A linear head whose bias starts as a Zipf law, p_k ∝ 1/(k+1)^zipf: like an LLM's, a few
    common tokens and a long tail of rare ones. Shared by TinyPolicy and the lab's policy."""
    head = nn.Linear(hidden, vocab)
    with torch.no_grad():
        ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
        head.bias.copy_(-zipf * ranks.log())
        head.weight.mul_(0.5)
    return head


class TinyPolicy(nn.Module):
    """Embedding → GRU → logits. Token `vocab` is the beginning-of-sequence marker.

    The output bias starts as a Zipf law (p_k ∝ 1/(k+1)), so that, like an LLM, the policy has a few
    common tokens and a long tail of rare ones.
    """

    def __init__(self, vocab=64, hidden=64, zipf=1.0):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab + 1, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = zipf_head(hidden, vocab, zipf)

    @property
    def bos(self):
        return self.vocab

    def logits(self, prompt, response):
        """Next-token logits for each response position: [B, T, vocab]."""
        B = response.shape[0]
        if prompt is None:
            prompt = torch.full((B, 1), self.bos, dtype=torch.long, device=response.device)
        inputs = torch.cat([prompt, response[:, :-1]], dim=1)
        out, _ = self.rnn(self.embed(inputs))
        return self.head(out[:, prompt.shape[1] - 1:])

    def log_probs(self, response, prompt=None):
        """log π(y_t | prompt, y_<t) for every response token: [B, T]."""
        logp = torch.log_softmax(self.logits(prompt, response), dim=-1)
        return logp.gather(-1, response[..., None]).squeeze(-1)

    @torch.no_grad()
    def sample(self, batch, length, prompt=None, generator=None, temperature=1.0):
        """Sample `batch` responses of `length` tokens; returns (tokens [B, T], logp [B, T])."""
        dev = self.head.weight.device
        if prompt is None:
            prompt = torch.full((batch, 1), self.bos, dtype=torch.long, device=dev)
        out, h = self.rnn(self.embed(prompt))
        last = out[:, -1]
        tokens, logps = [], []
        for _ in range(length):
            logp = torch.log_softmax(self.head(last) / temperature, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=generator)
            tokens.append(tok)
            logps.append(logp.gather(-1, tok))
            out, h = self.rnn(self.embed(tok), h)
            last = out[:, -1]
        return torch.cat(tokens, 1), torch.cat(logps, 1)

    def snapshot(self):
        """A frozen copy: the old policy π_old."""
        old = copy.deepcopy(self)
        old.requires_grad_(False)
        return old


def tail_reward(tokens, vocab):
    """A toy verifiable reward: the share of a response's tokens in the rare half of the vocabulary.

    Under the Zipf start these tokens are rare, so the useful tokens are the unlikely ones.
    """
    return (tokens >= vocab // 2).float().mean(-1)


def sample_groups(policy, prompts, group, length, generator=None):
    """G responses per prompt, one reward each, group advantages: a GRPO-style batch.

    Returns (tokens [P·G, T], logp [P·G, T], rewards [P, G], adv [P·G]).
    """
    from .advantages import group_advantages

    tokens, logp = policy.sample(prompts * group, length, generator=generator)
    rewards = tail_reward(tokens, policy.vocab).view(prompts, group)
    return tokens, logp, rewards, group_advantages(rewards).flatten()


def demo_batch(dev, seed=0, group=8, size=None):
    """The chapters' standard batch: a fresh TinyPolicy sized by `demo_size(dev)` and one
    GRPO-style batch sampled from it on `dev` with a seeded generator.

    Returns (policy, tokens [N, T], logp_old [N, T], rewards [N/group, group], adv [N]).
    """
    size = size or demo_size(dev)
    torch.manual_seed(seed)
    g = torch.Generator(device=dev).manual_seed(seed)
    policy = TinyPolicy(size["vocab"], size["hidden"]).to(dev)
    tokens, logp_old, rewards, adv = sample_groups(policy, size["batch"] // group, group,
                                                   size["length"], g)
    return policy, tokens, logp_old, rewards, adv


def policy_step(policy, optimizer, method, tokens, logp_old, adv, mask=None, agg=None):
    """One gradient step of `method.loss` on a batch (agg None: the method's default); returns
    the loss value."""
    loss = method.loss(policy.log_probs(tokens), logp_old, adv, mask, agg)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def lagged_log_ratios(lags=(0, 1, 2, 4, 8), vocab=64, hidden=64, prompts=8, group=8, length=16,
                      lr=3e-3, seed=0, device=None):
    """How far the live policy drifts from a rollout policy that lags k updates behind.

    Trains a TinyPolicy for max(lags) steps on `tail_reward` (plain policy gradient, no clip, so the
    drift is the optimiser's alone), keeping a snapshot after every step. Then, for each lag k, it
    samples responses from the snapshot k steps old and returns log ρ = log π_now − log π_rollout
    with the advantages: {k: (log_ratio [N, T], adv [N])}.
    """
    torch.manual_seed(seed)
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    policy = TinyPolicy(vocab, hidden).to(device or "cpu")
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    snapshots = [policy.snapshot()]
    for _ in range(max(lags)):
        tokens, logp_old, _, adv = sample_groups(policy, prompts, group, length, g)
        logp = policy.log_probs(tokens)
        loss = -(logp * adv[:, None]).mean()  # the ungated policy gradient
        opt.zero_grad()
        loss.backward()
        opt.step()
        snapshots.append(policy.snapshot())
    out = {}
    for k in lags:
        rollout = snapshots[-1 - k]
        tokens, logp_rollout, _, adv = sample_groups(rollout, prompts, group, length, g)
        with torch.no_grad():
            out[k] = (policy.log_probs(tokens) - logp_rollout, adv)
    return out
