"""The lab's training loop: every seed of a configuration trained as one batched computation.

One training step, as LLM RL trainers run it:
- ROLLOUT: sample G responses for each of `prompts` prompts from the behaviour policy (the
  policy as it was `lag` optimiser steps ago), score them, compute group advantages (or, for an
  arm with `advantage="gae"`, per-token advantages from its critic: `rlgates.lab.critic`);
- UPDATE: shuffle the rollout batch and cut it into `minibatches` minibatches; one optimiser
  step on each, so every response is stepped on once (`epochs` passes, 1 by default); a critic
  arm's value model takes one step of its own on the same rows;
- METRICS: observe the step, never change it: one call to rlgates.diagnostics.step_stats over
  all the tokens the step's updates saw (every registered diagnostic), plus the lab's own
  numbers (`LAB_METRICS`).

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
call equals a call with `seeds=[seed_r]` alone (tested), only faster. `run_many` batches the
arms of a comparison the same way: each arm (`Arm`: a method, and its own anchor, lag or
aggregation if they differ) gets its own rows of runs, its own loss and diagnostics, and equals
that arm trained alone (tested).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .. import _numerics as nx
from .. import diagnostics
from .._side import SideInfo
from ..advantages import group_advantages
from ..devices import on_accelerator
from ..methods import get
from ..policy import LabPolicy
from ..regularisers import entropy
from ._optim import _adam, _clip_grad_norm_per_run
from .critic import CRITIC_METRICS, Critics, check_config
from .task import PatternTask

#: The lab's own per-step numbers, beside every registered diagnostic (`metric_doc()`).
LAB_METRICS = {
    "step": "training step (one rollout batch)",
    "rare": "share of the rare-token positions (odd motif slots) answered right",
    "grad_norm": "mean gradient norm of the step's updates, before clipping",
    "staleness": "mean number of optimiser steps between the behaviour policy and the updated one",
}


def metric_doc(critic: bool = False) -> dict:
    """{key: what it measures} of a lab run's metrics, in order: the step, every diagnostic
    registered in rlgates.diagnostics (over the rollout batch, or over all the tokens the step's
    updates saw, as they saw them; log_ratio_absmax is the largest), then the lab's own, then
    (critic=True: a run with advantage="gae") the critic's (`critic.CRITIC_METRICS`)."""
    return {"step": LAB_METRICS["step"],
            **{k: d.doc for k, d in diagnostics.REGISTRY.items()},
            **{k: v for k, v in LAB_METRICS.items() if k != "step"},
            **(CRITIC_METRICS if critic else {})}


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
    temperature: float = 1.0  # sampling temperature T: the policy is softmax(logits / T)
    normalize_std: bool = True  # GRPO advantages (False: Dr. GRPO, no division by the std)
    anchor: str = "behaviour"  # ρ against the "behaviour" policy or a "proximal" one
    is_cap: float | None = 2.0  # C in min(π_prox/π_behav, C) ("proximal"; None: no cap)
    correction: object | None = None  # "proximal": the weight rule in place of min(·, is_cap)
    threads: int | None = 1  # torch CPU threads during a run (restored after); None: as is
    moe: object | None = None  # rlgates.moe.MoEConfig: a mixture-of-experts policy (chapter 20)
    dtype: str = "float32"
    device: str = "cpu"
    # Where A comes from (rlgates.lab.critic): "group" (GRPO's group advantages, one per
    # response) or "gae" (PPO's: a critic, GAE per token, whitened as verl whitens it). The rest
    # are the critic's, with verl's names and defaults (algorithm.*, critic.*).
    advantage: str = "group"
    gamma: float = 1.0  # GAE's discount γ
    lam: float = 1.0  # GAE's λ
    cliprange_value: float = 0.5  # the value loss's clip: V_old ± cliprange_value
    critic_lr: float | None = None  # the critic's Adam lr (None: the policy's lr)
    kl_coef: float = 0.0  # β of the KL penalty in the reward, against the initial policy (0: off)
    kl_penalty: str = "k1"  # its per-token estimate (advantages.KL_REWARD_ESTIMATORS)

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
        """Fresh policies, one run per seed (each seed's weights as if built alone); a
        rlgates.moe.MoEPolicy when `moe` is set."""
        if self.moe is not None:
            if self.temperature != 1.0:
                raise ValueError("the MoE lab policy samples at temperature 1: got moe with "
                                 f"temperature={self.temperature!r}")
            from ..moe import lab_policy
            return lab_policy(self, seeds)
        pol = LabPolicy(seeds, self.vocab, self.hidden, self.length, self.motif,
                        temperature=self.temperature)
        return pol.to(getattr(torch, self.dtype))

    def replace(self, **changes) -> LabConfig:
        return replace(self, **changes)


@dataclass
class LabResult:
    """One run: per-step `metrics` (lists of floats, keys `metric_doc()`) and how it was made."""

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


def _takes_is_weight(m) -> bool:
    loss = getattr(m.loss, "__func__", m.loss)  # a method's function: one signature per class
    try:
        return _has_is_weight(loss)
    except TypeError:  # an unhashable callable
        return _has_is_weight.__wrapped__(loss)


@functools.lru_cache(maxsize=256)
def _has_is_weight(loss) -> bool:
    try:
        return "is_weight" in inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return False


def summed_loss(m, logp, logp_old, adv, mask, agg, is_weight=None, side=None):
    """Σ_r m.loss(run r) for [R, b, T] inputs: each run's own loss, added up.

    One call on the R·b rows. Within run r, its own aggregation weight is the merged batch's
    times a constant: N / N_r, with N the tokens (token-mean) or the non-empty responses (the
    seq-mean modes) of all runs and N_r those of run r. Passing that constant (times
    `is_weight`) as the loss's per-token weight makes the merged loss equal the sum of the
    per-run losses, for every aggregation mode (tested). A method whose loss takes no
    `is_weight` (a hand-written object), or that reads side information (its batch statistics
    must stay each run's own), is called run by run, with run r's part of `side` (a SideInfo
    over [R, b, T]); a side field nobody gave raises the method's ValueError, which names it.
    """
    mask = nx.check_mask(mask, logp.shape, logp.device)
    R = logp.shape[0]
    if getattr(m, "side_inputs", ()):  # its batch statistics (a covariance, a pick) are per run
        w = [None] * R if is_weight is None else is_weight
        return sum(m.loss(logp[r], logp_old[r], adv[r], mask[r], agg, is_weight=w[r],
                          side=_run_side(side, r)) for r in range(R))
    if not _takes_is_weight(m):
        if is_weight is not None:
            raise TypeError(f"{m!r}.loss takes no is_weight: use anchor='behaviour'")
        return sum(m.loss(logp[r], logp_old[r], adv[r], mask[r], agg) for r in range(R))
    w = nx.run_scale(mask, agg).to(logp.dtype).view(R, 1, 1).expand_as(logp)
    if is_weight is not None:
        w = w * is_weight
    flat = (lambda x: x.flatten(0, 1))  # [R, b, ...] -> [R·b, ...]
    return m.loss(flat(logp), flat(logp_old), flat(adv), flat(mask), agg, is_weight=flat(w))


def _run_side(side, r):
    """Run r's part of a SideInfo over [R, b, T] (None stays None)."""
    if side is None:
        return None
    return side.replace(**{n: getattr(side, n)[r] for n in side.given()})


_DRAW_SEED = 7_777_777  # offsets a run's seed for its draws' generator, apart from its rollouts'

#: The side information the lab gives a method that reads some (`Method.side_inputs`); a field
#: not here (and not derived from the batch by the loss itself) raises the method's ValueError.
LAB_SIDE = {
    "entropy": "the policy's entropy at each token, from its full distribution",
    "sampler_logp": "the behaviour policy's log-probs (the lab samples with the policy itself: "
                    "no engine mismatch)",
    "draw": "uniform keys from a generator of each run's own, apart from its rollouts' (so that "
            "a run's samples do not depend on the arms beside it), for a loss that picks "
            "tokens at random",
}


@torch.no_grad()
def lab_side(ent, behaviour_logp, generators):
    """The lab's SideInfo, [R, b, T] fields (`LAB_SIDE`), from the policy's entropy `ent` and
    the behaviour log-probs; run r's draw from generators[r]."""
    draw = torch.stack([torch.rand(ent.shape[1:], generator=g, device=g.device,
                                   dtype=ent.dtype) for g in generators])
    return SideInfo(entropy=ent, sampler_logp=behaviour_logp.to(ent.dtype).clamp(max=0),
                    draw=draw)


class Rollout(NamedTuple):
    """One rollout batch per run, B = prompts × G responses: tensors [R, B, ...]."""

    prompts: torch.Tensor  # [R, B, motif], each prompt repeated G times side by side
    tokens: torch.Tensor  # [R, B, T]
    logp: torch.Tensor  # [R, B, T]: the sampling policy's log-probs of the tokens
    mask: torch.Tensor  # [R, B, T]: up to and including the end token
    right: torch.Tensor  # [R, B, T]: the positions answered right
    rewards: torch.Tensor  # [R, B]: the share of positions right
    adv: torch.Tensor  # [R, B]: group advantages (cfg.normalize_std); [R, B, T] per token
    #                    once a critic arm's are in (critic.Critics.advantages)
    routing: torch.Tensor | None = None  # [R, B, T, layers, k]: a MoE engine's expert choices


@torch.no_grad()
def rollout(cfg, policy, generators, task=None) -> Rollout:
    """The lab's ROLLOUT: `cfg.prompts` prompts per run and G = `cfg.group` responses to each,
    sampled from `policy` (run r drawing from generators[r]), scored, group advantages."""
    task = task or cfg.task()
    prompts = torch.stack([task.prompts(cfg.prompts, g, g.device) for g in generators])
    prompts = prompts.repeat_interleave(cfg.group, 1)
    routing = None
    if getattr(policy, "records_routing", False):  # a MoE policy: keep its expert choices
        tokens, logp, routing = policy.sample(prompts, cfg.length, generators, return_routing=True)
    else:
        tokens, logp = policy.sample(prompts, cfg.length, generators)
    right = task.right(prompts, tokens)
    rewards = right.float().mean(-1)
    adv = group_advantages(rewards.view(-1, cfg.group), cfg.normalize_std).view_as(rewards)
    return Rollout(prompts, tokens, logp, task.mask(tokens), right, rewards, adv.to(logp.dtype),
                   routing)


@torch.no_grad()
def _anchor(cfg, prox, logp, mask):
    """One arm's (log π_old of the ratio, behaviour weight or None), on its runs' rows: the
    rollout's own log-probs `logp`, or at the "proximal" anchor the policy's now (`prox`),
    weighted by min(π_prox/π_behav, C) or by `cfg.correction`'s rule."""
    if cfg.anchor == "behaviour":
        return logp, None
    if cfg.correction is None:
        w = (prox - logp).exp()
        return prox, (w.clamp(max=cfg.is_cap) if cfg.is_cap else w)
    flat = (lambda x: x.flatten(0, 1))  # its own rule, on [R·B, T] rows
    w = cfg.correction.weight(flat(prox), flat(logp), flat(mask))
    return prox, w.view_as(prox).to(prox.dtype)


@torch.no_grad()
def _anchors(arms, policy, batch, routing=None):
    """Every arm's anchor (`_anchor`), as [R, B, T] tensors: (log π_old, behaviour weight or
    None, which arms are weighted). π_prox is computed once, for all runs, if an arm needs it
    (a MoE policy's with `routing` replayed, if given: router replay R3)."""
    prox = None
    if any(a.config.anchor == "proximal" for a in arms):
        replay = {} if routing is None else {"routing": routing}
        prox = policy.log_probs(batch.tokens, batch.prompts, **replay)
    parts = [_anchor(a.config, None if prox is None else prox[a.rows], batch.logp[a.rows],
                     batch.mask[a.rows]) for a in arms]
    weighted = [w is not None for _, w in parts]
    is_w = torch.cat([torch.ones_like(old) if w is None else w for old, w in parts]) \
        if any(weighted) else None
    return torch.cat([old for old, _ in parts]), is_w, weighted


def _take(runs, idx):
    """x → x[runs, idx], each run's own rows (None stays None)."""
    return lambda x: None if x is None else x[runs, idx]


def _rollout_info(step, version, batch):
    """The hook's view of a rollout; a single run's tensors without the runs dimension."""
    one = (lambda x: x[0]) if len(batch.tokens) == 1 else (lambda x: x)
    return {"step": step, "version": version, "prompts": one(batch.prompts),
            "tokens": one(batch.tokens), "logp_behaviour": one(batch.logp)}


def _rows_side(side, rows):
    """The SideInfo of some runs' rows (None stays None)."""
    if side is None:
        return None
    return side.replace(**{n: getattr(side, n)[rows] for n in side.given()})


def _arms_loss(plan, weighted, logp, logp_old, adv, mask, is_w, side=None):
    """Every arm's summed loss on its own rows, added: one backward serves them all."""
    return torch.stack([
        summed_loss(a.m, logp[a.rows], logp_old[a.rows], adv[a.rows], mask[a.rows], a.agg,
                    is_weight=is_w[a.rows] if wt else None, side=_rows_side(side, a.rows))
        for a, wt in zip(plan, weighted, strict=True)]).sum()


def _arms_stats(plan, weighted, logp, logp_old, adv, mask, ent, is_w, batch, group, side=None):
    """diagnostics.step_stats on every arm's own rows, joined: {key: [R]}."""
    stats = [diagnostics.step_stats(a.m, logp[a.rows], logp_old[a.rows], adv[a.rows],
                                    mask[a.rows], ent[a.rows], a.agg,
                                    is_weight=is_w[a.rows] if wt else None,
                                    rewards=batch.rewards[a.rows], group=group,
                                    side=_rows_side(side, a.rows))
             for a, wt in zip(plan, weighted, strict=True)]
    return {k: torch.cat([s[k] for s in stats]) for k in stats[0]}


def _keep(kept, m, logp, logp_old, adv, mask, side=None):
    """keep_log_ratios: append, per run, the token log ρ and (gate, A) of the real tokens."""
    b = diagnostics.Batch(m, logp, logp_old, adv, mask, side=side)
    gate = b.gate if callable(getattr(m, "gate", None)) else None
    for r, (log_ratios, gates) in enumerate(kept):
        real = b.mask[r]
        log_ratios.append(b.token_log_ratio[r][real].float().cpu())
        if gate is not None:
            gates.append((gate[r][real].float().cpu(), b.adv[r][real].float().cpu()))


def _progress(label, steps, every):
    """The step printer of `train(progress=)`; None when silent."""
    if not every:
        return None
    t0 = time.perf_counter()

    def show(step, row):
        if (step + 1) % every == 0 or step + 1 == steps:
            print(f"{label} step {step + 1:>4}/{steps}: reward {float(row['reward'].mean()):.3f}"
                  f", max |log ρ| {float(row['log_ratio_absmax'].max()):.2f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return show


class Arm(NamedTuple):
    """One arm of `run_many`: a method and, where it differs from the call's, its anchor
    (`config`: only `ARM_FIELDS` may differ from the call's config), its lag and its
    aggregation (None: the call's)."""

    method: object
    config: LabConfig | None = None
    lag: int | None = None
    agg: str | None = None


#: The LabConfig fields in which the arms of one batched call may differ; every other field
#: (sizes, steps, optimiser) is shared, since all arms train as one computation.
ARM_FIELDS = ("anchor", "is_cap", "correction", "advantage", "gamma", "lam", "cliprange_value",
              "critic_lr", "kl_coef", "kl_penalty")


class _Arm(NamedTuple):
    """An arm as the loop runs it: its method object, aggregation, config, lag, and its runs'
    rows (arm-major: arm a's seed i is row a·len(seeds) + i)."""

    m: object
    agg: str
    config: LabConfig
    lag: int
    rows: slice


def _check(cfg, lag, agg):
    if lag < 0:
        raise ValueError(f"lag must be ≥ 0, got {lag}")
    if cfg.anchor not in ("behaviour", "proximal"):
        raise ValueError(f"anchor must be 'behaviour' or 'proximal', got {cfg.anchor!r}")
    if cfg.correction is not None and (cfg.anchor != "proximal"
                                       or not callable(getattr(cfg.correction, "weight", None))):
        raise ValueError("correction needs anchor='proximal' and a .weight(logp_prox, "
                         f"logp_behav, mask) method, got {cfg.correction!r}")
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    check_config(cfg)


def _batched(arms: dict, config, seeds, steps, lag, agg, progress, keep_log_ratios, hook=None):
    """Train every arm ({label: Arm}) with every seed as one batched computation:
    {label: [LabResult per seed]}. Each run depends on its own rows only, so run r of an arm
    equals that arm trained alone (tested)."""
    base = config or next((a.config for a in arms.values() if a.config is not None), None)
    base = base or LabConfig.for_device("cpu")
    base = base if steps is None else base.replace(steps=int(steps))
    seeds, plan = [int(s) for s in seeds], []
    for a, (label, arm) in enumerate(arms.items()):
        m = resolve(arm.method)
        own = base if arm.config is None else base.replace(
            **{f: getattr(arm.config, f) for f in ARM_FIELDS})
        if arm.config is not None and own != arm.config.replace(steps=base.steps):
            raise ValueError(f"arm {label!r}: its config may differ from the call's only in "
                             f"{ARM_FIELDS}")
        arm_lag, arm_agg = lag if arm.lag is None else arm.lag, arm.agg or agg or default_agg(m)
        _check(own, arm_lag, arm_agg)
        plan.append(_Arm(m, arm_agg, own, arm_lag, slice(a * len(seeds), (a + 1) * len(seeds))))
    if hook is not None and len(plan) > 1:
        raise ValueError("hook= needs a single arm (lab.train)")
    every = (max(1, base.steps // 5) if progress is True else int(progress)) if progress else 0
    lags = sorted({a.lag for a in plan})
    show = _progress(f"[{', '.join(map(str, arms))} lag {', '.join(map(str, lags))}, "
                     f"{len(plan) * len(seeds)} runs]", base.steps, every)
    threads = torch.get_num_threads()
    if base.threads and torch.device(base.device).type == "cpu":
        torch.set_num_threads(base.threads)
    try:
        table, kept = _train(plan, base, seeds, keep_log_ratios, hook or _ignore,
                             show or _ignore)
    finally:
        torch.set_num_threads(threads)
    out = {}
    for label, a in zip(arms, plan, strict=True):
        keys = [k for k in table if a.config.advantage == "gae" or k not in CRITIC_METRICS]
        out[label] = [LabResult(method_name(a.m), s, a.lag, a.agg, a.config,
                                {k: table[k][r].tolist() for k in keys},
                                *(kept[r] if keep_log_ratios else (None, None)))
                      for r, s in zip(range(a.rows.start, a.rows.stop), seeds, strict=True)]
    return out


def train(method, config: LabConfig | None = None, seeds=(0,), steps: int | None = None,
          lag: int = 0, agg: str | None = None, progress=True, keep_log_ratios: bool = False,
          hook=None) -> list[LabResult]:
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
        logp_behaviour, policy}) after each rollout (policy: the trainer's, as the step
        begins) and ("update", {update, policy}) after each optimiser step (`update` counts
        from 1; the policy is then version `update`). With a single seed the tensors have no
        runs dimension ([B, ...]).
    Same seeds, config and arguments → identical metrics (on the same device and torch).
    """
    name = method_name(method)
    return _batched({name: Arm(method)}, config, seeds, steps, lag, agg, progress,
                    keep_log_ratios, hook)[name]


def _behaviour(history, plan, seeds):
    """The rollout policy's weights: arm a's runs from the policy `a.lag` updates old (the
    oldest kept at the start)."""
    newest = len(history) - 1
    picks = [history[max(0, newest - a.lag)] for a in plan]
    if all(p is picks[0] for p in picks):
        return picks[0]
    return {k: torch.cat([p[k][a.rows] for a, p in zip(plan, picks, strict=True)])
            for k in picks[0]}


def _ignore(*_args):
    """A hook or progress printer that does nothing."""


def _side_reader(plan, seeds, dev):
    """side_of(entropy, behaviour log-probs): the lab's SideInfo (`lab_side`, run r drawing from
    its own generator) when an arm's method reads side information, else None."""
    if not any(getattr(a.m, "side_inputs", ()) for a in plan):
        return lambda ent, sampled: None
    draws = [torch.Generator(device=dev).manual_seed(s + _DRAW_SEED) for s in seeds]
    return lambda ent, sampled: lab_side(ent, sampled, draws)


def _shuffles(gens, n):
    """[R, n]: one permutation of the batch's rows per run, run r's from gens[r]."""
    return torch.stack([torch.randperm(n, generator=g, device=g.device) for g in gens])


def _staleness(updates, versions, n_updates, n_seeds):
    """Each run's mean staleness over the step's updates: how many updates its behaviour policy
    was behind, averaged over the updates (arm-major, one value per run)."""
    stale = [float(updates - v - (n_updates + 1) / 2) for v in versions]
    return torch.tensor(stale).repeat_interleave(n_seeds)


def _moe_routing(plan, cfg, seeds, dev):
    """rlgates.moe.LabRouting for a config with `moe` set, else None."""
    if cfg.moe is None:
        return None
    from ..moe import LabRouting
    return LabRouting(cfg, seeds, dev, anchors={a.config.anchor for a in plan})


def _scored(cfg, source, gens, task, moe, critics):
    """The step's rollout batch: sampled from `source` (through a MoE engine if any), scored,
    with its advantages (a critic arm's per token: `critic.Critics.advantages`)."""
    return critics.advantages(rollout(cfg, moe.engine(source) if moe else source, gens, task))


def _forward(policy, moe, batch, runs, idx):
    """The policy on each run's minibatch rows idx [R, b] (a MoE policy with its routing as
    `moe` replays it): the tokens' log-probs and the entropy at each token, [R, b, T] each."""
    prompts, tok = batch.prompts[runs, idx], batch.tokens[runs, idx]
    logits = (moe.logits(policy, prompts, tok, runs, idx, batch.mask[runs, idx]) if moe
              else policy.logits(prompts, tok))  # [R, b, T, vocab]
    logp = logits.log_softmax(-1).gather(-1, tok[..., None])[..., 0]
    return logp, entropy(logits.detach())


def _train(plan, cfg, seeds, keep, hook, show):
    """ROLLOUT, UPDATE, METRICS, step by step, every arm's runs at once (arm a's: rows a.rows)."""
    dev, task = torch.device(cfg.device), cfg.task()
    all_seeds = seeds * len(plan)  # arm-major: every arm starts from the same seeds
    R, lag = len(all_seeds), max(a.lag for a in plan)
    policy = cfg.policy(all_seeds).to(dev)
    behaviour = cfg.policy(all_seeds).to(dev).requires_grad_(False)  # the lagged copy
    opt, critics = _adam(policy.parameters(), cfg.lr), Critics(plan, cfg, all_seeds, dev)
    gens = [torch.Generator(device=dev).manual_seed(s) for s in all_seeds]
    runs = torch.arange(R, device=dev)[:, None]  # x[runs, idx]: each run's own rows
    history = deque([policy.state()], maxlen=lag + 1)  # [0]: the policy `lag` updates old
    rows, kept, updates = [], [([], []) for _ in all_seeds], 0
    side_of = _side_reader(plan, all_seeds, dev)  # None unless an arm's method reads it
    moe = _moe_routing(plan, cfg, all_seeds, dev)  # a MoE engine and router replay, or None
    for step in range(cfg.steps):
        # ROLLOUT: from the behaviour policy (each arm's `lag` updates old), scored, advantages
        if lag:
            behaviour.load_state_dict(_behaviour(history, plan, seeds))
        versions = [updates - min(len(history) - 1, a.lag) for a in plan]
        batch = _scored(cfg, behaviour if lag else policy, gens, task, moe, critics)
        replayed = moe.start(policy, batch) if moe else None  # R3: the engine's routing
        logp_old, is_w, weighted = _anchors(plan, policy, batch, replayed)  # anchor, weight
        hook("rollout", {**_rollout_info(step, versions[0], batch), "policy": policy})

        # UPDATE: one optimiser step per minibatch; m.loss is the only method-specific line
        seen = []
        for _ in range(cfg.epochs):
            for idx in _shuffles(gens, cfg.batch).chunk(cfg.minibatches, dim=1):  # [R, b]
                at, (logp, ent) = _take(runs, idx), _forward(policy, moe, batch, runs, idx)
                loss = _arms_loss(plan, weighted, logp, at(logp_old), at(batch.adv),
                                  at(batch.mask), at(is_w), side_of(ent, at(batch.logp)))
                opt.zero_grad()
                loss.backward()
                grad_norm = _clip_grad_norm_per_run(policy.parameters(), cfg.max_grad_norm)
                opt.step()
                critics.update(batch, idx)  # a critic arm's value model: one step, same rows
                updates += 1
                if lag:
                    history.append(policy.state())
                hook("update", {"update": updates, "policy": policy})
                seen.append((idx, logp.detach(), ent, grad_norm[:, None], at(batch.logp)))

        # METRICS: observation only; each run's row, over all the tokens its updates saw
        idx, logp, ent, norms, sampled = (torch.cat(x, 1) for x in zip(*seen, strict=True))
        at = _take(runs, idx)
        seen_by = logp, at(logp_old), at(batch.adv), at(batch.mask)  # what each update saw
        side = side_of(ent, sampled)  # the step's own batch statistics, and a fresh draw
        rows.append({"step": torch.full((R,), float(step)),
                     **_arms_stats(plan, weighted, *seen_by, ent, at(is_w), batch, cfg.group,
                                   side),
                     "rare": batch.right[..., task.rare_positions().to(dev)].float().mean((1, 2)),
                     "grad_norm": norms.mean(1),
                     "staleness": _staleness(updates, versions, norms.shape[1], len(seeds)),
                     **(moe.metrics() if moe else {}), **critics.stats()})
        for a in plan if keep else ():
            _keep(kept[a.rows], a.m, *(x[a.rows] for x in seen_by), _rows_side(side, a.rows))
        show(step, rows[-1])
    return {k: torch.stack([r[k].double().cpu() for r in rows], 1) for k in rows[0]}, kept


def run_many(methods, seeds=range(10), config: LabConfig | None = None, steps=None, lag=0,
             agg=None, progress=False, keep_log_ratios=False) -> dict:
    """Train every method with every seed, all as one batched computation: {label: [LabResult
    per seed]}.

    methods: a list of names or method objects, or a dict {label: method or Arm}. An `Arm`
    gives an arm its own anchor (its config, which may differ from `config` only in
    `ARM_FIELDS`), lag or aggregation. Every arm sees the same seeds, so run r of each arm
    starts from the same policy and draws its first rollout batch from the same stream; each run
    depends on its own rows only, so run r of an arm equals that arm trained alone.
    progress: False (silent), True (one line per method) or "steps" (train()'s step lines).
    """
    items = list(methods.items() if isinstance(methods, dict) else (
        (method_name(m.method if isinstance(m, Arm) else m), m) for m in methods))
    labels = [label for label, _ in items]
    if len(set(labels)) < len(labels):  # a dict would keep only the last of them
        raise ValueError(f"run_many: arms share a label in {labels}; give them labels with a "
                         "dict {label: method or Arm}")
    arms = {label: m if isinstance(m, Arm) else Arm(m) for label, m in items}
    t0 = time.perf_counter()
    out = _batched(arms, config, seeds, steps, lag, agg, progress == "steps", keep_log_ratios)
    for label, results in out.items():
        for res in results:
            res.method = label
        if progress is True:
            rewards = [r.final("reward") for r in results]
            print(f"[{label} lag {results[0].lag}] {len(rewards)} runs, final reward "
                  f"{sum(rewards) / len(rewards):.3f}", flush=True)
    if progress is True:
        print(f"{len(out)} arms × {len(list(seeds))} seeds, trained together in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return out


__all__ = [
    "ARM_FIELDS", "Arm", "LAB_METRICS", "LabConfig", "LabResult", "Rollout", "default_agg",
    "method_name", "metric_doc", "resolve", "rollout", "run_many", "summed_loss", "train",
]
