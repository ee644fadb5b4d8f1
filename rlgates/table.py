"""Table 1 of the article, generated from the methods themselves."""

from __future__ import annotations

from .methods import get


def table(names=("ppo", "dapo", "gspo", "sapo", "sao"), merge_grpo=True) -> str:
    """A Markdown table: method (date) | f | f' | insight, with the math in $...$."""
    rows = ["| method | $f(\\rho;A)$ | $f'(\\rho;A)$ | insight |", "| --- | --- | --- | --- |"]
    for name in names:
        m = get(name)
        label = f"{m.title} ({m.date})"
        if merge_grpo and name == "ppo":
            g = get("grpo")
            label = f"{m.title} ({m.date}) / {g.title} ({g.date})"
        rows.append(f"| {label} | ${m.f_latex}$ | ${m.gate_latex}$ | {m.insight} |")
    return "\n".join(rows)
