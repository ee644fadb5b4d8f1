"""Phone versions of the book's figures (review item R7): rlgates/_book/png.py draws them when
the chapters run for the web book, scripts/phone_figures.py serves them in a <picture>."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from rlgates._book.png import (  # noqa: E402
    PHONE_COLUMN_PX,
    PHONE_ERROR_KEY,
    PHONE_KEY,
    PHONE_MIN_TEXT_PX,
    _place,
    figure_png,
    phone_figure,
)
from rlgates.notebook import IMAGE_SCALE, STYLE  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import phone_figures  # noqa: E402

pytest.importorskip("IPython")


@pytest.fixture(autouse=True)
def book_style():
    with matplotlib.rc_context(STYLE):
        yield
    plt.close("all")


def two_panels(figsize=(10, 4), fontsize=8):
    """A (gate | signal)-like figure: two panels side by side, shared y, a colour bar each."""
    fig, axes = plt.subplots(1, 2, figsize=figsize, sharey=True, layout="constrained")
    for ax, title in zip(axes, ("gate", "signal"), strict=True):
        im = ax.imshow([[0, 1], [1, 0]], aspect="auto")
        fig.colorbar(im, ax=ax, label="value")
        ax.set_title(title)
        ax.set_xlabel("advantage")
    axes[0].set_ylabel("log ratio")
    axes[0].text(0, 0, "small note", fontsize=fontsize)
    # a legend of the whole figure, three columns across it (chapter 5 has one)
    lines = [plt.Line2D([], [], label=f"a long legend entry {k}") for k in range(3)]
    fig.legend(handles=lines, fontsize=fontsize, loc="outside lower center", ncols=3)
    return fig


def shown_px(png: bytes, column=PHONE_COLUMN_PX) -> float:
    """The PNG's smallest text as shown when it fills `column` CSS px (what the browser test
    reads from the same text chunks)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        pt, ppi, width = (float(im.text["rlgates:min-font-pt"]),
                          float(im.text["rlgates:px-per-inch"]), im.width)
    shown = min(column, width / IMAGE_SCALE)  # CSS px: never enlarged
    return pt / 72 * ppi * shown / width


def test_a_two_panel_figure_gets_a_one_column_phone_copy():
    fig = two_panels()
    figure_png(fig, IMAGE_SCALE, phone=False)  # constrained layout settles on the first draw
    plain, _ = figure_png(fig, IMAGE_SCALE, phone=False)
    data, meta = figure_png(fig, IMAGE_SCALE, phone=True)
    assert shown_px(data) < PHONE_MIN_TEXT_PX  # the laptop figure: too small in the column
    phone = base64.b64decode(meta[PHONE_KEY])
    assert shown_px(phone) >= PHONE_MIN_TEXT_PX
    # the reader's figure is untouched: the same PNG, the same size
    assert data == plain and fig.get_size_inches().tolist() == [10, 4]
    # the copy: both panels in one column, one above the other, each with its colour bar
    copy = phone_figure(fig, 8)
    copy.canvas.draw()
    panels = [ax for ax in copy.axes if not hasattr(ax, "_colorbar")]
    top, bottom = (ax.get_position() for ax in panels)
    assert top.y0 > bottom.y1 and top.x0 == pytest.approx(bottom.x0, abs=0.02)
    # each says where it was, as the captions ("Left:", "Right:") say it; the reader's figure
    # keeps its titles
    assert [ax.get_title() for ax in panels] == ["(left) gate", "(right) signal"]
    assert [ax.get_title() for ax in fig.axes if not hasattr(ax, "_colorbar")] == \
        ["gate", "signal"]
    assert panels[1].yaxis.get_tick_params()["labelleft"]  # its y ticks, hidden beside, shown
    for cbar, ax in zip((a for a in copy.axes if hasattr(a, "_colorbar")), panels, strict=True):
        assert cbar.get_position().x0 > ax.get_position().x1  # beside its own panel
        assert ax.get_position().y0 - 0.05 < cbar.get_position().y0 < ax.get_position().y1


def test_a_legible_figure_gets_none():
    """Negative control: a figure whose text already shows at 8 px in the column."""
    fig, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
    ax.plot([0, 1])
    ax.set_xlabel("step")
    data, meta = figure_png(fig, IMAGE_SCALE, phone=True)
    assert shown_px(data) >= PHONE_MIN_TEXT_PX
    assert PHONE_KEY not in meta and PHONE_ERROR_KEY not in meta


def test_only_the_book_build_asks_for_phone_figures(monkeypatch):
    """In Jupyter (no RLGATES_PHONE_FIGURES) the figure's output is as before."""
    monkeypatch.delenv("RLGATES_PHONE_FIGURES", raising=False)
    assert PHONE_KEY not in figure_png(two_panels(), IMAGE_SCALE)[1]
    monkeypatch.setenv("RLGATES_PHONE_FIGURES", "1")
    assert PHONE_KEY in figure_png(two_panels(), IMAGE_SCALE)[1]


def test_a_figure_that_cannot_be_copied_says_why():
    """A figure pickle cannot copy (a lambda formatter) keeps its laptop PNG, and its metadata
    says why it has no phone version (the build's log lists them)."""
    fig = two_panels()
    fig.axes[0].xaxis.set_major_formatter(lambda x, pos: f"{x:g}")
    data, meta = figure_png(fig, IMAGE_SCALE, phone=True)
    assert data and PHONE_KEY not in meta
    assert "pickle" in meta[PHONE_ERROR_KEY].lower()


def test_the_page_serves_the_phone_png_in_a_picture(tmp_path):
    """scripts/phone_figures.py: the phone PNG is written beside the laptop one and the <img>
    is wrapped in a <picture> (the link still opens the laptop PNG); running it again changes
    nothing, and a figure with no phone version stays a plain <img>."""
    wide, small = b"\x89PNG laptop", b"\x89PNG small"
    phone = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (700).to_bytes(4, "big") + (
        1200).to_bytes(4, "big")
    nb = {"cells": [{"outputs": [
        {"data": {"image/png": base64.b64encode(png).decode()},
         "metadata": {"image/png": meta}}
        for png, meta in ((wide, {PHONE_KEY: base64.b64encode(phone).decode()}), (small, {}))]}]}
    (tmp_path / "executed").mkdir()
    (tmp_path / "executed" / "ch.ipynb").write_text(json.dumps(nb))
    html = tmp_path / "html"
    (html / "_images").mkdir(parents=True)
    (html / "chapters").mkdir()
    h_wide, h_small = (hashlib.sha256(b).hexdigest() for b in (wide, small))
    img = '<img alt="two heat maps" src="../_images/{}.png" style="width: 1011px;" />'
    page = html / "chapters" / "ch.html"
    page.write_text(f'<a href="../_images/{h_wide}.png">{img.format(h_wide)}</a>'
                    f'<a href="../_images/{h_small}.png">{img.format(h_small)}</a>')
    summary = phone_figures.add_phone_figures(html, [tmp_path / "executed"])
    assert summary.startswith("phone figures: 1 on 1 pages")
    assert (html / "_images" / f"{h_wide}.phone.png").read_bytes() == phone
    assert page.read_text() == (
        f'<a href="../_images/{h_wide}.png"><picture><source media="(max-width: 599.98px)" '
        f'srcset="../_images/{h_wide}.phone.png" width="700" height="1200" />'
        f'{img.format(h_wide)}</picture></a>'
        f'<a href="../_images/{h_small}.png">{img.format(h_small)}</a>')
    once = page.read_text()
    phone_figures.add_phone_figures(html, [tmp_path / "executed"])
    assert page.read_text() == once


def test_a_stacked_panel_says_where_it_was():
    """A 2 x 2 grid names row and column; a panel across every column and a one-column figure
    (stacked already: its caption's "top" stays true) get no tag (negative controls)."""
    fig = plt.figure()
    grid = fig.add_gridspec(2, 2)
    assert _place(grid[0, 1]) == "top right" and _place(grid[1, 0]) == "bottom left"
    assert _place(grid[0, :]) == "" and _place(grid[:, 0]) == "left"
    assert _place(fig.add_gridspec(2, 1)[1, 0]) == ""
    assert _place(fig.add_gridspec(1, 3)[0, 1]) == "middle"
    plt.close(fig)
