"""Every figure of the book: the (A, log ρ) plane, its colours, and the plot helpers.

x = advantage A, y = log ρ. Colours are the same in every figure: encourage (the gradient raises
the token's probability) is red, discourage is blue, zero gradient is white or grey.

    ENCOURAGE, DISCOURAGE, ZERO, CMAP, EDGE_STYLE   the colours and the clip-edge line
    plane(method)                                   gate and signal on an (A, log ρ) grid
    sign_legend(ax), scatter_tokens(ax, adv, log_ratio, method)
    draw_edges(ax, method, adv_lim, grid), half_gate_lines(grid)   the gate's edges
    GatePanels, plot_gate_signal, plot_ppo_regions, plot_small_multiples, plot_profiles
    png_rgb(rgb)                                    a fast PNG for the live sliders
    plot_runs(runs, key), plot_shut_by_sign(runs)   lab curves over seeds (rlgates.lab)

A method that reads side information (`Method.side_inputs`, rlgates.SideInfo) is drawn with
`side=`: the plane holds those fields fixed while A and log ρ vary (a number per field, or a
tensor that broadcasts to the grid), and the caption says which values it holds. Without it
the method's ValueError names the field it lacks.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from .methods import Method, get

ENCOURAGE = "#b2182b"  # red: the gradient raises the token's probability (A > 0, gate open)
DISCOURAGE = "#2166ac"  # blue: it lowers it (A < 0, gate open)
ZERO = "#e0e0e0"  # grey: zero gradient (the gate is shut)
CMAP = "RdBu_r"  # the same three as a colour map: red > 0, white 0, blue < 0
EDGE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}


def _method(method) -> Method:
    return get(method) if isinstance(method, str) else method


def default_lim(method: Method) -> float:
    """The method's own half-height of the log ρ axis (its class's `log_ratio_lim`)."""
    return getattr(method, "log_ratio_lim", Method.log_ratio_lim)


def sign_legend(ax, extra=(), **kwargs):
    """A legend for the sign of A: red "A > 0 (encourage)", blue "A < 0 (discourage)", then any
    `extra` handles (matplotlib artists with labels)."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=ENCOURAGE, label="A > 0 (encourage)"),
               Line2D([], [], marker="o", ls="", color=DISCOURAGE, label="A < 0 (discourage)"),
               *extra]
    kwargs.setdefault("fontsize", 10)
    return ax.legend(handles=handles, **kwargs)


def scatter_tokens(ax, adv, log_ratio, method=None, gate=None, adv_lim=None, lim=None,
                   size=10, legend=True, side=None):
    """Tokens as points on the (A, log ρ) plane, red for A > 0 and blue for A < 0; tokens whose
    gate is shut (from `gate`, or from `method` at these points, with its side information
    `side` per token) are hollow grey circles.

    With `method` its clip edges are drawn too. Returns the axes.
    """
    adv = np.asarray(torch.as_tensor(adv, dtype=torch.float64).flatten())
    log_ratio = np.asarray(torch.as_tensor(log_ratio, dtype=torch.float64).flatten())
    method = _method(method) if method is not None else None
    if gate is None and method is not None:
        gate = method.gate(torch.from_numpy(log_ratio).exp(), torch.from_numpy(adv), side)
    shut = (np.zeros_like(adv, dtype=bool) if gate is None
            else np.asarray(torch.as_tensor(gate).flatten()) == 0)
    colour = np.where(adv > 0, ENCOURAGE, DISCOURAGE)
    ax.scatter(adv[~shut], log_ratio[~shut], s=size, c=colour[~shut], lw=0, alpha=0.8)
    if shut.any():
        ax.scatter(adv[shut], log_ratio[shut], s=size, facecolors="none", edgecolors="0.45",
                   lw=0.7)
    adv_lim = adv_lim or float(np.abs(adv).max() or 1.0) * 1.05
    if method is not None:
        draw_edges(ax, method, adv_lim)
    ax.axvline(0, color="0.4", lw=0.6)
    ax.axhline(0, color="0.4", lw=0.6)
    ax.set_xlim(-adv_lim, adv_lim)
    if lim is not None:
        ax.set_ylim(-lim, lim)
    A, r = axis_symbols(method) if method is not None else ("A_t", r"\rho_t")
    ax.set_xlabel(f"advantage ${A}$")
    ax.set_ylabel(rf"$\log {r}$")
    if legend:
        from matplotlib.lines import Line2D

        extra = [Line2D([], [], marker="o", ls="", mfc="none", mec="0.45", label="gate shut")]
        sign_legend(ax, extra=extra if shut.any() else (), loc="best")
    return ax


def axis_symbols(method: Method):
    """('A_t', '\\rho_t') at token level, ('A_s', '\\rho_s') for sequence-level methods."""
    s = "t" if method.level == "token" else "s"
    return f"A_{s}", rf"\rho_{s}"


@dataclass
class Plane:
    """Gate and signal sampled on a grid; arrays are [n_log_ratio, n_adv] (rows are y = log ρ)."""

    adv: np.ndarray
    log_ratio: np.ndarray
    gate: np.ndarray
    signal: np.ndarray

    @property
    def extent(self):
        return (self.adv[0], self.adv[-1], self.log_ratio[0], self.log_ratio[-1])


@contextmanager
def _one_torch_thread():
    """torch on one thread inside the block. A plane is too small to gain from more: a slider
    evaluates one per move, and on a machine with a core busy elsewhere, the second thread of
    each operation waits for that core (20x the CPU time of one thread, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def plane(method, adv_lim=1.0, log_ratio_lim=None, n=201, side=None) -> Plane:
    """Evaluate `method.gate` and `method.signal` on an n×n grid over A ∈ ±adv_lim, log ρ ∈ ±lim.
    side: the side information held fixed over the grid (for a method with side inputs)."""
    method = _method(method)
    lim = default_lim(method) if log_ratio_lim is None else log_ratio_lim
    with _one_torch_thread():
        adv = torch.linspace(-adv_lim, adv_lim, n, dtype=torch.float64)
        log_ratio = torch.linspace(-lim, lim, n, dtype=torch.float64)
        ratio = log_ratio.exp()[:, None]
        a = adv[None, :]
        return Plane(adv.numpy(), log_ratio.numpy(), method.gate(ratio, a, side).numpy(),
                     method.signal(ratio, a, side).numpy())


def side_caption(method, side) -> str:
    """', holding probs_old = 0.9' and so on: the side information a figure holds fixed (its
    single values; a field that varies is named only). Empty for a gate of (ρ, A)."""
    if side is None or not getattr(method, "side_inputs", ()):
        return ""
    held = []
    for name in method.side_inputs:
        value = getattr(side, name, None)
        if value is not None:
            held.append(f"{name} = {float(value):g}" if value.numel() == 1 else f"{name} given")
    return ", holding " + ", ".join(held) if held else ""


def half_gate_lines(grid: Plane) -> list[np.ndarray]:
    """Where the gate on `grid` has fallen to one half: polylines of (A, log ρ) vertices, traced
    separately for A < 0 and A > 0 (so that a gate that jumps at A = 0 gets no false edge there).
    The marching squares of `ax.contour` (contourpy, matplotlib's algorithm), without building a
    ContourSet: a fraction of its cost, which a slider pays on every move."""
    import contourpy
    import matplotlib as mpl

    lines = []
    for side in (grid.adv < 0, grid.adv > 0):
        if side.sum() >= 2 and np.ptp(grid.gate[:, side]) > 0:
            gen = contourpy.contour_generator(grid.adv[side], grid.log_ratio, grid.gate[:, side],
                                              name=mpl.rcParams["contour.algorithm"],
                                              line_type="SeparateCode")
            lines += [line for line in gen.lines(0.5)[0] if len(line) >= 2]
    return lines


def _bound_lines(method: Method, adv_lim):
    """A hard gate's edges as ([x0, x1], [y, y]): each bound on its side of A = 0."""
    lines = []
    for ratio, side in method.bounds():
        x0, x1 = {+1: (0, adv_lim), -1: (-adv_lim, 0), 0: (-adv_lim, adv_lim)}[side]
        lines.append(([x0, x1], [np.log(ratio)] * 2))
    return lines


def draw_edges(ax, method: Method, adv_lim, grid: Plane | None = None, lines=None):
    """Draw the gate's edges: a hard gate's as dashed lines on their side of A = 0; for a smooth
    gate (no `bounds()`), the dashed curves where it has fallen to one half (`half_gate_lines` on
    `grid`, or `lines` when they are already traced), as one LineCollection.
    """
    for xs, ys in _bound_lines(method, adv_lim):
        ax.plot(xs, ys, **EDGE_STYLE)
    if method.bounds() or grid is None:
        return
    lines = half_gate_lines(grid) if lines is None else lines
    if lines:
        from matplotlib.collections import LineCollection

        ax.add_collection(LineCollection(lines, colors=EDGE_STYLE["color"],
                                         linestyles=EDGE_STYLE["linestyle"],
                                         linewidths=EDGE_STYLE["linewidth"]), autolim=False)


class GatePanels:
    """The two-panel figure (gate | learning signal) of one method; `update` redraws it in place.
    Its title, `caption`, names the method and its hyperparameters; with live=True the figure
    leaves it out, for the widget to show as text.

    side: the side information held fixed (a method with side inputs), named in the caption.

    Left: sign(A)·f'(ρ; A), so an open gate is red where it encourages and blue where it
    discourages. Right: the learning signal f'·ρ·A. Both share axes; colour bars are labelled.
    """

    def __init__(self, method, adv_lim=1.0, log_ratio_lim=None, n=201, signal_max=None, axes=None,
                 live=False, side=None):
        import matplotlib.pyplot as plt

        self.adv_lim, self.lim, self.n, self.signal_max = adv_lim, log_ratio_lim, n, signal_max
        self.live, self._background, self._screens = live, None, None
        self.side = side
        if axes is None:
            fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True, sharey=True,
                                     layout="constrained")
        self.fig, self.axes = axes[0].figure, axes
        self._moving = []  # artists redrawn on every update (edges, contours)
        self._overlay = []  # fixed artists that lie over the images: axes at 0, frames
        self.update(method)

    def update(self, method):
        """Redraw for `method` (a name or a Method). Returns self."""
        method = get(method) if isinstance(method, str) else method
        self.method = method
        p = plane(method, self.adv_lim, self.lim, self.n, self.side)
        smax = self.signal_max or max(float(np.abs(p.signal).max()), 1e-12)
        signed_gate = np.sign(p.adv)[None, :] * p.gate
        if not hasattr(self, "_images"):
            self._first_draw(method, p, signed_gate, smax)
        else:
            self._images[0].set_data(signed_gate)
            self._images[1].set_data(p.signal)
            for im in self._images:
                if tuple(im.get_extent()) != p.extent:  # only when the axis was resized
                    im.set_extent(p.extent)
            self._images[1].set_clim(-smax, smax)
        self._draw_edges(method, p)
        self.caption = f"{method.title}: {method!r}{side_caption(method, self.side)}"
        if self._title is not None:
            self._title.set_text(self.caption)
        return self

    def _first_draw(self, method, p, signed_gate, smax):
        """The images, colour bars, axes at 0, labels and titles: drawn once."""
        from matplotlib.ticker import MaxNLocator

        A, r = axis_symbols(method)
        left, right = self.axes
        # resampled as data, then coloured: with nearest it looks the same as the default
        # (colour first; at most 1/255 apart) and draws about 4x faster, which a slider feels
        kw = {"extent": p.extent, "origin": "lower", "aspect": "auto", "cmap": CMAP,
              "interpolation": "nearest", "interpolation_stage": "data", "animated": self.live}
        self._images = (left.imshow(signed_gate, vmin=-1, vmax=1, **kw),
                        right.imshow(p.signal, vmin=-smax, vmax=smax, **kw))
        self.fig.colorbar(self._images[0], ax=left, shrink=0.9,
                          label="gate f′, signed by A (red A>0, blue A<0)")
        self.fig.colorbar(self._images[1], ax=right, shrink=0.9,
                          label=f"learning signal f′·${r}$·${A}$")
        for ax in self.axes:
            ax.xaxis.set_major_locator(MaxNLocator(5))
            self._overlay += [ax.axvline(0, color="0.4", linewidth=0.6),
                              ax.axhline(0, color="0.4", linewidth=0.6), *ax.spines.values()]
            ax.set_xlabel(f"advantage ${A}$")
        left.set_ylabel(rf"$\log {r}$")
        left.set_title(f"gate f′(${r}$; ${A}$)")
        right.set_title(f"learning signal f′·${r}$·${A}$")
        # live, the title is the widget's text line above the image (rlgates.explore): it
        # changes on every move, and drawing its glyphs would cost as much as a panel
        self._title = None if self.live else self.fig.suptitle("", fontsize=10)
        for artist in self._overlay:  # drawn on every move, after the images, not below them
            artist.set_animated(self.live)

    def _draw_edges(self, method, p):
        """The gate's edges (hard bounds, or the lines where a smooth gate is ½) on both panels:
        moved in place when live and their count is unchanged, else drawn anew."""
        bounds = _bound_lines(method, self.adv_lim)
        lines = [] if bounds else half_gate_lines(p)  # traced once, for both panels
        if self.live and self._move_edges(bounds, lines):
            return
        for artist in self._moving:
            artist.remove()
        self._moving = []
        for ax in self.axes:
            n_lines, n_coll = len(ax.lines), len(ax.collections)
            draw_edges(ax, method, self.adv_lim, p, lines=lines)
            self._moving += list(ax.lines[n_lines:]) + list(ax.collections[n_coll:])
        for artist in self._moving:
            artist.set_animated(self.live)

    def _move_edges(self, bounds, lines) -> bool:
        """Give the edge artists of the last update their new places, when there are as many as
        before (a Line2D per bound, one LineCollection for the half-gate lines, on each axes):
        a slider moves them without the cost of new artists. False if the count differs."""
        from matplotlib.collections import LineCollection
        from matplotlib.lines import Line2D

        per_axes = [Line2D] * len(bounds) + ([LineCollection] if lines else [])
        if [type(a) for a in self._moving] != per_axes * len(self.axes):
            return False
        places = [*bounds, *([lines] if lines else [])] * len(self.axes)
        for artist, place in zip(self._moving, places, strict=True):
            if isinstance(artist, Line2D):
                artist.set_data(*place)
            else:
                artist.set_segments(place)
        return True

    def png(self, dpi=72) -> bytes:
        """The figure as PNG bytes. With live=True only the moving parts are redrawn (blitting),
        and the heatmaps are painted from their cells (`_ScreenCells`), not resampled."""
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        if not self.live:
            buf = io.BytesIO()
            self.fig.savefig(buf, format="png", dpi=dpi)
            return buf.getvalue()
        self.fig.set_dpi(dpi)
        canvas = self.fig.canvas
        if not isinstance(canvas, FigureCanvasAgg):
            canvas = FigureCanvasAgg(self.fig)
        if self._background is None:  # draw the static frame once, then fix the layout
            canvas.draw()
            self.fig.set_layout_engine("none")
            self._background = canvas.copy_from_bbox(self.fig.bbox)
            self._screens = [_ScreenCells(im, canvas.get_renderer()) for im in self._images]
        canvas.restore_region(self._background)
        buffer = np.asarray(canvas.buffer_rgba())
        for im, screen in zip(self._images, self._screens, strict=True):
            if not screen.paint(im, buffer):  # not a case it knows: matplotlib draws it
                self.fig.draw_artist(im)
        for artist in (*self._overlay, *self._moving):  # over the images, as a full draw does
            self.fig.draw_artist(artist)
        # RGB: the figure is opaque, and a fourth channel costs encoding time and bytes
        rgb = Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")  # fast in Pillow
        return png_rgb(np.asarray(rgb))

    def close(self):
        import matplotlib.pyplot as plt

        plt.close(self.fig)


class _ScreenCells:
    """Which data cell each screen pixel of an image shows, to paint a new frame of a live
    figure's heatmap straight into the canvas: its cells coloured by its own norm and colour map,
    then copied to the pixels that show them. With nearest resampling of the data this is the
    image a draw makes, pixel for pixel, at a fraction of the cost (matplotlib resamples the
    data, then colours every screen pixel, on each draw).

    The map is matplotlib's own: the cells' flat indices, resampled once through a copy of the
    image (same extent, transform and clip) whose norm keeps what it is given. Valid while the
    image's extent, data shape and place on the canvas stay as they were when it was made."""

    def __init__(self, image, renderer):
        from matplotlib.colors import Normalize
        from matplotlib.image import AxesImage

        class Keep(Normalize):  # in the draw, the norm gets the data resampled to the screen
            def __call__(self, value, clip=None):
                self.seen = np.ma.getdata(value).copy()
                return super().__call__(value, clip)

        self.key = self._key(image)
        self.cells = None
        if image.get_interpolation() != "nearest" or image.get_interpolation_stage() != "data":
            return  # other resamplings mix cells: no one cell per pixel
        norm = Keep()
        probe = AxesImage(image.axes, norm=norm, interpolation="nearest",
                          interpolation_stage="data", origin=image.origin,
                          extent=image.get_extent(), resample=image.get_resample(),
                          filternorm=image.get_filternorm(), filterrad=image.get_filterrad())
        probe.set_transform(image.get_transform())
        probe.set_clip_box(image.get_clip_box())
        shape = image.get_array().shape
        probe.set_data(np.arange(math.prod(shape), dtype=np.float64).reshape(shape))
        rgba, left, bottom, _ = probe.make_image(renderer, renderer.get_image_magnification())
        if rgba is None or (rgba[..., 3] != 255).any():
            return  # a pixel that no cell covers fully: leave such images to matplotlib
        h, w = norm.seen.shape
        top = int(renderer.height - bottom - h)  # Agg's rows run down; the image's run up
        self.rows, self.cols = slice(top, top + h), slice(int(left), int(left) + w)
        self.cells = norm.seen[::-1].astype(np.intp)

    @staticmethod
    def _key(image):
        bbox = image.axes.bbox
        return (tuple(image.get_extent()), image.get_array().shape, tuple(bbox.bounds))

    def paint(self, image, buffer) -> bool:
        """Paint `image` into `buffer` (the canvas's [h, w, 4] pixels); False if it cannot (then
        nothing is painted): a changed layout, or a colour that is not opaque."""
        if self.cells is None or self._key(image) != self.key:
            return False
        colours = image.to_rgba(image.get_array(), bytes=True)  # [ny, nx, 4] uint8
        if (colours[..., 3] != 255).any():
            return False  # a see-through cell (a NaN's "bad" colour) would need blending
        pixels = buffer.view(np.uint32)[..., 0]  # one RGBA pixel per 32-bit word
        pixels[self.rows, self.cols] = colours.view(np.uint32).ravel()[self.cells]
        return True


def png_rgb(rgb: np.ndarray) -> bytes:
    """An [h, w, 3] uint8 image as PNG bytes: rows unfiltered, deflated at level 1. For a figure's
    flat colours this is as small as Pillow's PNG (whose adaptive row filters cannot be turned
    off) and about 3x faster to encode, which a slider pays on every move."""
    import struct
    import zlib

    h, w, _ = rgb.shape
    rows = np.zeros((h, 1 + 3 * w), np.uint8)  # each row: its filter type (0, none), its pixels
    rows[:, 1:] = rgb.reshape(h, 3 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


def plot_gate_signal(method, **kwargs):
    """Draw the two-panel (gate | signal) figure of any method; returns the figure."""
    return GatePanels(method, **kwargs).fig


def plot_ppo_regions(eps=0.2, adv_lim=1.0, log_ratio_lim=0.6, ax=None):
    """Figure 1: the four PPO regions on the (A, log ρ) plane."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    method = get("ppo", eps=eps)
    p = plane(method, adv_lim, log_ratio_lim, n=401)
    # 0: discourage, 1: zero gradient, 2: encourage
    region = 1 + np.sign(p.adv)[None, :] * p.gate
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    colours = [DISCOURAGE, ZERO, ENCOURAGE]
    ax.imshow(region, extent=p.extent, origin="lower", aspect="auto",
              cmap=ListedColormap(colours), vmin=0, vmax=2, interpolation="nearest")
    draw_edges(ax, method, adv_lim)
    ax.axvline(0, color="0.3", linewidth=0.8)
    hi, lo = np.log(1 + eps), np.log(1 - eps)
    labels = [
        (adv_lim / 2, (hi - log_ratio_lim) / 2, "A>0, unclipped:\nencourage", "white"),
        (adv_lim / 2, (hi + log_ratio_lim) / 2, "A>0, clipped\n(ρ > 1+ε): zero", "black"),
        (-adv_lim / 2, (lo + log_ratio_lim) / 2, "A<0, unclipped:\ndiscourage", "white"),
        (-adv_lim / 2, (lo - log_ratio_lim) / 2, "A<0, clipped\n(ρ < 1−ε): zero", "black"),
    ]
    for x, y, text, colour in labels:
        ax.text(x, y, text, ha="center", va="center", color=colour, fontsize=9)
    ax.set_xlabel(r"advantage $A_t$")
    ax.set_ylabel(r"$\log \rho_t$")
    ax.set_title(f"PPO's four regions (ε = {eps:g})")
    ax.legend(handles=[Patch(color=colours[2], label="encourage"),
                       Patch(color=colours[0], label="discourage"),
                       Patch(color=colours[1], label="zero gradient"),
                       plt.Line2D([], [], **EDGE_STYLE, label="clip bound")],
              loc="upper left", fontsize=8, framealpha=0.9)
    return ax.figure


def plot_small_multiples(name, param, values, panel="signal", adv_lim=1.0, log_ratio_lim=None,
                         fixed=None, side=None):
    """One panel per value of `param`: the static stand-in for a slider.

    panel: "signal" (f'·ρ·A) or "gate" (f' signed by A). `fixed` sets the other hyperparameters;
    `side` the side information every panel holds fixed (named in the title).
    All panels share axes and one colour scale, so they can be compared by eye.
    """
    import matplotlib.pyplot as plt

    if panel not in ("signal", "gate"):
        raise ValueError(f"panel must be 'signal' or 'gate', got {panel!r}")
    methods = [get(name, **{**(fixed or {}), param: v}) for v in values]
    planes = [plane(m, adv_lim, log_ratio_lim, side=side) for m in methods]
    if panel == "signal":
        grids = [p.signal for p in planes]
        vmax = max(float(np.abs(g).max()) for g in grids) or 1.0
    else:
        grids = [np.sign(p.adv)[None, :] * p.gate for p in planes]
        vmax = 1.0
    fig, axes = plt.subplots(1, len(values), figsize=(2.6 * len(values) + 1, 3), sharex=True,
                             sharey=True, layout="constrained", squeeze=False)
    A, r = axis_symbols(methods[0])
    for ax, m, p, g, v in zip(axes[0], methods, planes, grids, values, strict=True):
        im = ax.imshow(g, extent=p.extent, origin="lower", aspect="auto", cmap=CMAP,
                       vmin=-vmax, vmax=vmax, interpolation="nearest")
        draw_edges(ax, m, adv_lim, p)
        ax.set_title(f"{param} = {v:g}", fontsize=10)
        ax.set_xlabel(f"${A}$")
    axes[0][0].set_ylabel(rf"$\log {r}$")
    label = f"learning signal f′·${r}$·${A}$" if panel == "signal" else "gate f′, signed by A"
    fig.colorbar(im, ax=list(axes[0]), shrink=0.9, label=label)
    fig.suptitle(f"{methods[0].title}: {panel} as {param} varies"
                 f"{side_caption(methods[0], side)}", fontsize=10)
    return fig


def plot_profiles(*methods, log_ratio_lim=2.0, adv=(1.0, -1.0), axes=None, n=801, side=None):
    """f and f' against log ρ, one column per sign of A: the gate's cross-sections.

    methods: Method objects or registry names, drawn with line styles -, --, -., : in turn (so
    that coinciding curves stay visible). Each method's `bounds()` are drawn as dotted verticals
    in its colour. side: the side information held fixed for the methods that read it (the
    others ignore it). Returns the figure.
    """
    import matplotlib.pyplot as plt

    methods = [_method(m) for m in methods]
    if axes is None:
        _, axes = plt.subplots(2, len(adv), figsize=(4.2 * len(adv) + 1, 5.6), sharex=True,
                               layout="constrained", squeeze=False)
    log_ratio = torch.linspace(-log_ratio_lim, log_ratio_lim, n, dtype=torch.float64)
    ratio = log_ratio.exp()
    for j, a in enumerate(adv):
        a_t = torch.full_like(ratio, a)
        top, bottom = axes[0][j], axes[1][j]
        for i, m in enumerate(methods):
            style = {"color": f"C{i}", "lw": max(2.6 - 0.4 * i, 1.0), "label": m.title,
                     "ls": ("-", "--", "-.", ":")[i % 4]}
            top.plot(log_ratio, m.weight(ratio, a_t, side), **style)
            bottom.plot(log_ratio, m.gate(ratio, a_t, side), **style)
            for r, side in m.bounds():
                if side == 0 or side == (1 if a > 0 else -1):
                    for ax in (top, bottom):
                        if abs(math.log(r)) <= log_ratio_lim:
                            ax.axvline(math.log(r), color=f"C{i}", ls=":", lw=1.2)
        top.plot(log_ratio, ratio, color="0.6", lw=0.8, ls="--", label="ρ (REINFORCE)")
        top.set_title(f"A {'>' if a > 0 else '<'} 0 (A = {a:g})")
        top.set_ylabel("weight f(ρ; A)")
        bottom.set_ylabel("gate f′(ρ; A)")
        bottom.set_xlabel(r"$\log \rho_t$")
        bottom.axhline(0, color="0.4", lw=0.6)
        for ax in (top, bottom):
            ax.axvline(0, color="0.4", lw=0.6)
    axes[0][0].legend(fontsize=8, loc="upper left")
    return axes[0][0].figure


def plot_runs(runs: dict, key: str, ax=None, colors=None, label=True, limits=None):
    """Lab runs {label: [LabResult per seed]}: the mean of `key` over seeds against the training
    step, with its 95 % interval as a band. A registered method's label gets its colour.
    limits: (low, high) the metric cannot leave (a share: (0, 1)); the band is cut there."""
    import matplotlib.pyplot as plt

    from .lab.report import curves, method_color, t975

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    for i, (name, results) in enumerate(runs.items()):
        c = curves(results, key)
        steps = results[0].metrics["step"][: c.shape[1]]
        mean, n = c.mean(0), c.shape[0]
        half = t975(n - 1) * c.std(0) / math.sqrt(n) if n > 1 else 0 * mean
        low, high = mean - half, mean + half
        if limits is not None:
            low, high = low.clamp(min=limits[0]), high.clamp(max=limits[1])
        color = (colors or {}).get(name) or method_color(name, f"C{i}")
        ax.plot(steps, mean.numpy(), color=color, lw=1.8, label=name if label else None)
        ax.fill_between(steps, low.numpy(), high.numpy(), color=color, alpha=0.18, lw=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(key)
    return ax


def plot_shut_by_sign(results, ax=None, title=None):
    """One method's lab runs [LabResult per seed]: the share of tokens whose gate is shut, for
    A > 0 (red, `clipfrac_pos`) and A < 0 (blue, `clipfrac_neg`), mean and 95 % band."""
    ax = plot_runs({"$A_t > 0$": results}, "clipfrac_pos", ax=ax,
                   colors={"$A_t > 0$": ENCOURAGE}, limits=(0, 1))
    plot_runs({"$A_t < 0$": results}, "clipfrac_neg", ax=ax, colors={"$A_t < 0$": DISCOURAGE},
              limits=(0, 1))
    ax.set_ylabel("share of tokens shut")
    if title:
        ax.set_title(title)
    return ax


def plot_value_gate(clip_range=0.5, lim=None, n=401, ax=None):
    """The gate of PPO's clipped value loss (`advantages.value_gate`) on its own plane: x = R −
    V_old (where the target lies, from the value at rollout), y = V − V_old (how far the critic
    has moved since). Red: the gradient step raises V (towards R), blue: it lowers V, grey: the
    gate is shut (zero gradient). Dashed: the band V_old ± clip_range; dotted: the edges of the
    shut regions, R half-way between V and the band's edge. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from .advantages import value_gate

    eps = float(clip_range)
    lim = 3 * eps if lim is None else float(lim)
    with _one_torch_thread():
        axis = torch.linspace(-lim, lim, n, dtype=torch.float64)
        target, move = axis[None, :].expand(n, n), axis[:, None].expand(n, n)
        gate = value_gate(move, torch.zeros_like(move), target, eps)
        push = (gate * (target - move)).sign()  # the sign of −∂ℓ/∂V: + raises V
    region = (1 + push).numpy()  # 0: lowers V, 1: shut (or V = R), 2: raises V
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    colours = [DISCOURAGE, ZERO, ENCOURAGE]
    ext = (-lim, lim, -lim, lim)
    ax.imshow(region, extent=ext, origin="lower", aspect="auto", cmap=ListedColormap(colours),
              vmin=0, vmax=2, interpolation="nearest")
    for y in (eps, -eps):
        ax.axhline(y, **EDGE_STYLE)
    up, down = np.array([eps, lim]), np.array([-lim, -eps])
    kink = {"color": "black", "linestyle": ":", "linewidth": 1.2}
    ax.plot((up + eps) / 2, up, **kink)
    ax.plot((down - eps) / 2, down, **kink)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xlabel(r"target from the old value, $R_t - V_{\mathrm{old},t}$")
    ax.set_ylabel(r"critic's move, $V_t - V_{\mathrm{old},t}$")
    ax.set_title(f"The value loss's gate (cliprange_value = {eps:g})")
    ax.legend(handles=[Patch(color=colours[2], label="step raises V"),
                       Patch(color=colours[0], label="step lowers V"),
                       Patch(color=colours[1], label="gate shut: zero gradient"),
                       Line2D([], [], **EDGE_STYLE, label=r"band $V_{old} \pm$ clip"),
                       Line2D([], [], **kink, label="edge of the shut region")],
              loc="upper left", fontsize=8, framealpha=0.9)
    return ax.figure
