"""The book's inline figures: PNGs at a scale of their dpi, stored with a palette (about a third
of the bytes), each tagged with its pixels per inch and its smallest text size for the browser
test (tests/browser/test_layout.py). `rlgates.setup` installs them in a Jupyter kernel."""

from __future__ import annotations

#: Inline PNGs are stored with a palette of this many colours (None: full colour), about a third
#: of the bytes: the book's figures hold ~1000 colours, nearly all antialiasing; white stays white
#: and 99 % of pixels move by at most 8/255.
PNG_COLOURS = 256


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


def figure_png(fig, scale: float):
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


def sharp_inline_figures(scale: float) -> bool:
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
