"""Put the notebooks nbval executed into the book's jupyter-cache, so the book build does not
execute them again.

    python scripts/prime_cache.py EXECUTED_DIR [CACHE_DIR]

EXECUTED_DIR holds executed notebooks at their paths in the repository (written by
scripts/nbval_record.py, e.g. EXECUTED_DIR/chapters/07_sapo.ipynb, generated from
chapters/07_sapo.md). Each is cached under the hash of its chapter's code, which is what myst-nb
looks up with `execute_notebooks: cache`; a notebook whose code is no longer its `.md` source's
is skipped. The cache is emptied first:
outputs from an older run (an older library) must never be reused, so a notebook nbval did not
write is executed by the book as before.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import chapter_sources
import nbformat
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = ROOT / "_build" / ".jupyter_cache"


def prime(executed: Path, cache_dir: Path = DEFAULT_CACHE, root: Path = ROOT) -> list[Path]:
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = get_cache(str(cache_dir))
    done = []
    for nb_path in sorted(executed.rglob("*.ipynb")):
        source = (root / nb_path.relative_to(executed)).with_suffix(".md")
        if not source.is_file():
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        src = chapter_sources.read(source)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        if code != [c.source for c in src.cells if c.cell_type == "code"]:
            continue  # the chapter changed since nbval ran: let the book execute it
        cache.cache_notebook_bundle(CacheBundleIn(nb, uri=str(source)), check_validity=False,
                                    overwrite=True)
        done.append(source.relative_to(root))
    return done


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    cache_dir = Path(sys.argv[2]) if len(sys.argv) == 3 else DEFAULT_CACHE
    primed = prime(Path(sys.argv[1]).resolve(), cache_dir.resolve())
    print(f"jupyter-cache primed with {len(primed)} executed notebooks: "
          + " ".join(p.stem for p in primed))
