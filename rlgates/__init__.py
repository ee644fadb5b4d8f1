"""rlgates: LLM RL policy losses as J = f(ρ; A)·A, each with its gate f'(ρ; A).

    >>> import rlgates
    >>> m = rlgates.get("dapo")            # eps_low=0.2, eps_high=0.28
    >>> m.gate(ratio, adv)                  # f'(ρ; A)
    >>> m.loss(logp, logp_old, adv, mask)   # minus the aggregated objective
"""

from . import byo, diagnostics, more_methods  # more_methods registers dual_clip, cispo, reinforce
from ._numerics import AGG_MODES, LOG_RATIO_CLAMP, aggregate, aggregation_weight
from .advantages import STD_EPS, group_advantages
from .check import check_gradient
from .device import compare_devices, device, on_accelerator, time_step
from .interactive import explore, plot_small_multiples
from .lab import LabConfig, LabResult  # also binds the submodule rlgates.lab
from .methods import REGISTRY, Method, get, names
from .notebook import setup
from .plane import GatePanels, Plane, plane, plot_gate_signal, plot_ppo_regions
from .policy import (
    LabPolicy,
    TinyPolicy,
    demo_size,
    lagged_log_ratios,
    policy_step,
    sample_groups,
    tail_reward,
)
from .table import table

__all__ = [
    "lab", "LabConfig", "LabResult",
    "AGG_MODES", "LOG_RATIO_CLAMP", "REGISTRY", "STD_EPS",
    "GatePanels", "LabPolicy", "Method", "Plane", "TinyPolicy",
    "aggregate", "aggregation_weight", "check_gradient", "compare_devices", "demo_size", "device",
    "explore", "get",
    "group_advantages", "lagged_log_ratios", "names", "on_accelerator", "plane",
    "plot_gate_signal", "plot_ppo_regions", "plot_small_multiples", "policy_step",
    "sample_groups", "setup", "table", "tail_reward", "time_step",
    "byo", "diagnostics", "more_methods",
]
__version__ = "0.1.0"
