"""A reader's JupyterLab: the reader notebook of a chapter with sliders (07_sapo), in JupyterLab
in headless Chromium. Run all cells: no error, no raw MyST, the glued numbers in the text; move a
slider: the figure is redrawn. Screenshots land in screenshots/jupyterlab/.

Needs the reader notebooks (_build/reader, written by the book build) and JupyterLab in this
environment (`python3 tasks.py check` installs it). Without them the test skips with the reason,
unless RLGATES_REQUIRE_BROWSER=1 (set by tasks.py), where it fails. The slider's redraw time is
measured by benchmarks/jupyterlab_slider.py, not here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time

import pytest
from bookserver import SCREENSHOTS
from labdriver import (
    READER,
    ROOT,
    errors,
    jupyterlab_missing,
    lab_server,
    markdown_text,
    move_slider,
    open_notebook,
    run_all,
    slider_widget,
)

pytestmark = pytest.mark.browser
CHAPTER = "07_sapo.ipynb"


def _need(reason: str | None) -> None:
    if reason is None:
        return
    if os.environ.get("RLGATES_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def lab():
    _need(None if (READER / CHAPTER).is_file() else
          f"no reader notebook {READER / CHAPTER}: build the book (python3 tasks.py book)")
    _need(jupyterlab_missing())
    with lab_server([CHAPTER]) as server:
        yield server


def test_chapter_runs_reads_and_redraws_in_jupyterlab(lab, offline):
    base, token, _ = lab
    shots = SCREENSHOTS / "jupyterlab"
    shots.mkdir(parents=True, exist_ok=True)
    ctx = offline(viewport={"width": 1280, "height": 900})
    page = ctx.context.new_page()
    open_notebook(page, base, token, CHAPTER)
    page.screenshot(path=shots / "07_sapo-opened.png")

    seconds = run_all(page)
    print(f"run all: {seconds:.1f} s")
    assert errors(page) == []

    text = markdown_text(page)
    raw = re.findall(r"\{[a-z][\w:.-]*\}|:class:|^\s*:::|```\{", text, re.M)
    assert raw == [], f"raw MyST visible: {raw[:5]}"
    assert "[unrendered]" not in text
    # the numbers glued in the book are in the text (the half-gate ratios of "In short")
    glued = [v for v in re.findall(r"ρt≈\s*(\d\.\d\d)", text.replace(" ", ""))]
    assert glued, "no glued number in the rendered text"
    page.locator(".jp-RenderedMarkdown blockquote").first.scroll_into_view_if_needed()
    page.screenshot(path=shots / "07_sapo-in-short.png")

    handle, image = slider_widget(page)
    before = image.get_attribute("src")
    page.screenshot(path=shots / "07_sapo-slider-before.png")
    seconds = move_slider(page, handle)
    for _ in range(4):  # a visible change for the screenshot
        move_slider(page, handle)
    assert image.get_attribute("src") != before
    page.screenshot(path=shots / "07_sapo-slider-after.png")
    assert errors(page) == []
    print(f"slider redraw: {seconds * 1000:.0f} ms")

    # solutions and checks are folded: their source is not shown
    hidden = page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.content.widgets
                 .filter(c => c.model.getMetadata('jupyter')?.source_hidden)
                 .map(c => c.inputHidden)""")
    assert hidden and all(hidden)
    page.get_by_role("heading", name="Exercises").first.scroll_into_view_if_needed()
    page.screenshot(path=shots / "07_sapo-exercises.png")
    page.locator("blockquote", has_text="Figure 5").first.scroll_into_view_if_needed()
    page.screenshot(path=shots / "07_sapo-figure-caption.png")
    # the set-up cell found rlgates and installed nothing; no request left localhost
    setup = page.locator(".jp-CodeCell").first
    assert "pip" not in setup.locator(".jp-OutputArea").inner_text()
    assert ctx.blocked == []


GLANCED = "02_ppo_case_by_case.ipynb"  # a chapter the reader only opens


def _tasks():
    spec = importlib.util.spec_from_file_location("tasks", ROOT / "tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    return tasks


def test_a_notebook_only_opened_and_autosaved_follows_the_next_build(offline, tmp_path):
    """`tasks.py lab`'s working copy, in a real JupyterLab: the reader opens a chapter and does
    nothing; JupyterLab rewrites its metadata and autosaves it (every 2 s here, 120 s by
    default). The file on disk changed, its cells did not: the next build's version replaces it,
    with no "kept your version" note and no .new-build copy (R3)."""
    _need(None if (READER / GLANCED).is_file() else
          f"no reader notebook {READER / GLANCED}: build the book (python3 tasks.py book)")
    _need(jupyterlab_missing())
    tasks = _tasks()
    build1, build2 = tmp_path / "build1", tmp_path / "build2"
    build1.mkdir()
    build2.mkdir()
    shutil.copy2(READER / GLANCED, build1 / GLANCED)
    nb = json.loads((READER / GLANCED).read_text(encoding="utf-8"))
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    first["source"] = "".join(first["source"]) + "\n\n(a newer build)"
    (build2 / GLANCED).write_text(json.dumps(nb, indent=1), encoding="utf-8")
    autosave = {"@jupyterlab/docmanager-extension/plugin": {"autosave": True,
                                                           "autosaveInterval": 2}}
    with lab_server([], settings_extra=autosave) as (base, token, folder):
        assert tasks.sync_working_copy(build1, folder) == []  # what `tasks.py lab` does first
        mine = folder / GLANCED
        copied = mine.read_bytes()
        ctx = offline(viewport={"width": 1280, "height": 900})
        page = ctx.context.new_page()
        open_notebook(page, base, token, GLANCED)
        deadline = time.monotonic() + 60
        while mine.read_bytes() == copied and time.monotonic() < deadline:
            time.sleep(0.5)
        shots = SCREENSHOTS / "jupyterlab"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shots / "02-opened-autosaved.png")
        page.close()
        assert mine.read_bytes() != copied, "JupyterLab did not autosave the opened notebook"
        saved = json.loads(mine.read_text(encoding="utf-8"))
        print("metadata JupyterLab wrote:", sorted(saved["metadata"]),
              saved["metadata"].get("kernelspec", {}).get("display_name"))
        assert tasks._cells_digest(mine) == tasks._cells_digest(build1 / GLANCED)
        notes = tasks.sync_working_copy(build2, folder)
        assert notes == [], notes
        assert mine.read_bytes() == (build2 / GLANCED).read_bytes()
        assert not (folder / GLANCED.replace(".ipynb", ".new-build.ipynb")).exists()
    assert ctx.blocked == []
