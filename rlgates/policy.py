"""A tiny autoregressive policy over a vocabulary: real log-probs for the book's gradient demos."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ._numerics import positive_number
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

    def bos_prompt(self, batch):
        """`batch` prompts of the start marker alone: [batch, 1] (what `log_probs` assumes when
        it gets no prompt)."""
        return torch.full((batch, 1), self.bos, dtype=torch.long, device=self.head.weight.device)

    @torch.no_grad()
    def sample(self, prompt, length, generators):
        """Sample one response of `length` tokens per prompt row: prompt [B, P] → (tokens [B, T],
        logp [B, T]).

        The signature is `LabPolicy.sample`'s: `generators` holds one generator per run, and a
        TinyPolicy is one run, so it is `[g]` (`[None]`: torch's global generator). Part I's
        batches start from the start marker: `policy.sample(policy.bos_prompt(B), T, [g])`.
        """
        (generator,) = generators
        out, h = self.rnn(self.embed(prompt))
        last = out[:, -1]
        tokens, logps = [], []
        for _ in range(length):
            logp = torch.log_softmax(self.head(last), dim=-1)
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

    tokens, logp = policy.sample(policy.bos_prompt(prompts * group), length, [generator])
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
                      lr=1e-3, seed=0, device=None):
    """How far the live policy drifts from a rollout policy that lags k updates behind.

    Trains one `LabPolicy` (the lab's policy of chapters 11-13; every prompt is its start marker)
    for max(lags) steps on `tail_reward` (plain policy gradient, no clip, so the drift is the
    optimiser's alone), keeping a snapshot after every step. Then, for each lag k, it samples
    responses from the snapshot k steps old and returns log ρ = log π_now − log π_rollout with
    the advantages: {k: (log_ratio [N, T], adv [N])}. At lag 0 the two policies share weights,
    but sampling and scoring compute the log-probabilities by different routes, so log ρ is
    float rounding (about 1e-7), not exactly 0. At the same learning rate this policy drifts
    about three times as far in eight updates as the GRU `TinyPolicy` the function used before,
    hence the default lr of 1e-3 (was 3e-3). Used by chapters 1 and 6.
    """
    from .advantages import group_advantages

    dev = torch.device(device or "cpu")
    g = torch.Generator(device=dev).manual_seed(seed)
    policy = LabPolicy([seed], vocab, hidden, length, motif=1).to(dev)
    prompt = torch.full((1, prompts * group, 1), policy.bos, dtype=torch.long, device=dev)

    def batch(pol):
        tokens, logp = pol.sample(prompt, length, [g])
        rewards = tail_reward(tokens[0], vocab).view(prompts, group)
        return tokens, logp, group_advantages(rewards).flatten()

    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    snapshots = [policy.state()]
    for _ in range(max(lags)):
        tokens, _, adv = batch(policy)
        logp = policy.log_probs(tokens, prompt)[0]
        loss = -(logp * adv[:, None]).mean()  # the ungated policy gradient
        opt.zero_grad()
        loss.backward()
        opt.step()
        snapshots.append(policy.state())
    rollout = LabPolicy([seed], vocab, hidden, length, motif=1).to(dev).requires_grad_(False)
    out = {}
    for k in lags:
        rollout.load_state_dict(snapshots[-1 - k])
        tokens, logp_rollout, adv = batch(rollout)
        with torch.no_grad():
            out[k] = ((policy.log_probs(tokens, prompt) - logp_rollout)[0], adv)
    return out


def check_temperature(temperature) -> float:
    """A sampling temperature as a float; ValueError unless it is finite and > 0."""
    return positive_number(temperature, "temperature")


class LabPolicy(nn.Module):
    """R independent copies of a tiny autoregressive policy, trained as one computation.

    Every parameter has a leading runs dimension R: run r is its own policy (its own seed, its
    own Adam state), and a loss summed over runs gives each run its own gradient. Position t of a
    response sees: a projection of the prompt's token embeddings, a position embedding, the
    embedding of the previous token (a start marker at t = 0) and the mean of a second embedding
    over the earlier response tokens; a two-layer tanh MLP and a linear head give next-token
    logits. As in TinyPolicy, the head's bias starts as a Zipf law (p_k ∝ 1/(k+1)). There is no
    recurrence, so a CPU trains ten runs of it in milliseconds. Used by the lab (chapters 11-13)
    and by `lagged_log_ratios` (chapters 1 and 6).

    Shapes: prompt [R, B, motif], response [R, B, T] → logits [R, B, T, vocab].

    `temperature` T divides the logits, in sampling and in `logits` alike, as TRL's trainer does
    with its sampling temperature: the policy the lab samples from, scores and trains is then
    softmax(z / T), and the entropy it logs is that distribution's (T = 1: the logits themselves).

    Its `sample(prompt, length, generators)` and `log_probs(response, prompt)` take the same
    arguments as TinyPolicy's, with a leading runs dimension: every run draws from its own
    generator (so run r samples the same tokens alone or batched), and every response has a
    prompt (the task's motif), where the GRU demo policy of Part I is one run whose prompt is
    the start marker.
    """

    def __init__(self, seeds=(0,), vocab=16, hidden=32, length=8, motif=2, zipf=1.0,
                 temperature=1.0):
        super().__init__()
        self.vocab, self.length, self.motif = vocab, length, motif
        self.temperature = check_temperature(temperature)
        self.seeds = list(seeds)
        runs = [self._one_run(s, vocab, hidden, length, motif, zipf) for s in self.seeds]
        for name in runs[0]:
            setattr(self, name, nn.Parameter(torch.stack([r[name] for r in runs])))

    @staticmethod
    def _one_run(seed, vocab, hidden, length, motif, zipf):
        """One run's initial weights, from torch's default initialisers under `seed`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            tok, ctx = nn.Embedding(vocab + 1, hidden), nn.Embedding(vocab, hidden)
            pos = nn.Embedding(length, hidden)
            proj, body = nn.Linear(motif * hidden, hidden), nn.Linear(hidden, hidden)
            head = zipf_head(hidden, vocab, zipf)
        return {"tok": tok.weight, "ctx": ctx.weight, "pos": pos.weight,
                "w_prompt": proj.weight.T, "b_prompt": proj.bias,
                "w_body": body.weight.T, "b_body": body.bias,
                "w_head": head.weight.T, "b_head": head.bias}

    @property
    def bos(self):
        return self.vocab

    @property
    def runs(self):
        return len(self.seeds)

    def _embed(self, table, idx):
        """table [R, N, H], idx [R, ...] → [R, ..., H]: each run looks up its own table."""
        R, N, H = table.shape
        offset = torch.arange(R, device=idx.device).view(R, *[1] * (idx.dim() - 1)) * N
        return nn.functional.embedding(idx + offset, table.reshape(R * N, H))

    def _linear(self, x, w, b):
        """x [R, ..., I] @ w [R, I, O] + b [R, O], run by run."""
        shape = x.shape
        y = torch.baddbmm(b[:, None], x.reshape(shape[0], -1, shape[-1]), w)
        return y.reshape(*shape[:-1], w.shape[-1])

    def _prompt(self, prompt):
        return self._linear(self._embed(self.tok, prompt).flatten(-2), self.w_prompt,
                            self.b_prompt)

    def _body(self, x):
        return torch.tanh(self._linear(torch.tanh(x), self.w_body, self.b_body))

    def _head(self, x):
        return self._tempered(self._linear(self._body(x), self.w_head, self.b_head))

    def _tempered(self, logits):
        """logits / T (T = 1 returns the logits untouched, bit for bit)."""
        return logits if self.temperature == 1.0 else logits / self.temperature

    def logits(self, prompt, response):
        """Next-token logits for each response position: [R, B, T, vocab]. A single run also
        takes prompt [B, motif] and response [B, T] and returns [B, T, vocab]."""
        if response.dim() == 2:
            self._single_run()
            return self.logits(prompt[None], response[None])[0]
        return self._head(self._inputs(prompt, response))

    def _single_run(self):
        if self.runs != 1:
            raise ValueError(f"[B, T] inputs need a single run, this policy has {self.runs}")

    def features(self, prompt, response):
        """The hidden state the LM head reads, for each response position: [R, B, T, hidden]
        (or [B, T, hidden], as `logits`). Kept apart so that an engine can run the head in
        another precision than the body (`rlgates.engine.mixed_precision_log_probs`)."""
        if response.dim() == 2:
            self._single_run()
            return self.features(prompt[None], response[None])[0]
        return self._body(self._inputs(prompt, response))

    def _inputs(self, prompt, response):
        """The body's input for every response position: [R, B, T, hidden]. The prompt, the
        position, the previous token and the mean of the response so far."""
        R, B, T = response.shape
        start = response.new_full((R, B, 1), self.bos)
        prev = torch.cat([start, response[..., :-1]], -1)
        ctx = self._embed(self.ctx, response[..., :-1]).cumsum(-2)
        ctx = ctx / torch.arange(1, T, device=ctx.device, dtype=ctx.dtype)[:, None]
        ctx = torch.cat([ctx.new_zeros(R, B, 1, ctx.shape[-1]), ctx], -2)
        return (self._prompt(prompt)[:, :, None] + self.pos[:, None, :T]
                + self._embed(self.tok, prev) + ctx)

    def log_probs(self, response, prompt):
        """log π(y_t | prompt, y_<t) for every response token: [R, B, T] (or [B, T], as
        `logits`)."""
        logp = torch.log_softmax(self.logits(prompt, response), dim=-1)
        return logp.gather(-1, response[..., None]).squeeze(-1)

    @torch.no_grad()
    def sample(self, prompt, length, generators):
        """Sample one response per prompt row, run r drawing from generators[r].

        prompt [R, B, motif] → (tokens [R, B, length], logp [R, B, length]). Each run draws its
        uniforms from its own generator, so run r gets the same tokens whether it is sampled
        alone or with other runs.
        """
        R, B = prompt.shape[:2]
        u = torch.stack([torch.rand(B, length, generator=g, device=g.device)
                         for g in generators]).to(self.b_head.dtype)
        p = self._prompt(prompt)
        prev = prompt.new_full((R, B), self.bos)
        ctx_sum = torch.zeros_like(p)
        tokens, logps = [], []
        for t in range(length):
            ctx = ctx_sum / t if t > 0 else ctx_sum
            x = p + self.pos[:, None, t] + self._embed(self.tok, prev) + ctx
            logp = torch.log_softmax(self._head(x), dim=-1)
            cdf = logp.exp().cumsum(-1)
            tok = (cdf < u[..., t, None]).sum(-1).clamp(max=self.vocab - 1)
            tokens.append(tok)
            logps.append(logp.gather(-1, tok[..., None])[..., 0])
            prev = tok
            ctx_sum = ctx_sum + self._embed(self.ctx, tok)
        return torch.stack(tokens, -1), torch.stack(logps, -1)

    def state(self):
        """A detached copy of the weights (for lagged rollout policies)."""
        return {k: v.detach().clone() for k, v in self.state_dict().items()}
