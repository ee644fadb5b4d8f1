"""OpenRLHF's rows of the conformance matrix (rlgates.trainers.conformance), for OpenRLHF 0.11.2.

OpenRLHF's policy loss is one class, `PolicyLoss` in openrlhf/models/loss.py, built by
openrlhf/trainer/ray/ppo_actor.py from the options of openrlhf/cli/train_ppo_ray.py:
`--actor.policy_loss_type {ppo, gspo}`, `--actor.eps_clip` / `--actor.eps_clip_low_high`,
`--actor.dual_clip`, `--actor.loss_agg_mode {token-mean, seq-mean-token-mean}` and the
train/rollout correction `--algo.advantage.is_correction_{level,mode,gating,threshold}`. A row's
settings are those options (the leading "--" dropped); `policy_loss_kwargs` turns them into
PolicyLoss's arguments the way ppo_actor.py does (tests/test_conformance_openrlhf.py checks that
against the installed ppo_actor.py's source, and `cli_defaults` against train_ppo_ray.py's).

OpenRLHF is optional (`trainers-extra`: pip install --no-deps openrlhf==0.11.2), and its package
imports ray, deepspeed, flash_attn and transformers. `load()` therefore loads only the two files
the loss needs, openrlhf/models/utils.py and loss.py, from the installed package, under a
package of their own, as OpenRLHF's own tests/test_loss_aggregation.py does; utils.py's one
import that is not installed, `deepspeed`, is an empty stub module while it loads (only
`set_z3_leaf_modules` uses it, no loss does). openrlhf/utils/loss_utils.py (the step's
normalisers) imports torch only and is loaded the same way.

This module imports nothing of OpenRLHF until `load()` is called: the rows are data.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

from .._book import facts
from ..methods import get
from . import EXTRA_VERSIONS, flags
from ._row import Row

VERSION = EXTRA_VERSIONS["openrlhf"]
#: The installed files the rows are read from (relative to site-packages)
LOSS_FILE = "openrlhf/models/loss.py"
ACTOR_FILE = "openrlhf/trainer/ray/ppo_actor.py"
CLI_FILE = "openrlhf/cli/train_ppo_ray.py"
#: the wheel installs OpenRLHF's tests as a top-level package `tests` (its sdist is not on PyPI)
OWN_TESTS_FILE = "tests/test_loss_aggregation.py"
_PACKAGE = "_rlgates_openrlhf"

#: PolicyLoss's arguments as openrlhf/trainer/ray/ppo_actor.py (0.11.2) writes them, from the
#: parsed options `args` (test_ppo_actor_builds_policy_loss_so checks each source string).
POLICY_LOSS_ARGS = {
    "clip_eps_low": "self.args.actor.eps_clip_low_high[0]",
    "clip_eps_high": "self.args.actor.eps_clip_low_high[1]",
    "dual_clip": "self.args.actor.dual_clip",
    "token_level_loss": "self.args.actor.loss_agg_mode == 'token-mean'",
    "policy_loss_type": "self.args.actor.policy_loss_type",
    "is_correction_level": "self.args.algo.advantage.is_correction_level",
    "is_correction_mode": "self.args.algo.advantage.is_correction_mode",
    "is_correction_gating": "self.args.algo.advantage.is_correction_gating",
    "is_correction_threshold": "self.args.algo.advantage.is_correction_threshold",
}


def package_dir() -> Path | None:
    """Where OpenRLHF is installed (found, not imported), or None."""
    return facts.package_dir("openrlhf")


def installed() -> bool:
    return package_dir() is not None


def path(relative: str) -> Path:
    """An installed file of the OpenRLHF wheel, "openrlhf/..." or "tests/..." (site-packages)."""
    root = package_dir()
    if root is None:
        raise ModuleNotFoundError(f"openrlhf is not installed (pip install --no-deps "
                                  f"openrlhf=={VERSION})")
    return root.parent / relative


def _exec(name: str, file: Path):
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load() -> types.SimpleNamespace:
    """OpenRLHF's loss modules, from the installed files: `.loss` (PolicyLoss, aggregate_loss),
    `.utils` (masked_mean) and `.loss_utils` (get_loss_batch_info,
    iter_grad_accum_global_norm). Loaded once."""
    if f"{_PACKAGE}.loss" in sys.modules:
        return types.SimpleNamespace(loss=sys.modules[f"{_PACKAGE}.loss"],
                                     utils=sys.modules[f"{_PACKAGE}.utils"],
                                     loss_utils=sys.modules[f"{_PACKAGE}.loss_utils"])
    models = path(LOSS_FILE).parent
    pkg = types.ModuleType(_PACKAGE)
    pkg.__path__ = [str(models)]
    sys.modules[_PACKAGE] = pkg
    stub = importlib.util.find_spec("deepspeed") is None
    if stub:  # utils.py imports it at the top; no loss function reads it
        sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    try:
        utils = _exec(f"{_PACKAGE}.utils", models / "utils.py")
        loss = _exec(f"{_PACKAGE}.loss", models / "loss.py")
    finally:
        if stub:
            del sys.modules["deepspeed"]
    loss_utils = _exec(f"{_PACKAGE}.loss_utils", path("openrlhf/utils/loss_utils.py"))
    return types.SimpleNamespace(loss=loss, utils=utils, loss_utils=loss_utils)


def cli_defaults() -> dict:
    """{option: default} of every `parser.add_argument("--option", ..., default=...)` in the
    installed train_ppo_ray.py whose default is a literal (read from the source: importing it
    needs ray)."""
    tree = ast.parse(path(CLI_FILE).read_text())
    out = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        for kw in node.keywords:
            if kw.arg == "default":
                try:
                    out[node.args[0].value.removeprefix("--")] = ast.literal_eval(kw.value)
                except ValueError:
                    pass
    return out


def ppo_actor_policy_loss_args() -> dict:
    """{PolicyLoss keyword: source text} of the `PolicyLoss(...)` call in the installed
    ppo_actor.py."""
    tree = ast.parse(path(ACTOR_FILE).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "PolicyLoss":
            return {kw.arg: ast.unparse(kw.value) for kw in node.keywords}
    raise ValueError(f"{ACTOR_FILE} no longer builds PolicyLoss")


#: train_ppo_ray.py's defaults of the options a row may set (0.11.2; `cli_defaults` reads them).
#: eps_clip_low_high None becomes (eps_clip, eps_clip) after parsing.
DEFAULTS = {
    "actor.policy_loss_type": "ppo", "actor.eps_clip": 0.2, "actor.eps_clip_low_high": None,
    "actor.dual_clip": None, "actor.loss_agg_mode": "token-mean",
    "algo.advantage.is_correction_level": "off", "algo.advantage.is_correction_mode": "mask",
    "algo.advantage.is_correction_gating": "ratio",
    "algo.advantage.is_correction_threshold": [0.5, 5.0],
}
#: The settings that tell rows apart (`conformance.find`'s convention): at their defaults.
SETTING_DEFAULTS = {k: DEFAULTS[k] for k in ("actor.dual_clip",
                                             "algo.advantage.is_correction_level")}


def policy_loss_kwargs(settings: dict) -> dict:
    """PolicyLoss's keyword arguments for a row's settings, as ppo_actor.py builds them from
    the parsed options (train_ppo_ray.py's defaults for the options a row leaves out; a single
    threshold is an upper bound, as train_ppo_ray.py reads it)."""
    a = {**DEFAULTS, **settings}
    low_high = a["actor.eps_clip_low_high"] or (a["actor.eps_clip"], a["actor.eps_clip"])
    threshold = list(a["algo.advantage.is_correction_threshold"])
    if len(threshold) == 1:
        threshold.insert(0, 0.0)
    return {"clip_eps_low": low_high[0], "clip_eps_high": low_high[1],
            "dual_clip": a["actor.dual_clip"],
            "token_level_loss": a["actor.loss_agg_mode"] == "token-mean",
            "policy_loss_type": a["actor.policy_loss_type"],
            "is_correction_level": a["algo.advantage.is_correction_level"],
            "is_correction_mode": a["algo.advantage.is_correction_mode"],
            "is_correction_gating": a["algo.advantage.is_correction_gating"],
            "is_correction_threshold": threshold}


def openrlhf_row(method, name=None, status="equal", note="", settings=None, correction=None,
                 side=(), **hparams) -> Row:
    """The row of `method` at `hparams`, its settings read from the method's OpenRLHF flags
    (`settings` adds to them)."""
    m = get(method, **hparams)
    f = flags(m)["openrlhf"]
    if f is None:
        raise ValueError(f"{method} at {m.hparams} has no OpenRLHF flags")
    s = {**f, **(settings or {})}
    agg = ("seq-mean-token-mean" if s["actor.policy_loss_type"] == "gspo"
           else s.get("actor.loss_agg_mode", DEFAULTS["actor.loss_agg_mode"]))
    return Row(trainer="openrlhf", name=name or s["actor.policy_loss_type"], settings=s,
               method=method, hparams=dict(m.hparams), agg=agg, side=tuple(side),
               status=status, note=note, correction=dict(correction or {}))


_IS = "algo.advantage.is_correction_"

GSPO_PER_TOKEN = (
    "Equal with one advantage per response. OpenRLHF differentiates the sequence ratio "
    "exp(mean_t log ρ_t) itself, so with [B, T] advantages each token's gradient mixes the "
    "response's A_t (the values agree; rlgates' GSPO-token gives token t the gradient of its own "
    "A_t; tested). OpenRLHF does not clamp the sequence log-ratio.")
SAMPLER = ("The weight is π_old/μ with μ the sampler's (vLLM's) log-probs "
           "(rollout_log_probs); rlgates' is_weight from "
           "rlgates.offpolicy.importance_weight(logp_old, sampler_logp, mask, **row.correction). ")
NO_RLGATES_RULE = (
    "no rlgates Correction has this rule: the test builds the weight from the rule (stated "
    "here, not from OpenRLHF's code) and gives it to the method as is_weight; equal in value "
    "and gradient.")


def openrlhf_rows() -> list[Row]:
    """OpenRLHF 0.11.2's policy losses: both policy_loss_types, both aggregations, dual-clip, and
    each train/rollout correction."""
    seq_mask = {f"{_IS}level": "seq", f"{_IS}mode": "mask", f"{_IS}threshold": [0.5, 5.0]}
    return [
        openrlhf_row("ppo"),
        openrlhf_row("dapo"),
        openrlhf_row("grpo", note=(
            "seq-mean-token-mean: OpenRLHF's per-sample mean skips fully masked rows "
            "(global_batch_size counts the non-empty ones), as rlgates' does.")),
        openrlhf_row("dual_clip"),
        openrlhf_row("dapo_dual_clip"),
        openrlhf_row("gspo", status="partial", note=GSPO_PER_TOKEN),
        openrlhf_row("ppo", name="is_correction:tis", side=("sampler_logp",),
                     settings={f"{_IS}level": "token", f"{_IS}mode": "clip",
                               f"{_IS}threshold": [0.5, 5.0]},
                     correction={"correction": "tis", "level": "token", "low": 0.5, "high": 5.0},
                     note=SAMPLER + "TIS: the token weight clamped to [0.5, 5]."),
        openrlhf_row("ppo", name="is_correction:icepop", side=("sampler_logp",),
                     settings={f"{_IS}level": "token", f"{_IS}mode": "mask",
                               f"{_IS}threshold": [0.5, 5.0]},
                     correction={"correction": "icepop", "level": "token", "low": 0.5,
                                 "high": 5.0},
                     note=SAMPLER + "IcePop: the token weight, 0 outside [0.5, 5]; a dropped "
                                    "token still counts in the token mean."),
        openrlhf_row("ppo", name="is_correction:seq-mask-tis", side=("sampler_logp",),
                     settings=seq_mask,
                     correction={"correction": "seq_mask_tis", "level": "sequence", "low": 0.5,
                                 "high": 5.0},
                     note=SAMPLER + "seq-mask-tis keeps a response iff its geometric-mean "
                                    "weight exp(mean_t log w_t) lies in [0.5, 5] and weighs "
                                    "each kept token by its own w_t: rlgates.offpolicy's "
                                    "seq_mask_tis (its sequence-level TIS and IcePop weigh by "
                                    "the product Π_t w_t instead)."),
        openrlhf_row("ppo", name="is_correction:binary_kl", side=("sampler_logp",),
                     settings={f"{_IS}level": "token", f"{_IS}gating": "binary_kl",
                               f"{_IS}threshold": [0.0, 0.05]}, status="partial",
                     note=SAMPLER + "A trust region: a token is kept (weight w_t) iff the "
                                    "binary KL p·log(p/q) + (1−p)·log((1−p)/(1−q)) of the "
                                    "sampled token, p = μ, q = π_old (both clamped to "
                                    "[1e-6, 1 − 1e-6]), is at most δ; `tv` gates on |p − q| "
                                    "alike (tested too): " + NO_RLGATES_RULE),
        openrlhf_row("gspo", name="gspo:is_correction", side=("sampler_logp",), status="partial",
                     settings={f"{_IS}level": "token"},
                     note="With a correction on, OpenRLHF's gspo takes its sequence ratio "
                          "against the sampler (log π − log μ) and applies no weight: GSPO with "
                          "the sampler's log-probs as π_old (tested). " + GSPO_PER_TOKEN),
    ]


__all__ = ["ACTOR_FILE", "CLI_FILE", "DEFAULTS", "LOSS_FILE", "OWN_TESTS_FILE",
           "POLICY_LOSS_ARGS", "SETTING_DEFAULTS", "VERSION", "cli_defaults", "installed", "load",
           "openrlhf_row", "openrlhf_rows", "package_dir", "path", "policy_loss_kwargs",
           "ppo_actor_policy_loss_args"]
