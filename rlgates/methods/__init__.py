"""The policy losses, one class per method, grouped by the shape of their gate.

    clip.py         hard clips by the sign of A: ppo, grpo, dapo, gspo, dual_clip
    window.py       a window whatever the sign of A: sao
    smooth.py       a smooth gate: sapo
    weight_clip.py  a clipped weight that never drops a token: cispo
    reinforce.py    no gate: reinforce
    gmpo.py         a geometric mean of clipped token ratios: gmpo (verl's geo_mean)
    gpg.py          the policy gradient on log π, no importance weight: gpg
    dro.py          a gate whose edge moves with |A|: dro
    decoupled_dual_clip.py  DAPO's window with dual-clip's ceiling: dapo_dual_clip
    luspo.py        GSPO's gate, each response's loss times its length: luspo
    vespo.py        a smooth weight on the response's product ratio: vespo
    masks.py        a mask read from side information, times DAPO's gate: opsm, top_entropy
    dppo.py         a trust region on π − π_old (side input π_old): dppo_tv, dppo_kl
    cov.py          tokens picked by the batch covariance (side input: the pick): clip_cov, kl_cov
    topr.py         SFT on A > 0, a weight capped at 1 on A ≤ 0 (ROLL): topr
    sampler_band.py SAO's band on the ratio to the sampler, in CISPO's form (SkyRL): glm5_rollout_is
    ipo.py          a band on |π − μ| plus a (log ρ)² pull (prime-rl, side input μ): ipo

Each class is registered where it is defined (`@register`); `get`, `names` and every per-method
table in rlgates, the book and the tests read the registry.
"""

from . import (  # noqa: F401  (registers them)
    clip,
    cov,
    decoupled_dual_clip,
    dppo,
    dro,
    gmpo,
    gpg,
    ipo,
    luspo,
    masks,
    reinforce,
    sampler_band,
    smooth,
    topr,
    vespo,
    weight_clip,
    window,
)
from ._base import REGISTRY, Method, get, names, register, unregister
from .clip import DAPO, GRPO, GSPO, PPO, DualClip, SignClip
from .cov import ClipCov, KLCov
from .decoupled_dual_clip import DecoupledDualClip
from .dppo import DPPOKL, DPPOTV
from .dro import DRO
from .gmpo import GMPO
from .gpg import GPG
from .ipo import IPO
from .luspo import LUSPO
from .masks import OPSM, EntropyMask, OffPolicyMask, TopEntropy
from .reinforce import Reinforce
from .sampler_band import GLM5RolloutIS
from .smooth import SAPO
from .topr import TOPR
from .vespo import VESPO
from .weight_clip import CISPO
from .window import SAO

# the classes in reading order (the API page follows it), then the registry's functions
__all__ = ["SignClip", "PPO", "GRPO", "DAPO", "GSPO", "DualClip", "SAO", "SAPO", "CISPO",
           "Reinforce", "LUSPO", "VESPO", "GMPO", "GPG", "DRO", "DecoupledDualClip",
           "OffPolicyMask", "OPSM", "EntropyMask", "TopEntropy", "DPPOTV", "DPPOKL", "ClipCov",
           "KLCov", "TOPR", "GLM5RolloutIS", "IPO",
           "Method", "REGISTRY", "get", "names", "register", "unregister"]
