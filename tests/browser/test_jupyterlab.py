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

from tests.kernels import TRAINER_MODULES, hide_from_kernels, unreachable_repository

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
    # folded, it shows its first line: plain words, not Colab's "#@title" (R15)
    folded_line = setup.locator(".jp-InputPlaceholder .jp-PlaceholderText").inner_text()
    assert folded_line.startswith("# Set-up for Colab and Binder") and "@" not in folded_line
    # an opened solution: its code, then "Output:", then its output (R15)
    solution = page.locator(".jp-MarkdownCell details", has_text="Solution to Exercise 7.2: its")
    solution.locator("summary").click()
    parts = solution.evaluate(
        """d => [...d.children].filter(e => e.tagName !== 'SUMMARY')
                 .map(e => e.tagName + ':' + e.textContent.trim().slice(0, 20))""")
    assert [x.split(":")[0] for x in parts] == ["PRE", "P", "PRE"], parts
    assert parts[1] == "P:Output:", parts
    solution.scroll_into_view_if_needed()
    page.screenshot(path=shots / "07_sapo-solution-opened.png")
    # the next exercise is set apart from the folded solution above it, in the same cell (R15)
    fold = page.locator(".jp-MarkdownCell details", has_text="Solution to Exercise 7.2").filter(
        has_not_text="its code").first
    after = page.locator(".jp-MarkdownCell p", has_text="Exercise 7.3").first
    fold.scroll_into_view_if_needed()
    gap = after.bounding_box()["y"] - (fold.bounding_box()["y"] + fold.bounding_box()["height"])
    page.screenshot(path=shots / "07_sapo-exercise-after-solution.png")
    print(f"gap between a folded solution and the next exercise: {gap:.0f} px")
    assert gap >= 12
    assert ctx.blocked == []


def _kernel_idle(page, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
                   return w.sessionContext.session.kernel.status === 'idle'; }""",
        timeout=timeout_ms, polling=250)


def test_run_all_stops_at_the_set_up_cell_when_rlgates_cannot_be_installed(
        offline, tmp_path, monkeypatch):
    """Chapter 7 on Colab or Binder before the notebooks branch is published (or offline): the
    set-up cell finds no rlgates and cannot install it (git reaches no repository here). Run All
    shows what it tried, then one line, the local alternative, and stops: no traceback, and no
    later cell runs to fail on the missing library (R14)."""
    _need(None if (READER / CHAPTER).is_file() else
          f"no reader notebook {READER / CHAPTER}: build the book (python3 tasks.py book)")
    _need(jupyterlab_missing())
    hide_from_kernels(tmp_path, monkeypatch, ["rlgates"])
    unreachable_repository(tmp_path, monkeypatch)
    with lab_server([CHAPTER]) as (base, token, _):
        ctx = offline(viewport={"width": 1280, "height": 900})
        page = ctx.context.new_page()
        open_notebook(page, base, token, CHAPTER)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(
            """() => window.jupyterapp.shell.currentWidget.content.widgets
                     .find(c => c.model.type === 'code').model.executionCount !== null""",
            timeout=120_000, polling=250)
        _kernel_idle(page)
        page.wait_for_timeout(1000)  # the aborted cells' replies
        counts = page.evaluate(
            """() => window.jupyterapp.shell.currentWidget.content.widgets
                     .filter(c => c.model.type === 'code').map(c => c.model.executionCount)""")
        shots = SCREENSHOTS / "jupyterlab"
        shots.mkdir(parents=True, exist_ok=True)
        page.locator(".jp-MarkdownCell").first.scroll_into_view_if_needed()
        page.screenshot(path=shots / "07_sapo-set-up-failed.png")
        found = errors(page)
        setup = page.locator(".jp-CodeCell").first.locator(".jp-OutputArea").inner_text()
    print(setup)
    assert counts[0] is not None and counts[1:] == [None] * (len(counts) - 1), counts
    assert len(found) == 1, found
    assert found[0].strip().count("\n") == 0 and found[0].startswith(
        "rlgates could not be installed"), found
    assert "python3 tasks.py lab" in found[0] and "Traceback" not in setup
    assert setup.startswith("installing rlgates from git+")
    assert ctx.blocked == []


TRAINERS = "14_real_trainers.ipynb"


def test_chapter_14_on_binder_shows_the_trainer_cells_recorded_outputs(
        offline, tmp_path, monkeypatch):
    """Chapter 14 where TRL and verl are missing (Binder): Run All goes through; the cells that
    need the trainers print the install line, as many as the header says; under them, folded,
    the outputs the book's build recorded with the trainers (R13)."""
    _need(None if (READER / TRAINERS).is_file() else
          f"no reader notebook {READER / TRAINERS}: build the book (python3 tasks.py book)")
    _need(jupyterlab_missing())
    hide_from_kernels(tmp_path, monkeypatch, TRAINER_MODULES)
    with lab_server([TRAINERS]) as (base, token, _):
        ctx = offline(viewport={"width": 1280, "height": 900})
        page = ctx.context.new_page()
        open_notebook(page, base, token, TRAINERS)
        shots = SCREENSHOTS / "jupyterlab"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shots / "14_real_trainers-opened.png")
        run_all(page)
        assert errors(page) == []
        printing = page.evaluate(
            """() => window.jupyterapp.shell.currentWidget.content.widgets
                     .filter(c => c.model.type === 'code')
                     .filter(c => { const o = c.model.outputs.toJSON();
                                    return o.some(x => String(x.text || '')
                                        .includes('This cell needs TRL and verl')); })
                     .length""")
        header = page.locator(".jp-MarkdownCell").first.inner_text()
        stated = int(re.search(r"(\d+) of its \d+ code cells", header).group(1))
        recorded = page.locator(".jp-MarkdownCell details", has_text="Output recorded when")
        count = recorded.count()
        first = recorded.nth(1)
        first.locator("summary").click()
        first.scroll_into_view_if_needed()
        page.screenshot(path=shots / "14_real_trainers-recorded-output.png")
    print(f"{printing} cells print the install line; the header says {stated}; "
          f"{count} recorded outputs")
    assert printing == stated and count >= 10
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
