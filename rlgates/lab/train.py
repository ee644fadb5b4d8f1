"""The lab's training loop: every seed of a configuration trained as one batched computation.

One training step, as LLM RL trainers run it:
- ROLLOUT: sample G responses for each of `prompts` prompts from the behaviour policy (the
  policy as it was `lag` optimiser steps ago), score them, compute group advantages;
- UPDATE: shuffle the rollout batch and cut it into `minibatches` minibatches; one optimiser
  step on each, so every response is stepped on once (`epochs` passes, 1 by default);
- METRICS: observe the step (rlgates.diagnostics on every update), never change it.

The ratio's anchor (`LabConfig.anchor`):
- "behaviour": ρ = π_θ / π_behav, the rollout policy's own log-probs;
- "proximal" (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641): ρ = π_θ / π_prox, with
  π_prox the policy at the start of the step, recomputed on the rollout tokens; the gap from the
  behaviour policy is corrected outside the gate by the constant weight
  min(π_prox / π_behav, C), C = `is_cap` (truncated importance sampling), passed to the loss as
  `is_weight=`. With lag 0 the two anchors coincide (π_prox = π_behav, weight 1).
  `LabConfig.correction` replaces that rule by any other (rlgates.offpolicy.Correction: TIS,
  MIS, IcePop, at token or sequence level).

Runs: `seeds` is a list; run r has its own initial weights, its own random stream
(`torch.Generator(seed)`) and its own Adam state and gradient-norm clip, so run r of a batched
call equals a call with `seeds=[seed_r]` alone (tested), only faster.
"""

from __future__ import annotations

import inspect
import time
from collections import deque
from dataclasses import asdict, dataclass, replace

import torch

from .. import _numerics as nx
from ..advantages import group_advantages
from ..devices import on_accelerator
from ..diagnostics import step_stats, token_gates
from ..methods import Method, get
from ..policy import LabPolicy
from .task import PatternTask

#: Per step and run: the rollout's own numbers, then the update's (means over the step's
#: updates; log_ratio_absmax is their maximum).
METRIC_DOC = {
    "step": "training step (one rollout batch)",
    "reward": "mean sequence reward of the rollout batch (share of positions right)",
    "solved": "share of rollout responses with reward 1",
    "rare": "share of the rare-token positions (odd motif slots) answered right",
    "live": "share of responses with A ≠ 0 (groups whose rewards are not all equal)",
    "length": "mean response length, in tokens (up to and including the end token)",
    "entropy": "mean per-token entropy of π on the minibatch tokens (nats)",
    "clipfrac_pos": "share of A > 0 tokens whose gate is exactly zero",
    "clipfrac_neg": "share of A < 0 tokens whose gate is exactly zero",
    "gated": "share of A ≠ 0 tokens whose gate is exactly zero",
    "pg_clipfrac": "share of tokens clipped (A > 0 above, A < 0 below): verl's name",
    "pg_clipfrac_lower": "share of tokens with A < 0 shut above ρ = 1 (dual clip): verl's name",
    "signal_lost": "share of the aggregated abs(ρ·A) on tokens whose gate is zero",
    "gate_mean": "mean gate f'(ρ; A) over tokens with A ≠ 0",
    "ppo_kl": "mean log π_old − log π of the updated tokens (verl's name)",
    "log_ratio_absmax": "largest abs(log ρ) any update of the step saw",
    "is_weight_mean": "mean behaviour weight min(π_prox/π_behav, C) (1 without one)",
    "loss": "the method's loss on all the tokens the step's updates used, as they saw them",
    "grad_norm": "mean gradient norm of the step's updates, before clipping",
    "staleness": "mean number of optimiser steps between the behaviour policy and the updated one",
}
METRIC_KEYS = tuple(METRIC_DOC)
_DIAG = ("entropy", "clipfrac_pos", "clipfrac_neg", "pg_clipfrac", "pg_clipfrac_lower",
         "signal_lost", "gate_mean", "ppo_kl")


@dataclass(frozen=True)
class LabConfig:
    """Sizes and optimiser settings of a lab run; `LabConfig.for_device(dev)` sizes it by device.

    The defaults were fixed before any method was compared: four optimiser steps per rollout
    batch (each response stepped on once), Adam at lr 3e-3 with gradient-norm clipping at 1.0,
    a step size at which one update moves the largest token |log ρ| by about 0.1 to 1, the
    range LLM trainers report.
    """

    vocab: int = 16  # response tokens 0..vocab-1 (token 0 the most likely at the start)
    hidden: int = 32  # MLP width
    prompts: int = 8  # prompts per rollout batch
    group: int = 8  # G responses per prompt
    length: int = 8  # T, the maximum response length
    motif: int = 2  # motif length in the prompt
    eos: int | None = 3  # end-of-sequence token (None: every response has T tokens)
    rare_tokens: int = 2  # the rare pool: the `rare_tokens` rarest tokens (0: the whole rare half)
    steps: int = 80  # training steps (rollout batches)
    minibatches: int = 4  # optimiser steps per pass over the rollout batch
    epochs: int = 1  # passes over the rollout batch
    lr: float = 3e-3  # Adam learning rate
    max_grad_norm: float | None = 1.0  # clip each run's gradient norm (None: no clipping)
    normalize_std: bool = True  # GRPO advantages (False: Dr. GRPO, no division by the std)
    anchor: str = "behaviour"  # ρ against the "behaviour" policy or a "proximal" one
    is_cap: float | None = 2.0  # C in min(π_prox/π_behav, C) ("proximal"; None: no cap)
    correction: object | None = None  # "proximal": the weight rule in place of min(·, is_cap)
    recompute_old: bool = False  # ratio against π_prox with no lab weight (the loss corrects)
    threads: int | None = 1  # torch CPU threads during a run (restored after); None: as is
    dtype: str = "float32"
    device: str = "cpu"

    @classmethod
    def for_device(cls, dev=None, **overrides) -> LabConfig:
        """The same task on any device; on an accelerator, twice the prompts per batch."""
        dev = torch.device(dev) if dev is not None else torch.device("cpu")
        if on_accelerator(dev):
            base = cls(prompts=16, threads=None, device=str(dev))
        else:
            base = cls(device=str(dev))
        return replace(base, **overrides)

    @property
    def batch(self) -> int:
        """Responses per rollout batch: prompts × G."""
        return self.prompts * self.group

    def task(self) -> PatternTask:
        return PatternTask(self.vocab, self.length, self.motif, self.eos, self.rare_tokens)

    def policy(self, seeds=(0,)) -> LabPolicy:
        """Fresh policies, one run per seed (each seed's weights as if built alone)."""
        pol = LabPolicy(seeds, self.vocab, self.hidden, self.length, self.motif)
        return pol.to(getattr(torch, self.dtype))

    def replace(self, **changes) -> LabConfig:
        return replace(self, **changes)


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
    """The method's own aggregation (`.agg`), else token-mean."""
    return getattr(resolve(method), "agg", None) or "token-mean"


def _run_scale(mask, agg):
    """[R]: N / N_r, the factor between run r's aggregation weight and the merged batch's."""
    count = mask.sum((1, 2)) if agg == "token-mean" else (mask.sum(-1) > 0).sum(-1)
    count = count.to(torch.float64)
    return count.sum() / count.clamp(min=1)


@torch.no_grad()
def per_run_loss(m, logp, logp_old, adv, mask, agg, is_weight=None):
    """[R]: each run's m.loss on its own rows of [R, b, T] inputs (a metric, no gradient).

    For an rlgates Method, in one pass: its per-token objective on the merged rows, weighted by
    each run's own aggregation weight (equal to m.loss run by run, tested); for any other
    object, m.loss run by run."""
    mask = nx.check_mask(mask, logp.shape, logp.device)
    R = logp.shape[0]
    if not isinstance(m, Method):
        kw = [{} if is_weight is None else {"is_weight": is_weight[r]} for r in range(R)]
        return torch.stack([m.loss(logp[r], logp_old[r], adv[r], mask[r], agg, **kw[r])
                            for r in range(R)])
    flat = (lambda x: x.flatten(0, 1))
    lp, lo, a, mk = nx.check_loss_inputs(flat(logp), flat(logp_old), flat(adv), flat(mask), agg)
    obj = m.token_objective(lp, lo, a, mk)
    if is_weight is not None:
        obj = obj * flat(is_weight).to(obj.dtype)
    w = nx.aggregation_weight(mk, agg).to(obj.dtype)
    w = w.view(R, -1) * _run_scale(mask, agg).to(obj.dtype)[:, None]
    return -torch.where(mk.view(R, -1), obj.view(R, -1) * w, 0.0).sum(1)


def _takes_is_weight(m) -> bool:
    try:
        return "is_weight" in inspect.signature(m.loss).parameters
    except (TypeError, ValueError):
        return False


def summed_loss(m, logp, logp_old, adv, mask, agg, is_weight=None):
    """Σ_r m.loss(run r) for [R, b, T] inputs: each run's own loss, added up.

    One call on the R·b rows. Within run r, its own aggregation weight is the merged batch's
    times a constant: N / N_r, with N the tokens (token-mean) or the non-empty responses (the
    seq-mean modes) of all runs and N_r those of run r. Passing that constant (times
    `is_weight`) as the loss's per-token weight makes the merged loss equal the sum of the
    per-run losses, for every aggregation mode (tested). A method whose loss takes no
    `is_weight` (a hand-written object) is called run by run.
    """
    mask = nx.check_mask(mask, logp.shape, logp.device)
    R = logp.shape[0]
    if not _takes_is_weight(m):
        if is_weight is not None:
            raise TypeError(f"{m!r}.loss takes no is_weight: use anchor='behaviour'")
        return sum(m.loss(logp[r], logp_old[r], adv[r], mask[r], agg) for r in range(R))
    w = _run_scale(mask, agg).to(logp.dtype).view(R, 1, 1).expand_as(logp)
    if is_weight is not None:
        w = w * is_weight
    flat = (lambda x: x.flatten(0, 1))  # [R, b, ...] -> [R·b, ...]
    return m.loss(flat(logp), flat(logp_old), flat(adv), flat(mask), agg, is_weight=flat(w))


def _adam(params, lr):
    """torch.optim.Adam, its fused kernel where this torch and device have one (measured: a
    fifth faster a lab step on the CPU; the same update up to rounding)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def _clip_grad_norm_per_run(params, max_norm):
    """Each run's gradient norm over all parameters ([R]); scale a run's gradients to
    `max_norm` when its norm is larger (torch.nn.utils.clip_grad_norm_, run by run)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.cat([g.flatten(1) for g in grads], 1).norm(dim=1)
    if max_norm:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *[1] * (g.dim() - 1)))
    return norm


def train(method, config: LabConfig | None = None, seeds=(0,), steps: int | None = None,
          lag: int = 0, agg: str | None = None, progress=True, keep_log_ratios: bool = False,
          hook=None, seed: int | None = None) -> list[LabResult]:
    """Train one fresh policy per seed with `method`, all seeds at once: [LabResult per seed].

    method: a registry name ("dapo") or any object with `.loss(logp, logp_old, adv, mask, agg)`
        (and, for the gate metrics, `.gate(ratio, adv)` and `.level`; without `.gate` they are
        NaN).
    config: a LabConfig (default: LabConfig.for_device("cpu")); steps overrides config.steps.
    lag: the behaviour policy is the policy `lag` optimiser steps old (the oldest one kept at
        the start).
    agg: the loss aggregation (default: the method's own `.agg`).
    progress: print a progress line every few steps (True: about 5 a call; an int: every that
        many steps; False: silent).
    keep_log_ratios: keep, per run and step, the token log ρ and the (gate, A) the updates saw.
    hook: optional hook(event, info), called with ("rollout", {step, version, prompts, tokens,
        logp_behaviour, logp_rollout (the same)}) after each rollout and ("update", {update,
        policy}) after each optimiser step (`update` counts from 1; the policy is then version
        `update`). With a single seed the tensors have no runs dimension ([B, ...]).
    seed: one seed, for `train(method, config, seed=s)`: returns that run's LabResult alone.
    Same seeds, config and arguments → identical metrics (on the same device and torch).
    `LabConfig(recompute_old=True)` takes the ratio against the proximal policy with no
    behaviour weight, for a loss that applies its own correction (rlgates.offpolicy).
    """
    if seed is not None:
        return train(method, config, [seed], steps, lag, agg, progress, keep_log_ratios,
                     hook)[0]
    cfg = config or LabConfig.for_device("cpu")
    steps = cfg.steps if steps is None else int(steps)
    seeds = [int(s) for s in seeds]
    if lag < 0:
        raise ValueError(f"lag must be ≥ 0, got {lag}")
    if cfg.anchor not in ("behaviour", "proximal"):
        raise ValueError(f"anchor must be 'behaviour' or 'proximal', got {cfg.anchor!r}")
    if cfg.correction is not None and (cfg.anchor != "proximal"
                                       or not callable(getattr(cfg.correction, "weight", None))):
        raise ValueError("correction needs anchor='proximal' and a .weight(logp_prox, "
                         f"logp_behav, mask) method, got {cfg.correction!r}")
    name, m = method_name(method), resolve(method)
    agg = agg or default_agg(m)
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    dev = torch.device(cfg.device)
    threads = torch.get_num_threads()
    if cfg.threads and dev.type == "cpu":
        torch.set_num_threads(cfg.threads)
    try:
        return _train(m, name, cfg, seeds, steps, lag, agg, progress, keep_log_ratios, hook)
    finally:
        torch.set_num_threads(threads)


def _train(m, name, cfg, seeds, steps, lag, agg, progress, keep_log_ratios, hook):
    dev, R = torch.device(cfg.device), len(seeds)
    task, rare_pos = cfg.task(), cfg.task().rare_positions().to(dev)
    policy = cfg.policy(seeds).to(dev)
    behaviour = cfg.policy(seeds).to(dev).requires_grad_(False)  # the lagged copy
    opt = _adam(policy.parameters(), cfg.lr)
    gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]
    runs = torch.arange(R, device=dev)[:, None]  # x[runs, idx]: each run's own minibatch
    history = deque([policy.state()], maxlen=lag + 1)  # [0]: the policy `lag` steps old
    has_gate = callable(getattr(m, "gate", None))
    metrics = {k: [] for k in METRIC_KEYS}
    kept = [([], []) for _ in seeds] if keep_log_ratios else None
    every = (max(1, steps // 5) if progress is True else int(progress)) if progress else 0
    updates, t_run = 0, time.perf_counter()

    for step in range(steps):
        # ROLLOUT: sample from the behaviour policy, score, group advantages
        sampler = policy
        if lag:  # the behaviour policy: the policy as it was `lag` optimiser steps ago
            behaviour.load_state_dict(history[0])
            sampler = behaviour
        version = updates - (len(history) - 1)
        with torch.no_grad():
            prompts = torch.stack([task.prompts(cfg.prompts, g, dev) for g in gens])
            prompts = prompts.repeat_interleave(cfg.group, 1)  # [R, B, motif]
            tokens, logp_behav = sampler.sample(prompts, cfg.length, gens)  # [R, B, T]
            mask, right = task.mask(tokens), task.right(prompts, tokens)
            rewards = right.float().mean(-1)  # [R, B]
            adv = group_advantages(rewards.view(-1, cfg.group), cfg.normalize_std)
            adv = adv.view_as(rewards).to(logp_behav.dtype)
            logp_old = logp_behav  # the ratio's anchor: behaviour, or π_prox recomputed
            if cfg.anchor == "proximal" or cfg.recompute_old:
                logp_old = policy.log_probs(tokens, prompts)
            is_w = torch.ones_like(logp_behav)  # decoupled PPO's min(π_prox/π_behav, C)
            if cfg.anchor == "proximal":
                is_w = (logp_old - logp_behav).exp()
                is_w = is_w.clamp(max=cfg.is_cap) if cfg.is_cap else is_w
                if cfg.correction is not None:  # its own rule, on [R·B, T] rows
                    flat = (lambda x: x.flatten(0, 1))
                    is_w = cfg.correction.weight(flat(logp_old), flat(logp_behav), flat(mask))
                    is_w = is_w.view_as(logp_old).to(logp_old.dtype)
        if hook is not None:
            one = (lambda x: x[0]) if R == 1 else (lambda x: x)
            hook("rollout", {"step": step, "version": version, "prompts": one(prompts),
                             "tokens": one(tokens), "logp_behaviour": one(logp_behav),
                             "logp_rollout": one(logp_behav)})

        seen = {"idx": [], "logp": [], "entropy": [], "grad_norm": []}
        for _ in range(cfg.epochs):
            # UPDATE: one optimiser step per minibatch; m.loss is the only method-specific line
            perm = torch.stack([torch.randperm(cfg.batch, generator=g, device=dev)
                                for g in gens])
            for idx in perm.chunk(cfg.minibatches, dim=1):  # [R, b]: each run's own rows
                tok = tokens[runs, idx]
                logits = policy.logits(prompts[runs, idx], tok)  # [R, b, T, vocab]
                logp_all = logits.log_softmax(-1)
                logp = logp_all.gather(-1, tok[..., None])[..., 0]
                w = is_w[runs, idx] if cfg.anchor == "proximal" else None
                loss = summed_loss(m, logp, logp_old[runs, idx], adv[runs, idx],
                                   mask[runs, idx], agg, is_weight=w)
                opt.zero_grad()
                loss.backward()
                grad_norm = _clip_grad_norm_per_run(policy.parameters(), cfg.max_grad_norm)
                opt.step()
                updates += 1
                if lag:
                    history.append(policy.state())
                if hook is not None:
                    hook("update", {"update": updates, "policy": policy})
                with torch.no_grad():  # kept for the metrics
                    for k, v in zip(seen, (idx, logp.detach(), -(logp_all.exp() * logp_all).sum(-1),
                                           grad_norm), strict=True):
                        seen[k].append(v)

        # METRICS: observation only; each run's row, over all the tokens its updates saw
        with torch.no_grad():
            idx = torch.cat(seen["idx"], 1)
            logp, ent = torch.cat(seen["logp"], 1), torch.cat(seen["entropy"], 1)
            mb = (logp_old[runs, idx], adv[runs, idx], mask[runs, idx])
            if has_gate:
                d = step_stats(m, logp, *mb, entropy=ent, agg=agg)
            else:
                d = {k: torch.full((R,), float("nan")) for k in _DIAG}
                d["entropy"] = torch.where(mb[2], ent, 0).sum((1, 2)) / mb[2].sum((1, 2))
            lr_tok = torch.where(mb[2], logp - mb[0], 0.0)
            n_up = cfg.epochs * cfg.minibatches
            pos, neg = (mb[2] & (mb[1][..., None] > 0)).sum((1, 2)), (
                mb[2] & (mb[1][..., None] < 0)).sum((1, 2))
            gated = ((d["clipfrac_pos"] * pos + d["clipfrac_neg"] * neg)
                     / (pos + neg).clamp(min=1))
            w_seen = is_w[runs, idx] if cfg.anchor == "proximal" else None
            loss_r = per_run_loss(m, logp, *mb, agg, is_weight=w_seen)
            row = {
                "step": torch.full((R,), float(step)),
                "reward": rewards.mean(-1),
                "solved": (rewards == 1).float().mean(-1),
                "rare": right[..., rare_pos].float().mean((-2, -1)),
                "live": (adv != 0).float().mean(-1),
                "length": mask.sum(-1).float().mean(-1),
                **{k: d[k] for k in _DIAG},
                "gated": gated,
                "loss": loss_r.detach(),
                "log_ratio_absmax": lr_tok.abs().amax((1, 2)),
                "is_weight_mean": (torch.where(mask, is_w, 0).sum((1, 2)) / mask.sum((1, 2))),
                "grad_norm": torch.stack(seen["grad_norm"]).mean(0),
                "staleness": torch.full((R,), updates - version - (n_up + 1) / 2),
            }
            if keep_log_ratios:
                gate = token_gates(m, logp, *mb)[0] if has_gate else None
                for r, (lrs, gates) in enumerate(kept):
                    mk = mb[2][r]
                    lrs.append(lr_tok[r][mk].float().cpu())
                    if gate is not None:
                        a = mb[1][r][:, None].expand_as(mk)[mk]
                        gates.append((gate[r][mk].float().cpu(), a.float().cpu()))
        for k in METRIC_KEYS:
            metrics[k].append(row[k].detach().double().cpu())
        if every and ((step + 1) % every == 0 or step + 1 == steps):
            print(f"[{name} lag {lag}, {R} runs] step {step + 1:>4}/{steps}: reward "
                  f"{float(row['reward'].mean()):.3f}, max |log ρ| "
                  f"{float(row['log_ratio_absmax'].max()):.2f} "
                  f"({time.perf_counter() - t_run:.1f} s)", flush=True)

    table = {k: torch.stack(v, 1) for k, v in metrics.items()}  # [R, steps]
    return [LabResult(name, s, lag, agg, cfg, {k: v[r].tolist() for k, v in table.items()},
                      kept[r][0] if kept else None, kept[r][1] if kept else None)
            for r, s in enumerate(seeds)]


def run_many(methods, seeds=range(10), config: LabConfig | None = None, steps=None, lag=0,
             agg=None, progress=False, keep_log_ratios=False) -> dict:
    """Train every method with every seed: {label: [LabResult per seed]}.

    methods: a list of names or method objects, or a dict {label: method}. The seeds of one
    method train as one batched call; every method sees the same seeds, so run r of each method
    starts from the same policy and draws its first rollout batch from the same stream.
    progress: False (silent), True (one line per method) or "steps" (train()'s step lines).
    """
    items = methods.items() if isinstance(methods, dict) else (
        (method_name(m), m) for m in methods)
    out = {}
    for label, method in items:
        t0 = time.perf_counter()
        out[label] = train(method, config, seeds=seeds, steps=steps, lag=lag, agg=agg,
                           progress=progress == "steps", keep_log_ratios=keep_log_ratios)
        for res in out[label]:
            res.method = label
        if progress is True:
            rewards = [r.final("reward") for r in out[label]]
            print(f"[{label} lag {lag}] {len(rewards)} runs, final reward "
                  f"{sum(rewards) / len(rewards):.3f} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
    return out


__all__ = [
    "METRIC_DOC", "METRIC_KEYS", "LabConfig", "LabResult", "default_agg", "method_name",
    "per_run_loss", "resolve", "run_many", "summed_loss", "train",
]
