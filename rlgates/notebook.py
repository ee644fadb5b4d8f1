"""What the chapters call: `setup` (seeds, plotting style, device) and `show_source` (the library's
own code, shown where a chapter teaches it)."""

from __future__ import annotations

import random

import numpy as np
import torch

from .devices import device

#: Figure text size (points). Figures are drawn at 100 dpi, so 12 pt is about 17 CSS px at full
#: size; a 10-inch figure in the web book's ~800 px column (at 1280 px) keeps it near 13 px, and a
#: 14-inch one near 9.5 px (tests/browser/test_layout.py measures every figure).
FONT_SIZE = 12
#: Inline PNGs carry this many pixels per CSS pixel (sharp on most high-density screens, half the
#: bytes of 2x). The web page shows each figure at its 100-dpi size, linked to the full image.
IMAGE_SCALE = 1.5
#: Inline PNGs are stored with a palette of this many colours (None: full colour), about a third
#: of the bytes: the book's figures hold ~1000 colours, nearly all antialiasing; white stays white
#: and 99 % of pixels move by at most 8/255.
PNG_COLOURS = 256

STYLE = {
    # opaque white figures: a transparent PNG vanishes on a dark page
    "figure.facecolor": "white", "savefig.facecolor": "white", "axes.facecolor": "white",
    "savefig.transparent": False, "figure.dpi": 100, "axes.grid": False,
    # every relative size ("medium", "large") follows font.size
    "font.size": FONT_SIZE, "axes.titlesize": "medium", "figure.titlesize": "large",
}


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _with_palette(data: bytes, colours: int, meta: dict) -> bytes:
    """The PNG re-encoded with a palette of `colours` (median cut, no dithering), if smaller."""
    import io

    from PIL import Image, PngImagePlugin

    with Image.open(io.BytesIO(data)) as im:
        pal = im.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT,
                                         dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    for key, value in meta.items():
        info.add_text(key, value)
    out = io.BytesIO()
    pal.save(out, format="PNG", optimize=True, pnginfo=info)
    return out.getvalue() if out.tell() < len(data) else data


def smallest_text_pt(fig) -> float | None:
    """The size (points) of the smallest visible, non-empty text in a figure, or None."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else None


def figure_png(fig, scale: float = IMAGE_SCALE):
    """A figure as (PNG bytes, {"width", "height"}): drawn at `scale` times the figure's dpi, with
    the display size in CSS pixels at its dpi (what Jupyter and myst-nb show it at).

    The PNG records its pixels per inch and its smallest text size (text chunks
    `rlgates:px-per-inch`, `rlgates:min-font-pt`): the browser test turns them into the text's
    size on the page.
    """
    from IPython.core.pylabtools import print_figure

    dpi = fig.dpi * scale
    meta = {"rlgates:px-per-inch": f"{dpi:g}"}
    small = smallest_text_pt(fig)
    if small is not None:
        meta["rlgates:min-font-pt"] = f"{small:g}"
    data = print_figure(fig, "png", bbox_inches="tight", dpi=dpi, metadata=meta)
    if data is None:  # an empty figure: nothing to show
        return None
    if PNG_COLOURS:
        data = _with_palette(data, PNG_COLOURS, meta)
    w, h = _png_size(data)
    return data, {"width": round(w / scale), "height": round(h / scale)}


def _sharp_inline_figures(scale: float = IMAGE_SCALE) -> bool:
    """In a Jupyter kernel with the inline backend, show figures at `scale` x their dpi.

    Returns whether it did. The backend is loaded first, so that the inline backend registers its
    own PNG formatter before ours replaces it.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with Jupyter
        return False
    ip = get_ipython()
    if ip is None or not hasattr(ip, "kernel"):
        return False
    import matplotlib as mpl
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    if "inline" not in mpl.get_backend():
        return False
    plt.switch_backend(mpl.get_backend())  # load it now: it registers its formatter on load
    ip.display_formatter.formatters["image/png"].for_type(
        Figure, lambda fig: figure_png(fig, scale))
    return True


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
    _sharp_inline_figures()
    dev = device()
    if dev.type == "cpu":  # the book's models are tiny: one thread beats two fighting over them
        torch.set_num_threads(1)
    if verbose:
        print(f"rlgates: device = {dev} (torch {torch.__version__})")
    return dev
