"""A small, real RL-for-sequences lab: train a tiny policy with any gate and watch the gates act.

    >>> from rlgates import lab
    >>> cfg = lab.LabConfig.for_device("cpu")
    >>> runs = lab.train("dapo", cfg, seeds=range(10))     # ten seeds, one batched computation
    >>> runs[0].metrics["reward"][-1], runs[0].final("entropy")
    >>> many = lab.run_many(["ppo", "dapo"], seeds=range(10), config=cfg)
    >>> lab.paired_difference(many, "dapo", "ppo", "reward")  # mean and 95 % interval
    >>> lab.paired(many, "dapo", "ppo", lab.area)  # learning speed: the mean over all steps
    >>> lab.run_many({"k=0": lab.Arm("ppo", lag=0), "k=8": lab.Arm("ppo", lag=8)}, range(10))

Three rooms: `task` (PatternTask, the environment), `loop` (LabConfig, the rollout, the one
training loop `train`, LabResult) and `report` (summaries over seeds, paired differences, verdicts
and tables; learning speed and plateaus: `area`, `slope`, `plateau`, `upto`). The policy is
rlgates.LabPolicy. `critic` gives an arm PPO's advantages in place of GRPO's: a value model
(`critic.LabCritic`) and GAE, per token (`LabConfig(advantage="gae")`). The metrics are every
diagnostic registered in `rlgates.diagnostics` plus the lab's own (`lab.metric_doc()`), and a
critic's (`lab.metric_doc(critic=True)`).
"""

from ..figures import plot_runs, plot_shut_by_sign
from ..policy import LabPolicy
from . import critic, loop, report, task
from .drift import drift_after_updates
from .loop import (
    Arm,
    LabConfig,
    LabResult,
    Rollout,
    default_agg,
    method_name,
    metric_doc,
    resolve,
    rollout,
    run_many,
    summed_loss,
    train,
)
from .report import (
    area,
    budget_table,
    curves,
    effect_table,
    effect_words,
    effects,
    family_table,
    family_verdicts,
    format_interval,
    interval,
    marked_verdict,
    method_color,
    paired,
    paired_difference,
    paired_table,
    plateau,
    slope,
    summary,
    summary_table,
    upto,
    verdict,
)
from .task import PatternTask

__all__ = [
    "Arm", "LabConfig", "LabPolicy", "LabResult", "PatternTask", "Rollout", "area",
    "budget_table",
    "curves", "default_agg", "drift_after_updates", "effect_table", "effect_words", "effects",
    "family_table", "family_verdicts",
    "format_interval", "interval", "marked_verdict", "method_color", "method_name", "metric_doc",
    "paired", "paired_difference", "paired_table", "plateau", "plot_runs", "plot_shut_by_sign",
    "resolve", "rollout", "run_many", "slope", "summary",
    "summary_table", "summed_loss", "train", "upto", "verdict", "critic", "loop", "report", "task",
]
