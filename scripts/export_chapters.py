#!/usr/bin/env python3
"""Export every chapter's code cells to plain .py files, so that library tools can read them.

    python scripts/export_chapters.py [OUT]      (default OUT: _build/chapter_code)

The chapters are Markdown (scripts/chapter_sources.py), which neither ruff nor the duplicate
check reads as code, so the check (`tasks.py check`) exports their code cells here and runs both
over the result. Each cell is one
`# %%` block headed by its number and tags, so a finding points back to its cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import chapter_sources

ROOT = Path(__file__).resolve().parents[1]


def export(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for md_path in chapter_sources.sources(ROOT):
        cells = chapter_sources.read(md_path).cells
        parts = [f"# Code cells of chapters/{md_path.name} (scripts/export_chapters.py)\n"]
        for i, cell in enumerate(cells):
            if cell.cell_type != "code":
                continue
            tags = cell.metadata.get("tags", [])
            source = cell.source
            magic = [line for line in source.splitlines() if line.lstrip().startswith(("%", "!"))]
            body = "\n".join(f"# {line}" if line in magic else line for line in source.splitlines())
            parts.append(f"# %% cell {i} {' '.join(tags)}".rstrip() + "\n" + body + "\n")
        path = out / f"{md_path.stem}.py"
        path.write_text("\n".join(parts))
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / "chapter_code"
    for p in export(target):
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
