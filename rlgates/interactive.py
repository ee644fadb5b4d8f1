"""Sliders for a live notebook (the static page shows `figures.plot_small_multiples` instead)."""

from __future__ import annotations

import numpy as np

from .figures import GatePanels, log_ratio_lim, plane
from .methods import get


def explore(name, **panel_kwargs):
    """ipywidgets sliders for every hyperparameter of `name`, redrawing its gate | signal panels.

    Only useful in a live kernel: a static web page cannot move a slider, so the book pairs each
    call with `plot_small_multiples`, which carries the same information.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    method = get(name)
    adv_lim = panel_kwargs.pop("adv_lim", 1.0)
    lim = panel_kwargs.pop("log_ratio_lim_", None) or log_ratio_lim(method)
    # a fixed colour scale (the default's), so that the colour bars stay put while sliders move
    start = plane(method, adv_lim, lim, panel_kwargs.get("n", 201))
    panel_kwargs.setdefault("signal_max", float(np.abs(start.signal).max()) or 1.0)
    panels = GatePanels(method, adv_lim=adv_lim, log_ratio_lim_=lim, live=True, **panel_kwargs)
    plt.close(panels.fig)  # shown through the Image widget below, not by the inline backend
    image = w.Image(value=panels.png(), format="png")
    sliders = {}
    for key, value in method.hparams.items():
        lo, hi, step = method.slider_range(key)
        sliders[key] = w.FloatSlider(value=value, min=lo, max=hi, step=step, description=key,
                                     readout_format=".3g", continuous_update=True)

    def redraw(_change=None):
        try:
            panels.update(get(name, **{k: s.value for k, s in sliders.items()}))
        except ValueError as err:  # an invalid combination: say so instead of drawing
            status.value = f"<span style='color:#b2182b'>{err}</span>"
            return
        status.value = ""
        image.value = panels.png()

    status = w.HTML()
    for s in sliders.values():
        s.observe(redraw, names="value")
    box = w.VBox([w.HBox(list(sliders.values())), status, image])
    box.panels, box.sliders, box.redraw = panels, sliders, redraw
    return box
