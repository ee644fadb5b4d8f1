"""AReaL's rows of the conformance matrix (rlgates.trainers.conformance), for AReaL 1.0.4.

AReaL's actor loss is `grpo_loss_fn` (areal/trainer/ppo/actor.py), which calls
`ppo_actor_loss_fn` or `sapo_loss_fn` (areal/utils/functional/functional.py) with the fields of
`PPOActorConfig` (areal/api/cli_args.py): `eps_clip`, `eps_clip_higher`, `c_clip`,
`importance_sampling_level` (token | sequence), `use_sapo_loss` with `sapo_tau_pos/neg`,
`use_decoupled_loss` with `rejection_sampling` (a `RejectionSamplingConfig`: the weight
π_prox/π_behave), and `m2_threshold` (M2PO). A row's settings are those fields ("actor." and
the field; "actor.rejection_sampling.<field>" for the rejection sampling's). AReaL has one
aggregation: each micro-batch's sum over its token count, the micro-batches weighed by their
token counts (`loss_weight_fn`), i.e. the step's token mean.

AReaL is optional (`trainers-extra`: pip install --no-deps areal==1.0.4), and importing any of
its modules needs packages it does not get with --no-deps (areal/__init__ imports its
infrastructure; functional.py imports areal.api.cli_args, which imports hydra, uvloop and the
engines). `load()` therefore executes the installed functional.py under a module name of its
own, with its two imports from AReaL given while it loads: `RejectionSamplingConfig` and
`KLEstimator`, each executed from its own class definition in the installed cli_args.py and
utils/data.py (the rest of those files is not run). From actor.py it takes `_apply_m2po_masking`
and `_get_m2po_loss_mask` the same way (torch only). Nothing of AReaL is imported until `load()`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
import types
from pathlib import Path

import torch

from .._book import facts
from ..methods import get
from . import AREAL_AGG, EXTRA_VERSIONS, flags
from ._row import Row

VERSION = EXTRA_VERSIONS["areal"]
FUNCTIONAL_FILE = "areal/utils/functional/functional.py"
CONFIG_FILE = "areal/api/cli_args.py"
ACTOR_FILE = "areal/trainer/ppo/actor.py"
DATA_FILE = "areal/utils/data.py"
_MODULE = "_rlgates_areal_functional"


def package_dir() -> Path | None:
    """Where AReaL is installed (found, not imported), or None."""
    return facts.package_dir("areal")


def installed() -> bool:
    return package_dir() is not None


def path(relative: str) -> Path:
    root = package_dir()
    if root is None:
        raise ModuleNotFoundError(f"areal is not installed (pip install --no-deps "
                                  f"areal=={VERSION})")
    return root.parent / relative


def _definitions(relative: str, names) -> dict:
    """{name: source} of the top-level classes and functions `names` of an installed file."""
    text = path(relative).read_text()
    lines = text.splitlines()
    found = {node.name: "\n".join(lines[min([d.lineno for d in node.decorator_list]
                                             + [node.lineno]) - 1:node.end_lineno])
             for node in ast.parse(text).body  # with its decorators (@dataclass)
             if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names}
    missing = set(names) - set(found)
    if missing:
        raise ValueError(f"{relative} no longer defines {sorted(missing)}")
    return found


def _run(sources, scope) -> dict:
    """Execute AReaL's definitions in a module of their own (dataclass looks its module up)."""
    module = types.ModuleType(f"{_MODULE}_{scope['__name__'].replace('.', '_')}")
    module.__dict__.update({**scope, "__name__": module.__name__})
    sys.modules[module.__name__] = module
    for source in sources:
        exec(compile(source, str(path(scope["__file__"])), "exec"), module.__dict__)  # noqa: S102
    return module.__dict__


_LOADED: dict = {}


def load() -> types.SimpleNamespace:
    """AReaL's loss functions, from the installed files: `.functional` (ppo_actor_loss_fn,
    sapo_loss_fn, apply_rejection_sampling), `.RejectionSamplingConfig`, `.KLEstimator`,
    `.apply_m2po_masking`. Loaded once."""
    if _LOADED:
        return types.SimpleNamespace(**_LOADED)
    file = path(FUNCTIONAL_FILE)  # found before the stand-ins below hide the package
    scope = {"__name__": "areal.api.cli_args", "__file__": CONFIG_FILE,
             "dataclass": dataclasses.dataclass, "field": dataclasses.field}
    config = _run(_definitions(CONFIG_FILE, ["RejectionSamplingConfig"]).values(),
                  scope)["RejectionSamplingConfig"]
    kl = _run(_definitions(DATA_FILE, ["KLEstimator"]).values(),
              {"__name__": "areal.utils.data", "__file__": DATA_FILE,
               "torch": torch})["KLEstimator"]
    given = {"areal": None, "areal.api": None, "areal.utils": None,
             "areal.api.cli_args": {"RejectionSamplingConfig": config},
             "areal.utils.data": {"KLEstimator": kl}}
    m2 = _run(_definitions(ACTOR_FILE, ["_apply_m2po_masking", "_get_m2po_loss_mask"]).values(),
              {"__name__": "areal.trainer.ppo.actor", "__file__": ACTOR_FILE, "torch": torch})
    saved = {k: sys.modules.get(k) for k in given}
    for k, attrs in given.items():
        if saved[k] is None:  # what functional.py imports from AReaL, and nothing else
            mod = types.ModuleType(k)
            mod.__path__ = []
            mod.__dict__.update(attrs or {})
            sys.modules[k] = mod
    try:
        spec = importlib.util.spec_from_file_location(_MODULE, file)
        functional = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(functional)
    finally:
        for k, mod in saved.items():
            if mod is None:
                del sys.modules[k]
    _LOADED.update(functional=functional, RejectionSamplingConfig=config, KLEstimator=kl,
                   apply_m2po_masking=m2["_apply_m2po_masking"])
    return types.SimpleNamespace(**_LOADED)


def config_defaults(cls="PPOActorConfig") -> dict:
    """{field: default} of the fields of `cls` in the installed cli_args.py whose default is a
    literal (read from the source: importing it needs hydra and AReaL's engines)."""
    text = path(CONFIG_FILE).read_text()
    (node,) = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls]
    out = {}
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        value = item.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
            value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
        try:
            out[item.target.id] = ast.literal_eval(value) if value is not None else None
        except ValueError:
            pass
    return out


#: PPOActorConfig's defaults of the fields a row may set (1.0.4; `config_defaults` reads them)
DEFAULTS = {"eps_clip": 0.2, "eps_clip_higher": None, "c_clip": None,
            "importance_sampling_level": "token", "use_sapo_loss": False, "sapo_tau_pos": 1.0,
            "sapo_tau_neg": 1.05, "use_decoupled_loss": False, "rejection_sampling": None,
            "m2_threshold": None}
#: The settings that tell rows apart (`conformance.find`'s convention): at their defaults.
SETTING_DEFAULTS = {f"actor.{k}": DEFAULTS[k] for k in ("eps_clip_higher", "c_clip",
                                                        "use_sapo_loss", "use_decoupled_loss",
                                                        "m2_threshold")}
_RS = "actor.rejection_sampling."


def loss_kwargs(settings: dict) -> dict:
    """grpo_loss_fn's keyword arguments for a row's settings (the PPOActorConfig fields it
    reads, as actor.py passes them); `rejection_sampling` is a dict of RejectionSamplingConfig
    fields, or None."""
    a = {**DEFAULTS, **{k.removeprefix("actor."): v for k, v in settings.items()
                        if not k.startswith(_RS)}}
    rs = {k.removeprefix(_RS): v for k, v in settings.items() if k.startswith(_RS)}
    out = {k: a[k] for k in ("eps_clip", "eps_clip_higher", "c_clip", "importance_sampling_level",
                             "use_sapo_loss", "sapo_tau_pos", "sapo_tau_neg", "use_decoupled_loss",
                             "m2_threshold")}
    out["rejection_sampling"] = rs or None
    return out


def areal_row(method, name, status="equal", note="", settings=None, correction=None, side=(),
              agg_of=None, **hparams) -> Row:
    """The row of `method` at `hparams`, its settings read from the method's AReaL flags at
    AReaL's aggregation (`settings` adds to them)."""
    m = get(method, **hparams)
    f = flags(m, agg=AREAL_AGG)["areal"]
    if f is None:
        raise ValueError(f"{method} at {m.hparams} has no AReaL flags")
    return Row(trainer="areal", name=name, settings={**f, **(settings or {})}, method=method,
               hparams=dict(m.hparams), agg=AREAL_AGG, side=tuple(side), status=status,
               note=note, correction=dict(correction or {}))


NO_CLAMP = ("AReaL does not clamp the log-ratio (ratio = exp(logprobs − proximal_logprobs)): "
            "equal for |log ρ| ≤ 20, where rlgates clamps.")
FLOAT32_WEIGHT = (
    "Decoupled PPO: the gate's ratio is π_θ/π_prox and the weight π_prox/π_behave "
    "(apply_rejection_sampling) multiplies it; a dropped token still counts in the token mean "
    "(ppo_actor_loss_fn keeps the original count). AReaL computes the weight in float32 "
    "(`proximal_logprobs.detach().float()`, which rounds float64 down): equal in value and "
    "gradient with rlgates' weight from the float32-rounded log-probs (tested), ~1e-7 relative "
    "otherwise. ")


def areal_rows() -> list[Row]:
    """AReaL 1.0.4's actor losses: PPO's clip (decoupled bounds, dual clip), the sequence level,
    SAPO, decoupled PPO with each kind of rejection sampling, and M2PO."""
    decoupled = {"actor.use_decoupled_loss": True}
    return [
        areal_row("ppo", "ppo_actor_loss_fn", note=NO_CLAMP),
        areal_row("dapo", "ppo_actor_loss_fn", note=NO_CLAMP),
        areal_row("dual_clip", "ppo_actor_loss_fn", note=NO_CLAMP),
        areal_row("dapo_dual_clip", "ppo_actor_loss_fn", note=NO_CLAMP),
        areal_row("gspo", "importance_sampling_level=sequence", status="partial", note=(
            "AReaL's sequence level is a token mean over the step (long responses weigh more), "
            "so the row is GSPO at agg token-mean. AReaL replaces each token's advantage by its "
            "response's mean A and differentiates the sequence ratio through its mean: equal "
            "with one advantage per response, and with [B, T] advantages equal to rlgates given "
            "the row means (tested). " + NO_CLAMP)),
        areal_row("sapo", "sapo_loss_fn", note=(
            "AReaL's SAPO is a token mean over the step (verl's and TRL's are seq-mean-token-"
            "mean): the row is SAPO at agg token-mean. " + NO_CLAMP)),
        areal_row("ppo", "rejection_sampling:token-mask", side=("sampler_logp",),
                  status="partial",
                  settings={**decoupled, f"{_RS}level": "token", f"{_RS}action": "mask",
                            f"{_RS}metric": "ratio", f"{_RS}upper": 5.0},
                  correction={"correction": "mis", "level": "token", "high": 5.0},
                  note=FLOAT32_WEIGHT + "Token mask at upper 5 (lower unset): MIS."),
        areal_row("ppo", "rejection_sampling:token-clamp", side=("sampler_logp",),
                  status="partial",
                  settings={**decoupled, f"{_RS}level": "token", f"{_RS}action": "clamp",
                            f"{_RS}metric": "ratio", f"{_RS}upper": 5.0},
                  correction={"correction": "tis", "level": "token", "high": 5.0},
                  note=FLOAT32_WEIGHT + "Token clamp to [0, 5] (lower unset is 0): TIS."),
        areal_row("ppo", "rejection_sampling:sequence", side=("sampler_logp",),
                  status="partial",
                  settings={**decoupled, f"{_RS}level": "sequence", f"{_RS}action": "mask",
                            f"{_RS}metric": "ratio", f"{_RS}agg": "mean", f"{_RS}upper": 5.0},
                  note=FLOAT32_WEIGHT + (
                      "Sequence level, metric ratio: every token of a response is weighted by "
                      "the response's geometric-mean weight exp(mean_t log w_t), 0 where it "
                      "passes the bound (rlgates' sequence level is the product Π_t w_t): no "
                      "rlgates Correction has this rule; the test builds the weight from it.")),
        areal_row("ppo", "m2_threshold", side=("sampler_logp",), status="partial",
                  settings={**decoupled, "actor.m2_threshold": 0.04},
                  note=("M2PO (arXiv:2510.01161): drops the tokens of largest "
                        "(log π_behave − log π_prox)² until the mean of the rest is below the "
                        "threshold (0.04, AReaL's examples/math/gsm8k_m2po.yaml): the tokens "
                        "rlgates.offpolicy's m2po correction keeps (tested against AReaL's "
                        "_apply_m2po_masking); the row's test takes AReaL's selection as a 0/1 "
                        "is_weight. The micro-batch's loss then "
                        "divides by the kept tokens while the engine weighs it by all of them: "
                        "equal with rlgates.trainers.loss(..., norm=kept tokens) (tested).")),
    ]


__all__ = ["ACTOR_FILE", "CONFIG_FILE", "DATA_FILE", "DEFAULTS", "FUNCTIONAL_FILE",
           "SETTING_DEFAULTS", "VERSION", "areal_row", "areal_rows", "config_defaults",
           "installed", "load", "loss_kwargs", "package_dir", "path"]
