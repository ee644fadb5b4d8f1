"""What the chapters call: `setup` (seeds, plotting style, device) and `show_source` (the library's
own code, shown where a chapter teaches it)."""

from __future__ import annotations

import random

import numpy as np
import torch

from ._book.png import sharp_inline_figures  # the PNG plumbing, private
from .devices import device

#: Figure text size (points). Figures are drawn at 100 dpi, so 12 pt is about 17 CSS px at full
#: size; a 10-inch figure in the web book's ~800 px column (at 1280 px) keeps it near 13 px, and a
#: 14-inch one near 9.5 px (tests/browser/test_layout.py measures every figure).
FONT_SIZE = 12
#: Inline PNGs carry this many pixels per CSS pixel (sharp on most high-density screens, half the
#: bytes of 2x). The web page shows each figure at its 100-dpi size, linked to the full image.
IMAGE_SCALE = 1.5
STYLE = {
    # opaque white figures: a transparent PNG vanishes on a dark page
    "figure.facecolor": "white", "savefig.facecolor": "white", "axes.facecolor": "white",
    "savefig.transparent": False, "figure.dpi": 100, "axes.grid": False,
    # every relative size ("medium", "large") follows font.size
    "font.size": FONT_SIZE, "axes.titlesize": "medium", "figure.titlesize": "large",
}


def _without_docstring(source: str) -> str:
    """A def's or class's source with its docstring's lines removed (if it has one)."""
    import ast

    node = ast.parse(source).body[0]
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)) or len(node.body) == 1:
        return source
    lines = source.splitlines()
    return "\n".join(lines[:first.lineno - 1] + lines[first.end_lineno:])


def source_text(*objs, docstrings: bool = False) -> str:
    """The source of functions, methods or classes, each headed by the name it is defined under
    (`# rlgates.methods.clip.SignClip._gate`), without docstrings unless asked."""
    import inspect
    import textwrap

    parts = []
    for obj in objs:
        fn = inspect.unwrap(getattr(obj, "__func__", obj))  # a bound method: its function
        code = textwrap.dedent(inspect.getsource(fn))
        code = code if docstrings else _without_docstring(code)
        parts.append(f"# {fn.__module__}.{fn.__qualname__}\n{code.rstrip()}")
    return "\n\n".join(parts)


def show_source(*objs, docstrings: bool = False):
    """The library's code, shown in a chapter as a highlighted Python block (a Markdown output:
    the book and Jupyter both render it). It is read from the running objects
    (`inspect.getsource`), so what the page shows is the code that runs."""
    from IPython.display import Markdown

    return Markdown("```python\n" + source_text(*objs, docstrings=docstrings) + "\n```")


def setup(seed: int = 0, verbose: bool = True) -> torch.device:
    """Fix the seeds, set a plotting style readable in light and dark themes, pick the device.

    Figures get white faces, 12-pt text and, in Jupyter, PNGs at 1.5x their dpi (IMAGE_SCALE).
    On the CPU it also uses one torch thread: the book's models are so small that a second thread
    costs more in coordination than it gains (measured: 10x faster training steps under load).
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    import matplotlib as mpl

    mpl.rcParams.update(STYLE)
    sharp_inline_figures(IMAGE_SCALE)
    dev = device()
    if dev.type == "cpu":  # the book's models are tiny: one thread beats two fighting over them
        torch.set_num_threads(1)
    if verbose:
        print(f"rlgates: device = {dev} (torch {torch.__version__})")
    return dev
