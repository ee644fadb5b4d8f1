"""A critic in the lab: PPO's per-token advantages from a value model, beside GRPO's group ones.

An arm whose config has `advantage="gae"` trains a value model of its own (`LabCritic`, one per
run) beside its policy, as verl's PPO does (`algorithm.adv_estimator="gae"`):

- ROLLOUT: the critic scores the rollout, V_old [B, T]; each response's reward sits on its last
  real token (`advantages.outcome_rewards`), minus β·KL to the initial policy on every token when
  `kl_coef` > 0 (`advantages.kl_penalised_rewards`: verl's use_kl_in_reward); then
  `advantages.gae` gives the returns and the advantages, whitened over the run's real tokens
  (verl's compute_gae_advantage_return). The policy's loss sees these A [B, T], token by token.
- UPDATE: on each of the policy's minibatches, one step of the critic's own Adam (lr
  `critic_lr`, by default the policy's lr) on `advantages.value_loss` (clipped at
  V_old ± `cliprange_value`, aggregated as the arm's policy loss, as verl's critic follows the
  actor's loss_agg_mode), its gradient norm clipped per run like the policy's.
- METRICS: `CRITIC_METRICS`, on the critic arms' runs only.

Every run has its own critic weights and Adam state, so run r still equals run r trained alone
(tested). An arm with `advantage="group"` is untouched: when a call has both kinds, the group
advantages are repeated on every token ([R, B, T]) so that one tensor holds both.
"""

from __future__ import annotations

import math

import torch

from ..advantages import (
    KL_REWARD_ESTIMATORS,
    gae,
    kl_penalised_rewards,
    masked_whiten,
    outcome_rewards,
    value_clip_fraction,
    value_loss,
)
from ..policy import LabPolicy
from ._optim import _adam, _clip_grad_norm_per_run

#: Where A comes from (`LabConfig.advantage`).
ADVANTAGES = ("group", "gae")

#: The critic arms' own per-step numbers (`lab.metric_doc(critic=True)`).
CRITIC_METRICS = {
    "vf_loss": "the critic's clipped value loss, mean over the step's updates (verl's "
               "critic/vf_loss)",
    "vf_clipfrac": "share of real tokens whose value-loss gate is shut, mean over the step's "
                   "updates (verl's critic/vf_clipfrac), read before clipping",
    "vf_explained_var": "1 − Var(R − V_old) / Var(R) over the rollout's real tokens, R the GAE "
                        "returns (verl's critic/vf_explained_var)",
    "adv_mixed": "share of responses whose per-token advantages take both signs",
    "kl_ref": "mean per-token KL estimate to the initial policy in the reward (NaN when "
              "kl_coef = 0)",
}


class LabCritic(LabPolicy):
    """R independent value models: the lab policy's network with a scalar value head in place of
    its language-model head.

    Run r's body starts as a copy of run r's policy (its own weights from then on: nothing is
    shared), as verl's critic starts from the actor's checkpoint; the value head starts at 0, so
    V ≡ 0 before the first update. `values(prompt, response)` is V_t, the value of the state
    that token t is drawn in (the prompt and y_<t): [R, B, T] from prompt [R, B, motif] and
    response [R, B, T].
    """

    def __init__(self, seeds=(0,), vocab=16, hidden=32, length=8, motif=2):
        super().__init__(seeds, vocab, hidden, length, motif)
        del self.w_head, self.b_head  # a value model has no token head
        self.w_value = torch.nn.Parameter(torch.zeros(len(self.seeds), hidden, 1))
        self.b_value = torch.nn.Parameter(torch.zeros(len(self.seeds), 1))

    def values(self, prompt, response):
        if response.dim() != 3:
            raise ValueError(f"response must be [R, B, T], got shape {tuple(response.shape)}")
        return self._linear(self.features(prompt, response), self.w_value, self.b_value)[..., 0]


def check_config(cfg):
    """Clear errors for the critic's fields of a LabConfig (any arm's)."""
    if cfg.advantage not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {ADVANTAGES}, got {cfg.advantage!r}")
    for name in ("gamma", "lam"):
        v = getattr(cfg, name)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {v!r}")
    if not (math.isfinite(cfg.cliprange_value) and cfg.cliprange_value >= 0):
        raise ValueError(f"cliprange_value must be finite and ≥ 0, got {cfg.cliprange_value!r}")
    if cfg.critic_lr is not None and not cfg.critic_lr > 0:
        raise ValueError(f"critic_lr must be > 0 (or None: the policy's lr), got "
                         f"{cfg.critic_lr!r}")
    if not (math.isfinite(cfg.kl_coef) and cfg.kl_coef >= 0):
        raise ValueError(f"kl_coef must be finite and ≥ 0, got {cfg.kl_coef!r}")
    if cfg.kl_coef and cfg.advantage != "gae":
        raise ValueError("kl_coef (the KL penalty in the reward) needs advantage='gae', got "
                         f"advantage={cfg.advantage!r}")
    if cfg.kl_penalty not in KL_REWARD_ESTIMATORS:
        raise ValueError(f"kl_penalty must be one of {tuple(KL_REWARD_ESTIMATORS)}, got "
                         f"{cfg.kl_penalty!r}")


def explained_variance(values, returns, mask):
    """verl's critic/vf_explained_var per run: 1 − Var(R − V) / (Var(R) + 1e-5) over each run's
    real tokens (unbiased variances). values, returns, mask: [R, B, T] → [R]."""
    out = []
    for v, r, m in zip(values, returns, mask, strict=True):
        ret, val = r[m], v[m]
        out.append(1.0 - (ret - val).var() / (ret.var() + 1e-5))
    return torch.stack(out)


def mixed_signs(adv, mask):
    """Per run, the share of responses whose advantages take both signs on their real tokens."""
    pos = ((adv > 0) & mask).any(-1)
    neg = ((adv < 0) & mask).any(-1)
    return (pos & neg).to(adv.dtype).mean(-1)


class _ArmCritic:
    """One critic arm's value models (one per run), optimiser and the step's state."""

    def __init__(self, arm, base, seeds, dev):
        self.cfg, self.rows, self.agg = arm.config, arm.rows, arm.agg
        dtype = getattr(torch, base.dtype)
        self.model = LabCritic(seeds, base.vocab, base.hidden, base.length, base.motif)
        self.model = self.model.to(dev, dtype)
        self.opt = _adam(self.model.parameters(), self.cfg.critic_lr or base.lr)
        self.max_grad_norm = base.max_grad_norm  # verl's critic.grad_clip: the actor's 1.0
        self.reference = None
        if self.cfg.kl_coef:  # the initial policy, frozen
            self.reference = base.policy(seeds).to(dev).requires_grad_(False)
        self.seen = []

    @torch.no_grad()
    def advantages(self, batch):
        """This arm's per-token A [R_a, B, T]; keeps V_old and the returns for its updates."""
        c, rows = self.cfg, self.rows
        prompts, tokens, mask = batch.prompts[rows], batch.tokens[rows], batch.mask[rows]
        shape, flat = tokens.shape, (lambda x: x.flatten(0, 1))
        self.values_old = self.model.values(prompts, tokens)
        scores = outcome_rewards(flat(batch.rewards[rows]), flat(mask))
        self.kl = torch.full(shape[:1], math.nan, dtype=self.values_old.dtype)
        if self.reference is not None:
            ref = self.reference.log_probs(tokens, prompts)
            shaped = kl_penalised_rewards(scores, flat(batch.logp[rows]), flat(ref), flat(mask),
                                          c.kl_coef, c.kl_penalty)
            k = ((scores - shaped) / c.kl_coef).view(shape)
            self.kl = ((k * mask).sum((1, 2)) / mask.sum((1, 2))).cpu()
            scores = shaped
        raw, returns = gae(scores, flat(self.values_old), flat(mask), c.gamma, c.lam)
        # whitened per run, over that run's real tokens (verl whitens over its batch)
        adv = torch.stack([masked_whiten(a, m) for a, m in zip(raw.view(shape), mask,
                                                                  strict=True)])
        self.returns = returns.view(shape)
        self.explained = explained_variance(self.values_old, self.returns, mask).cpu()
        self.mixed = mixed_signs(adv, mask).cpu()
        return adv

    def update(self, batch, idx):
        """One critic step on the policy's minibatch idx [R, b] (this arm's rows of it)."""
        c, rows = self.cfg, self.rows
        idx = idx[rows]
        runs = torch.arange(idx.shape[0], device=idx.device)[:, None]
        mask = batch.mask[rows][runs, idx]
        values = self.model.values(batch.prompts[rows][runs, idx], batch.tokens[rows][runs, idx])
        old, ret = self.values_old[runs, idx], self.returns[runs, idx]
        losses = torch.stack([value_loss(values[r], old[r], ret[r], mask[r], c.cliprange_value,
                                         self.agg) for r in range(len(values))])
        self.opt.zero_grad()
        losses.sum().backward()  # each run's loss reaches only its own weights
        _clip_grad_norm_per_run(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        shut = torch.stack([value_clip_fraction(values[r].detach(), old[r], ret[r], mask[r],
                                                c.cliprange_value) for r in range(len(values))])
        self.seen.append((losses.detach().cpu(), shut.cpu()))

    def stats(self):
        loss, shut = (torch.stack(x, 1).mean(1) for x in zip(*self.seen, strict=True))
        self.seen = []
        return {"vf_loss": loss, "vf_clipfrac": shut, "vf_explained_var": self.explained,
                "adv_mixed": self.mixed, "kl_ref": self.kl}


class Critics:
    """Every critic arm of a batched call (`_ArmCritic`); with none, each call is a no-op."""

    def __init__(self, plan, base, all_seeds, dev):
        self.runs = len(all_seeds)
        self.arms = [_ArmCritic(a, base, all_seeds[a.rows], dev)
                     for a in plan if a.config.advantage == "gae"]

    def advantages(self, batch):
        """The rollout with each critic arm's per-token A in its rows (the others' group A
        repeated on every token); unchanged when no arm has a critic."""
        if not self.arms:
            return batch
        adv = batch.adv[..., None].expand(batch.tokens.shape).clone()
        for arm in self.arms:
            adv[arm.rows] = arm.advantages(batch).to(adv.dtype)
        return batch._replace(adv=adv)

    def update(self, batch, idx):
        for arm in self.arms:
            arm.update(batch, idx)

    def stats(self):
        """{key: [R]} of `CRITIC_METRICS`, NaN on the rows of arms without a critic."""
        if not self.arms:
            return {}
        out = {k: torch.full((self.runs,), math.nan, dtype=torch.float64)
               for k in CRITIC_METRICS}
        for arm in self.arms:
            for k, v in arm.stats().items():
                out[k][arm.rows] = v.double()
        return out


__all__ = ["ADVANTAGES", "CRITIC_METRICS", "Critics", "LabCritic",
           "check_config", "explained_variance", "mixed_signs"]
