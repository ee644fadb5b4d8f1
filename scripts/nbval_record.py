"""pytest plugin: keep what nbval executed, so that the book need not run the notebooks again.

    pytest --nbval-lax -p nbval_record --nbval-record DIR chapters      (scripts/ on sys.path)

nbval runs each code cell in a kernel and keeps the cell's outputs on the test item
(`IPyNbCell.test_outputs`). This plugin copies them into the notebook nbval read, adds the
kernel's language_info (as Jupyter and myst-nb do when they execute a notebook: the book's code
highlighting reads it), and when the last cell of a notebook has run, and every cell passed,
writes the executed notebook to DIR/<notebook's path relative to the rootdir>.
`scripts/prime_cache.py` then puts those notebooks into the book's jupyter-cache, so that
`jupyter-book build` (execute_notebooks: cache) takes their outputs, glue values included,
instead of executing again.

Works under pytest-xdist with `--dist loadfile` (every cell of a notebook runs in one worker, in
order). A notebook with a failed, skipped or unrun cell is not written: the book would execute it.
Under xdist it also orders the notebooks for the workers, Part III's first (see
`pytest_collection_modifyitems`). At the end it prints each notebook's time (its cells' setup,
call and teardown, kernel start included), slowest first: what to look at when the notebooks
step is slow.
nbval drops `clear_output` and `update_display_data` messages (it prints "unhandled iopub msg"):
a chapter that used them would show every intermediate output. None does today.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

_SECONDS: dict[str, float] = {}  # notebook path -> seconds, summed from the reports


def pytest_addoption(parser):
    parser.getgroup("nbval").addoption(
        "--nbval-record", metavar="DIR", default=None,
        help="write each notebook nbval executed, with its outputs, under DIR")


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "test_outputs")


def _language_info(kernel, timeout=60):
    """The kernel's language_info, as an executed notebook records it (Jupyter and myst-nb
    write it; the book's code highlighting reads its pygments_lexer, ipython3). nbval skips the
    shell and iopub messages of a request it did not send."""
    msg_id = kernel.kc.kernel_info()
    while True:
        msg = kernel.get_message(stream="shell", timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            return nbformat.from_dict(msg["content"]["language_info"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "call" or not _is_nbval_cell(item):
        return
    report = outcome.get_result()
    nb_file = item.parent
    state = nb_file.__dict__.setdefault("_record_state", {"count": 0, "ok": True, "ran": 0})
    if not report.passed or item.test_outputs is None:
        state["ok"] = False
        return
    if state["ran"] == 0:
        nb_file.nb.metadata["language_info"] = _language_info(nb_file.kernel)
    state["count"] += 1
    state["ran"] += 1
    item.cell.outputs = [nbformat.from_dict(dict(o)) for o in item.test_outputs]
    item.cell.execution_count = state["count"]
    for out in item.cell.outputs:
        if out.get("output_type") == "execute_result":
            out["execution_count"] = state["count"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    root = item.config.getoption("nbval_record", None)
    if not root or not _is_nbval_cell(item):
        return
    if nextitem is not None and nextitem.parent is item.parent:
        return  # not the notebook's last cell yet
    nb_file = item.parent
    state = nb_file.__dict__.get("_record_state", {"ok": False, "ran": 0})
    n_code = sum(c.cell_type == "code" for c in nb_file.nb.cells)
    if not state["ok"] or state["ran"] != n_code:
        return
    rel = Path(str(nb_file.path)).resolve().relative_to(Path(str(item.config.rootpath)).resolve())
    out = Path(root) / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb_file.nb, str(out))


def pytest_collection_modifyitems(config, items):
    """Hand the notebooks to the workers last chapter first: the later chapters run the lab and
    the trainers and take two to five times as long as Part I's, so started first they leave the
    short ones to fill both workers at the end (run with --no-loadscope-reorder, which keeps
    this order; xdist's own orders by cell count). Cells keep their order within a notebook."""
    if not config.getoption("nbval_record", None):
        return
    notebook = {id(item): str(item.nodeid).split("::")[0] for item in items}
    order = sorted({notebook[id(i)] for i in items}, reverse=True)
    rank = {path: k for k, path in enumerate(order)}
    items.sort(key=lambda item: rank[notebook[id(item)]])  # stable: cells stay in order


def pytest_runtest_logreport(report):
    """Sum each notebook's time (under xdist the controller sees every worker's reports)."""
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _SECONDS[path] = _SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    terminalreporter.write_sep("-", "seconds per notebook (kernel start included)")
    for path, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:7.1f}  {path}")
