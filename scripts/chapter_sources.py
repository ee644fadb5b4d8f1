#!/usr/bin/env python3
"""The chapters are MyST Markdown notebooks (`chapters/NN_name.md`, jupytext's `myst` format):
text that a diff and a review read line by line (their code cells reach ruff and the duplicate
check through scripts/export_chapters.py). Their `.ipynb` twins are generated from them, never
committed (.gitignore), and rewritten whenever they are needed:

    python scripts/chapter_sources.py notebooks   write chapters/NN_name.ipynb from each chapter
    python scripts/chapter_sources.py check       exit 1 if a chapter changes in the round trip

nbval collects only `.ipynb`, so `tasks.py check` writes the notebooks before it runs nbval; the
book reads the `.md` files themselves. In JupyterLab, jupytext pairs the two (CONTRIBUTING.md):
an edit saved in either is written to both, and the `.md` is the one git keeps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
FORMAT = "md:myst"


def sources(root: Path = ROOT) -> list[Path]:
    """The chapter sources, in file-name (reading) order."""
    return sorted((root / "chapters").glob("[0-9][0-9]_*.md"))


def read(path: Path) -> nbformat.NotebookNode:
    """A chapter as a notebook (no outputs), from its `.md` source."""
    return jupytext.read(str(path), fmt=FORMAT)


def text(nb: nbformat.NotebookNode) -> str:
    """A notebook written as a chapter source."""
    return jupytext.writes(nb, fmt=FORMAT)


def write_notebooks(root: Path = ROOT) -> list[Path]:
    """Write each chapter's `.ipynb` beside it (what nbval and the launch buttons read)."""
    written = []
    for source in sources(root):
        target = source.with_suffix(".ipynb")
        nbformat.write(read(source), str(target))
        written.append(target)
    return written


def through_ipynb(source: Path) -> nbformat.NotebookNode:
    """A chapter written to .ipynb JSON and read back, as nbval reads its generated twin."""
    return nbformat.reads(nbformat.writes(read(source)), as_version=4)


def round_trip_problems(root: Path = ROOT) -> list[str]:
    """Chapters whose text changes when converted to a notebook and back."""
    return [f"{source.relative_to(root)}: md -> ipynb -> md changes the text"
            for source in sources(root) if text(through_ipynb(source)) != source.read_text()]


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) == 2 else ""
    if command == "notebooks":
        paths = write_notebooks()
        print(f"{len(paths)} chapter notebooks written from their .md sources")
    elif command == "check":
        found = round_trip_problems()
        print("\n".join(found) or f"{len(sources())} chapters survive md -> ipynb -> md")
        sys.exit(1 if found else 0)
    else:
        sys.exit(__doc__)
