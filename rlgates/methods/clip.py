"""Hard clips whose open side depends on the sign of A: PPO, GRPO, DAPO, GSPO and dual-clip PPO.

    f  = min(ρ, 1+ε_h) if A > 0, else max(ρ, 1−ε_l)
    f' = 1[A>0, ρ<1+ε_h] + 1[A<0, ρ>1−ε_l]        (0 exactly at an edge, and at A = 0)

PPO and GRPO use one ε for both edges; GSPO applies the gate once per sequence, at ρ_s; dual-clip
adds a ceiling c for A < 0.
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from ._base import Method, _hparam, _window, register

_SIGN_CLIP_JS = {
    "gate": "(a > 0 && r < 1 + p.eps_high) || (a < 0 && r > 1 - p.eps_low) ? 1 : 0",
    "bounds": "[[1 + p.eps_high, 1], [1 - p.eps_low, -1]]",
}


class SignClip(Method):
    """PPO's clip, with separate lower and upper edges (DAPO, GSPO).

    f = min(ρ, 1+ε_h) if A > 0, else max(ρ, 1−ε_l);
    f' = 1[A>0, ρ<1+ε_h] + 1[A<0, ρ>1−ε_l]  (zero at the edges and at A = 0).
    """

    hard = True
    defaults = {"eps_low": 0.2, "eps_high": 0.28}
    slider_ranges = {"eps_low": (0.0, 0.95, 0.005), "eps_high": (0.0, 1.0, 0.005)}
    explorer = _SIGN_CLIP_JS

    def _validate(self):
        self.low, self.high = _window(self)

    def _weight(self, ratio, adv, side=None):
        # torch.where, not min/max or clamp: autograd's derivative at an edge is then exactly the
        # strict gate's 0 (the constant branch is selected there)
        pos = adv > 0
        inside = torch.where(pos, ratio < self.high, ratio > self.low)
        edge = torch.where(pos, ratio.new_tensor(self.high), ratio.new_tensor(self.low))
        return torch.where(inside, ratio, edge)

    def _gate(self, ratio, adv, side=None):
        open_pos = (adv > 0) & (ratio < self.high)
        open_neg = (adv < 0) & (ratio > self.low)
        return (open_pos | open_neg).to(ratio.dtype)

    def bounds(self):
        return [(self.high, +1)] + ([(self.low, -1)] if self.low > 0 else [])


@register
class PPO(SignClip):
    name, title, date, order = "ppo", "PPO", "July 2017", 1
    article_row = 1  # its row in the article's Table 1
    paper = "Schulman et al. 2017, Proximal Policy Optimization Algorithms, arXiv:1707.06347"
    defaults = {"eps": 0.2}
    agg_source = ("PPO averages the clipped objective over every sampled timestep: the token "
                  "mean. verl's default loss_agg_mode is token-mean too.")
    trainer_flags = {  # a str value names a hyperparameter; see rlgates.trainers.flags
        "verl": {"loss_mode": "vanilla", "clip_ratio_low": "eps", "clip_ratio_high": "eps",
                 "clip_ratio_c": float("inf"), "loss_agg_mode": "token-mean"},
        "trl": {"loss_type": "dapo", "epsilon": "eps", "epsilon_high": "eps",
                "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        "openrlhf": {"actor.policy_loss_type": "ppo",
                     "actor.eps_clip_low_high": lambda h: (h["eps"], h["eps"]),
                     "actor.loss_agg_mode": "token-mean"},
        "areal": {"actor.eps_clip": "eps", "actor.importance_sampling_level": "token"},
    }
    color = "#1b9e77"
    slider_ranges = {"eps": (0.01, 0.6, 0.01)}
    explorer = {
        "gate": "(a > 0 && r < 1 + p.eps) || (a < 0 && r > 1 - p.eps) ? 1 : 0",
        "bounds": "[[1 + p.eps, 1], [1 - p.eps, -1]]",
    }
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon) & A_t>0\\"
               r"\max(\rho_t,\,1-\epsilon) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon]"
                  r"\\+\,\mathbf{1}[A_t<0,\ \rho_t>1-\epsilon]\end{gathered}")
    gate_text = "1[A>0, ρ<1+ε] + 1[A<0, ρ>1−ε]"
    insight = (
        "A hard gate whose open side depends on the sign of A: a token stops once it has "
        "moved far enough."
    )

    def _validate(self):
        eps = _hparam(self.name, "eps", self.hparams["eps"], low=0, below=1)
        self.hparams["eps"] = eps
        self.low, self.high = 1 - eps, 1 + eps


@register
class GRPO(PPO):
    name, title, date, order = "grpo", "GRPO", "February 2024", 2
    article_row = 1  # shares PPO's row
    paper = "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300"
    agg = "seq-mean-token-mean"
    agg_source = ("DeepSeekMath's GRPO objective is (1/G) Σ_i (1/|o_i|) Σ_t: the mean over "
                  "responses of each response's token mean. verl's default loss_agg_mode is "
                  "token-mean, so GRPO run with verl's defaults weighs responses by length.")
    trainer_flags = {
        "verl": {"loss_mode": "vanilla", "clip_ratio_low": "eps", "clip_ratio_high": "eps",
                 "clip_ratio_c": float("inf"), "loss_agg_mode": "seq-mean-token-mean"},
        "trl": {"loss_type": "grpo", "epsilon": "eps", "epsilon_high": "eps",
                "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        "openrlhf": {"actor.policy_loss_type": "ppo",
                     "actor.eps_clip_low_high": lambda h: (h["eps"], h["eps"]),
                     "actor.loss_agg_mode": "seq-mean-token-mean"},
        # AReaL has only the step's token mean: PPO's settings, not GRPO's aggregation
        "areal": {"actor.eps_clip": "eps", "actor.importance_sampling_level": "token"},
    }
    color = "#d95f02"
    gate_text = "PPO's"
    insight = (
        "PPO's gate unchanged; what is new is the advantage, normalised within a group of "
        "G samples."
    )


@register
class DAPO(SignClip):
    name, title, date, order = "dapo", "DAPO", "March 2025", 3
    article_row = 2  # its row in the article's Table 1
    paper = "Yu et al. 2025, DAPO, arXiv:2503.14476"
    agg_source = ("DAPO's token-level policy-gradient loss: the sum over every token of the "
                  "batch divided by the batch's token count.")
    trainer_flags = {
        "verl": {"loss_mode": "vanilla", "clip_ratio_low": "eps_low",
                 "clip_ratio_high": "eps_high", "clip_ratio_c": float("inf"),
                 "loss_agg_mode": "token-mean"},
        "trl": {"loss_type": "dapo", "epsilon": "eps_low", "epsilon_high": "eps_high",
                "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        "openrlhf": {"actor.policy_loss_type": "ppo",
                     "actor.eps_clip_low_high": lambda h: (h["eps_low"], h["eps_high"]),
                     "actor.loss_agg_mode": "token-mean"},
        "areal": {"actor.eps_clip": "eps_low", "actor.eps_clip_higher": "eps_high",
                  "actor.importance_sampling_level": "token"},
    }
    color = "#7570b3"
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon_h) & A_t>0\\"
               r"\max(\rho_t,\,1-\epsilon_l) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon_h]"
                  r"\\+\,\mathbf{1}[A_t<0,\ \rho_t>1-\epsilon_l]\end{gathered}")
    gate_text = "1[A>0, ρ<1+ε_h] + 1[A<0, ρ>1−ε_l]"
    insight = (
        "Clip-higher: a larger ε_h keeps the gate open longer for tokens the policy is "
        "learning to prefer, often rare ones."
    )


@register
class GSPO(SignClip):
    """DAPO's gate applied once per sequence, at the geometric-mean ratio ρ_s.

    The loss uses GSPO-token's form (as trainers write it): token t sees
    s_t = exp(logp_t − sg(logp_t) + sg(log ρ_s)), whose value is ρ_s and whose gradient carries
    token t's own ∇log π. With one advantage per sequence this equals GSPO exactly.

    Advantages per token ([B, T], e.g. from GAE): each token is gated at (ρ_s, A_t), so one
    response can have tokens shut (A_t > 0 past 1 + ε_h) beside tokens open (A_t < 0), and
    token t's gradient is −w_t·f'(ρ_s; A_t)·ρ_s·A_t: GSPO-token as its paper defines it, and
    verl's gspo. TRL's importance_sampling_level="sequence" has the same loss value but
    differentiates through ρ_s, so every token of a response gets that response's mean of
    these gradients (tests/test_per_token.py). ρ_s is taken over the mask's tokens only: a
    multi-turn response's tool tokens (mask 0) do not enter it.
    """

    name, title, date, order, level = "gspo", "GSPO", "July 2025", 6, "sequence"
    article_row = 3  # its row in the article's Table 1
    paper = "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071"
    defaults = {"eps_low": 3e-4, "eps_high": 4e-4}
    agg = "seq-mean-token-mean"
    agg_source = ("GSPO's objective is a mean over the G responses, each weighted once. Neither "
                  "trainer does this by default: verl's gspo loss follows the actor's "
                  "loss_agg_mode (default token-mean), and TRL's sequence-level ratio under its "
                  "default loss_type 'dapo' weighs each response by its length. Set "
                  "loss_agg_mode=seq-mean-token-mean in verl, loss_type='grpo' in TRL.")
    trainer_flags = {
        "verl": {"loss_mode": "gspo", "clip_ratio_low": "eps_low", "clip_ratio_high": "eps_high",
                 "loss_agg_mode": "seq-mean-token-mean"},
        "trl": {"loss_type": "grpo", "epsilon": "eps_low", "epsilon_high": "eps_high",
                "importance_sampling_level": "sequence"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        # OpenRLHF's gspo forces the per-sample mean; AReaL's sequence level is token-mean
        "openrlhf": {"actor.policy_loss_type": "gspo",
                     "actor.eps_clip_low_high": lambda h: (h["eps_low"], h["eps_high"])},
        "areal": {"actor.eps_clip": "eps_low", "actor.eps_clip_higher": "eps_high",
                  "actor.importance_sampling_level": "sequence"},
    }
    color = "#a6761d"
    log_ratio_lim = 1.5e-3
    slider_ranges = {"eps_low": (0.0, 2e-3, 1e-5), "eps_high": (0.0, 2e-3, 1e-5)}
    f_latex = (r"\begin{cases}\min(\rho_s,\,1+\epsilon_h) & A_s>0\\"
               r"\max(\rho_s,\,1-\epsilon_l) & A_s\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_s>0,\ \rho_s<1+\epsilon_h]"
                  r"\\+\,\mathbf{1}[A_s<0,\ \rho_s>1-\epsilon_l]\end{gathered}")
    gate_text = "DAPO's, at the sequence ratio ρ_s (geometric mean)"
    insight = (
        "Accept or reject whole responses, judged by their geometric-mean ratio, with a "
        "tiny ε."
    )

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        seq = nx.sequence_log_ratio(logp.detach(), logp_old, mask)
        log_s = logp - logp.detach() + seq[:, None]  # value log ρ_s, gradient ∇log π_t
        return self._weight(nx.ratio_from_log(log_s), adv) * adv


@register
class DualClip(PPO):
    """Dual-clip PPO: PPO's clip, plus a cap c on the loss of negative-advantage tokens.

    For A < 0 PPO's loss −A·max(ρ, 1−ε) = −A·ρ grows without bound in ρ; dual-clip caps it at
    −c·A (trainers write min(−c·A, PPO's loss)). So f = min(max(ρ, 1−ε), c) for A ≤ 0, and
    the gate closes again once ρ ≥ c. At the edges ρ = 1±ε and ρ = c the gate is 0, as in Part I.
    """

    name, title, date, order = "dual_clip", "Dual-clip PPO", "December 2019", 7
    article_row = None  # not in the article (the attribute would be inherited from PPO)
    paper = ("Ye et al. 2020, Mastering Complex Control in MOBA Games with Deep Reinforcement "
             "Learning, arXiv:1912.09729")
    defaults = {"eps": 0.2, "c": 3.0}
    agg = "token-mean"
    agg_source = ("verl's default policy loss ('vanilla') is dual-clip PPO with c = 3 and "
                  "loss_agg_mode token-mean.")
    trainer_flags = {
        "verl": {"loss_mode": "vanilla", "clip_ratio_low": "eps", "clip_ratio_high": "eps",
                 "clip_ratio_c": "c", "loss_agg_mode": "token-mean"},
        # TRL's delta caps ρ for both signs of A: dual-clip only while c > 1 + ε (at c ≤ 1 + ε it
        # would also cap the A > 0 tokens, which dual-clip leaves to PPO's clip)
        "trl": lambda h: None if h["c"] <= 1 + h["eps"] else {
            "loss_type": "dapo", "epsilon": h["eps"], "epsilon_high": h["eps"], "delta": h["c"],
            "importance_sampling_level": "token"},
        # OpenRLHF 0.11.2 (train_ppo_ray.py options), AReaL 1.0.4 (PPOActorConfig fields)
        # both assert c > 1 (PolicyLoss.__init__, ppo_actor_loss_fn)
        "openrlhf": lambda h: None if h["c"] <= 1 else {
            "actor.policy_loss_type": "ppo", "actor.eps_clip_low_high": (h["eps"], h["eps"]),
            "actor.dual_clip": h["c"], "actor.loss_agg_mode": "token-mean"},
        "areal": lambda h: None if h["c"] <= 1 else {
            "actor.eps_clip": h["eps"], "actor.c_clip": h["c"],
            "actor.importance_sampling_level": "token"},
    }
    color = "#666666"
    log_ratio_lim = 1.5
    slider_ranges = {"eps": (0.01, 0.6, 0.01), "c": (1.05, 10.0, 0.05)}
    explorer = {
        "gate": "(a > 0 && r < 1 + p.eps) || (a < 0 && r > 1 - p.eps && r < p.c) ? 1 : 0",
        "bounds": "[[1 + p.eps, 1], [1 - p.eps, -1], [p.c, -1]]",
    }
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon) & A_t>0\\"
               r"\min\!\big(\max(\rho_t,\,1-\epsilon),\,c\big) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon]"
                  r"\\+\,\mathbf{1}[A_t<0,\ 1-\epsilon<\rho_t<c]\end{gathered}")
    gate_text = "PPO's, and 0 for A<0 once ρ ≥ c"
    insight = (
        "PPO plus a ceiling for bad tokens: a negative-advantage token whose ratio has run past c "
        "stops pushing, so one stale token cannot dominate the batch."
    )

    def _validate(self):
        super()._validate()
        self.hparams["c"] = _hparam(self.name, "c", self.hparams["c"], low=1, low_open=True)
        self.c = self.hparams["c"]

    def _weight(self, ratio, adv, side=None):
        # torch.where with a constant branch, so that autograd's derivative at ρ = c is the gate's 0
        upper = torch.where(ratio < self.high, ratio, self.high)
        lower = torch.where(ratio > self.low, ratio, self.low)
        capped = torch.where(ratio < self.c, lower, self.c)
        return torch.where(adv > 0, upper, capped)

    def _gate(self, ratio, adv, side=None):
        open_pos = (adv > 0) & (ratio < self.high)
        open_neg = (adv < 0) & (ratio > self.low) & (ratio < self.c)
        return (open_pos | open_neg).to(ratio.dtype)

    def bounds(self):
        lower = [(self.low, -1)] if self.low > 0 else []
        return [(self.high, +1), *lower, (self.c, -1)]
