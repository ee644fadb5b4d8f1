"""Tables generated from the method classes (the article's Table 1, the conventions page), and
`markdown`, the one helper that writes any rows as a Markdown table."""

from __future__ import annotations

from . import _numerics as nx
from .methods import REGISTRY, get, names


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
    rows = ["| method | $f(\\rho;A)$ | $f'(\\rho;A)$ | insight |", "| --- | --- | --- | --- |"]
    for name in names:
        if merged and name == "grpo":
            continue
        m = get(name)
        label = f"{m.title} ({m.date})"
        if merged and name == "ppo":
            g = get("grpo")
            label = f"{m.title} ({m.date}) / {g.title} ({g.date})"
        rows.append(f"| {label} | ${m.f_latex}$ | ${m.gate_latex}$ | {m.insight} |")
    return "\n".join(rows)


def defaults_table() -> str:
    """A Markdown table of every method's defaults, level, default aggregation and its source."""
    rows = ["| method | hyperparameters (defaults) | level | default `agg` | why that default |",
            "| --- | --- | --- | --- | --- |"]
    for name in names():
        m = get(name)
        hp = ", ".join(f"`{k}` = {v:g}" for k, v in m.hparams.items()) or "none"
        source = m.agg_source.replace("|", "\\|")  # a literal | would split the cell
        rows.append(f"| `{name}` ({m.title}; {m.paper}) | {hp} | {m.level} | `{m.agg}` | "
                    f"{source} |")
    return "\n".join(rows)


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
    rows = ["| `agg` | loss = |", "| --- | --- |"]
    rows += [f"| `{mode}` | {AGG_DEFINITIONS[mode]} |" for mode in nx.AGG_MODES]
    return "\n".join(rows)


def markdown(rows, header) -> str:
    """A Markdown table: `header` (the column names) over `rows` (one sequence of cells each,
    turned into strings; a literal | in a cell is escaped so that it cannot split the cell)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    header = list(header)
    out = [line(header), "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        r = list(r)
        if len(r) != len(header):
            raise ValueError(f"a row has {len(r)} cells, the header {len(header)}: {r!r}")
        out.append(line(r))
    return "\n".join(out)
