"""JupyterLab on the reader notebooks, driven in Chromium: shared by tests/browser/test_jupyterlab.py
and benchmarks/jupyterlab_slider.py. (Not named conftest: it is imported by both.)

The server runs this interpreter's JupyterLab on 127.0.0.1 with a random token, in a scratch
copy of the reader notebooks (the build's copies stay untouched), and stops when the `with`
block ends. `expose_app_in_browser` lets the page run JupyterLab's own commands ("run all").
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READER = Path(os.environ.get("READER_NOTEBOOKS", ROOT / "_build" / "reader" / "chapters"))


def jupyterlab_missing() -> str | None:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return ("JupyterLab is not installed in this environment "
                "(`python3 tasks.py lab` or `tasks.py check` installs it into .venv)")
    return None


# a reader's defaults, except: every cell rendered (no windowing, so that the whole notebook can
# be read and screenshotted), and no question about fetching news
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                     "checkForUpdates": False},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def lab_server(notebooks: list[str], timeout: float = 90, settings_extra: dict | None = None):
    """Yields (base_url, token, folder) of a running JupyterLab serving copies of `notebooks`
    (`settings_extra`: more JupyterLab settings, {plugin: values}, over SETTINGS)."""
    folder = Path(tempfile.mkdtemp(prefix="rlgates-lab-"))
    for name in notebooks:
        shutil.copy2(READER / name, folder / name)
    settings = folder / ".settings"
    for plugin, values in {**SETTINGS, **(settings_extra or {})}.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={port}",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={folder}",
           f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.news_url=None",  # as `tasks.py lab`: no question about news
           "--ServerApp.port_retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / ".config"),
           "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(settings)}
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, as a reader gets
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (folder / "server.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        yield base, token, folder
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def open_notebook(page, base: str, token: str, name: str, timeout_ms: int = 90_000) -> None:
    page.goto(f"{base}/lab/tree/{name}?token={token}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=timeout_ms)
    page.wait_for_function("() => !!window.jupyterapp", timeout=timeout_ms)
    # the kernel has started when the status shows Idle
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
                   return w && w.sessionContext && w.sessionContext.session
                          && w.sessionContext.session.kernel
                          && w.sessionContext.session.kernel.status === 'idle'; }""",
        timeout=timeout_ms)


def run_all(page, timeout_ms: int = 180_000) -> float:
    """Run every cell with JupyterLab's own command; returns the seconds until the last is done."""
    start = time.perf_counter()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        """() => { const nb = window.jupyterapp.shell.currentWidget.content;
                   const cells = nb.widgets.filter(c => c.model.type === 'code');
                   return cells.length > 0 && cells.every(
                       c => c.model.executionCount !== null && c.promptNode
                            && !c.promptNode.textContent.includes('*')); }""",
        timeout=timeout_ms, polling=250)
    return time.perf_counter() - start


def errors(page) -> list[str]:
    """The error outputs (what a cell raised) anywhere in the notebook, as the reader sees them
    (their traceback lines, colour codes taken off). Read from the notebook's model: JupyterLab
    renders an error as text of type application/vnd.jupyter.stderr, like any stderr stream."""
    return page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.content.widgets
                 .filter(c => c.model.type === 'code')
                 .flatMap(c => c.model.outputs.toJSON())
                 .filter(o => o.output_type === 'error')
                 .map(o => ((o.traceback || []).join('\\n') || `${o.ename}: ${o.evalue}`)
                             .replace(/\\x1b\\[[0-9;]*m/g, '').slice(0, 500))""")


def markdown_text(page) -> str:
    """The rendered prose of every Markdown cell (hidden solutions included). Code blocks are
    left out: a solution's code shown as code may hold braces ({x:.3f}) that are not MyST."""
    return page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.content.widgets
                 .filter(c => c.model.type === 'markdown')
                 .map(c => {
                   const r = c.node.querySelector('.jp-RenderedMarkdown');
                   if (!r) return '[unrendered] ' + c.model.sharedModel.getSource();
                   const prose = r.cloneNode(true);
                   prose.querySelectorAll('pre').forEach(p => p.remove());
                   return prose.textContent;
                 })
                 .join('\\n')""")


SLIDER_IMAGE = ".jp-OutputArea-output .widget-image"


def slider_widget(page):
    """The first slider and the figure it redraws (an ipywidgets Image)."""
    page.wait_for_selector(SLIDER_IMAGE, timeout=60_000)
    image = page.locator(SLIDER_IMAGE).first
    image.scroll_into_view_if_needed()
    handle = page.locator(".jp-OutputArea-output .widget-slider .noUi-handle").first
    return handle, image


def move_slider(page, handle, key: str = "ArrowRight", timeout_ms: int = 10_000) -> float:
    """Press an arrow key on the slider; returns the seconds until the figure's image changed."""
    page.evaluate(
        """sel => { const img = document.querySelector(sel);
                    window.__rlgatesSrc = img.src; window.__rlgatesChanged = null;
                    new MutationObserver((_, obs) => { if (img.src !== window.__rlgatesSrc) {
                        window.__rlgatesChanged = performance.now(); obs.disconnect(); } })
                      .observe(img, {attributes: true, attributeFilter: ['src']}); }""",
        SLIDER_IMAGE)
    handle.focus()
    t0 = page.evaluate("() => performance.now()")
    handle.press(key)
    page.wait_for_function("() => window.__rlgatesChanged !== null", timeout=timeout_ms,
                           polling="raf")
    return (page.evaluate("() => window.__rlgatesChanged") - t0) / 1000
