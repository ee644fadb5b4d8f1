"""Sliders for a live notebook, and the static figure that stands in for them on the web page."""

from __future__ import annotations

import numpy as np

from .methods import get
from .plane import CMAP, GatePanels, axis_symbols, draw_edges, log_ratio_lim, plane

#: Slider ranges (min, max, step) for every hyperparameter name in the registry.
SLIDER_RANGES = {
    "eps": (0.01, 0.6, 0.01),
    "eps_low": (0.0, 0.95, 0.01),
    "eps_high": (0.0, 6.0, 0.01),
    "tau_pos": (0.1, 5.0, 0.05),
    "tau_neg": (0.1, 5.0, 0.05),
    "c": (1.05, 10.0, 0.05),
}
#: Per-method overrides, where a method's scale differs (GSPO's ε are ~1e-4).
METHOD_SLIDER_RANGES = {
    "gspo": {"eps_low": (0.0, 2e-3, 1e-5), "eps_high": (0.0, 2e-3, 1e-5)},
    "cispo": {"eps_low": (0.0, 1.0, 0.01), "eps_high": (0.0, 10.0, 0.05)},
}


def slider_range(name, key, value):
    """(min, max, step) of the slider for hyperparameter `key` of method `name`."""
    override = METHOD_SLIDER_RANGES.get(name, {}).get(key)
    return override or SLIDER_RANGES.get(key, (0.0, max(2 * value, 1.0), 0.01))


def axis_lim(method, base):
    """Half-height of the log ρ axis that keeps every clip bound of `method` in view: `base`, or
    1.15·|log bound| when a bound lies beyond it (the web explorer's rule)."""
    lim = float(base)
    for ratio, _side in method.bounds():
        if ratio > 0 and np.isfinite(np.log(ratio)):
            lim = max(lim, 1.15 * abs(float(np.log(ratio))))
    return lim


def explore(name, **panel_kwargs):
    """ipywidgets sliders for every hyperparameter of `name`, redrawing its gate | signal panels.

    Only useful in a live kernel: a static web page cannot move a slider, so the book pairs each
    call with `plot_small_multiples`, which carries the same information. As in the web explorer,
    the log ρ axis widens when a clip bound would leave it (and says so), and narrows back. The
    image is drawn at `IMAGE_SCALE` x the figure's dpi and shown at its 100-dpi size, so it is as
    sharp as the book's inline figures.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .notebook import IMAGE_SCALE

    method = get(name)
    adv_lim = panel_kwargs.pop("adv_lim", 1.0)
    base_lim = panel_kwargs.pop("log_ratio_lim_", None) or log_ratio_lim(method)
    lim = axis_lim(method, base_lim)
    # a fixed colour scale (the default's), so that the colour bars stay put while sliders move
    start = plane(method, adv_lim, lim, panel_kwargs.get("n", 201))
    panel_kwargs.setdefault("signal_max", float(np.abs(start.signal).max()) or 1.0)
    panels = GatePanels(method, adv_lim=adv_lim, log_ratio_lim_=lim, live=True, **panel_kwargs)
    plt.close(panels.fig)  # shown through the Image widget below, not by the inline backend
    dpi = panels.fig.get_dpi() * IMAGE_SCALE
    css_width = f"{round(panels.fig.get_figwidth() * panels.fig.get_dpi())}px"
    image = w.Image(value=panels.png(dpi=dpi), format="png", width=css_width)
    sliders = {}
    for key, value in method.hparams.items():
        lo, hi, step = slider_range(method.name, key, value)
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
        image.value = panels.png(dpi=dpi)

    for s in sliders.values():
        s.observe(redraw, names="value")
    box = w.VBox([w.HBox(list(sliders.values())), status, image])
    box.panels, box.sliders, box.redraw, box.image = panels, sliders, redraw, image
    return box


def plot_small_multiples(name, param, values, panel="signal", adv_lim=1.0, log_ratio_lim_=None,
                         fixed=None):
    """One panel per value of `param`: the static stand-in for a slider.

    panel: "signal" (f'·ρ·A) or "gate" (f' signed by A). `fixed` sets the other hyperparameters.
    All panels share axes and one colour scale, so they can be compared by eye.
    """
    import matplotlib.pyplot as plt

    if panel not in ("signal", "gate"):
        raise ValueError(f"panel must be 'signal' or 'gate', got {panel!r}")
    methods = [get(name, **{**(fixed or {}), param: v}) for v in values]
    planes = [plane(m, adv_lim, log_ratio_lim_) for m in methods]
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
    fig.suptitle(f"{methods[0].title}: {panel} as {param} varies", fontsize=10)
    return fig
