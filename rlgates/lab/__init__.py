"""A small, real RL-for-sequences lab: train a tiny policy with any gate and watch the gates act.

    >>> from rlgates import lab
    >>> cfg = lab.LabConfig.for_device("cpu")
    >>> runs = lab.train("dapo", cfg, seeds=range(10))     # ten seeds, one batched computation
    >>> runs[0].metrics["reward"][-1], runs[0].final("entropy")
    >>> many = lab.run_many(["ppo", "dapo"], seeds=range(10), config=cfg)
    >>> lab.paired_difference(many, "dapo", "ppo", "reward")  # mean and 95 % interval

Three rooms: `task` (PatternTask, the environment), `train` (LabConfig, the one training loop,
LabResult) and `report` (summaries over seeds, paired differences, verdicts and tables). The
policy is rlgates.LabPolicy. (`lab.train` is the function; its module is `lab.train_module`.)
"""

from ..figures import plot_runs, plot_shut_by_sign
from ..policy import LabPolicy
from . import report, task
from . import train as train_module
from .report import (
    curves,
    format_interval,
    interval,
    method_color,
    paired_difference,
    paired_table,
    summary,
    summary_table,
    verdict,
)
from .task import PatternTask
from .train import (
    METRIC_DOC,
    METRIC_KEYS,
    LabConfig,
    LabResult,
    default_agg,
    method_name,
    resolve,
    run_many,
    summed_loss,
    train,
)

__all__ = [
    "METRIC_DOC", "METRIC_KEYS", "LabConfig", "LabPolicy", "LabResult", "PatternTask",
    "curves", "default_agg", "format_interval", "interval", "method_color", "method_name",
    "paired_difference", "paired_table", "plot_runs", "plot_shut_by_sign", "resolve", "run_many",
    "summary", "summary_table", "summed_loss", "train", "verdict", "report", "task", "train_module",
]
