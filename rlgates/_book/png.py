"""The book's inline figures: PNGs at a scale of their dpi, stored with a palette (about a third
of the bytes), each tagged with its pixels per inch and its smallest text size for the browser
test (tests/browser/test_layout.py). `rlgates.setup` installs them in a Jupyter kernel.

For the web book (RLGATES_PHONE_FIGURES=1, set by tasks.py when it runs the chapters) a figure
whose text would be too small in a phone's column also gets a phone version: its panels stacked
in one narrower column (`phone_figure`), kept in the output's metadata for the build
(scripts/phone_figures.py). Jupyter shows the normal figure either way.
"""

from __future__ import annotations

import os

#: Inline PNGs are stored with a palette of this many colours (None: full colour), about a third
#: of the bytes: the book's figures hold ~1000 colours, nearly all antialiasing; white stays white
#: and 99 % of pixels move by at most 8/255.
PNG_COLOURS = 256
#: How wide a figure shows on a 390 px phone (CSS px, measured: 342 in most cells, 320 in one
#: whose code is folded, the narrowest), and the smallest figure text to show there; a figure
#: whose text would be smaller gets a phone version.
PHONE_COLUMN_PX = 320
PHONE_MIN_TEXT_PX = 8
#: the environment variable that asks for phone versions, and where they go: a key of the
#: PNG output's metadata (base64), or, when the figure could not be redrawn, why
PHONE_ENV = "RLGATES_PHONE_FIGURES"
PHONE_KEY = "rlgates:phone-png"
PHONE_ERROR_KEY = "rlgates:phone-error"


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


def _png(fig, scale: float):
    """The figure as PNG bytes at `scale` x its dpi (None for an empty figure), tagged with its
    pixels per inch and smallest text size."""
    from IPython.core.pylabtools import print_figure

    dpi = fig.dpi * scale
    meta = {"rlgates:px-per-inch": f"{dpi:g}"}
    small = smallest_text_pt(fig)
    if small is not None:
        meta["rlgates:min-font-pt"] = f"{small:g}"
    data = print_figure(fig, "png", bbox_inches="tight", dpi=dpi, metadata=meta)
    if data is not None and PNG_COLOURS:
        data = _with_palette(data, PNG_COLOURS, meta)
    return data


def shown_text_px(text_pt: float, width_in: float, dpi: float,
                  column_px: float = PHONE_COLUMN_PX) -> float:
    """How tall `text_pt` text shows (CSS px) in a figure `width_in` inches wide, shown at `dpi`
    CSS px per inch but shrunk to fit a `column_px` column (never enlarged)."""
    return text_pt / 72 * dpi * min(1.0, column_px / (width_in * dpi))


def phone_figure(fig, text_pt: float):
    """A copy of `fig` for a phone's column: its panels stacked in one column, each as tall as
    before, and the figure narrow enough that `text_pt` text shows at PHONE_MIN_TEXT_PX when it
    fills PHONE_COLUMN_PX. Raises when the figure cannot be copied (pickle) or re-laid (an
    Axes placed by hand, not on a grid)."""
    import pickle

    from matplotlib import rcParams
    from matplotlib.gridspec import GridSpec

    copy = pickle.loads(pickle.dumps(fig))
    panels, followers = [], {}  # followers: a panel's twins (twinx), which take its new place
    for ax in copy.axes:
        if hasattr(ax, "_colorbar"):  # a colour bar: the layout keeps it beside its panel
            continue
        if ax.get_subplotspec() is None:
            raise ValueError("an Axes not on a grid (fig.add_axes)")
        first = next(a for a in copy.axes if a in ax._twinned_axes.get_siblings(ax))
        if first is ax:
            panels.append(ax)
        else:
            followers.setdefault(first, []).append(ax)
    # Reading order, row by row; but each column stays together when only the top row has
    # titles (they name the columns) or when a column shares a colour bar (which stays beside
    # its panels, so they must stay together)
    def cell(ax):
        ss = ax.get_subplotspec()
        return ss.rowspan.start, ss.colspan.start

    bars = [cax._colorbar_info["parents"] for cax in copy.axes
            if len(getattr(cax, "_colorbar_info", {}).get("parents", [])) > 1]
    titled = {cell(ax)[0] for ax in panels if ax.get_title()}
    by_column = len({cell(ax)[0] for ax in panels}) > 1 and (titled == {0} or any(
        len({cell(ax)[1] for ax in parents}) == 1 for parents in bars))
    panels.sort(key=lambda ax: cell(ax)[::-1] if by_column else cell(ax))
    for parents in bars:  # a shared colour bar beside panels that are no longer together
        rows = sorted(panels.index(ax) for ax in parents)
        if rows != list(range(rows[0], rows[-1] + 1)):
            raise ValueError("a colour bar shared by panels that a column would separate")
    places = {ax: _place(ax.get_subplotspec()) for ax in panels}  # before they move
    heights = []
    for ax in panels:
        ss = ax.get_subplotspec()
        heights.append(fig.get_figheight() * len(ss.rowspan) / ss.get_gridspec().nrows)
    # the PNG's width in inches, less the margin the tight bounding box adds on each side
    width = text_pt * PHONE_COLUMN_PX / (72 * PHONE_MIN_TEXT_PX)
    width -= 2 * rcParams["savefig.pad_inches"]
    copy.set_size_inches(width, sum(heights))
    grid = GridSpec(len(panels), 1, figure=copy, height_ratios=heights)
    for k, ax in enumerate(panels):
        for a in [ax, *followers.get(ax, [])]:
            a.set_subplotspec(grid[k, 0])
        # the captions say "Left:", "Right:": each stacked panel says where it was
        if places[ax]:
            title = next((t for t in (ax.title, ax._left_title, ax._right_title)
                          if t.get_text()), ax.title)
            tag = f"({places[ax]})"
            title.set_text(f"{tag} {title.get_text()}" if title.get_text() else tag)
        # a panel that shared its y axis with the one on its left showed no y ticks; alone on
        # its row now, it shows them
        if len(ax.get_shared_y_axes().get_siblings(ax)) > 1 and \
                ax.yaxis.get_label_position() == "left":
            ax.yaxis.set_tick_params(which="both", labelleft=True)
    # a long title wraps in the narrower figure, and a legend of the whole figure, laid out
    # across the laptop one, takes one column, instead of widening it
    for title in [copy._suptitle, *(ax.title for ax in panels)]:
        if title is not None:
            title.set_wrap(True)
    outside = "outside " if copy.get_constrained_layout() else ""
    for legend in list(copy.legends):  # drawn anew: a legend cannot change its columns
        texts = legend.get_texts()
        copy.legend(handles=legend.legend_handles, labels=[t.get_text() for t in texts],
                    loc=f"{outside}lower center", fontsize=texts[0].get_fontsize(),
                    title=legend.get_title().get_text() or None)
        legend.remove()
    if copy.get_layout_engine() is None:
        copy.tight_layout()
    return copy


def _place(ss) -> str:
    """Where a panel sits in its grid, as a caption says it ("left", "top right"); "" when it
    spans every column (stacked, it keeps its place)."""
    grid = ss.get_gridspec()
    if len(ss.colspan) == grid.ncols:
        return ""
    words = {2: ["left", "right"], 3: ["left", "middle", "right"]}
    column = (words[grid.ncols][ss.colspan.start] if grid.ncols in words and len(ss.colspan) == 1
              else f"column {ss.colspan.start + 1}")
    if grid.nrows == 1 or len(ss.rowspan) == grid.nrows:
        return column
    rows = {2: ["top", "bottom"], 3: ["top", "middle", "bottom"]}
    row = (rows[grid.nrows][ss.rowspan.start] if grid.nrows in rows and len(ss.rowspan) == 1
           else f"row {ss.rowspan.start + 1}")
    return f"{row} {column}"


def phone_png(fig, scale: float, text_pt: float) -> bytes:
    """`phone_figure`'s PNG, made narrower (up to twice) if labels sticking out of the figure
    (the tight bounding box) made it wider than planned."""
    import io

    from PIL import Image

    phone = phone_figure(fig, text_pt)
    try:
        for _ in range(3):
            data = _png(phone, scale)
            with Image.open(io.BytesIO(data)) as im:
                width = im.width / (phone.dpi * scale)  # inches
            if shown_text_px(text_pt, width, phone.dpi) >= PHONE_MIN_TEXT_PX - 0.01:
                break
            phone.set_figwidth(phone.get_figwidth() * shown_text_px(text_pt, width, phone.dpi)
                               / PHONE_MIN_TEXT_PX - 0.05)
        return data
    finally:
        import matplotlib.pyplot as plt

        plt.close(phone)


def figure_png(fig, scale: float, phone: bool | None = None):
    """A figure as (PNG bytes, {"width", "height"}): drawn at `scale` times the figure's dpi, with
    the display size in CSS pixels at its dpi (what Jupyter and myst-nb show it at).

    The PNG records its pixels per inch and its smallest text size (text chunks
    `rlgates:px-per-inch`, `rlgates:min-font-pt`): the browser test turns them into the text's
    size on the page.

    phone (default: whether $RLGATES_PHONE_FIGURES is set): also draw the phone version of a
    figure whose smallest text would show under PHONE_MIN_TEXT_PX in a phone's column; it goes
    into the metadata (PHONE_KEY, base64), or why it could not be drawn (PHONE_ERROR_KEY).
    """
    data = _png(fig, scale)
    if data is None:  # an empty figure: nothing to show
        return None
    w, h = _png_size(data)
    meta = {"width": round(w / scale), "height": round(h / scale)}
    if phone is None:
        phone = os.environ.get(PHONE_ENV, "") not in ("", "0")
    small = smallest_text_pt(fig)
    if phone and small and shown_text_px(small, w / scale / fig.dpi, fig.dpi) < PHONE_MIN_TEXT_PX:
        import base64

        try:
            meta[PHONE_KEY] = base64.b64encode(phone_png(fig, scale, small)).decode()
        except Exception as err:  # noqa: BLE001 - the book still has the laptop figure
            meta[PHONE_ERROR_KEY] = f"{type(err).__name__}: {err}"
    return data, meta


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
