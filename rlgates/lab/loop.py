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

import contextlib
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
from ..methods import Method, get
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


def summed_loss(m, logp, logp_old, adv, mask, agg, is_weight=None, side=None):
    """Σ_r m.loss(run r) for [R, b, T] inputs: each run's own loss, added up.

    An rlgates Method: one call on the R·b rows. Within run r, its own aggregation weight is
    the merged batch's times a constant: N / N_r, with N the tokens (token-mean) or the
    non-empty responses (the seq-mean modes) of all runs and N_r those of run r. Passing that
    constant (times `is_weight`) as the loss's per-token weight makes the merged loss equal the
    sum of the per-run losses, for every aggregation mode (tested).

    Run by run instead: a method that reads side information (`.side_inputs`: its batch
    statistics must stay each run's own), with run r's part of `side` (a SideInfo over
    [R, b, T]; a side field nobody gave raises the method's ValueError, which names it); and
    any other object with a `.loss`, given `is_weight=` only when it is not None. `side` goes
    only to a method that reads it.
    """
    mask = nx.check_mask(mask, logp.shape, logp.device)
    R, reads_side = logp.shape[0], bool(getattr(m, "side_inputs", ()))
    if reads_side or not isinstance(m, Method):
        side = side if reads_side else None
        return sum(m.loss(logp[r], logp_old[r], adv[r], mask[r], agg,
                          **_run_inputs(is_weight, side, r, logp.shape)) for r in range(R))
    w = nx.run_scale(mask, agg).to(logp.dtype).view(R, 1, 1).expand_as(logp)
    if is_weight is not None:
        w = w * is_weight
    logp, logp_old, adv, mask, w = (x.flatten(0, 1) for x in (logp, logp_old, adv, mask, w))
    return m.loss(logp, logp_old, adv, mask, agg, is_weight=w)  # on the [R·b, ...] rows


def _run_inputs(is_weight, side, r, shape):
    """Run r's is_weight= and side= keywords for its own loss, each only when given."""
    given = {}
    if is_weight is not None:
        given["is_weight"] = is_weight[r]
    if side is not None:
        given["side"] = side.index(r, shape)
    return given


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


class _Arm(NamedTuple):
    """An arm as the loop runs it: its method object, aggregation, config, lag, and its runs'
    rows (arm-major: arm a's seed i is row a·len(seeds) + i)."""

    m: object
    agg: str
    config: LabConfig
    lag: int
    rows: slice

    @property
    def weighted(self) -> bool:
        """Whether its loss takes a behaviour weight (`is_weight=`): the "proximal" anchor."""
        return self.config.anchor == "proximal"

    def part(self, x):
        """Its runs' rows of a tensor or SideInfo over all runs [R, ...] (None stays None)."""
        if x is None:
            return None
        return x.index(self.rows) if isinstance(x, SideInfo) else x[self.rows]


class _Plan(NamedTuple):
    """A batched call, merged and checked once (`_Plan.build`): the config every arm shares,
    the seeds, and each arm as the loop runs it."""

    config: LabConfig
    seeds: list
    labels: tuple
    arms: tuple  # _Arm per label; arm a's runs are rows a·len(seeds) ... (a+1)·len(seeds) - 1

    @classmethod
    def build(cls, arms: dict, config=None, seeds=(0,), steps=None, lag=0, agg=None) -> _Plan:
        """{label: Arm} and the call's arguments → the plan. The shared config: `config`, else
        the first arm's, else LabConfig.for_device("cpu"), with `steps` if given; each arm's
        own: the shared one with its `ARM_FIELDS`; its lag and aggregation: its own, else the
        call's (else the method's `.agg`). Every arm is checked here, before any training."""
        base = config or next((a.config for a in arms.values() if a.config is not None), None)
        base = base or LabConfig.for_device("cpu")
        base = base if steps is None else base.replace(steps=int(steps))
        seeds, n = [int(s) for s in seeds], len(seeds)
        planned = [_planned(label, arm, base, lag, agg, slice(a * n, (a + 1) * n))
                   for a, (label, arm) in enumerate(arms.items())]
        return cls(base, seeds, tuple(arms), tuple(planned))

    @property
    def all_seeds(self) -> list:
        """Every run's seed, arm-major: every arm starts from the same seeds."""
        return self.seeds * len(self.arms)


def _planned(label, arm, base, lag, agg, rows) -> _Arm:
    """One arm of `_Plan.build`, its config merged with the call's and checked."""
    m = resolve(arm.method)
    own = base if arm.config is None else base.replace(
        **{f: getattr(arm.config, f) for f in ARM_FIELDS})
    if arm.config is not None and own != arm.config.replace(steps=base.steps):
        raise ValueError(f"arm {label!r}: its config may differ from the call's only in "
                         f"{ARM_FIELDS}")
    a = _Arm(m, arm.agg or agg or default_agg(m), own, lag if arm.lag is None else arm.lag, rows)
    _check(a.config, a.lag, a.agg)
    return a


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
    plan = _Plan.build(arms, config, seeds, steps, lag, agg)
    if hook is not None and len(plan.arms) > 1:
        raise ValueError("hook= needs a single arm (lab.train)")
    with _threads(plan.config):
        table, kept = _train(plan, keep_log_ratios, hook or _ignore, _progress(plan, progress))
    return {label: _results(a, plan.seeds, table, kept if keep_log_ratios else None)
            for label, a in zip(plan.labels, plan.arms, strict=True)}


def _train(plan, keep, hook, show):
    """The loop: ROLLOUT, UPDATE, METRICS, step by step, every arm's runs at once (arm a's:
    rows a.rows). Returns ({metric: [R, steps]}, per run its kept (log ρ, (gate, A)) lists)."""
    cfg, seeds, arms = plan.config, plan.all_seeds, plan.arms
    dev, task = torch.device(cfg.device), cfg.task()
    policy = cfg.policy(seeds).to(dev)
    behaviour = _Behaviour(plan, policy, dev)  # each arm's rollout policy, `lag` updates old
    opt, critics = _adam(policy.parameters(), cfg.lr), Critics(arms, cfg, seeds, dev)
    gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]  # run r's own stream
    runs = torch.arange(len(seeds), device=dev)[:, None]  # x[runs, idx]: each run's own rows
    side_of = _side_reader(arms, seeds, dev)  # None unless an arm's method reads it
    moe = _moe_routing(arms, cfg, seeds, dev)  # a MoE engine and router replay, or None
    rows, kept = [], [([], []) for _ in seeds]
    for step in range(cfg.steps):
        # ROLLOUT: sampled by the behaviour policy, scored, advantages; the ratio's anchor
        source, versions = behaviour.load()
        sampler = moe.engine(source) if moe else source  # a MoE engine: rounding, noise
        batch = critics.advantages(rollout(cfg, sampler, gens, task))  # a critic arm's A
        replayed = moe.start(policy, batch) if moe else None  # R3: the engine's routing
        logp_old, is_w = _anchors(arms, policy, batch, replayed)  # is_w: behaviour weight
        hook("rollout", {**_rollout_info(step, versions[0], batch), "policy": policy})

        # UPDATE: one optimiser step per minibatch; m.loss is the only method-specific line
        seen = []
        for idx in _minibatches(gens, cfg):  # [R, b]: each run's own rows
            mb = _Seen.take(batch, logp_old, is_w, runs, idx)
            logp, ent = _forward(policy, moe, batch, runs, idx)
            loss = _arms_loss(arms, logp, mb, side_of(ent, mb.sampled))
            opt.zero_grad()
            loss.backward()
            grad_norm = _clip_grad_norm_per_run(policy.parameters(), cfg.max_grad_norm)
            opt.step()
            critics.update(batch, idx)  # a critic arm's value model: one step, same rows
            hook("update", {"update": behaviour.stepped(), "policy": policy})
            seen.append(mb._replace(logp=logp.detach(), entropy=ent, grad_norm=grad_norm[:, None]))

        # METRICS: observation only; each run's row, over all the tokens its updates saw
        seen = _Seen.join(seen)
        side = side_of(seen.entropy, seen.sampled)  # the step's batch statistics, a fresh draw
        rows.append({"step": torch.full((len(seeds),), float(step)),
                     **_arms_stats(arms, seen, batch, cfg.group, side),
                     "rare": batch.right[..., task.rare_positions().to(dev)].float().mean((1, 2)),
                     "grad_norm": seen.grad_norm.mean(1),
                     "staleness": _staleness(behaviour.updates, versions,
                                             seen.grad_norm.shape[1], len(plan.seeds)),
                     **(moe.metrics() if moe else {}), **critics.stats()})
        for a in arms if keep else ():
            _keep(kept, a, seen, side)
        show(step, rows[-1])
    return {k: torch.stack([r[k].double().cpu() for r in rows], 1) for k in rows[0]}, kept


# -- the loop's pieces, in the order it uses them --------------------------------------------

class _Behaviour:
    """The rollout policy, and the count of optimiser steps. With every arm's lag 0, the policy
    itself; else a copy, loaded before each rollout with arm a's weights from `a.lag` updates
    ago (the oldest kept at the start)."""

    def __init__(self, plan, policy, dev):
        self.arms, self.policy, self.updates = plan.arms, policy, 0
        self.lag = max(a.lag for a in plan.arms)
        self.history = deque([policy.state()], maxlen=self.lag + 1)  # [0]: `lag` updates old
        if self.lag:
            self.copy = plan.config.policy(plan.all_seeds).to(dev).requires_grad_(False)

    def load(self):
        """(the policy that samples this step's rollout, each arm's version of it)."""
        newest = len(self.history) - 1
        versions = [self.updates - min(newest, a.lag) for a in self.arms]
        if not self.lag:
            return self.policy, versions
        picks = [self.history[max(0, newest - a.lag)] for a in self.arms]
        weights = picks[0]
        if any(p is not weights for p in picks):  # arms of different lags: each its own rows
            weights = {k: torch.cat([p[k][a.rows] for a, p in zip(self.arms, picks, strict=True)])
                       for k in weights}
        self.copy.load_state_dict(weights)
        return self.copy, versions

    def stepped(self) -> int:
        """After an optimiser step: count it (the policy is now that version) and keep it."""
        self.updates += 1
        if self.lag:
            self.history.append(self.policy.state())
        return self.updates


@torch.no_grad()
def _anchors(arms, policy, batch, routing=None):
    """Every arm's anchor (`_anchor`), [R, B, T]: (log π_old, the behaviour weight: None when no
    arm is weighted, else 1 on an unweighted arm's rows). π_prox is computed once, for all runs,
    if an arm needs it (a MoE policy's with `routing` replayed, if given: router replay R3)."""
    prox = None
    if any(a.weighted for a in arms):
        replay = {} if routing is None else {"routing": routing}
        prox = policy.log_probs(batch.tokens, batch.prompts, **replay)
    parts = [_anchor(a.config, a.part(prox), a.part(batch.logp), a.part(batch.mask))
             for a in arms]
    logp_old = torch.cat([old for old, _ in parts])
    if prox is None:
        return logp_old, None
    return logp_old, torch.cat([torch.ones_like(old) if w is None else w for old, w in parts])


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
    w = cfg.correction.weight(prox.flatten(0, 1), logp.flatten(0, 1), mask.flatten(0, 1))
    return prox, w.view_as(prox).to(prox.dtype)  # its own rule, on the [R·B, T] rows


class _Seen(NamedTuple):
    """Rows of the step's rollout as the updates see them, [R, b, ...] each: one minibatch's
    (`take`), or every update's of the step side by side (`join`), for the step's metrics."""

    logp_old: torch.Tensor  # the ratio's anchor, log π_old
    adv: torch.Tensor  # [R, b] (group A) or [R, b, T] (a critic arm's)
    mask: torch.Tensor
    is_weight: torch.Tensor | None  # the behaviour weight (None: no arm is weighted)
    sampled: torch.Tensor  # the behaviour policy's log-probs (for the side information)
    logp: torch.Tensor | None = None  # the policy's, as the update saw them (detached)
    entropy: torch.Tensor | None = None  # the policy's entropy at each token
    grad_norm: torch.Tensor | None = None  # [R, 1] per update, before clipping

    @classmethod
    def take(cls, batch, logp_old, is_weight, runs, idx) -> _Seen:
        """Each run's rows idx [R, b] of the rollout and of its anchor."""
        return cls(*(None if x is None else x[runs, idx]
                     for x in (logp_old, batch.adv, batch.mask, is_weight, batch.logp)))

    @classmethod
    def join(cls, seen) -> _Seen:
        """Several updates' rows side by side: every field joined along the rows."""
        return cls(*(None if x[0] is None else torch.cat(x, 1) for x in zip(*seen, strict=True)))


def _minibatches(gens, cfg):
    """UPDATE's minibatches, [R, b] rows each: per pass (`cfg.epochs`), one shuffle of the batch
    per run (run r's from gens[r]), cut into `cfg.minibatches`."""
    for _ in range(cfg.epochs):
        shuffled = torch.stack([torch.randperm(cfg.batch, generator=g, device=g.device)
                                for g in gens])
        yield from shuffled.chunk(cfg.minibatches, dim=1)


def _forward(policy, moe, batch, runs, idx):
    """The policy on each run's minibatch rows idx [R, b] (a MoE policy with its routing as
    `moe` replays it): the tokens' log-probs and the entropy at each token, [R, b, T] each."""
    prompts, tok = batch.prompts[runs, idx], batch.tokens[runs, idx]
    logits = (moe.logits(policy, prompts, tok, runs, idx, batch.mask[runs, idx]) if moe
              else policy.logits(prompts, tok))  # [R, b, T, vocab]
    logp = logits.log_softmax(-1).gather(-1, tok[..., None])[..., 0]
    return logp, entropy(logits.detach())


def _arms_loss(arms, logp, s, side=None):
    """Every arm's summed loss on its own rows, added: one backward serves them all."""
    return torch.stack([
        summed_loss(a.m, a.part(logp), a.part(s.logp_old), a.part(s.adv), a.part(s.mask), a.agg,
                    is_weight=a.part(s.is_weight) if a.weighted else None, side=a.part(side))
        for a in arms]).sum()


def _arms_stats(arms, s, batch, group, side=None):
    """diagnostics.step_stats on every arm's own rows of `s` (a _Seen), joined: {key: [R]}."""
    stats = [diagnostics.step_stats(a.m, a.part(s.logp), a.part(s.logp_old), a.part(s.adv),
                                    a.part(s.mask), a.part(s.entropy), a.agg,
                                    is_weight=a.part(s.is_weight) if a.weighted else None,
                                    rewards=a.part(batch.rewards), group=group,
                                    side=a.part(side))
             for a in arms]
    return {k: torch.cat([x[k] for x in stats]) for k in stats[0]}


def _keep(kept, a, s, side=None):
    """keep_log_ratios: append, per run of arm `a`, the token log ρ and (gate, A) of the real
    tokens in `s` (a _Seen)."""
    b = diagnostics.Batch(a.m, a.part(s.logp), a.part(s.logp_old), a.part(s.adv),
                          a.part(s.mask), side=a.part(side))
    gate = b.gate if callable(getattr(a.m, "gate", None)) else None
    for r, (log_ratios, gates) in enumerate(kept[a.rows]):
        real = b.mask[r]
        log_ratios.append(b.token_log_ratio[r][real].float().cpu())
        if gate is not None:
            gates.append((gate[r][real].float().cpu(), b.adv[r][real].float().cpu()))


def _staleness(updates, versions, n_updates, n_seeds):
    """Each run's mean staleness over the step's updates: how many updates its behaviour policy
    was behind, averaged over the updates (arm-major, one value per run)."""
    stale = [float(updates - v - (n_updates + 1) / 2) for v in versions]
    return torch.tensor(stale).repeat_interleave(n_seeds)


def _side_reader(arms, seeds, dev):
    """side_of(entropy, behaviour log-probs): the lab's SideInfo (`lab_side`, run r drawing from
    its own generator) when an arm's method reads side information, else None."""
    if not any(getattr(a.m, "side_inputs", ()) for a in arms):
        return lambda ent, sampled: None
    draws = [torch.Generator(device=dev).manual_seed(s + _DRAW_SEED) for s in seeds]
    return lambda ent, sampled: lab_side(ent, sampled, draws)


def _moe_routing(arms, cfg, seeds, dev):
    """rlgates.moe.LabRouting for a config with `moe` set, else None."""
    if cfg.moe is None:
        return None
    from ..moe import LabRouting
    return LabRouting(cfg, seeds, dev, anchors={a.config.anchor for a in arms})


def _rollout_info(step, version, batch):
    """The hook's view of a rollout; a single run's tensors without the runs dimension."""
    one = (lambda x: x[0]) if len(batch.tokens) == 1 else (lambda x: x)
    return {"step": step, "version": version, "prompts": one(batch.prompts),
            "tokens": one(batch.tokens), "logp_behaviour": one(batch.logp)}


def _ignore(*_args):
    """A hook or progress printer that does nothing."""


@contextlib.contextmanager
def _threads(cfg):
    """torch's CPU threads at `cfg.threads` during a run on the CPU, restored after."""
    threads = torch.get_num_threads()
    if cfg.threads and torch.device(cfg.device).type == "cpu":
        torch.set_num_threads(cfg.threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _progress(plan, progress):
    """The step printer of `train(progress=)`: every few steps (True: about 5 a call; an int:
    every that many), or silent (False)."""
    steps = plan.config.steps
    every = (max(1, steps // 5) if progress is True else int(progress)) if progress else 0
    if not every:
        return _ignore
    lags = sorted({a.lag for a in plan.arms})
    label = (f"[{', '.join(map(str, plan.labels))} lag {', '.join(map(str, lags))}, "
             f"{len(plan.all_seeds)} runs]")
    t0 = time.perf_counter()

    def show(step, row):
        if (step + 1) % every == 0 or step + 1 == steps:
            print(f"{label} step {step + 1:>4}/{steps}: reward {float(row['reward'].mean()):.3f}"
                  f", max |log ρ| {float(row['log_ratio_absmax'].max()):.2f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return show


def _results(a, seeds, table, kept):
    """Arm a's [LabResult per seed]: its rows of the metrics `table` ({key: [R, steps]}; a
    critic's only for a critic arm) and, with keep_log_ratios, of `kept`."""
    keys = [k for k in table if a.config.advantage == "gae" or k not in CRITIC_METRICS]
    return [LabResult(method_name(a.m), s, a.lag, a.agg, a.config,
                      {k: table[k][r].tolist() for k in keys},
                      *(kept[r] if kept is not None else (None, None)))
            for r, s in zip(range(a.rows.start, a.rows.stop), seeds, strict=True)]


__all__ = [
    "ARM_FIELDS", "Arm", "LAB_METRICS", "LabConfig", "LabResult", "Rollout", "default_agg",
    "method_name", "metric_doc", "resolve", "rollout", "run_many", "summed_loss", "train",
]
