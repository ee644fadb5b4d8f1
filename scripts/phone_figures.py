"""Phone versions of the book's figures, after the build (scripts/lighter_assets.py's `lighten`
calls `add_phone_figures`):

    python scripts/phone_figures.py _build/html      # the same, on a built book (idempotent)

When tasks.py runs the chapters for the book it sets RLGATES_PHONE_FIGURES=1, and rlgates' figure
formatter (rlgates/_book/png.py) then also draws a phone version of each figure whose text would
be too small in a phone's column: its panels stacked in one narrower column, kept (base64) in the
PNG output's metadata. Here each one is written beside the laptop PNG the build made
(`_images/<sha256>.png` -> `_images/<sha256>.phone.png`), and the figure's <img> is wrapped in a
<picture> whose <source> serves it below 600 px (MEDIA): a phone downloads only the phone
image, a laptop only the laptop one. The link around the figure still opens the laptop image
(book.js's tap-to-enlarge on a phone).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from pathlib import Path

from rlgates._book.png import PHONE_ERROR_KEY, PHONE_KEY

#: the screens that get the phone image: below 600 px, as book.css's phone rules and book.js's
#: tap-to-enlarge (wider, the column holds the laptop figure's text at about 6 px or more)
MEDIA = "(max-width: 599.98px)"
SUFFIX = ".phone.png"
#: a figure's <img>, as myst-nb writes it: src="<dir>_images/<sha256 of the PNG>.png"
IMG = re.compile(r'<img\b[^>]*?\bsrc="(?P<dir>[^"]*_images/)(?P<hash>[0-9a-f]{64})\.png"[^>]*>')


def phone_pngs(notebook_dirs) -> tuple[dict[str, bytes], list[str]]:
    """({sha256 of a figure's PNG: its phone PNG}, [why a figure has none]) from the outputs of
    every notebook under `notebook_dirs` (the book's jupyter-cache, nbval's executed copies)."""
    found, errors = {}, []
    for folder in notebook_dirs:
        for path in sorted(Path(folder).rglob("*.ipynb")):
            nb = json.loads(path.read_text(encoding="utf-8"))
            for cell in nb.get("cells", []):
                for out in cell.get("outputs", []):
                    meta = out.get("metadata", {}).get("image/png", {})
                    png = out.get("data", {}).get("image/png")
                    if not png or not isinstance(meta, dict):
                        continue
                    digest = hashlib.sha256(base64.b64decode("".join(png))).hexdigest()
                    if PHONE_KEY in meta:
                        found[digest] = base64.b64decode(meta[PHONE_KEY])
                    elif PHONE_ERROR_KEY in meta:
                        errors.append(f"{path.name}: {meta[PHONE_ERROR_KEY]}")
    return found, errors


def picture(img: str, src_dir: str, digest: str, phone: bytes) -> str:
    """The <img> in a <picture> whose <source> is the phone PNG on a narrow screen. The source's
    width and height (the PNG's pixels) give the page the phone figure's aspect ratio before it
    loads; the <img>'s own style still sets its width."""
    w, h = int.from_bytes(phone[16:20], "big"), int.from_bytes(phone[20:24], "big")
    return (f'<picture><source media="{MEDIA}" '
            f'srcset="{src_dir}{digest}{SUFFIX}" width="{w}" height="{h}" />{img}</picture>')


def add_phone_figures(out: Path, notebook_dirs=None) -> str:
    """Write the phone PNGs into `out`/_images and point the pages' figures at them; a one-line
    summary (naming the figures that could not be redrawn for a phone)."""
    out = Path(out)
    if notebook_dirs is None:  # where tasks.py's build keeps the executed notebooks
        notebook_dirs = [out.parent / ".jupyter_cache", out.parent / "executed"]
    found, errors = phone_pngs([d for d in notebook_dirs if Path(d).is_dir()])
    written, pages = set(), 0
    for page in out.rglob("*.html"):
        if "_static" in page.relative_to(out).parts:
            continue
        html = page.read_text(encoding="utf-8")

        def swap(m, html=html):
            digest, src_dir = m["hash"], m["dir"]
            if digest not in found or f'srcset="{src_dir}{digest}{SUFFIX}"' in html:
                return m[0]  # no phone version, or done already
            (out / "_images" / f"{digest}{SUFFIX}").write_bytes(found[digest])
            written.add(digest)
            return picture(m[0], src_dir, digest, found[digest])

        new = IMG.sub(swap, html)
        if new != html:
            page.write_text(new, encoding="utf-8")
            pages += 1
    note = f"; no phone version of {len(errors)}: {'; '.join(errors)}" if errors else ""
    return f"phone figures: {len(written)} on {pages} pages{note}"


if __name__ == "__main__":
    print(add_phone_figures(Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")))
