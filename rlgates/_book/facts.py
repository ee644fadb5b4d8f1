"""What the installed verl and TRL do, read from their files: the one reader of trainer facts.

The book states what verl and TRL do (defaults, aggregation, normalisers, flags, options that are
gone). Each such sentence is asserted against the installed trainer: in a hidden cell of its
chapter, or in tests/test_trainer_facts.py for the pages that run no code. Both read the trainers
through this module, so an upgrade fails on the sentence it breaks.

It reads files and imports neither trainer (importing TRL takes 10-20 s, which every chapter
would pay):

    installed()            True when both trainers are installed (the book's set-up; Binder has
                           neither, and the chapters then skip their trainer checks)
    versions()             {"trl": ..., "verl": ...} from the installed distributions
    verl_config()          the configuration a verl user gets: verl's generated
                           `trainer/config/_generated_ppo_trainer.yaml` (what `main_ppo` composes
                           before any override), parsed; verl(key) reads one value of it by
                           dotted key, verl("actor_rollout_ref.actor.loss_agg_mode")
    trl(name)              the default of a `GRPOConfig` field as its dataclass declares it (or
                           the `TrainingArguments` field it inherits)
    code(path, name=None)  the text of an installed file, or of one class, function or method in
                           it ("GRPOTrainer._compute_loss"), whitespace collapsed to one space
    says(path, *snippets, name=None)   asserts that each snippet is in `code(path, name)`
    registered(path, decorator)        the names a file registers with a decorator, e.g. verl's
                           policy losses (`register_policy_loss("gspo")`) or its advantage
                           estimators (`register_adv_est(AdvantageEstimator.GAE)`)

Defaults are the user-facing ones, never a docstring, a function's fallback or a nested
dataclass's default where the user's config differs. Where they disagree today: verl's
`RolloutCorrectionConfig` dataclass has `rollout_is="sequence"` while the YAML a user gets has
`null`; TRL's class docstring calls `token_truncate` the default of
`vllm_importance_sampling_mode` while its field default is `sequence_mask`; verl's DPPO losses
fall back to c = 20 while the actor config gives `clip_ratio_c: 3.0`. `trl()` reads the field
as declared; tests/test_trainer_facts.py checks every name the chapters read against a
constructed `GRPOConfig` (whose `__post_init__` runs).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
from pathlib import Path

#: GRPOConfig's field declarations, most derived first: a field's default is the first found.
TRL_CONFIG_CLASSES = (("trl/trainer/grpo_config.py", "GRPOConfig"),
                      ("trl/trainer/base_config.py", "_BaseConfig"),
                      ("transformers/training_args.py", "TrainingArguments"))
VERL_CONFIG = "verl/trainer/config/_generated_ppo_trainer.yaml"


def package_dir(name: str) -> Path | None:
    """Where the top-level package `name` is installed (found, not imported), or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed() -> bool:
    """Both trainers are installed (`requirements.txt` pins them; Binder installs neither)."""
    return package_dir("trl") is not None and package_dir("verl") is not None


def versions() -> dict:
    return {name: importlib.metadata.version(name) for name in ("trl", "verl")}


def path(relative: str) -> Path:
    """An installed file, named from its package: "verl/trainer/ppo/core_algos.py"."""
    package, _, rest = relative.partition("/")
    root = package_dir(package)
    if root is None:
        raise ModuleNotFoundError(f"{package} is not installed", name=package)
    return root / rest


@functools.cache
def _text(relative: str) -> str:
    return path(relative).read_text()


@functools.cache
def _tree(relative: str) -> ast.Module:
    return ast.parse(_text(relative))


def _find(body, dotted: str):
    head, _, rest = dotted.partition(".")
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name == head:
            return _find(node.body, rest) if rest else node
    raise LookupError(dotted)


def code(relative: str, name: str | None = None) -> str:
    """The file's text, or one definition's (`name`: "Class.method"), on one line: every run of
    whitespace becomes one space, so a snippet matches across line breaks."""
    text = _text(relative)
    if name is not None:
        text = ast.get_source_segment(text, _find(_tree(relative).body, name))
    return " ".join(text.split())


def says(relative: str, *snippets: str, name: str | None = None) -> None:
    """Assert that the installed file (or its definition `name`) contains every snippet."""
    text = code(relative, name)
    for snippet in snippets:
        snippet = " ".join(snippet.split())
        assert snippet in text, f"{relative}{':' + name if name else ''} no longer says {snippet!r}"


def _string_constants(relative: str) -> dict:
    """{"Class.NAME": "value"} for every `NAME = "value"` in a class body of the file (an enum's
    members, which verl's advantage estimators are registered by)."""
    found = {}
    for cls in ast.walk(_tree(relative)):
        if isinstance(cls, ast.ClassDef):
            for node in cls.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                        and isinstance(node.value.value, str):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            found[f"{cls.name}.{target.id}"] = node.value.value
    return found


def registered(relative: str, decorator: str) -> list:
    """The names given to `@decorator("name")` in an installed file, in order; a member of an
    enum defined in the same file, `@decorator(Enum.MEMBER)`, counts by its string value."""
    constants = _string_constants(relative)
    names = []
    for node in ast.walk(_tree(relative)):
        for dec in getattr(node, "decorator_list", ()):
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == decorator
                    and dec.args):
                continue
            arg = dec.args[0]
            if isinstance(arg, ast.Constant):
                names.append(arg.value)
            elif isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
                key = f"{arg.value.id}.{arg.attr}"
                if key not in constants:
                    raise LookupError(f"{relative}: @{decorator}({key}) names no string "
                                      "constant of a class in that file")
                names.append(constants[key])
    return names


@functools.cache
def verl_config() -> dict:
    """verl's generated PPO trainer config, parsed (what `verl(key)` reads)."""
    import yaml  # verl depends on it

    return yaml.safe_load(_text(VERL_CONFIG))


def verl(key: str):
    """A value of verl's generated PPO trainer config, by dotted key:
    verl("actor_rollout_ref.actor.loss_agg_mode")."""
    node = verl_config()
    for part in key.split("."):
        node = node[part]
    return node


def _field_default(value: ast.expr):
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return ast.literal_eval(kw.value)
        raise LookupError("a field without a literal default")
    return ast.literal_eval(value)


def trl(name: str):
    """The default of GRPOConfig's field `name`, as declared (before `__post_init__`)."""
    for relative, cls in TRL_CONFIG_CLASSES:
        for node in _find(_tree(relative).body, cls).body:
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name \
                    and node.value is not None:
                return _field_default(node.value)
    raise LookupError(f"GRPOConfig has no field {name!r}")
