"""Reporting lab runs over seeds: means with 95 % intervals, paired differences, verdict words.

All intervals are Student-t intervals over seeds (runs are independent; the seeds are common to
every method, so a difference between two methods is taken seed by seed: a paired difference).
A chapter that makes several comparisons reads them as one family: `effects` gives each
difference its interval after Holm's correction, and `effect_table` renders them as a table of
effect sizes (`effect_words` writes one of them for prose); `family_verdicts` gives the verdict
words beside their Holm-adjusted ones, and a flag on intervals that end close to zero.

A run's last-5 mean, read after a fixed number of steps on a curve that still rises, measures
learning speed at that budget. `area` (the mean over all steps) measures speed directly; `slope`
and `plateau` find where a reward stops rising; `upto` reads long runs at any shorter budget.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..methods import REGISTRY
from ..tables import markdown

#: Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1 … 30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """t_{0.975, df}: a table to 30, then the Cornish-Fisher expansion (error < 1e-3)."""
    if df < 1:
        return math.nan
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def interval(values) -> dict:
    """Mean and 95 % Student-t interval of independent values: {mean, lo, hi, half, std, n}
    (half: the half-width, hi − mean)."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    n = v.numel()
    mean = float(v.mean())
    std = float(v.std()) if n > 1 else math.nan
    half = t975(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "half": half, "std": std, "n": n}


def format_interval(iv, fmt=".3f") -> str:
    """"mean [lo, hi]" of an `interval(...)` dict, or of the values to take one of."""
    if not isinstance(iv, dict):
        iv = interval(iv)
    return f"{iv['mean']:{fmt}} [{iv['lo']:{fmt}}, {iv['hi']:{fmt}}]"


def curves(results, key):
    """Stack one metric over seeds: a [seeds, steps] tensor (float64)."""
    return torch.tensor([r.metrics[key] for r in results], dtype=torch.float64)


def finals(results, key, last=5):
    """Each run's final value of `key` (mean over its last `last` steps): [seeds]."""
    return torch.tensor([r.final(key, last) for r in results], dtype=torch.float64)


def summary(runs: dict, keys=("reward", "entropy", "pg_clipfrac"), last=5) -> dict:
    """{label: {key: interval(...) plus min and max}} of each run's final value."""
    out = {}
    for label, results in runs.items():
        out[label] = {}
        for key in keys:
            v = finals(results, key, last)
            out[label][key] = {**interval(v), "min": float(v.min()), "max": float(v.max())}
    return out


def paired_difference(runs: dict, a: str, b: str, key="reward", last=5) -> dict:
    """a − b seed by seed (the runs share their seeds): mean and 95 % interval."""
    return paired(runs, a, b, lambda results: finals(results, key, last))


def verdict(diff: dict, higher="higher", lower="lower", same="no difference detected",
            null=0.0) -> str:
    """A word from an interval: `higher` if it lies above `null`, `lower` if below, else `same`.
    null: the value of no effect (0 for a difference, 1 for a ratio)."""
    if diff["lo"] > null:
        return higher
    if diff["hi"] < null:
        return lower
    return same


def t_pvalue(t: float, df: int) -> float:
    """Two-sided p-value P(|T| ≥ |t|) of Student's t with an integer df ≥ 1, exact: the finite
    series of Abramowitz and Stegun 26.7.3 (odd df) and 26.7.4 (even df)."""
    if df < 1 or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term = math.cos(theta) ** 2, 1.0
    if df % 2:  # 2/π (θ + sin θ cos θ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + …))
        series = 0.0
        if df > 1:
            series = term = math.cos(theta)
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                series += term
        inside = 2 / math.pi * (theta + math.sin(theta) * series)
    else:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + …)
        series = term
        for k in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        inside = math.sin(theta) * series
    return min(1.0, max(0.0, 1.0 - inside))


def family_verdicts(diffs: dict, margin=0.005, null=0.0, alpha=0.05) -> dict:
    """Read several comparisons as one family: {label: {"raw", "p", "p_holm", "holm", "marginal"}}.

    diffs: {label: interval(...)}, each a paired difference (mean, std and n over seeds). "raw" is
    `verdict`'s word for the 95 % interval; "p" its two-sided t-test p-value; "p_holm" the
    Holm-adjusted p-value over the family (Holm 1979: sort the m p-values, multiply the i-th
    smallest by m − i + 1, keep them increasing); "holm" is the raw word if p_holm < alpha, else
    "no difference detected". "marginal": an end of the interval lies within `margin` of `null`,
    so a small shift would change the raw word. A family of one is its own Holm correction."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    p = {}
    for label, d in diffs.items():
        se = d["std"] / math.sqrt(d["n"]) if d["n"] > 1 else math.nan
        gap = d["mean"] - null
        t = gap / se if se > 0 else (math.inf if gap else 0.0)
        p[label] = t_pvalue(t, d["n"] - 1) if gap or se > 0 else 1.0
    order, m, running, holm = sorted(p, key=p.get), len(p), 0.0, {}
    for i, label in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[label]))
        holm[label] = running
    out = {}
    for label, d in diffs.items():
        raw = verdict(d, null=null)
        out[label] = {"raw": raw, "p": p[label], "p_holm": holm[label],
                      "holm": raw if holm[label] < alpha else "no difference detected",
                      "marginal": min(abs(d["lo"] - null), abs(d["hi"] - null)) < margin}
    return out


def marked_verdict(diff: dict, margin=0.005) -> str:
    """`verdict`'s word for one comparison, followed by " (marginal)" when `family_verdicts`
    flags its interval (a family of one, so no Holm adjustment)."""
    one = family_verdicts({"": diff}, margin)[""]
    return one["raw"] + (" (marginal)" if one["marginal"] else "")


def family_table(diffs: dict, fmt="+.3f", margin=0.005) -> str:
    """A Markdown table of `family_verdicts`: per comparison, mean [95 % interval], the raw
    verdict (marked when marginal), the p-value, and the Holm-adjusted p-value and verdict."""
    fam = family_verdicts(diffs, margin)
    rows = [[label, format_interval(d, fmt), marked_verdict(d, margin),
             f"{fam[label]['p']:.3f}", f"{fam[label]['p_holm']:.3f}", fam[label]["holm"]]
            for label, d in diffs.items()]
    return (markdown(rows, ["comparison", "mean [95 % interval]", "verdict", "p",
                            "Holm p", "verdict after Holm"])
            + f"\n\nHolm's correction over these {len(diffs)} comparisons; marginal: an end "
            f"of the interval within {margin:g} of zero.")


def t_quantile(p: float, df: int) -> float:
    """The t ≥ 0 with two-sided P(|T| ≥ t) = p for Student's t with df degrees of freedom:
    `t_pvalue` inverted by bisection (to 1e-10). t_quantile(0.05, df) = t975(df)."""
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    if df < 1:
        return math.nan
    lo, hi = 0.0, 1.0
    while t_pvalue(hi, df) > p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_pvalue(mid, df) > p else (lo, mid)
    return (lo + hi) / 2


CORRECTIONS = ("holm", "bonferroni", None)


def effects(diffs: dict, correction="holm", alpha=0.05, null=0.0) -> dict:
    """Several paired differences read as one family, each with an interval after the
    correction: {label: {**diff, "p", "p_adj", "lo_adj", "hi_adj", "level", "word", "m",
    "correction"}}.

    diffs: {label: interval(...)}, each a paired difference (mean, std and n over seeds).

    Holm's correction (Holm 1979) keeps the chance that *any* of the m comparisons reads
    "higher" or "lower" by luck at `alpha`, while ten comparisons read at 95 % each would do so
    up to 10 times in 20: sort the p-values, test the smallest at alpha/m, the next at
    alpha/(m − 1), and so on, stopping at the first that fails. Each comparison's interval here
    is the one its step uses, at level 1 − alpha/(m − i + 1) for the i-th smallest p-value (and
    at the failing step's level for every comparison from there on), so an interval excludes
    `null` exactly when Holm's procedure keeps that comparison: "p_adj" (`family_verdicts`'
    p_holm) < alpha. "bonferroni": every interval at level 1 − alpha/m (wider; jointly they
    cover all m true differences with probability ≥ 1 − alpha). None: each at 1 − alpha alone.
    "word": `verdict`'s word for the interval after the correction ("higher", "lower", "no
    difference detected"); "level": that interval's confidence level."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    fam = family_verdicts(diffs, null=null, alpha=alpha)
    m = len(diffs)
    order = sorted(diffs, key=lambda k: fam[k]["p"])
    level = {}
    stop = None  # the rank of the first comparison Holm's procedure fails to keep
    for i, label in enumerate(order):
        if correction is None:
            level[label] = alpha
        elif correction == "bonferroni":
            level[label] = alpha / m
        else:
            if stop is None and fam[label]["p_holm"] >= alpha:
                stop = i
            level[label] = alpha / (m - (i if stop is None else stop))
    out = {}
    for label, d in diffs.items():
        se = d["std"] / math.sqrt(d["n"]) if d["n"] > 1 else math.nan
        half = t_quantile(level[label], d["n"] - 1) * se if se > 0 else (0.0 if se == 0
                                                                           else math.nan)
        p_adj = {"holm": fam[label]["p_holm"], "bonferroni": min(1.0, m * fam[label]["p"]),
                 None: fam[label]["p"]}[correction]
        adj = {"mean": d["mean"], "lo": d["mean"] - half, "hi": d["mean"] + half}
        out[label] = {**d, "p": fam[label]["p"], "p_adj": p_adj, "lo_adj": adj["lo"],
                      "hi_adj": adj["hi"], "level": 1 - level[label],
                      "word": verdict(adj, null=null), "m": m, "correction": correction}
    return out


def correction_words(e: dict) -> str:
    """How an `effects` entry's interval was corrected, in words: "after Holm's correction over
    12 comparisons", "after Bonferroni's correction over 12 comparisons" or "uncorrected"."""
    if e["correction"] is None or e["m"] == 1:
        return "uncorrected" if e["correction"] is None else "on its own"
    name = {"holm": "Holm's", "bonferroni": "Bonferroni's"}[e["correction"]]
    return f"after {name} correction over {e['m']} comparisons"


def effect_words(e: dict, fmt="+.3f") -> str:
    """One `effects` entry for prose: "+0.040 (95 % interval +0.010 to +0.070 after Holm's
    correction over 6 comparisons)" (the difference and its corrected interval; the chapter's
    sentence says what it means)."""
    return (f"{e['mean']:{fmt}} (95 % interval {e['lo_adj']:{fmt}} to {e['hi_adj']:{fmt}} "
            f"{correction_words(e)})")


def effect_table(diffs: dict, baseline: str | None = None, key="reward", last=5,
                 correction="holm", alpha=0.05, fmt="+.3f", measures: dict | None = None,
                 null=0.0) -> str:
    """A Markdown table of effect sizes: per comparison the difference (mean over seeds), its
    95 % interval on its own, its interval after the family's `correction` (`effects`), and
    what that interval says ("higher", "lower", or "no difference detected": an interval
    that contains `null`). A note under the table says what the correction does.

    diffs: {label: paired difference}; or, with `baseline`, runs ({label: [LabResult]}), each
    compared with the baseline by `paired_difference(runs, label, baseline, key, last)`.
    measures: {label: what the comparison measures}, an extra column."""
    if baseline is not None:
        diffs = {f"{label} − {baseline}": paired_difference(diffs, label, baseline, key, last)
                 for label in diffs if label != baseline}
    eff = effects(diffs, correction, alpha, null)
    rows = []
    for label, e in eff.items():
        row = [label] + ([measures.get(label, "")] if measures else [])
        row += [f"{e['mean']:{fmt}}", f"{e['lo']:{fmt}} to {e['hi']:{fmt}}",
                f"{e['lo_adj']:{fmt}} to {e['hi_adj']:{fmt}}", e["word"]]
        rows.append(row)
    after = {"holm": "after Holm's correction", "bonferroni": "after Bonferroni's correction",
             None: "uncorrected"}[correction]
    head = ["comparison", *(["what it measures"] if measures else []), "difference",
            "95 % interval", f"95 % interval, {after}", "reading"]
    m = len(diffs)
    n = sorted({e["n"] for e in eff.values()})
    note = {"holm": (f"Holm's correction over these {m} comparisons keeps the chance that any "
                     f"of them reads \"higher\" or \"lower\" by luck at {alpha:g}: each "
                     "interval is widened to the level its step of Holm's procedure tests "
                     "(the smallest p-value at 1 − α/m, the next at 1 − α/(m − 1), …)."),
            "bonferroni": (f"Bonferroni's correction: every interval at level 1 − {alpha:g}/{m}, "
                           "so that all of them hold at once with probability 1 − "
                           f"{alpha:g}."),
            None: "No correction: each interval read on its own."}[correction]
    return (markdown(rows, head) + f"\n\nDifferences over {'/'.join(map(str, n))} common "
            f"seeds, paired seed by seed. {note} \"No difference detected\": the interval "
            "contains 0, which is not the same as no difference.")


def summary_table(runs: dict, keys=("reward", "entropy", "pg_clipfrac", "log_ratio_absmax"),
                  last=5, fmt=".3f") -> str:
    """A Markdown table: per method, mean [95 % interval] over seeds of each final value."""
    s = summary(runs, keys, last)
    n = len(next(iter(runs.values())))
    rows = [[label] + [format_interval(stats[k], fmt) for k in keys] for label, stats in s.items()]
    return (markdown(rows, ["method", *keys]) + f"\n\nmean [95 % interval] over {n} seeds "
            f"of each run's mean over its last {last} steps.")


def paired_table(runs: dict, baseline: str, keys=("reward", "entropy"), last=5,
                 fmt="+.3f") -> str:
    """A Markdown table of paired differences (each label − `baseline`, seed by seed): mean
    [95 % interval] and the verdict word of each."""
    rows = []
    for label in runs:
        if label == baseline:
            continue
        diffs = [paired_difference(runs, label, baseline, key, last) for key in keys]
        rows.append([label] + [f"{format_interval(d, fmt)} {verdict(d)}" for d in diffs])
    n = len(runs[baseline])
    return (markdown(rows, [f"− {baseline}", *keys]) + f"\n\nPaired differences over "
            f"{n} common seeds: mean [95 % interval] of each run's mean over its last {last} "
            "steps minus its baseline's.")


def upto(runs: dict, steps: int) -> dict:
    """The runs as they stood after their first `steps` steps: {label: [LabResult]} with every
    metric cut there. A run's first steps do not depend on how many follow, so this equals
    training for `steps` steps (tested): one long run gives every shorter budget."""
    steps = int(steps)
    if steps < 1 or any(len(r.metrics["reward"]) < steps for rs in runs.values() for r in rs):
        raise ValueError(f"upto: every run needs at least {steps} ≥ 1 steps")
    return {label: [replace(r, config=r.config.replace(steps=steps),
                            metrics={k: v[:steps] for k, v in r.metrics.items()},
                            log_ratios=None if r.log_ratios is None else r.log_ratios[:steps],
                            gates=None if r.gates is None else r.gates[:steps])
                    for r in results]
            for label, results in runs.items()}


def area(results, key="reward") -> torch.Tensor:
    """Each run's mean of `key` over all its steps: the area under its curve divided by the
    number of steps, [seeds]. Two runs that end at the same value differ here when one got there
    sooner."""
    return curves(results, key).mean(1)


def slope(results, key="reward", last=50) -> torch.Tensor:
    """Each run's least-squares slope of `key` per step over its last `last` steps: [seeds]."""
    return _slope(curves(results, key)[:, -last:])


def _slope(y):
    """Least-squares slope per row of [runs, steps] values, per step."""
    if y.shape[1] < 2:
        raise ValueError(f"a slope needs at least 2 steps, got {y.shape[1]}")
    x = torch.arange(y.shape[1], dtype=torch.float64)
    x = x - x.mean()
    return ((y - y.mean(1, keepdim=True)) * x).sum(1) / (x * x).sum()


def plateau(results, key="reward", last=50, start=None) -> int | None:
    """The first budget n (at least `start`, default `last`) at which the 95 % interval over
    seeds of the slope of `key` over steps n − last … n − 1 contains 0; None if no budget of
    these runs reaches it."""
    y = curves(results, key)
    for n in range(max(last, start or last), y.shape[1] + 1):
        iv = interval(_slope(y[:, n - last:n]))
        if iv["lo"] <= 0 <= iv["hi"]:
            return n
    return None


def paired(runs: dict, a: str, b: str, measure) -> dict:
    """a − b seed by seed of any per-run `measure(results) -> [seeds]` (e.g. `area`): mean and
    95 % interval."""
    if [r.seed for r in runs[a]] != [r.seed for r in runs[b]]:
        raise ValueError(f"{a} and {b} must share their seeds to be paired")
    return interval(measure(runs[a]) - measure(runs[b]))


def budget_table(runs: dict, baseline: str, budgets, key="reward", last=5,
                 fmt="+.3f") -> str:
    """A Markdown table of paired differences (each label − `baseline`) at each budget n in
    `budgets` (steps): the mean over the last `last` steps up to n, and the mean over steps 1 to
    n (`area`), each as mean [95 % interval] and its verdict word."""
    cols, cells = [], {label: [] for label in runs if label != baseline}
    for n in budgets:
        cut = upto(runs, n)
        cols += [f"last {last} at {n}", f"mean over 1–{n}"]
        for label in cells:
            for d in (paired(cut, label, baseline, lambda rs: finals(rs, key, last)),
                      paired(cut, label, baseline, lambda rs: area(rs, key))):
                cells[label].append(f"{format_interval(d, fmt)} {verdict(d)}")
    n_seeds = len(runs[baseline])
    return (markdown([[label, *c] for label, c in cells.items()], [f"{key} − {baseline}", *cols])
            + f"\n\nPaired differences over {n_seeds} common seeds, mean [95 % interval]: of "
            f"each run's {key} over its last {last} steps before the budget, and over all its "
            "steps to the budget (the area under the curve per step: learning speed).")


def method_color(label, fallback="C0"):
    """A registered method's line colour (its class's `color`), else `fallback`. A label such
    as "dapo eps_high=2" takes the colour of its first word."""
    cls = REGISTRY.get(str(label).lower()) or REGISTRY.get(str(label).lower().split(" ")[0])
    return getattr(cls, "color", None) or fallback


__all__ = ["CORRECTIONS", "area", "budget_table", "correction_words", "curves", "effect_table",
           "effect_words", "effects", "family_table", "family_verdicts", "finals",
           "format_interval", "interval", "marked_verdict", "method_color", "paired",
           "paired_difference", "paired_table", "plateau", "slope", "summary", "summary_table",
           "t975", "t_pvalue", "t_quantile", "upto", "verdict"]
