"""Markdown tables: `markdown`, the one writer every table in the book goes through, and the
tables generated from the method classes (the article's Table 1, the conventions page, the
README's method table)."""

from __future__ import annotations

import re
from numbers import Number

from . import _numerics as nx
from .methods import REGISTRY, get, names

_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _cell(value, fmt) -> str:
    if fmt is not None and isinstance(value, Number) and not isinstance(value, bool):
        value = format(value, fmt)
    # a bare | would split the row; one already written as \| stays as it is
    return _UNESCAPED_PIPE.sub(r"\\|", str(value).replace("\n", " "))


def markdown(rows, header, fmt: str | None = None) -> str:
    """A Markdown (pipe) table: the `header` row (column names), the `| --- |` rule, then one
    line per row of `rows` (each a sequence of cells).

    Cells are written with str(); numbers with format(value, fmt) when `fmt` is given (".3f").
    A "|" in a cell is escaped (one already written as \\| is kept), so it cannot split the row.
    Every row must have as many cells as the header. Show it with IPython's `Markdown(...)` or
    glue that object (MyST renders it as a table)."""
    header = list(header)
    lines = ["| " + " | ".join(_cell(h, None) for h in header) + " |",
             "|" + " --- |" * len(header)]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"row {i} has {len(row)} cells, the header {len(header)}: {row}")
        lines.append("| " + " | ".join(_cell(c, fmt) for c in row) + " |")
    return "\n".join(lines)


def _row_order():
    """Table 1's rows first, in the article's order; then every other method in `names()`."""
    article = sorted((n for n in names() if REGISTRY[n].article_row), key=lambda n:
                     REGISTRY[n].article_row)
    return article + [n for n in names() if n not in article]


def table(names=None, merge_grpo=True, article=False) -> str:
    """A Markdown table: method (date) | f | f' | insight, with the math in $...$.

    names: the methods (default: every registered one, Table 1's rows first). article=True:
    only the article's Table 1 rows, in its order. merge_grpo: GRPO shares PPO's row.
    """
    if names is None:
        names = [n for n in _row_order() if REGISTRY[n].article_row or not article]
    merged = merge_grpo and "ppo" in names
    rows = []
    for name in names:
        if merged and name == "grpo":
            continue
        m = get(name)
        label = f"{m.title} ({m.date})"
        if merged and name == "ppo":
            g = get("grpo")
            label = f"{m.title} ({m.date}) / {g.title} ({g.date})"
        rows.append([label, f"${m.f_latex}$", f"${m.gate_latex}$", m.insight])
    return markdown(rows, ["method", "$f(\\rho;A)$", "$f'(\\rho;A)$", "insight"])


def _hparam_text(v) -> str:
    return f"{v:.0e}".replace("e-0", "e-") if 0 < abs(v) < 1e-3 else repr(v)


def methods_table() -> str:
    """The README's table: name, hyperparameters (defaults), default `agg`, the gate in plain
    text (`gate_text`, else `gate_latex` as math). scripts/readme_methods.py writes it there."""
    rows = []
    for name in names():
        m = get(name)
        hp = ", ".join(f"`{k}` ({_hparam_text(v)})" for k, v in m.hparams.items()) or "none"
        rows.append([f"`{name}`", hp, m.agg, m.gate_text or f"${m.gate_latex}$"])
    return markdown(rows, ["name", "hyperparameters (defaults)", "default `agg`",
                           "gate f'(ρ; A)"])


def defaults_table() -> str:
    """A Markdown table of every method's defaults, level, default aggregation and its source."""
    rows = []
    for name in names():
        m = get(name)
        hp = ", ".join(f"`{k}` = {v:g}" for k, v in m.hparams.items()) or "none"
        rows.append([f"`{name}` ({m.title}; {m.paper})", hp, m.level, f"`{m.agg}`",
                     m.agg_source])
    return markdown(rows, ["method", "hyperparameters (defaults)", "level", "default `agg`",
                           "why that default"])


AGG_DEFINITIONS = {
    "token-mean": "Σ_bt L·m / Σ_bt m: every token of the batch weighs the same.",
    "seq-mean-token-mean": "the mean, over sequences with at least one token, of "
                           "Σ_t L·m / Σ_t m: every response weighs the same.",
    "seq-mean-token-sum": "the mean, over sequences with at least one token, of Σ_t L·m: "
                          "a response weighs in proportion to its length.",
    "seq-mean-token-sum-norm": "the same mean of Σ_t L·m / T, T the padded length: Dr. GRPO's "
                               "constant normaliser (pad to a fixed generation budget).",
}


def aggregation_table() -> str:
    """A Markdown table of the aggregation modes (`rlgates.AGG_MODES`) and their definitions."""
    return markdown([(f"`{mode}`", AGG_DEFINITIONS[mode]) for mode in nx.AGG_MODES],
                    ["`agg`", "loss ="])
