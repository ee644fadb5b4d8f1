"""A small, real RL-for-sequences lab: train a tiny policy with any gate and watch the gates act.

    >>> from rlgates import lab
    >>> cfg = lab.LabConfig.for_device("cpu")
    >>> res = lab.train("dapo", cfg, seed=0)          # or any object with .loss(...)
    >>> res.metrics["reward"][-1], res.final("entropy")
    >>> runs = lab.run_many(["ppo", "dapo"], seeds=[0, 1, 2], config=cfg)

The task (`PatternTask`): the prompt is a short motif of tokens; the response must repeat it, one
motif token per position, and the reward is the share of the T positions answered right. A response
ends at its first end-of-sequence token (the positions after it count as wrong), so lengths vary
and the three aggregation modes differ. Half of each motif comes from the rare tail of the policy's
Zipf-shaped start distribution: the useful tokens are unlikely ones, where clip-higher acts.

One training step: sample G responses for each of `prompts` prompts from the rollout policy, score
them, compute group advantages, then make `minibatches × epochs` optimizer updates on the batch.
With `lag=k` the rollout policy is the policy as it was k optimizer updates earlier (asynchronous
training), and every method's ratio is taken against that rollout policy's own log-probs (as SAO
does; with `LabConfig(recompute_old=True)` the ratio is instead against the current policy at the
start of the step, a fresh π_old snapshot, as synchronous PPO trainers do).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from . import _numerics as nx
from .advantages import group_advantages
from .devices import on_accelerator
from .methods import REGISTRY, get
from .policy import TinyPolicy, zipf_head

#: The keys of `LabResult.metrics`, one value per training step.
METRIC_KEYS = (
    "step", "reward", "solved", "rare", "live", "length", "entropy", "loss",
    "gated", "gated_pos", "gated_neg", "gate_mean",
    "grad_norm", "kl", "log_ratio_std", "log_ratio_absmax", "staleness", "seconds",
)

#: One-line meaning of each metric (for tables and plots).
METRIC_DOC = {
    "step": "training step (one rollout batch)",
    "reward": "mean sequence reward of the rollout batch (share of positions right)",
    "solved": "share of rollout responses with reward 1",
    "rare": "share of the rare-token positions (odd motif slots) answered right",
    "live": "share of responses with A ≠ 0 (groups whose rewards are not all equal)",
    "length": "mean response length, in tokens (up to and including the end token)",
    "entropy": "mean per-token entropy of the current policy on the rollout contexts (nats)",
    "loss": "mean loss over the step's minibatch updates",
    "gated": "share of tokens with A ≠ 0 whose gate is exactly zero (0 if there are none)",
    "gated_pos": "share of tokens with A > 0 whose gate is exactly zero",
    "gated_neg": "share of tokens with A < 0 whose gate is exactly zero",
    "gate_mean": "mean gate f'(ρ; A) over tokens with A ≠ 0 (over all tokens if there are none)",
    "grad_norm": "mean gradient norm of the step's updates (before any clipping)",
    "kl": "KL(π_rollout ‖ π after the step) on the rollout tokens (k3 estimator)",
    "log_ratio_std": "std of the token log ρ seen by the updates",
    "log_ratio_absmax": "largest |log ρ| seen by the updates",
    "staleness": "mean number of optimizer updates between the rollout policy and the one updated",
    "seconds": "wall time of the step",
}


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabConfig:
    """Sizes and optimizer settings of a lab run; `LabConfig.for_device(dev)` sizes it by device."""

    vocab: int = 16  # response tokens 0..vocab-1 (token 0 the most likely at the start)
    hidden: int = 32  # GRU width
    prompts: int = 8  # prompts per rollout batch
    group: int = 8  # G responses per prompt
    length: int = 8  # T, the maximum response length
    motif: int = 2  # motif length in the prompt
    eos: int | None = 3  # end-of-sequence token (None: every response has T tokens)
    rare_tokens: int = 2  # the rare pool: the `rare_tokens` rarest tokens (0: the whole rare half)
    steps: int = 30  # training steps (rollout batches)
    minibatches: int = 2  # optimizer updates per epoch over the rollout batch
    epochs: int = 2  # passes over the rollout batch
    lr: float = 1e-2  # Adam learning rate
    max_grad_norm: float | None = None  # clip the gradient norm (None: no clipping)
    normalize_std: bool = True  # GRPO advantages (False: Dr. GRPO, no division by the std)
    recompute_old: bool = False  # ratio against the policy at the step start, not the rollout
    arch: str = "mlp"  # "mlp" (LabPolicy, fast) or "gru" (rlgates.TinyPolicy)
    threads: int | None = 1  # torch CPU threads during a run (restored after); None: leave as is
    device: str = "cpu"

    @classmethod
    def for_device(cls, dev=None, **overrides) -> LabConfig:
        """Tiny on a CPU (a notebook trains 18 runs in seconds), larger on an accelerator."""
        dev = torch.device(dev) if dev is not None else torch.device("cpu")
        if on_accelerator(dev):
            # the same task, with twice the prompts per batch and a wider policy
            base = cls(hidden=64, prompts=16, threads=None, device=str(dev))
        else:
            base = cls(device=str(dev))
        return replace(base, **overrides)

    @property
    def batch(self) -> int:
        """Responses per rollout batch: prompts × G."""
        return self.prompts * self.group

    def task(self) -> PatternTask:
        return PatternTask(self.vocab, self.length, self.motif, self.eos, self.rare_tokens)

    def policy(self) -> nn.Module:
        """A fresh policy of this configuration (uses the global torch RNG for its weights)."""
        if self.arch == "gru":
            return TinyPolicy(self.vocab, self.hidden)
        if self.arch == "mlp":
            return LabPolicy(self.vocab, self.hidden, self.length, self.motif)
        raise ValueError(f"arch must be 'mlp' or 'gru', got {self.arch!r}")

    def replace(self, **changes) -> LabConfig:
        return replace(self, **changes)


# --------------------------------------------------------------------------------------------
# the task
# --------------------------------------------------------------------------------------------
class PatternTask:
    """Repeat the prompt's motif. A verifiable, sequence-level reward with rare useful tokens.

    A prompt is a motif (m_0, …, m_{k-1}); the right response is m_0 m_1 … m_{k-1} m_0 … (T tokens).
    Motif token j is drawn from the common half of the vocabulary when j is even and from the rare
    half when j is odd (never the end token). The reward of a response is the share of the T
    positions that hold the right token before the response ends; it is 1 only for the whole
    pattern, and every rare token the policy learns to emit earns credit.
    """

    def __init__(self, vocab=16, length=8, motif=2, eos=3, rare_tokens=2):
        if vocab < 6:
            raise ValueError(f"vocab must be ≥ 6, got {vocab}")
        if eos is not None and not 0 <= eos < vocab:
            raise ValueError(f"eos must be a token in [0, {vocab}), got {eos}")
        self.vocab, self.length, self.motif, self.eos = vocab, length, motif, eos
        half = vocab // 2
        common = [t for t in range(half) if t != eos]
        rare = [t for t in range(half, vocab) if t != eos]
        if rare_tokens:
            rare = rare[-rare_tokens:]
        self.common = torch.tensor(common)
        self.rare = torch.tensor(rare)

    def prompts(self, n, generator=None, device="cpu"):
        """n random motifs: LongTensor [n, motif]."""
        cols = []
        for j in range(self.motif):
            pool = (self.common if j % 2 == 0 else self.rare).to(device)
            idx = torch.randint(len(pool), (n,), generator=generator, device=device)
            cols.append(pool[idx])
        return torch.stack(cols, 1)

    def target(self, prompts):
        """The right response for each prompt: [n, T]."""
        reps = -(-self.length // self.motif)
        return prompts.repeat(1, reps)[:, : self.length]

    def mask(self, tokens):
        """True up to and including the first end token: the tokens the response really has."""
        if self.eos is None:
            return torch.ones_like(tokens, dtype=torch.bool)
        ended_before = (tokens == self.eos).long().cumsum(1) - (tokens == self.eos).long()
        return ended_before == 0

    def right(self, prompts, tokens):
        """[n, T] bool: position t holds the right token and the response has not ended."""
        return (tokens == self.target(prompts)) & self.mask(tokens)

    def reward(self, prompts, tokens):
        """Share of the T positions answered right before the response ends: [n] in [0, 1]."""
        return self.right(prompts, tokens).float().mean(1)

    def rare_positions(self):
        """[T] bool: the positions whose right token comes from the rare half (odd motif slots)."""
        return torch.arange(self.length) % self.motif % 2 == 1


# --------------------------------------------------------------------------------------------
# the policy
# --------------------------------------------------------------------------------------------
class LabPolicy(nn.Module):
    """A tiny autoregressive policy with no recurrence, so that a CPU trains it in milliseconds.

    The features of position t are the sum of: a projection of the prompt's token embeddings, a
    position embedding, the embedding of the previous token (a start marker at t = 0) and the mean
    of a second embedding over all earlier response tokens; a two-layer tanh MLP and a linear head
    turn them into next-token logits. As in rlgates.TinyPolicy, the head's bias starts as a Zipf law
    (p_k ∝ 1/(k+1)): a few common tokens and a long tail of rare ones. Same interface as
    TinyPolicy: logits(prompt, response), log_probs(response, prompt), sample(...).
    """

    def __init__(self, vocab=16, hidden=32, length=8, motif=2, zipf=1.0):
        super().__init__()
        self.vocab, self.length = vocab, length
        self.tok = nn.Embedding(vocab + 1, hidden)  # index `vocab`: the start marker
        self.ctx = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(length, hidden)
        self.prompt_proj = nn.Linear(motif * hidden, hidden)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = zipf_head(hidden, vocab, zipf)

    @property
    def bos(self):
        return self.vocab

    def _prompt(self, prompt):
        return self.prompt_proj(self.tok(prompt).flatten(1))

    def logits(self, prompt, response):
        """Next-token logits for each response position: [B, T, vocab]."""
        B, T = response.shape
        start = torch.full((B, 1), self.bos, dtype=torch.long, device=response.device)
        prev = torch.cat([start, response[:, :-1]], 1)
        ctx = self.ctx(response[:, :-1]).cumsum(1)
        ctx = ctx / torch.arange(1, T, device=ctx.device, dtype=ctx.dtype)[:, None]
        ctx = torch.cat([ctx.new_zeros(B, 1, ctx.shape[-1]), ctx], 1)
        x = self._prompt(prompt)[:, None] + self.pos.weight[:T] + self.tok(prev) + ctx
        return self.head(self.body(x))

    def log_probs(self, response, prompt):
        """log π(y_t | prompt, y_<t) for every response token: [B, T]."""
        logp = torch.log_softmax(self.logits(prompt, response), dim=-1)
        return logp.gather(-1, response[..., None]).squeeze(-1)

    @torch.no_grad()
    def sample(self, batch, length, prompt, generator=None):
        """Sample `batch` responses of `length` tokens; returns (tokens [B, T], logp [B, T])."""
        p = self._prompt(prompt)
        prev = torch.full((batch,), self.bos, dtype=torch.long, device=p.device)
        ctx_sum = torch.zeros_like(p)
        tokens, logps = [], []
        for t in range(length):
            ctx = ctx_sum / t if t > 0 else ctx_sum
            x = p + self.pos.weight[t] + self.tok(prev) + ctx
            logp = torch.log_softmax(self.head(self.body(x)), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=generator)
            tokens.append(tok)
            logps.append(logp.gather(-1, tok))
            prev = tok[:, 0]
            ctx_sum = ctx_sum + self.ctx(prev)
        return torch.cat(tokens, 1), torch.cat(logps, 1)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------
@dataclass
class LabResult:
    """One run: per-step `metrics` (lists of floats, keys METRIC_KEYS) and how it was made."""

    method: str
    seed: int
    lag: int
    agg: str
    config: LabConfig
    metrics: dict
    log_ratios: list | None = None  # per step, the token log ρ the updates saw (keep_log_ratios)
    gates: list | None = None  # per step, (gate, adv) of those tokens (keep_log_ratios)

    def __getitem__(self, key):
        return self.metrics[key]

    def final(self, key, last=5):
        """Mean of `key` over the last `last` steps (a less noisy end value)."""
        vals = self.metrics[key][-last:]
        return float(sum(vals) / len(vals))

    def as_dict(self):
        return {"method": self.method, "seed": self.seed, "lag": self.lag, "agg": self.agg,
                "config": asdict(self.config), "metrics": self.metrics}


def method_name(method) -> str:
    """A label for a method given by name or as an object."""
    if isinstance(method, str):
        return method.lower()
    return getattr(method, "name", None) or type(method).__name__


def resolve(method):
    """A registry name → rlgates.get(name); an object with .loss(...) is used as it is."""
    if isinstance(method, str):
        return get(method)
    if not callable(getattr(method, "loss", None)):
        raise ValueError(f"method must be a registry name or have .loss(...), got {method!r}")
    return method


def default_agg(method) -> str:
    """The method's own default aggregation (its class's `agg`), else token-mean."""
    if isinstance(method, str):
        method = get(method)
    return getattr(method, "agg", None) or "token-mean"


def method_color(label: str, fallback: str) -> str:
    """A registered method's line colour (its class's `color`), else `fallback`."""
    cls = REGISTRY.get(str(label).lower())
    return cls.color if cls is not None else fallback


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
def _logp_entropy(policy, prompts, tokens):
    logits = policy.logits(prompts, tokens)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _gate_stats(method, logp, logp_old, adv, mask):
    """The gate each token saw: token level at ρ_t, sequence level at ρ_s (per token)."""
    gate_fn = getattr(method, "gate", None)
    adv_t = adv[:, None].expand_as(logp)
    if gate_fn is None:
        return None, adv_t
    log_ratio = nx.gate_log_ratio(logp, logp_old, mask, getattr(method, "level", "token"))
    gate = gate_fn(nx.ratio_from_log(log_ratio), adv_t)
    return torch.as_tensor(gate).expand_as(logp).float(), adv_t


class _Adam:
    """Adam (Kingma & Ba), as torch.optim.Adam with its defaults; written out because importing
    torch.optim pulls in torch._dynamo, which costs seconds on a small CPU."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def grad_norm(self, max_norm=None):
        """The total gradient norm; with max_norm, scale the gradients down to it (clipping)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        if max_norm:
            scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(scale)
        return norm

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)


def _share(flags, where):
    n = where.sum()
    return float((flags & where).sum() / n) if n > 0 else 0.0


def train(method, config: LabConfig | None = None, seed: int = 0, steps: int | None = None,
          lag: int = 0, agg: str | None = None, progress=True, keep_log_ratios: bool = False,
          init_state: dict | None = None, hook=None) -> LabResult:
    """Train a fresh TinyPolicy on the pattern task with `method`; return per-step metrics.

    method: a registry name ("dapo") or any object with `.loss(logp, logp_old, adv, mask, agg)`
        (and, for the gate metrics, `.gate(ratio, adv)` and `.level`; without `.gate` they are NaN).
    config: a LabConfig (default: LabConfig.for_device("cpu")). steps overrides config.steps.
    lag: the rollout policy is the policy k optimizer updates old (the oldest one at the start).
    agg: the loss aggregation (default: the method's conventional one, `default_agg`).
    progress: print a compact progress line every few steps (True: about 5 lines a run; an int:
        every that many steps; False: silent).
    keep_log_ratios: keep, per step, the token log ρ and the (gate, A) the updates saw.
    init_state: a policy state_dict to start from (default: the seed's fresh initialisation).
    hook: optional callable hook(event, info), called with ("rollout", {step, version, prompts,
        tokens, logp_rollout}) after each rollout and ("update", {update, policy}) after each
        optimizer update (`update` counts from 1; the policy is then version `update`).
    Same seed, config and arguments → identical metrics (on the same device and torch).
    """
    cfg = config or LabConfig.for_device("cpu")
    steps = cfg.steps if steps is None else int(steps)
    if lag < 0:
        raise ValueError(f"lag must be ≥ 0, got {lag}")
    name = method_name(method)
    m = resolve(method)
    agg = agg or default_agg(method)
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    dev = torch.device(cfg.device)

    threads = torch.get_num_threads()
    if cfg.threads and dev.type == "cpu":
        torch.set_num_threads(cfg.threads)
    try:
        return _train(m, name, cfg, dev, seed, steps, lag, agg, progress, keep_log_ratios,
                      init_state, hook)
    finally:
        torch.set_num_threads(threads)


def _train(m, name, cfg, dev, seed, steps, lag, agg, progress, keep_log_ratios, init_state,
           hook):
    task = cfg.task()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = cfg.policy()
        rollout = cfg.policy().requires_grad_(False)
    if init_state is not None:
        policy.load_state_dict(init_state)
    policy.to(dev)
    rollout.to(dev)
    opt = _Adam(policy.parameters(), lr=cfg.lr)
    g = torch.Generator(device=dev).manual_seed(seed)

    def state():
        return {k: v.detach().clone() for k, v in policy.state_dict().items()}

    history = deque([state()] if lag else [], maxlen=lag + 1)  # [0]: the version `lag` updates old
    rare_pos = task.rare_positions().to(dev)
    updates = 0
    metrics = {k: [] for k in METRIC_KEYS}
    kept_lr, kept_gate = ([], []) if keep_log_ratios else (None, None)
    every = (max(1, steps // 5) if progress is True else int(progress)) if progress else 0
    t_run = time.perf_counter()

    for step in range(steps):
        t0 = time.perf_counter()
        rollout_version = updates - max(len(history) - 1, 0)
        if lag == 0:
            sampler = policy
        else:
            rollout.load_state_dict(history[0])
            sampler = rollout
        with torch.no_grad():
            prompts = task.prompts(cfg.prompts, g, dev).repeat_interleave(cfg.group, 0)
            tokens, logp_roll = sampler.sample(cfg.batch, cfg.length, prompt=prompts, generator=g)
            mask = task.mask(tokens)
            right = task.right(prompts, tokens)
            rewards = right.float().mean(1)
            adv = group_advantages(rewards.view(cfg.prompts, cfg.group),
                                   normalize_std=cfg.normalize_std).flatten()
            logp_old = policy.log_probs(tokens, prompts) if cfg.recompute_old else logp_roll
        if hook is not None:
            hook("rollout", {"step": step, "version": rollout_version, "prompts": prompts,
                             "tokens": tokens, "logp_rollout": logp_roll})

        acc = {k: [] for k in ("loss", "entropy", "grad_norm", "staleness")}
        lr_seen, gate_seen, adv_seen, mask_seen = [], [], [], []
        for _ in range(cfg.epochs):
            perm = torch.randperm(cfg.batch, generator=g, device=dev)
            for idx in perm.chunk(cfg.minibatches):
                logp, ent = _logp_entropy(policy, prompts[idx], tokens[idx])
                mk = mask[idx]
                loss = m.loss(logp, logp_old[idx], adv[idx], mk, agg)
                opt.zero_grad()
                loss.backward()
                gn = opt.grad_norm(cfg.max_grad_norm)
                opt.step()
                with torch.no_grad():
                    lp = logp.detach()
                    gate, adv_t = _gate_stats(m, lp, logp_old[idx], adv[idx], mk)
                    lr_seen.append(torch.where(mk, lp - logp_old[idx], 0.0))
                    gate_seen.append(gate)
                    adv_seen.append(adv_t)
                    mask_seen.append(mk)
                    acc["loss"].append(float(loss))
                    acc["entropy"].append(float(ent[mk].mean()) if mk.any() else 0.0)
                    acc["grad_norm"].append(float(gn))
                    acc["staleness"].append(updates - rollout_version)
                updates += 1
                if lag:
                    history.append(state())
                if hook is not None:
                    hook("update", {"update": updates, "policy": policy})

        with torch.no_grad():
            log_ratio = torch.cat(lr_seen)
            mk = torch.cat(mask_seen)
            adv_t = torch.cat(adv_seen)
            lr_tok = log_ratio[mk]
            new = policy.log_probs(tokens, prompts) - logp_roll
            kl = float((new.exp() - 1 - new)[mask].mean())
            if gate_seen[0] is None:
                gated = gated_pos = gated_neg = gate_mean = float("nan")
                gate = None
            else:
                gate = torch.cat(gate_seen)
                zero = gate == 0
                live = mk & (adv_t != 0)
                gated = _share(zero, live)
                gated_pos = _share(zero, mk & (adv_t > 0))
                gated_neg = _share(zero, mk & (adv_t < 0))
                gate_mean = float(gate[live].mean() if live.any() else gate[mk].mean())
            if keep_log_ratios:
                kept_lr.append(lr_tok.float().cpu())
                if gate is not None:
                    kept_gate.append((gate[mk].cpu(), adv_t[mk].float().cpu()))

        row = {
            "step": step,
            "reward": float(rewards.mean()),
            "solved": float((rewards == 1).float().mean()),
            "rare": float(right[:, rare_pos].float().mean()),
            "live": float((adv != 0).float().mean()),
            "length": float(mask.sum(1).float().mean()),
            "entropy": sum(acc["entropy"]) / len(acc["entropy"]),
            "loss": sum(acc["loss"]) / len(acc["loss"]),
            "gated": gated, "gated_pos": gated_pos, "gated_neg": gated_neg, "gate_mean": gate_mean,
            "grad_norm": sum(acc["grad_norm"]) / len(acc["grad_norm"]),
            "kl": kl,
            "log_ratio_std": float(lr_tok.std()) if lr_tok.numel() > 1 else 0.0,
            "log_ratio_absmax": float(lr_tok.abs().max()) if lr_tok.numel() else 0.0,
            "staleness": sum(acc["staleness"]) / len(acc["staleness"]),
            "seconds": time.perf_counter() - t0,
        }
        for k, v in row.items():
            metrics[k].append(float(v))
        if every and ((step + 1) % every == 0 or step + 1 == steps):
            print(f"[{name} s{seed} lag{lag}] {step + 1:>4}/{steps} reward {row['reward']:.3f} "
                  f"H {row['entropy']:.2f} gated+ {row['gated_pos']:.2f} "
                  f"gated- {row['gated_neg']:.2f} kl {row['kl']:.1e} "
                  f"({time.perf_counter() - t_run:.1f} s)", flush=True)

    return LabResult(name, seed, lag, agg, cfg, metrics, kept_lr, kept_gate)


def run_many(methods, seeds=(0, 1, 2), config: LabConfig | None = None, steps=None, lag=0,
             agg=None, progress=False, keep_log_ratios=False) -> dict:
    """Train every method with every seed: {label: [LabResult per seed]}.

    methods: a list of names or method objects, or a dict {label: method}. Each seed gives every
    method the same initial policy and the same first rollout batch.
    progress: False (silent), True (one line per run) or "steps" (train()'s per-step lines).
    """
    items = methods.items() if isinstance(methods, dict) else ((method_name(m), m) for m in methods)
    out = {}
    for label, method in items:
        out[label] = []
        for seed in seeds:
            t0 = time.perf_counter()
            res = train(method, config, seed=seed, steps=steps, lag=lag, agg=agg,
                        progress=progress == "steps", keep_log_ratios=keep_log_ratios)
            res.method = label
            out[label].append(res)
            if progress is True:
                print(f"[{label} s{seed} lag{lag}] reward {res.final('reward'):.3f} "
                      f"H {res.final('entropy'):.2f} gated {res.final('gated'):.3f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return out


# --------------------------------------------------------------------------------------------
# summaries and plots
# --------------------------------------------------------------------------------------------
def curves(results, key):
    """Stack one metric over seeds: a [seeds, steps] tensor (float64)."""
    return torch.tensor([r.metrics[key] for r in results], dtype=torch.float64)


def summary(runs: dict, keys=("reward", "entropy", "gated"), last=5) -> dict:
    """{label: {key: {"mean", "std", "min", "max"}}} over seeds of each run's final value."""
    out = {}
    for label, results in runs.items():
        out[label] = {}
        for key in keys:
            v = torch.tensor([r.final(key, last) for r in results], dtype=torch.float64)
            out[label][key] = {"mean": float(v.mean()),
                               "std": float(v.std()) if len(v) > 1 else 0.0,
                               "min": float(v.min()), "max": float(v.max())}
    return out


def summary_table(runs: dict, keys=("reward", "entropy", "gated"), last=5, fmt=".3f") -> str:
    """A Markdown table: per method, mean ± std [min, max] over seeds of each final value."""
    s = summary(runs, keys, last)
    n = len(next(iter(runs.values())))
    head = "| method | " + " | ".join(f"{k} (last {last} steps)" for k in keys) + " |"
    rows = [head, "|" + " --- |" * (len(keys) + 1)]
    for label, stats in s.items():
        cells = [f"{st['mean']:{fmt}} ± {st['std']:{fmt}} [{st['min']:{fmt}}, {st['max']:{fmt}}]"
                 for st in (stats[k] for k in keys)]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + f"\n\nmean ± std [min, max] over {n} seeds."


def plot_runs(runs: dict, key: str, ax=None, band="minmax", colors=None, smooth=1, label=True):
    """Mean over seeds against steps, with a band: "minmax" (min to max) or "std" (± one std)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    for i, (name, results) in enumerate(runs.items()):
        c = curves(results, key)
        if smooth > 1:
            kernel = torch.ones(1, 1, smooth, dtype=c.dtype) / smooth
            padded = torch.cat([c[:, :1].expand(-1, smooth - 1), c], 1)
            c = torch.nn.functional.conv1d(padded[:, None], kernel)[:, 0]
        steps = results[0].metrics["step"][: c.shape[1]]
        mean = c.nanmean(0)
        if band == "std":
            lo, hi = mean - c.std(0), mean + c.std(0)
        else:
            lo, hi = c.min(0).values, c.max(0).values
        color = (colors or {}).get(name) or method_color(name, f"C{i}")
        ax.plot(steps, mean.numpy(), color=color, lw=1.8, label=name if label else None)
        ax.fill_between(steps, lo.numpy(), hi.numpy(), color=color, alpha=0.18, lw=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(key)
    return ax


__all__ = [
    "METRIC_DOC", "METRIC_KEYS", "LabConfig", "LabPolicy",
    "LabResult", "PatternTask", "curves", "default_agg", "method_color", "method_name",
    "plot_runs", "resolve",
    "run_many", "summary", "summary_table", "train",
]
