"""Notebook sliders (rlgates.explore) and the inline figure format set by rlgates.setup."""

from __future__ import annotations

import io
import math

import matplotlib
import pytest

matplotlib.use("Agg")

import rlgates  # noqa: E402
from rlgates._book.png import figure_png, smallest_text_pt  # noqa: E402
from rlgates.interactive import LIVE_SCALE, axis_lim  # noqa: E402
from rlgates.notebook import IMAGE_SCALE  # noqa: E402

pytest.importorskip("ipywidgets")


def test_axis_lim_keeps_every_bound_in_view():
    base = 0.6
    assert axis_lim(rlgates.get("ppo"), base) == base  # 1 ± 0.2 is inside ±0.6
    wide = rlgates.get("ppo", eps=0.46)  # log(0.54) = -0.62: just outside
    assert axis_lim(wide, base) == pytest.approx(1.15 * abs(math.log(0.54)))
    assert axis_lim(rlgates.get("sapo"), 3.0) == 3.0  # no hard bounds


def test_explore_axis_follows_the_bounds_and_comes_back():
    """Moving DAPO's ε_h past the axis widens it (and says so); moving it back restores it."""
    from PIL import Image

    box = rlgates.explore("dapo")
    panels, slider = box.panels, box.sliders["eps_high"]
    base = panels.lim
    slider.value = slider.max
    want = 1.15 * math.log(1 + slider.max)
    if want > base:
        assert panels.lim == pytest.approx(want)
        assert all(ax.get_ylim()[1] == pytest.approx(want) for ax in panels.axes)
        assert "widened" in box.children[1].value
    slider.value = 0.28
    assert panels.lim == pytest.approx(base)
    assert box.children[1].value == ""
    # drawn at LIVE_SCALE x the figure's dpi, shown at its 100-dpi size
    png = Image.open(io.BytesIO(box.image.value))
    css = int(box.image.width.removesuffix("px"))
    assert png.size[0] == pytest.approx(css * LIVE_SCALE, abs=2)
    assert png.mode == "RGB"  # an opaque figure: no alpha channel to encode


def test_explore_title_is_text_that_follows_the_sliders():
    """The figure's title (method and hyperparameters) is the text line above the image."""
    box = rlgates.explore("sapo")
    assert box.children[2] is box.title and box.children[3] is box.image
    assert "SAPO: rlgates.get(&#x27;sapo&#x27;, tau_pos=1" in box.title.value
    box.sliders["tau_pos"].value = 0.5
    assert "tau_pos=0.5," in box.title.value and box.panels.method.hparams["tau_pos"] == 0.5
    box.panels.close()


def test_figure_png_records_size_and_smallest_text():
    import matplotlib.pyplot as plt
    from PIL import Image

    pytest.importorskip("IPython")
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], label="line")
    ax.legend(fontsize=7)
    assert smallest_text_pt(fig) == 7
    data, meta = figure_png(fig, IMAGE_SCALE)
    plt.close(fig)
    im = Image.open(io.BytesIO(data))
    assert im.mode == "P"  # a palette PNG (rlgates._book.png.PNG_COLOURS)
    assert im.convert("RGB").getpixel((0, 0)) == (255, 255, 255)  # the white face stays white
    assert im.text["rlgates:min-font-pt"] == "7"
    assert float(im.text["rlgates:px-per-inch"]) == pytest.approx(100 * IMAGE_SCALE)
    assert meta["width"] == pytest.approx(im.size[0] / IMAGE_SCALE, abs=1)


def test_png_rgb_round_trips_exactly():
    """The live figure's own PNG writer: Pillow reads back every pixel, on an odd-sized noisy
    image (no flat colour for the deflate to hide a row or channel mix-up behind)."""
    import numpy as np
    from PIL import Image

    from rlgates.figures import png_rgb

    rgb = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    im = Image.open(io.BytesIO(png_rgb(rgb)))
    assert im.format == "PNG" and im.mode == "RGB" and im.size == (53, 37)
    assert np.array_equal(np.asarray(im), rgb)


def test_live_png_is_the_canvas_after_each_move():
    import numpy as np
    from PIL import Image

    box = rlgates.explore("sapo")
    before = np.asarray(Image.open(io.BytesIO(box.image.value)))
    box.sliders["tau_neg"].value = 3.0
    after = np.asarray(Image.open(io.BytesIO(box.image.value)))
    canvas = np.asarray(box.panels.fig.canvas.buffer_rgba())
    assert np.array_equal(after, canvas[..., :3])
    assert before.shape == after.shape and (before != after).any(axis=-1).sum() > 1000  # redrawn
    box.panels.close()


def test_live_redraw_matches_a_full_draw():
    """Blitting draws the moving parts over a saved frame: the image must be the one a full draw
    of the figure makes (zero lines and frames over the colours, edges on top)."""
    import numpy as np

    box = rlgates.explore("sapo")
    box.sliders["tau_neg"].value = 2.0
    panels = box.panels
    blitted = np.asarray(panels.fig.canvas.buffer_rgba()).copy()
    for artist in (*panels._images, *panels._overlay, *panels._moving):
        artist.set_animated(False)
    panels.fig.canvas.draw()
    full = np.asarray(panels.fig.canvas.buffer_rgba())
    assert blitted.shape == full.shape
    diff = np.abs(blitted.astype(int) - full).max(axis=-1)
    assert diff.max() <= 1 and (diff > 0).sum() < 100  # rounding where a dash meets a frame
    panels.close()


def test_live_heatmaps_are_painted_as_matplotlib_draws_them():
    """Live, each heatmap's pixels are painted from its cells (figures._ScreenCells), not drawn
    by matplotlib: they must be the pixels matplotlib's draw of the image makes, on both panels,
    with the log ρ axis widened and back. Control: the cells one column or one row over (the
    neighbouring cells of the data) paint pixels that differ."""
    import numpy as np

    box = rlgates.explore("dapo")
    panels, slider = box.panels, box.sliders["eps_high"]
    canvas = panels.fig.canvas
    for value in (slider.max, 0.2):  # a bound beyond the axis widens it: a new map of cells
        slider.value = value
        for image, screen in zip(panels._images, panels._screens, strict=True):
            canvas.restore_region(panels._background)
            panels.fig.draw_artist(image)
            drawn = np.asarray(canvas.buffer_rgba()).copy()
            canvas.restore_region(panels._background)
            assert screen.paint(image, np.asarray(canvas.buffer_rgba()))  # painted, no fallback
            assert np.array_equal(np.asarray(canvas.buffer_rgba()), drawn)
            cells, n_rows = screen.cells, image.get_array().shape[1]
            for shift in (1, n_rows):  # one cell right, one cell up
                screen.cells = np.minimum(cells + shift, image.get_array().size - 1)
                canvas.restore_region(panels._background)
                screen.paint(image, np.asarray(canvas.buffer_rgba()))
                assert (np.asarray(canvas.buffer_rgba()) != drawn).any(axis=-1).sum() > 500
            screen.cells = cells
    panels.close()


def test_sliders_do_not_echo_the_browsers_value():
    """A value set by the browser is not sent back (ipywidgets 8's echo_update: a message per
    move); a value set in the kernel still reaches the browser. Control: ipywidgets' own
    FloatSlider echoes."""
    import ipywidgets as w

    box = rlgates.explore("sapo")
    ours, theirs = box.sliders["tau_pos"], w.FloatSlider(value=1.0)
    sent = {id(ours): [], id(theirs): []}
    for slider in (ours, theirs):
        slider._send = lambda msg, buffers=None, s=slider: sent[id(s)].append(msg["method"])
        slider.set_state({"value": 0.5})  # as a browser's move arrives
        assert slider.value == 0.5
    assert sent[id(theirs)] == ["echo_update"] and sent[id(ours)] == []
    assert box.panels.method.hparams["tau_pos"] == 0.5  # the move redrew the figure
    ours.value = 0.7  # set in the kernel: sent
    assert sent[id(ours)] == ["update"]
    box.panels.close()
