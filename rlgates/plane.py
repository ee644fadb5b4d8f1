"""The (A, log ρ) plane: gate and learning-signal grids, and the book's figures.

x = advantage A, y = log ρ. Colours are the same in every figure: encourage (the gradient raises
the token's probability) is red, discourage is blue, zero gradient is white or grey.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .methods import Method, get

#: Default half-height of the log ρ axis, per method, so that each gate's edges are visible.
LOG_RATIO_LIM = {"sao": 2.0, "sapo": 3.0, "gspo": 1.5e-3, "cispo": 2.0, "dual_clip": 1.5}
DEFAULT_LOG_RATIO_LIM = 0.6
CMAP = "RdBu_r"  # red > 0 (encourage), white 0, blue < 0 (discourage)
EDGE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}


def log_ratio_lim(method: Method) -> float:
    return LOG_RATIO_LIM.get(method.name, DEFAULT_LOG_RATIO_LIM)


def axis_symbols(method: Method):
    """('A_t', '\\rho_t') at token level, ('A_s', '\\rho_s') for sequence-level methods."""
    s = "s" if method.level == "sequence" else "t"
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


def plane(method, adv_lim=1.0, log_ratio_lim_=None, n=201) -> Plane:
    """Evaluate `method.gate` and `method.signal` on an n×n grid over A ∈ ±adv_lim, log ρ ∈ ±lim."""
    method = get(method) if isinstance(method, str) else method
    lim = log_ratio_lim(method) if log_ratio_lim_ is None else log_ratio_lim_
    adv = torch.linspace(-adv_lim, adv_lim, n, dtype=torch.float64)
    log_ratio = torch.linspace(-lim, lim, n, dtype=torch.float64)
    ratio = log_ratio.exp()[:, None]
    a = adv[None, :]
    return Plane(adv.numpy(), log_ratio.numpy(), method.gate(ratio, a).numpy(),
                 method.signal(ratio, a).numpy())


def draw_edges(ax, method: Method, adv_lim, grid: Plane | None = None):
    """Draw the gate's edges: a hard gate's as dashed lines on their side of A = 0; for a smooth
    gate (no `bounds()`), the dashed curve where it has fallen to one half, computed on `grid`
    separately for A < 0 and A > 0 (so that a gate that jumps at A = 0 gets no false edge there).
    """
    for ratio, side in method.bounds():
        x0, x1 = {+1: (0, adv_lim), -1: (-adv_lim, 0), 0: (-adv_lim, adv_lim)}[side]
        ax.plot([x0, x1], [np.log(ratio)] * 2, **EDGE_STYLE)
    if method.bounds() or grid is None:
        return
    for side in (grid.adv < 0, grid.adv > 0):
        if side.sum() >= 2 and np.ptp(grid.gate[:, side]) > 0:
            ax.contour(grid.adv[side], grid.log_ratio, grid.gate[:, side], levels=[0.5],
                       colors=EDGE_STYLE["color"], linestyles=EDGE_STYLE["linestyle"],
                       linewidths=EDGE_STYLE["linewidth"])


class GatePanels:
    """The two-panel figure (gate | learning signal) of one method; `update` redraws it in place.

    Left: sign(A)·f'(ρ; A), so an open gate is red where it encourages and blue where it
    discourages. Right: the learning signal f'·ρ·A. Both share axes; colour bars are labelled.
    """

    def __init__(self, method, adv_lim=1.0, log_ratio_lim_=None, n=201, signal_max=None, axes=None,
                 live=False):
        import matplotlib.pyplot as plt

        self.adv_lim, self.lim, self.n, self.signal_max = adv_lim, log_ratio_lim_, n, signal_max
        self.live, self._background = live, None
        if axes is None:
            fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True, sharey=True,
                                     layout="constrained")
        self.fig, self.axes = axes[0].figure, axes
        self._moving = []  # artists redrawn on every update (edges, contours)
        self.update(method)

    def update(self, method):
        """Redraw for `method` (a name or a Method). Returns self."""
        method = get(method) if isinstance(method, str) else method
        self.method = method
        p = plane(method, self.adv_lim, self.lim, self.n)
        smax = self.signal_max or max(float(np.abs(p.signal).max()), 1e-12)
        signed_gate = np.sign(p.adv)[None, :] * p.gate
        A, r = axis_symbols(method)
        left, right = self.axes
        for artist in self._moving:
            artist.remove()
        self._moving = []
        if not hasattr(self, "_images"):
            kw = {"extent": p.extent, "origin": "lower", "aspect": "auto", "cmap": CMAP,
                  "interpolation": "nearest", "animated": self.live}
            self._images = (left.imshow(signed_gate, vmin=-1, vmax=1, **kw),
                            right.imshow(p.signal, vmin=-smax, vmax=smax, **kw))
            self.fig.colorbar(self._images[0], ax=left, shrink=0.9,
                              label="gate f′, signed by A (red A>0, blue A<0)")
            self.fig.colorbar(self._images[1], ax=right, shrink=0.9,
                              label=f"learning signal f′·${r}$·${A}$")
            from matplotlib.ticker import MaxNLocator

            for ax in self.axes:
                ax.xaxis.set_major_locator(MaxNLocator(5))
                ax.axvline(0, color="0.4", linewidth=0.6)
                ax.axhline(0, color="0.4", linewidth=0.6)
                ax.set_xlabel(f"advantage ${A}$")
            left.set_ylabel(rf"$\log {r}$")
            left.set_title(f"gate f′(${r}$; ${A}$)")
            right.set_title(f"learning signal f′·${r}$·${A}$")
            self._title = self.fig.suptitle("", fontsize=10, animated=self.live)
        else:
            self._images[0].set_data(signed_gate)
            self._images[1].set_data(p.signal)
            for im in self._images:
                im.set_extent(p.extent)
            self._images[1].set_clim(-smax, smax)
        for ax in self.axes:
            n_lines, n_coll = len(ax.lines), len(ax.collections)
            draw_edges(ax, method, self.adv_lim, p)
            self._moving += list(ax.lines[n_lines:]) + list(ax.collections[n_coll:])
        for artist in self._moving:
            artist.set_animated(self.live)
        self._title.set_text(f"{method.title}: {method!r}")
        return self

    def png(self, dpi=72) -> bytes:
        """The figure as PNG bytes. With live=True only the moving parts are redrawn (blitting)."""
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
        canvas.restore_region(self._background)
        for artist in (*self._images, *self._moving, self._title):
            self.fig.draw_artist(artist)
        buf = io.BytesIO()
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def close(self):
        import matplotlib.pyplot as plt

        plt.close(self.fig)


def plot_gate_signal(method, **kwargs):
    """Draw the two-panel (gate | signal) figure of any method; returns the figure."""
    return GatePanels(method, **kwargs).fig


def plot_ppo_regions(eps=0.2, adv_lim=1.0, log_ratio_lim_=0.6, ax=None):
    """Figure 1: the four PPO regions on the (A, log ρ) plane."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    method = get("ppo", eps=eps)
    p = plane(method, adv_lim, log_ratio_lim_, n=401)
    # 0: discourage, 1: zero gradient, 2: encourage
    region = 1 + np.sign(p.adv)[None, :] * p.gate
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    colours = ["#2166ac", "#e0e0e0", "#b2182b"]
    ax.imshow(region, extent=p.extent, origin="lower", aspect="auto",
              cmap=ListedColormap(colours), vmin=0, vmax=2, interpolation="nearest")
    draw_edges(ax, method, adv_lim)
    ax.axvline(0, color="0.3", linewidth=0.8)
    hi, lo = np.log(1 + eps), np.log(1 - eps)
    labels = [
        (adv_lim / 2, (hi - log_ratio_lim_) / 2, "A>0, unclipped:\nencourage", "white"),
        (adv_lim / 2, (hi + log_ratio_lim_) / 2, "A>0, clipped\n(ρ > 1+ε): zero", "black"),
        (-adv_lim / 2, (lo + log_ratio_lim_) / 2, "A<0, unclipped:\ndiscourage", "white"),
        (-adv_lim / 2, (lo - log_ratio_lim_) / 2, "A<0, clipped\n(ρ < 1−ε): zero", "black"),
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
