"""A notebook without TRL or verl (Colab, Binder): a cell that needs them says what to install.

`rlgates.trainers.guard_notebook()` calls `install(shell)` when a trainer is missing. From then
on, in that IPython kernel, a cell that fails because a trainer is missing prints one line,
the install command, instead of a traceback, and its run counts as a success, so "Run All" goes
on: the cells that need only rlgates still run. A cell fails "because a trainer is missing" when
it raises:

- ModuleNotFoundError for a trainer or a package that comes with them (`import trl`,
  `from transformers import Trainer`), or
- NameError for a name that such a skipped cell would have defined (its assignments, functions,
  classes and imports, read from its code), and so on down the chapter. A skipped cell leaves
  those names as they were before it ran.

Any other error (a typo's NameError included) is shown and stops "Run All" as usual.
"""

from __future__ import annotations

import ast

#: the trainers, and the packages that come with them (Binder has none of these)
TRAINER_PACKAGES = frozenset({"trl", "verl"})
COMES_WITH_THEM = frozenset({"transformers", "datasets", "tokenizers", "accelerate", "peft",
                             "ray", "yaml"})


def install_line(versions: dict) -> str:
    return ("needs TRL and verl, not installed here: pip install "
            + " ".join(f"{name}=={versions[name]}" for name in sorted(TRAINER_PACKAGES)))


def defined_names(code: str) -> set:
    """The names a cell's code binds at its top level (not inside functions or classes)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def install(shell, versions: dict) -> None:
    """Guard the cells run by `shell` (an IPython InteractiveShell) from here on."""
    line = install_line(versions)
    missing: set = set()  # names that skipped cells would have defined
    state = {"skipped": False}

    def needs_trainers(value) -> bool:
        if isinstance(value, ModuleNotFoundError):
            return (value.name or "").split(".")[0] in TRAINER_PACKAGES | COMES_WITH_THEM
        return isinstance(value, NameError) and getattr(value, "name", None) in missing

    def handler(shell, etype, value, tb, tb_offset=None):
        if needs_trainers(value):
            state["skipped"] = True
            print(f"This cell {line}")
            return None
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None

    def before_cell(info) -> None:
        names = defined_names(shell.transform_cell(info.raw_cell))
        state["names"] = names
        state["before"] = {n: shell.user_ns[n] for n in names if n in shell.user_ns}

    def after_cell(result) -> None:
        if result is None or not state["skipped"]:
            return
        state["skipped"] = False
        # a skipped cell leaves its names as they were: a half-filled table would fail later
        # with a misleading error; a name it would have made is missing, and says so
        for name in state["names"]:
            if name in state["before"]:
                shell.user_ns[name] = state["before"][name]
            else:
                shell.user_ns.pop(name, None)
                missing.add(name)
        result.error_in_exec = None  # not an error: "Run All" goes on to the next cell

    shell.set_custom_exc((ModuleNotFoundError, NameError), handler)
    shell.events.register("pre_run_cell", before_cell)
    shell.events.register("post_run_cell", after_cell)
