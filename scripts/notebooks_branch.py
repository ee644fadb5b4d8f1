"""Assemble the tree of the `notebooks` branch, which the launch buttons open (_config.yml,
repository.branch): the reader notebooks, the library that produced their numbers, and Binder's
light environment. The workflow (.github/workflows/book.yml) pushes it after a green check.

    python scripts/notebooks_branch.py OUT [COMMIT]      (needs a built book: _build/reader)

It prints the branch's file list (and `assemble` returns it): the launch buttons of the web book
must name files in it (tests/browser/test_reader_path.py checks every page's buttons against it).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "_build" / "reader"
COPIED = ["rlgates", "pyproject.toml", "binder", "LICENSE", "LICENSE-CONTENT", "CITATION.cff"]


def assemble(out: Path, commit: str = "") -> list[Path]:
    if not (READER / "chapters").is_dir():
        sys.exit(f"no reader notebooks in {READER}: build the book first (python3 tasks.py book)")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(READER / "chapters", out / "chapters")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, out / name, ignore=ignore)
        else:
            shutil.copy2(src, out / name)
    made_from = f" from commit {commit}" if commit else ""
    (out / "README.md").write_text(
        "# Reader notebooks\n\n"
        f"Generated{made_from} of the main branch by the book's workflow; do not edit here.\n"
        "Each notebook in `chapters/` is a chapter of the book as a plain Jupyter notebook: "
        "open it in JupyterLab, Colab or Binder. Its first cell installs `rlgates` (this "
        "branch's copy, in `rlgates/`) when it is missing. Code: MIT (LICENSE); text and "
        "figures: CC BY 4.0 (LICENSE-CONTENT).\n")
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    files = assemble(Path(sys.argv[1]).resolve(), sys.argv[2] if len(sys.argv) == 3 else "")
    print(*(f.as_posix() for f in files), sep="\n")
    print(f"{len(files)} files in {sys.argv[1]}", file=sys.stderr)
