"""rlgates: LLM RL policy losses as J = f(ρ; A)·A, each with its gate f'(ρ; A).

    >>> import rlgates
    >>> m = rlgates.get("dapo")            # eps_low=0.2, eps_high=0.28
    >>> m.gate(ratio, adv)                  # f'(ρ; A)
    >>> m.loss(logp, logp_old, adv, mask)   # minus the aggregated objective (agg: m.agg)
    >>> rlgates.get("dppo_tv").gate(ratio, adv, rlgates.SideInfo(probs_old=p))  # side inputs
"""

from . import byo, diagnostics, figures, lab, offpolicy, tables
from ._numerics import AGG_MODES, LOG_RATIO_CLAMP, aggregate, aggregation_weight, ragged_mask
from ._side import SideInfo
from .advantages import STD_EPS, group_advantages
from .check import check_gradient
from .devices import compare_devices, device, on_accelerator, time_loss, time_step
from .figures import (
    GatePanels,
    Plane,
    plane,
    plot_gate_signal,
    plot_ppo_regions,
    plot_profiles,
    plot_small_multiples,
)
from .interactive import explore
from .lab import LabConfig, LabResult
from .methods import REGISTRY, Method, get, names, register, unregister
from .notebook import setup, show_source
from .policy import (
    LabPolicy,
    TinyPolicy,
    demo_batch,
    demo_size,
    lagged_log_ratios,
    policy_step,
    sample_groups,
    tail_reward,
)
from .tables import aggregation_table, defaults_table, table

__all__ = [
    "AGG_MODES", "LOG_RATIO_CLAMP", "REGISTRY", "STD_EPS",
    "GatePanels", "LabConfig", "LabPolicy", "LabResult", "Method", "Plane", "SideInfo",
    "TinyPolicy",
    "aggregate", "aggregation_table", "aggregation_weight", "byo", "check_gradient",
    "compare_devices", "defaults_table", "demo_batch", "demo_size", "device", "diagnostics",
    "explore", "figures", "get", "group_advantages", "lab", "lagged_log_ratios", "names",
    "offpolicy", "on_accelerator",
    "plane", "plot_gate_signal", "plot_ppo_regions", "plot_profiles", "plot_small_multiples",
    "policy_step", "ragged_mask", "register", "sample_groups", "setup", "show_source", "table",
    "tables",
    "tail_reward", "time_loss",
    "time_step", "unregister",
]
__version__ = "0.2.0"
