"""The policy losses, each written as J = f(ρ; A)·A with its gate f'(ρ; A).

One class per shape of gate. `weight` (f) is the formula the loss differentiates through autograd;
`gate` (f') is its closed-form derivative, written separately so that the tests can check one
against the other (and both against finite differences and a trainer-style reference).
"""

from __future__ import annotations

import math

import torch

from . import _numerics as nx


def _hparam(method, name, value, *, low=None, low_open=False, below=None):
    """Validate one hyperparameter: a finite real number within the stated range."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{method}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{method}: {name} must be finite, got {value!r}")
    if low is not None and (v <= low if low_open else v < low):
        op = ">" if low_open else "≥"
        raise ValueError(f"{method}: {name} must be {op} {low}, got {value!r}")
    if below is not None and v >= below:
        raise ValueError(f"{method}: {name} must be < {below}, got {value!r}")
    return v


class Method:
    """Base class: a token objective J = f(ρ; A)·A and everything derived from it.

    Subclasses set the class attributes and implement `_weight` and `_gate` on float tensors.
    """

    name = ""  # registry name, lowercase
    title = ""  # display name
    date = ""  # when the paper appeared
    paper = ""  # citation with arXiv id
    level = "token"  # "token" or "sequence"
    defaults: dict = {}
    f_latex = ""
    gate_latex = ""
    insight = ""

    def __init__(self, **hparams):
        unknown = sorted(set(hparams) - set(self.defaults))
        if unknown:
            known = ", ".join(self.defaults) or "no hyperparameters"
            raise ValueError(f"{self.name}: unknown hyperparameter(s) {unknown}; it takes {known}")
        self.hparams = {**self.defaults, **hparams}
        self._validate()

    def _validate(self):
        pass

    # --- the elementwise functions of (ρ, A) ---------------------------------------------------
    def weight(self, ratio, adv):
        """f(ρ; A): the weight whose product with A is the token objective."""
        ratio, adv = self._lift(ratio, adv)
        return self._weight(ratio, adv)

    def gate(self, ratio, adv):
        """f'(ρ; A) = ∂f/∂ρ: how much of the shared term ρ·A·∇log π gets through."""
        ratio, adv = self._lift(ratio, adv)
        return self._gate(ratio, adv)

    def signal(self, ratio, adv):
        """The learning signal f'(ρ; A)·ρ·A: the gradient's coefficient on ∇log π."""
        ratio, adv = self._lift(ratio, adv)
        return self._gate(ratio, adv) * ratio * adv

    def objective(self, ratio, adv):
        """The token objective J = f(ρ; A)·A."""
        ratio, adv = self._lift(ratio, adv)
        return self._weight(ratio, adv) * adv

    @staticmethod
    def _lift(ratio, adv):
        ratio, adv = nx.as_float(ratio, "ratio"), nx.as_float(adv, "adv")
        dtype = nx.compute_dtype(ratio, adv)
        return ratio.to(dtype), adv.to(dtype)

    def bounds(self):
        """Hard gate edges for plots: [(ratio, side)], side +1 (A>0), -1 (A<0) or 0 (both)."""
        return []

    # --- the loss -------------------------------------------------------------------------------
    def token_objective(self, logp, logp_old, adv, mask):
        """[B, T] objective J_t, differentiable in logp. Inputs already checked and lifted."""
        # Padding may hold NaN or ±inf: `aggregate` drops it from the value, and the log-ratio
        # clamp's backward sends it zero gradient (NaN fails the clamp's range test), so the
        # token path needs no masking pass of its own (tested).
        ratio = nx.ratio_from_log(logp - logp_old)
        return self._weight(ratio, adv) * adv

    def loss(self, logp, logp_old, adv, mask=None, agg="token-mean"):
        """Minus the aggregated objective: a scalar whose gradient flows into `logp` only.

        logp, logp_old, mask: [B, T]; adv: [B] or [B, T]; agg: one of rlgates.AGG_MODES.
        """
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp, logp_old, adv, mask, agg)
        return -nx.aggregate(self.token_objective(logp, logp_old, adv, mask), mask, agg)

    def expected_grad(self, logp, logp_old, adv, mask=None, agg="token-mean"):
        """Closed-form ∂loss/∂logp = −f'(ρ; A)·ρ·A·w_t (eq. 5), w_t the aggregation weight.

        ρ is the ratio the gate sees (ρ_s for sequence-level methods). Where the log-ratio clamp
        is active the gradient is zero.
        """
        logp, logp_old, adv, mask = nx.check_loss_inputs(logp.detach(), logp_old, adv, mask, agg)
        log_ratio = nx.gate_log_ratio(logp, logp_old, mask, self.level)
        inside = log_ratio.abs() <= nx.LOG_RATIO_CLAMP
        ratio = nx.ratio_from_log(log_ratio)
        w = nx.aggregation_weight(mask, agg).to(logp.dtype)
        return -self._gate(ratio, adv) * ratio * adv * w * inside

    def __repr__(self):
        args = ", ".join(f"{k}={v:g}" for k, v in self.hparams.items())
        return f"rlgates.get({self.name!r}{', ' if args else ''}{args})"


class SignClip(Method):
    """PPO's clip, with separate lower and upper edges (DAPO, GSPO).

    f = min(ρ, 1+ε_h) if A > 0, else max(ρ, 1−ε_l);
    f' = 1[A>0, ρ<1+ε_h] + 1[A<0, ρ>1−ε_l]  (zero at the edges and at A = 0).
    """

    defaults = {"eps_low": 0.2, "eps_high": 0.28}

    def _validate(self):
        h = self.hparams
        h["eps_low"] = _hparam(self.name, "eps_low", h["eps_low"], low=0, below=1)
        h["eps_high"] = _hparam(self.name, "eps_high", h["eps_high"], low=0)
        self.low, self.high = 1 - h["eps_low"], 1 + h["eps_high"]

    def _weight(self, ratio, adv):
        # f = ρ inside the gate, else the edge on A's side. torch.where (not min/max or clamp)
        # makes autograd's derivative at an edge exactly the gate's (strict inequalities).
        pos = adv > 0
        inside = torch.where(pos, ratio < self.high, ratio > self.low)
        edge = torch.where(pos, ratio.new_tensor(self.high), ratio.new_tensor(self.low))
        return torch.where(inside, ratio, edge)

    def _gate(self, ratio, adv):
        open_pos = (adv > 0) & (ratio < self.high)
        open_neg = (adv < 0) & (ratio > self.low)
        return (open_pos | open_neg).to(ratio.dtype)

    def bounds(self):
        return [(self.high, +1), (self.low, -1)]


class PPO(SignClip):
    name, title, date = "ppo", "PPO", "July 2017"
    paper = "Schulman et al. 2017, Proximal Policy Optimization Algorithms, arXiv:1707.06347"
    defaults = {"eps": 0.2}
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon) & A_t>0\\"
               r"\max(\rho_t,\,1-\epsilon) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon]"
                  r"\\+\,\mathbf{1}[A_t<0,\ \rho_t>1-\epsilon]\end{gathered}")
    insight = (
        "A hard gate whose open side depends on the sign of A: a token stops once it has "
        "moved far enough."
    )

    def _validate(self):
        eps = _hparam(self.name, "eps", self.hparams["eps"], low=0, below=1)
        self.hparams["eps"] = eps
        self.low, self.high = 1 - eps, 1 + eps


class GRPO(PPO):
    name, title, date = "grpo", "GRPO", "February 2024"
    paper = "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300"
    insight = (
        "PPO's gate unchanged; what is new is the advantage, normalised within a group of "
        "G samples."
    )


class DAPO(SignClip):
    name, title, date = "dapo", "DAPO", "March 2025"
    paper = "Yu et al. 2025, DAPO, arXiv:2503.14476"
    f_latex = (r"\begin{cases}\min(\rho_t,\,1+\epsilon_h) & A_t>0\\"
               r"\max(\rho_t,\,1-\epsilon_l) & A_t\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_t>0,\ \rho_t<1+\epsilon_h]"
                  r"\\+\,\mathbf{1}[A_t<0,\ \rho_t>1-\epsilon_l]\end{gathered}")
    insight = (
        "Clip-higher: a larger ε_h keeps the gate open longer for tokens the policy is "
        "learning to prefer, often rare ones."
    )


class GSPO(SignClip):
    """DAPO's gate applied once per sequence, at the geometric-mean ratio ρ_s.

    The loss uses GSPO-token's form (as trainers write it): token t sees
    s_t = exp(logp_t − sg(logp_t) + sg(log ρ_s)), whose value is ρ_s and whose gradient carries
    token t's own ∇log π. With one advantage per sequence this equals GSPO exactly.
    """

    name, title, date, level = "gspo", "GSPO", "July 2025", "sequence"
    paper = "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071"
    defaults = {"eps_low": 3e-4, "eps_high": 4e-4}
    f_latex = (r"\begin{cases}\min(\rho_s,\,1+\epsilon_h) & A_s>0\\"
               r"\max(\rho_s,\,1-\epsilon_l) & A_s\le 0\end{cases}")
    gate_latex = (r"\begin{gathered}\mathbf{1}[A_s>0,\ \rho_s<1+\epsilon_h]"
                  r"\\+\,\mathbf{1}[A_s<0,\ \rho_s>1-\epsilon_l]\end{gathered}")
    insight = (
        "Accept or reject whole responses, judged by their geometric-mean ratio, with a "
        "tiny ε."
    )

    def _sequence_log_ratio_per_token(self, logp, logp_old, mask):
        seq = nx.sequence_log_ratio(logp.detach(), logp_old, mask)
        return logp - logp.detach() + seq[:, None]

    def token_objective(self, logp, logp_old, adv, mask):
        ratio = nx.ratio_from_log(self._sequence_log_ratio_per_token(logp, logp_old, mask))
        return self._weight(ratio, adv) * adv


class SAO(Method):
    """A top-hat trust region: f = clip(ρ, 1−ε_l, 1+ε_h) whatever the sign of A."""

    name, title, date = "sao", "SAO", "July 2026"
    paper = "Hou et al. 2026, Single-rollout Asynchronous Optimization, arXiv:2607.07508"
    defaults = {"eps_low": 0.3, "eps_high": 5.0}
    f_latex = r"\operatorname{clip}(\rho_t,\,1-\epsilon_l,\,1+\epsilon_h)"
    gate_latex = r"\mathbf{1}[1-\epsilon_l<\rho_t<1+\epsilon_h]"
    insight = (
        "One window for every token, whatever its advantage: a ratio outside (1−ε_l, "
        "1+ε_h) is treated as stale data and passes nothing."
    )

    def _validate(self):
        h = self.hparams
        h["eps_low"] = _hparam(self.name, "eps_low", h["eps_low"], low=0, below=1)
        h["eps_high"] = _hparam(self.name, "eps_high", h["eps_high"], low=0)
        self.low, self.high = 1 - h["eps_low"], 1 + h["eps_high"]

    def _inside(self, ratio):
        return (ratio > self.low) & (ratio < self.high)

    def _weight(self, ratio, adv):
        # not torch.clamp: its derivative is 1 at the edges, where the strict gate's is 0
        return nx.strict_clamp(ratio, self.low, self.high)

    def _gate(self, ratio, adv):
        shape = torch.broadcast_shapes(ratio.shape, adv.shape)
        return self._inside(ratio).to(ratio.dtype).expand(shape)

    def bounds(self):
        return [(self.high, 0), (self.low, 0)]


class SAPO(Method):
    """A smooth gate: f = (4/τ)·σ(τ(ρ−1)), τ = τ_pos if A > 0 else τ_neg; f' = sech²(τ(ρ−1)/2)."""

    name, title, date = "sapo", "SAPO", "November 2025"
    paper = "Gao et al. (Qwen team) 2025, Soft Adaptive Policy Optimization, arXiv:2511.20347"
    defaults = {"tau_pos": 1.0, "tau_neg": 1.05}
    f_latex = (r"\begin{gathered}\tfrac{4}{\tau_t}\,\sigma\!\big(\tau_t(\rho_t-1)\big),\\ "
               r"\tau_t=\tau_{\rm pos}\text{ if }A_t>0\text{ else }\tau_{\rm neg}\end{gathered}")
    gate_latex = (r"\begin{gathered}4\sigma\big(\tau_t(\rho_t-1)\big)"
                  r"\big(1-\sigma(\tau_t(\rho_t-1))\big)"
                  r"\\=\operatorname{sech}^2\!\big(\tfrac{\tau_t(\rho_t-1)}{2}\big)\end{gathered}")
    insight = (
        "A bell-shaped gate with no edge; the negative side uses a slightly larger "
        "temperature, so tokens with a negative advantage lose trust sooner."
    )

    def _validate(self):
        h = self.hparams
        for k in ("tau_pos", "tau_neg"):
            h[k] = _hparam(self.name, k, h[k], low=0, low_open=True)

    def _tau(self, adv):
        h = self.hparams  # tensors of adv's dtype, so float64 stays exact
        return torch.where(adv > 0, adv.new_tensor(h["tau_pos"]), adv.new_tensor(h["tau_neg"]))

    def _weight(self, ratio, adv):
        tau = self._tau(adv)
        return 4 / tau * torch.sigmoid(tau * (ratio - 1))

    def _gate(self, ratio, adv):
        x = self._tau(adv) * (ratio - 1)
        # sech²(x/2) = 4σ(x)(1−σ(x)); the cosh form stays ≤ 1 and keeps relative precision far out
        return torch.cosh(x / 2).pow(-2)


REGISTRY: dict[str, type[Method]] = {m.name: m for m in (PPO, GRPO, DAPO, SAO, SAPO, GSPO)}


def names():
    """The registered method names, in the article's order."""
    return list(REGISTRY)


def get(name: str, **hparams) -> Method:
    """Build a method by name: rlgates.get("dapo", eps_high=0.3)."""
    key = str(name).lower()
    if key not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(REGISTRY)}")
    return REGISTRY[key](**hparams)
