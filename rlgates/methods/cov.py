"""Tokens picked by the batch covariance of (log π, A): Clip-Cov and KL-Cov (verl's `clip_cov`
and `kl_cov`).

    cov_t = (log π_t − mean log π)·(A_t − mean A)        means over the batch's real tokens

A token with a large cov_t is one whose update lowers the policy's entropy most (Cui et al.
2025). Clip-Cov drops a few such tokens from the gradient; KL-Cov pulls them back towards π_old
with a penalty on |log ρ|. Which tokens are picked is a property of the whole batch, not of one
token's (ρ, A): the pick is a side input (`SideInfo.picked`), which the loss derives from the
covariance (`SideInfo.cov`, from the batch) and, for Clip-Cov's random choice, `SideInfo.draw`.
"""

from __future__ import annotations

import torch

from .. import _numerics as nx
from .. import _side
from ._base import Method, _hparam, register
from .clip import SignClip

_PAPER = ("Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning "
          "Language Models, arXiv:2505.22617")


def pick_count(ratio, mask):
    """max(⌊ratio·N⌋, 1), N the batch's real tokens: how many tokens verl's covariance rules
    pick (one below 1/ratio tokens: at the default 2e-4, fewer than 5,000)."""
    return max(int(ratio * int(mask.sum())), 1)


class _CovPick(Method):
    """What Clip-Cov and KL-Cov share: the side input `picked`, derived per batch."""

    chapter = 18
    side_inputs = ("picked",)
    agg = "token-mean"
    agg_source = ("verl's clip_cov and kl_cov follow the actor's loss_agg_mode, whose default "
                  "is token-mean; the paper's code is verl's.")
    explorer = None  # the gate reads the batch's pick: not a function of (ρ, A) alone

    def _derive_side(self, logp, logp_old, adv, mask, side):
        if side.picked is not None:
            return side
        real = None  # (indices, values) of the real tokens' covariances, when computed here
        if side.cov is None:  # the flat list is kept for the pick: no second nonzero
            real = _side.real_cov(logp, adv, mask)
            cov = _side.batch_cov(logp, adv, mask, real)
        else:
            cov = side.cov.to(logp.dtype).expand_as(logp)
        return side.replace(cov=cov, picked=self.pick(logp, logp_old, adv, mask, cov, side, real))


@register
class ClipCov(_CovPick, SignClip):
    """Clip-Cov: DAPO's clip, and a few tokens of high covariance dropped from the gradient.

    verl's clip_cov: the candidates are the real tokens that PPO's clip has not already clipped
    and whose covariance lies strictly inside the band (cov_low, cov_high); it drops
    max(⌊cov_ratio·N⌋, 1) of them, N the real tokens, chosen at random (an unseeded
    `torch.randperm`): exactly one below 1/cov_ratio = 5,000 tokens. Here the choice takes the
    candidates with the smallest `side.draw` keys (a uniform draw per token: a random
    permutation's law), so a given draw makes it reproducible; `side.picked` may also be given
    outright. The gate is DAPO's, 0 on a picked token; there the value is 0 too.

    Defaults: verl 0.9.1's actor config, which agrees with its code's fallbacks: clip_ratio_low
    = clip_ratio_high = 0.2, clip_cov_ratio = 2e-4, clip_cov_lb = 1, clip_cov_ub = 5. verl's
    means carry its masked_mean's 1e-8 in the token count, a relative change of 1e-8/N that
    moves a token across the band only if its covariance lies that close to an edge; and verl
    does not clamp log ρ (rlgates clamps it at ±20, as everywhere).
    """

    name, title, date, order = "clip_cov", "Clip-Cov", "May 2025", 32
    paper = _PAPER
    defaults = {"eps_low": 0.2, "eps_high": 0.2, "cov_ratio": 2e-4, "cov_low": 1.0,
                "cov_high": 5.0}
    trainer_flags = {
        "verl": {"loss_mode": "clip_cov", "clip_ratio_low": "eps_low",
                 "clip_ratio_high": "eps_high", "clip_cov_ratio": "cov_ratio",
                 "clip_cov_lb": "cov_low", "clip_cov_ub": "cov_high",
                 "loss_agg_mode": "token-mean"},
        "trl": None,
    }
    color = "#9467bd"
    log_ratio_lim = 0.6
    slider_ranges = {"eps_low": (0.0, 0.95, 0.005), "eps_high": (0.0, 1.0, 0.005),
                     "cov_ratio": (1e-4, 0.05, 1e-4), "cov_low": (0.0, 5.0, 0.1),
                     "cov_high": (0.5, 10.0, 0.1)}
    f_latex = (r"(1-P_t)\begin{cases}\min(\rho_t,\,1+\epsilon_h) & A_t>0\\"
               r"\max(\rho_t,\,1-\epsilon_l) & A_t\le 0\end{cases}")
    gate_latex = (r"(1-P_t)\big(\mathrm{1}[A_t>0,\ \rho_t<1+\epsilon_h]"
                  r"+\mathrm{1}[A_t<0,\ \rho_t>1-\epsilon_l]\big)")
    gate_text = "DAPO's, and 0 on the picked tokens P (high covariance, random)"
    insight = (
        "Entropy collapses through a few tokens whose log-probability and advantage move "
        "together; dropping a random few of them keeps exploration alive."
    )

    def _validate(self):
        super()._validate()
        h = self.hparams
        h["cov_ratio"] = _hparam(self.name, "cov_ratio", h["cov_ratio"], low=0, low_open=True)
        if h["cov_ratio"] > 1:
            raise ValueError(f"clip_cov: cov_ratio must be ≤ 1, got {h['cov_ratio']!r}")
        h["cov_low"] = _hparam(self.name, "cov_low", h["cov_low"])
        h["cov_high"] = _hparam(self.name, "cov_high", h["cov_high"])
        if not h["cov_low"] < h["cov_high"]:
            raise ValueError(f"clip_cov: cov_low must be < cov_high, got {h['cov_low']!r} and "
                             f"{h['cov_high']!r}")

    def candidates(self, logp, logp_old, adv, mask, cov):
        """The tokens Clip-Cov may drop: real, not clipped by PPO's clip (its clipped branch
        strictly larger, as verl's `clip_by_origin`), covariance inside the band."""
        ratio = nx.ratio_from_log(nx.token_log_ratio(logp.detach(), logp_old, mask))
        clipped = -adv * torch.clamp(ratio, self.low, self.high) > -adv * ratio
        band = (cov > self.hparams["cov_low"]) & (cov < self.hparams["cov_high"])
        return mask & ~clipped & band

    def pick(self, logp, logp_old, adv, mask, cov, side, real=None):
        """The `pick_count` candidates with the smallest draws (ties: the earlier token).
        `real`: unused (the candidates are not the real tokens)."""
        if side.draw is None:
            raise _side.MissingSide(
                self.name, "draw", "clip_cov picks tokens at random: sideinfo.draw (a uniform "
                "key per token, the smallest picked) was not given. Pass side=rlgates."
                "SideInfo(draw=torch.rand(logp.shape)), or the pick itself as picked=...")
        can = self.candidates(logp, logp_old, adv, mask, cov).flatten()
        # sort the candidates' keys only (a few of the batch's tokens), in token order: the
        # stable sort then breaks ties by the earlier token, as a sort of all keys would
        index = can.nonzero().squeeze(-1)
        keys = side.draw.to(logp.dtype).expand_as(logp).reshape(-1)[index]
        count = pick_count(self.hparams["cov_ratio"], mask)
        picked = torch.zeros_like(can)
        picked[index[torch.sort(keys, stable=True).indices[:count]]] = True
        return picked.view_as(mask)

    def _weight(self, ratio, adv, side=None):
        return torch.where(side.picked, 0.0, SignClip._weight(self, ratio, adv))

    def _gate(self, ratio, adv, side=None):
        return torch.where(side.picked, 0.0, SignClip._gate(self, ratio, adv))


@register
class KLCov(_CovPick):
    """KL-Cov: no clip at all, and a penalty κ·|log ρ| on the tokens of highest covariance.

    verl's kl_cov: every token's loss is −A·ρ (REINFORCE's f = ρ, unclipped); the
    max(⌊cov_ratio·N⌋, 1) real tokens with the largest covariance (`torch.topk`) get
    +κ·|log ρ|. So a picked token's objective is J = A·ρ − κ·|log ρ|, its gradient coefficient
    A·ρ − κ·sign(log ρ), and its gate f' = 1 − κ·sign(log ρ)/(ρ·A): below 1 (even negative, a
    pull back) when the token has moved the way A pushes it, above 1 when it has moved against.
    At A = 0 the penalty still pulls (the loss has it: J = −κ·|log ρ|) but no f(ρ; A)·A can
    write it: there `weight` and `gate` give REINFORCE's f = ρ and f' = 1 (signal 0), and only
    `loss` and `grad_coefficient` carry the pull. The template bends here.

    Defaults: verl 0.9.1's actor config: kl_cov_ratio = 2e-4 and ppo_kl_coef = 0.1. verl's code
    falls back to ppo_kl_coef = 1.0 when the config has none; its actor config always has 0.1.
    The covariance is `SideInfo.cov`, computed as verl's kl_cov does (plain means over the real
    tokens). verl does not clamp log ρ (rlgates clamps it at ±20).
    """

    name, title, date, order = "kl_cov", "KL-Cov", "May 2025", 33
    paper = _PAPER
    defaults = {"cov_ratio": 2e-4, "kl_coef": 0.1}
    trainer_flags = {
        "verl": {"loss_mode": "kl_cov", "kl_cov_ratio": "cov_ratio", "ppo_kl_coef": "kl_coef",
                 "loss_agg_mode": "token-mean"},
        "trl": None,
    }
    color = "#17a768"
    log_ratio_lim = 1.0
    slider_ranges = {"cov_ratio": (1e-4, 0.05, 1e-4), "kl_coef": (0.0, 2.0, 0.01)}
    param_labels = {**Method.param_labels, "kl_coef": "κ"}
    f_latex = r"\rho_t-P_t\,\kappa\,\lvert\log\rho_t\rvert/A_t"
    gate_latex = r"1-P_t\,\kappa\,\operatorname{sign}(\log\rho_t)/(\rho_t A_t)"
    gate_text = "1, and 1 − κ·sign(log ρ)/(ρA) on the picked tokens P (top covariance)"
    insight = (
        "No clip: every token passes, and only the few whose log-probability and advantage "
        "move together most are pulled back towards π_old."
    )

    def _validate(self):
        h = self.hparams
        h["cov_ratio"] = _hparam(self.name, "cov_ratio", h["cov_ratio"], low=0, low_open=True)
        if h["cov_ratio"] > 1:
            raise ValueError(f"kl_cov: cov_ratio must be ≤ 1, got {h['cov_ratio']!r}")
        h["kl_coef"] = _hparam(self.name, "kl_coef", h["kl_coef"], low=0)
        self.kl_coef = h["kl_coef"]

    def pick(self, logp, logp_old, adv, mask, cov, side, real=None):
        """The `pick_count` real tokens of largest covariance (torch.topk, as verl). `real`:
        the real tokens' flat indices and covariances, when the caller has them (`real_cov`)."""
        picked = torch.zeros_like(mask)
        if not bool(mask.any()):
            return picked
        if real is None:
            index = mask.flatten().nonzero().squeeze(-1)
            real = index, cov.flatten()[index]
        index, values = real
        top = torch.topk(values, pick_count(self.hparams["cov_ratio"], mask))
        picked.view(-1)[index[top.indices]] = True
        return picked

    def _weight(self, ratio, adv, side=None):
        safe = torch.where(adv == 0, 1.0, adv)
        pulled = ratio - self.kl_coef * ratio.log().abs() / safe
        return torch.where(side.picked & (adv != 0), pulled, ratio)

    def _gate(self, ratio, adv, side=None):
        safe = torch.where(adv == 0, 1.0, adv)
        pulled = 1 - self.kl_coef * torch.sign(ratio.log()) / (ratio * safe)
        return torch.where(side.picked & (adv != 0), pulled, 1.0)

    def token_objective(self, logp, logp_old, adv, mask, side=None):
        """verl's J_t = A·ρ − P_t·κ·|log ρ|, exact at A = 0 too."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        penalty = self.kl_coef * log_ratio.clamp(-nx.LOG_RATIO_CLAMP, nx.LOG_RATIO_CLAMP).abs()
        return adv * nx.ratio_from_log(log_ratio) - torch.where(side.picked, penalty, 0.0)

    def grad_coefficient(self, logp, logp_old, adv, mask, side=None):
        """A·ρ − P_t·κ·sign(log ρ), zero where the ±20 clamp of log ρ is active."""
        log_ratio = nx.token_log_ratio(logp, logp_old, mask)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        ratio = nx.ratio_from_log(log_ratio)
        pulled = side.picked.to(ratio.dtype)
        return (adv * ratio - pulled * self.kl_coef * torch.sign(log_ratio)) * inside
