"""Sliders for a live notebook (the static page shows `figures.plot_small_multiples` instead)."""

from __future__ import annotations

import numpy as np

from .figures import GatePanels, default_lim, plane
from .methods import get

#: Pixels per CSS pixel of the live figure: 1, where the book's static figures have 1.5
#: (notebook.IMAGE_SCALE). A move then draws and encodes 2.25x fewer pixels (a PNG of about 72
#: instead of 117 kB) and takes about half the kernel's time (benchmarks/jupyterlab_slider.py);
#: the image is a little softer on a high-density screen.
LIVE_SCALE = 1.0


def axis_lim(method, base):
    """Half-height of the log ρ axis that keeps every clip bound of `method` in view: `base`, or
    1.15·|log bound| when a bound lies beyond it (the web explorer's rule)."""
    lim = float(base)
    for ratio, _side in method.bounds():
        if ratio > 0 and np.isfinite(np.log(ratio)):
            lim = max(lim, 1.15 * abs(float(np.log(ratio))))
    return lim


def _caption_html(text):
    import html

    return f"<span style='font-size:10pt'>{html.escape(text)}</span>"


def explore(name, **panel_kwargs):
    """ipywidgets sliders for every hyperparameter of `name`, redrawing its gate | signal panels.

    Only useful in a live kernel: a static web page cannot move a slider, so the book pairs each
    call with `plot_small_multiples`, which carries the same information. As in the web explorer,
    the log ρ axis widens when a clip bound would leave it (and says so), and narrows back. The
    image is drawn at `LIVE_SCALE` x the figure's dpi and shown at its 100-dpi size; its title
    (the method and its hyperparameters) is a line of text above it. A method with side inputs
    takes `side=rlgates.SideInfo(...)`, held fixed while the sliders move.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    method = get(name)
    adv_lim = panel_kwargs.pop("adv_lim", 1.0)
    base_lim = panel_kwargs.pop("log_ratio_lim", None) or default_lim(method)
    lim = axis_lim(method, base_lim)
    # a fixed colour scale (the default's), so that the colour bars stay put while sliders move
    start = plane(method, adv_lim, lim, panel_kwargs.get("n", 201), panel_kwargs.get("side"))
    panel_kwargs.setdefault("signal_max", float(np.abs(start.signal).max()) or 1.0)
    panels = GatePanels(method, adv_lim=adv_lim, log_ratio_lim=lim, live=True, **panel_kwargs)
    plt.close(panels.fig)  # shown through the Image widget below, not by the inline backend
    dpi = panels.fig.get_dpi() * LIVE_SCALE
    css_width = f"{round(panels.fig.get_figwidth() * panels.fig.get_dpi())}px"
    image = w.Image(value=panels.png(dpi=dpi), format="png", width=css_width)
    # the figure's title, as text above it (cheaper than drawing its glyphs on every move)
    title = w.HTML(layout=w.Layout(width=css_width, justify_content="center"))
    title.value = _caption_html(panels.caption)
    sliders = {}
    for key, value in method.hparams.items():
        lo, hi, step = method.slider_range(key)
        sliders[key] = w.FloatSlider(value=value, min=lo, max=hi, step=step, description=key,
                                     readout_format=".3g", continuous_update=True)
    status = w.HTML()

    def redraw(_change=None):
        try:
            m = get(name, **{k: s.value for k, s in sliders.items()})
        except ValueError as err:  # an invalid combination: say so instead of drawing
            status.value = f"<span style='color:#b2182b'>{err}</span>"
            return
        new_lim = axis_lim(m, base_lim)
        if new_lim != panels.lim:  # a bound left (or came back into) the default range
            panels.lim = new_lim
            for ax in panels.axes:
                ax.set_ylim(-new_lim, new_lim)
            panels._background = None  # the y ticks change: redraw the static frame once
        panels.update(m)
        status.value = (f"The log ρ axis was widened (to ±{new_lim:.3g}) so that every clip "
                        "bound stays in view." if new_lim > base_lim else "")
        title.value = _caption_html(panels.caption)
        image.value = panels.png(dpi=dpi)

    for s in sliders.values():
        s.observe(redraw, names="value")
    box = w.VBox([w.HBox(list(sliders.values())), status, title, image])
    box.panels, box.sliders, box.redraw = panels, sliders, redraw
    box.image, box.title = image, title
    return box
