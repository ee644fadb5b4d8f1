"""Any rlgates gate inside a real trainer: TRL's `GRPOTrainer` and verl's policy-loss registry.

The trainers stay the engines (sampling, batching, optimiser, logging, processes); an adapter only
swaps the per-token objective for an rlgates method's. Two thin modules do the plumbing and import
their trainer; this one imports neither, so it stays light:

    rlgates.trainers.trl    RlgatesGRPOTrainer (a GRPOTrainer subclass), trl_loss,
                            builtin_loss (TRL's own loss at given log-probs)
    rlgates.trainers.verl   policy_loss(method), register(method) -> "rlgates_<name>"

What lives here is shared by both (and `guard_notebook()`, for a notebook without the trainers):

- `flags(m, agg=None)`: the trainer settings that make a trainer's *built-in* loss compute `m`
  (the flag table of the book's chapter 14, from each method class's `trainer_flags`), under
  its own aggregation or another (TRL's bnpo and dr_grpo are aggregations of its clip), or None
  where a trainer has no built-in equivalent;
- `loss(m, ..., norm=, length=)`: `m.loss` with a trainer's normaliser in place of the local one.

The normaliser. `rlgates.aggregate` divides by counts of the batch it is given: its tokens
(token-mean) or its non-empty sequences (the seq-mean modes), and T for seq-mean-token-sum-norm.
A trainer that splits a batch into micro-batches (and over processes) divides each micro-batch's
sum by a count of the *whole* batch instead, so that the accumulated gradient equals the
full-batch loss's. Every denominator is a constant (it does not depend on log π), so the
trainer's loss is the local one times local count / trainer count, exactly, value and gradient.
`loss` does that rescaling; the library's own `aggregate` keeps one meaning (the batch you pass).
"""

from __future__ import annotations

import math

import torch

from .. import _numerics as nx
from .. import diagnostics

#: The trainer versions the adapters and the flag table were tested with (tests/test_trainers.py).
TESTED_VERSIONS = {"trl": "1.16.0", "verl": "0.9.1"}
#: The optional trainers of the conformance matrix (the `trainers-extra` install: pip install
#: --no-deps; their loss modules only, tests/test_conformance_openrlhf.py and _areal.py), and the
#: versions their flags were read from.
EXTRA_VERSIONS = {"openrlhf": "0.11.2", "areal": "1.0.4"}
#: Every trainer `flags` answers for, in the order of the tables.
TRAINERS = ("verl", "trl", "openrlhf", "areal")
#: The trainers' names as the tables write them.
TRAINER_TITLES = {"verl": "verl", "trl": "TRL", "openrlhf": "OpenRLHF", "areal": "AReaL"}

_INF = math.inf


def guard_notebook() -> bool:
    """In a notebook without TRL and verl (Colab, Binder): from here on, a cell that needs them
    prints one line, what to install, instead of failing, and "Run All" goes on with the cells
    that need only rlgates (rlgates/trainers/_guard.py says how). Does nothing where both are
    installed, or outside IPython. Returns whether both are installed."""
    from .._book import facts

    if facts.installed():
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is not None:
        from . import _guard

        _guard.install(shell, TESTED_VERSIONS)
    return False


def engine_runs() -> dict:
    """What the real trainers did at TESTED_VERSIONS: the numbers of the engine tests
    (tests/engines), committed beside this module and checked against every engine run."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).with_name("engine_runs.json")).read_text())


def _resolve(spec, h):
    if spec is None:
        return None
    if callable(spec):
        return spec(dict(h))
    out = {}
    for k, v in spec.items():
        if callable(v):
            v = v(dict(h))
        elif isinstance(v, str) and v in h:
            v = h[v]
        out[k] = v
    return out


#: What a token mean divides by, for `flags`: "step", the whole optimiser step's token count
#: (over micro-batches and processes: `loss(norm=...)`, verl's batch_num_tokens, TRL's dapo); or
#: "micro-batch", each micro-batch's own (TRL's bnpo). The sequence means divide by responses,
#: and micro-batches hold as many each, so for them the two agree.
NORMALISERS = ("step", "micro-batch")
#: TRL 1.16's loss types that share one per-token loss (the clip of grpo, bnpo, dr_grpo, dapo and
#: luspo) and differ only in how they aggregate it: (rlgates aggregation, normaliser) -> loss_type.
TRL_LOSS_TYPE_FOR_AGG = {
    ("token-mean", "step"): "dapo", ("token-mean", "micro-batch"): "bnpo",
    ("seq-mean-token-mean", "step"): "grpo", ("seq-mean-token-sum", "step"): "luspo",
    ("seq-mean-token-sum-norm", "step"): "dr_grpo",
}
#: TRL's clip loss types (the keys above are the one place they are written)
TRL_CLIP_LOSS_TYPES = tuple(dict.fromkeys(TRL_LOSS_TYPE_FOR_AGG.values()))
#: The loss_mode names `rlgates.trainers.verl.register` gives: "rlgates_<method name>"
VERL_PREFIX = "rlgates_"
#: TRL loss types whose aggregation comes with the loss: (aggregation, normaliser).
TRL_FIXED_AGG = {"sapo": ("seq-mean-token-mean", "step"), "cispo": ("token-mean", "step"),
                 "vespo": ("token-mean", "step")}
#: verl losses that do not read loss_agg_mode: sapo forces seq-mean-token-mean; geo_mean takes a
#: plain mean over the rows. verl's other losses follow it, over the whole step.
VERL_FIXED_AGG = {"sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean"}
#: OpenRLHF 0.11.2's `--actor.loss_agg_mode` choices (openrlhf/cli/train_ppo_ray.py), both over
#: the optimiser step (`iter_grad_accum_global_norm`, openrlhf/utils/loss_utils.py); its
#: `--actor.policy_loss_type gspo` forces the per-sample mean (PolicyLoss.__init__).
OPENRLHF_AGGS = ("token-mean", "seq-mean-token-mean")
OPENRLHF_FIXED_AGG = {"gspo": "seq-mean-token-mean"}
#: AReaL 1.0.4 has one aggregation: ppo_actor_loss_fn and sapo_loss_fn divide each micro-batch's
#: sum by its token count, and the engine weighs micro-batches by their token counts
#: (areal/trainer/ppo/actor.py: loss_weight_fn=lambda x: x["loss_mask"].count_nonzero()): the
#: step's token mean.
AREAL_AGG = "token-mean"


def flags(method, agg=None, *, normaliser="step") -> dict:
    """{"verl": settings or None, "trl": ..., "openrlhf": ..., "areal": ...}: the settings that
    make each trainer's built-in loss compute `method` with its current hyperparameters, read
    from the method class's `trainer_flags`. None: no built-in equivalent (the adapters still
    run the method; verl and TRL only). OpenRLHF's settings are its `train_ppo_ray` options
    (`--actor.…`, `--algo.…`), AReaL's its PPOActorConfig fields (`actor.…`): each only where
    the trainer's aggregation is the method's (`OPENRLHF_AGGS`, `AREAL_AGG`).

    agg: one of rlgates.AGG_MODES, to run the method under another aggregation than its own
    (`method.agg`); normaliser: "step" or "micro-batch" (`NORMALISERS`), what a token mean
    divides by. TRL's clipped losses then switch loss_type (`TRL_LOSS_TYPE_FOR_AGG`: dapo, bnpo,
    grpo, luspo, dr_grpo; dr_grpo divides by max_completion_length, so pad to it); verl sets
    loss_agg_mode. A loss that fixes its own aggregation (TRL's sapo, cispo, vespo; verl's sapo,
    geo_mean) gives None for any other, and verl has no micro-batch token mean.

        flags(rlgates.get("dapo"), agg="token-mean", normaliser="micro-batch")  # TRL's bnpo
        flags(rlgates.get("grpo"), agg="seq-mean-token-sum-norm")               # TRL's dr_grpo
    """
    spec = getattr(type(method), "trainer_flags", None) or {}
    out = {k: _resolve(spec.get(k), method.hparams) for k in TRAINERS}
    if agg is None and normaliser == "step":
        return {**out, "openrlhf": _openrlhf_at(out["openrlhf"], method.agg, normaliser),
                "areal": _areal_at(out["areal"], method.agg, normaliser)}
    agg = method.agg if agg is None else agg
    if agg not in nx.AGG_MODES:
        raise ValueError(f"agg must be one of {nx.AGG_MODES}, got {agg!r}")
    if normaliser not in NORMALISERS:
        raise ValueError(f"normaliser must be one of {NORMALISERS}, got {normaliser!r}")
    if agg != "token-mean":
        normaliser = "step"  # a sequence mean divides by responses either way
    return {"verl": _verl_at(out["verl"], agg, normaliser),
            "trl": _trl_at(out["trl"], agg, normaliser),
            "openrlhf": _openrlhf_at(out["openrlhf"], agg, normaliser),
            "areal": _areal_at(out["areal"], agg, normaliser)}


def _verl_at(f, agg, normaliser):
    if f is None or normaliser == "micro-batch":
        return None  # verl divides a token mean by the step's token count (batch_num_tokens)
    if f["loss_mode"] in VERL_FIXED_AGG:
        return f if agg == VERL_FIXED_AGG[f["loss_mode"]] else None
    return {**f, "loss_agg_mode": agg}


def _trl_at(f, agg, normaliser):
    if f is None:
        return None
    if f["loss_type"] in TRL_FIXED_AGG:
        return f if TRL_FIXED_AGG[f["loss_type"]] == (agg, normaliser) else None
    if f["loss_type"] not in TRL_LOSS_TYPE_FOR_AGG.values():
        return None  # a loss type this table does not know: no claim
    return {**f, "loss_type": TRL_LOSS_TYPE_FOR_AGG[agg, normaliser]}


def _openrlhf_at(f, agg, normaliser):
    if f is None or normaliser == "micro-batch":
        return None  # OpenRLHF divides by the optimiser step's counts
    fixed = OPENRLHF_FIXED_AGG.get(f.get("actor.policy_loss_type"))
    if fixed is not None:
        return f if agg == fixed else None
    return {**f, "actor.loss_agg_mode": agg} if agg in OPENRLHF_AGGS else None


def _areal_at(f, agg, normaliser):
    return f if f is not None and agg == AREAL_AGG and normaliser == "step" else None


def _fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float):
        return "inf (off)" if v == _INF else f"{v:g}"
    if isinstance(v, (tuple, list)):
        return " ".join(_fmt(x) for x in v)
    return str(v)


def _why_not(method, trainer) -> str:
    """The flag table's cell where `trainer` has no built-in for `method`: under which other
    aggregation it has one (its settings then), or that it has none."""
    import rlgates

    for agg in rlgates.AGG_MODES:
        f = flags(method, agg=agg)[trainer]
        if f is not None and agg != method.agg:
            return (f"— (only as `{agg}`: "
                    + ", ".join(f"{k}={_fmt(v)}" for k, v in f.items() if v is not None) + ")")
    return "— (adapter only)" if trainer in ("verl", "trl") else "— (no built-in)"


def flag_rows(names=None, trainers=("verl", "trl")):
    """One row per method (at its defaults): [name, settings of each of `trainers`] as strings;
    where a trainer has no built-in, under which other aggregation it has one, or that it has
    none."""
    import rlgates

    rows = []
    for name in names or rlgates.names():
        m = rlgates.get(name)
        f = flags(m)
        cells = [", ".join(f"{k}={_fmt(v)}" for k, v in f[t].items() if v is not None)
                 if f[t] else _why_not(m, t) for t in trainers]
        rows.append([name, *cells])
    return rows


def flag_table(names=None, trainers=("verl", "trl")) -> str:
    """The flag table as Markdown: per method (at its defaults), the settings of each of
    `trainers` (verl and TRL unless named; `TRAINERS` for all four) that make that trainer's
    built-in loss compute it, and the versions they were tested with."""
    from ..tables import markdown

    versions = {**TESTED_VERSIONS, **EXTRA_VERSIONS}
    head = ("method", *(f"{TRAINER_TITLES[t]} {versions[t]}" for t in trainers))
    return markdown(((f"`{n}`", *(c.replace(", ", "; ") for c in cells))
                     for n, *cells in flag_rows(names, trainers)), head)


# --- the settings that differ across trainers (the book's "Which gate when") -------------------
#: The columns of `defaults_across_trainers`: CISPO's window on ρ at the trainer's defaults,
#: dual-clip's c, KL-Cov's fraction of tokens (and its coefficient), OPSM's δ, the default
#: aggregation of the policy loss.
DEFAULT_COLUMNS = ("cispo", "dual_clip_c", "kl_cov", "opsm_delta", "agg")
_NONE = "no such loss"
#: Trainers not installed here: values cited from each trainer's public source, at the file and
#: release named in `source` (not read from an installed package). "not stated": not found
#: there.
_NOTED = (
    {"trainer": "SkyRL", "release": "skyrl 0.4.0",
     "source": "skyrl/train/config/config.py, skyrl/backends/skyrl_train/utils/ppo_utils.py",
     "cispo": "[0, 5] (cispo_eps_clip_low 1.0, cispo_eps_clip_high 4.0)",
     "dual_clip_c": "3.0", "kl_cov": "kl_cov_frac 0.2, ppo_kl_coef 1.0", "opsm_delta": _NONE,
     "agg": "token_mean (loss_reduction)"},
    {"trainer": "ROLL", "release": "alibaba/ROLL v0.3.0",
     "source": "roll/configs/base_config.py, roll/pipeline/rlvr/actor_pg_worker.py",
     "cispo": "[0.9, 1.1] (ε 0.1 / 0.1)", "dual_clip_c": "1 + 2·pg_clip = 1.4",
     "kl_cov": "not stated", "opsm_delta": "not stated", "agg": "seq-mean-token-mean"},
    {"trainer": "slime", "release": "THUDM/slime v0.3.1",
     "source": "slime/utils/arguments.py, slime/utils/ppo_utils.py",
     "cispo": "[1 − ε, 1 + ε_h] (--eps-clip 0.2: [0.8, 1.2])", "dual_clip_c": "off (--eps-clip-c)",
     "kl_cov": "not stated", "opsm_delta": "1e-4 (--opsm-delta)", "agg": "sum_of_sample_mean"},
    {"trainer": "NeMo-RL", "release": "NVIDIA-NeMo/RL @ 7ea279a (2026-08-22)",
     "source": "nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossConfig)",
     "cispo": "use_cispo; ratio_clip_min/max 0.2 / 0.2",
     "dual_clip_c": "ratio_clip_c (\"usually 3\")",
     "kl_cov": "not stated", "opsm_delta": "not stated",
     "agg": "token-mean (token_level_loss=true)"},
    {"trainer": "prime-rl", "release": "PrimeIntellect-ai/prime-rl @ 559b447 (2026-08-21)",
     "source": "src/prime_rl/trainer/rl/loss.py",
     "cispo": _NONE, "dual_clip_c": _NONE, "kl_cov": _NONE, "opsm_delta": _NONE,
     "agg": "Σ / global token count, per loss component"},
)
#: The four installed trainers' values (each asserted against the installed package by
#: `installed_defaults`, tests/test_conformance_openrlhf.py and test_conformance_areal.py).
_INSTALLED = (
    {"trainer": "verl", "release": "verl 0.9.1",
     "source": "verl/trainer/config/_generated_ppo_trainer.yaml (actor_rollout_ref.actor)",
     "cispo": "[0.8, 1.2] (1 − clip_ratio_low, 1 + clip_ratio_high)",
     "dual_clip_c": "3.0 (clip_ratio_c; on in vanilla)",
     "kl_cov": "kl_cov_ratio 0.0002, ppo_kl_coef 0.1", "opsm_delta": _NONE, "agg": "token-mean"},
    {"trainer": "TRL", "release": "trl 1.16.0", "source": "trl/trainer/grpo_config.py",
     "cispo": "min(ρ, 0.2): epsilon_high unset is epsilon, an absolute cap",
     "dual_clip_c": "off (delta None)", "kl_cov": _NONE,
     "opsm_delta": "off (off_policy_mask_threshold None)", "agg": "dapo: Σ / global token count"},
    {"trainer": "OpenRLHF", "release": "openrlhf 0.11.2", "source": "openrlhf/cli/train_ppo_ray.py",
     "cispo": _NONE, "dual_clip_c": "off (--actor.dual_clip None)", "kl_cov": _NONE,
     "opsm_delta": _NONE, "agg": "token-mean (--actor.loss_agg_mode)"},
    {"trainer": "AReaL", "release": "areal 1.0.4",
     "source": "areal/api/cli_args.py (PPOActorConfig), areal/trainer/ppo/actor.py",
     "cispo": _NONE, "dual_clip_c": "off (c_clip None)", "kl_cov": _NONE, "opsm_delta": _NONE,
     "agg": "token-mean (the only one)"},
)


def defaults_across_trainers() -> list[dict]:
    """The settings that differ across trainers, one dict per trainer: `DEFAULT_COLUMNS`, the
    trainer's release and the file the values are read from, and `installed`: True for verl,
    TRL, OpenRLHF and AReaL (each value asserted against the installed package:
    `installed_defaults`), False for SkyRL, ROLL, slime, NeMo-RL and prime-rl (values cited from
    their public source at the file and release each row names; not read from an installed
    package here)."""
    return ([{**r, "installed": True} for r in _INSTALLED]
            + [{**r, "installed": False} for r in _NOTED])


def installed_defaults(trainer: str) -> dict:
    """The numbers behind a row of `defaults_across_trainers`, read from the installed trainer
    (its config file or source, without importing it): for verl, TRL, OpenRLHF or AReaL."""
    if trainer == "verl":
        from .._book import facts

        a = "actor_rollout_ref.actor."
        return {"cispo": (1 - facts.verl(a + "clip_ratio_low"),
                          1 + facts.verl(a + "clip_ratio_high")),
                "dual_clip_c": facts.verl(a + "clip_ratio_c"),
                "kl_cov": (facts.verl(a + "policy_loss.kl_cov_ratio"),
                           facts.verl(a + "policy_loss.ppo_kl_coef")),
                "loss_modes": facts.registered("verl/trainer/ppo/core_algos.py",
                                               "register_policy_loss"),
                "agg": facts.verl(a + "loss_agg_mode")}
    if trainer == "TRL":
        from .._book import facts

        eps_high = facts.trl("epsilon_high")
        return {"cispo": eps_high if eps_high is not None else facts.trl("epsilon"),
                "dual_clip_c": facts.trl("delta"),
                "opsm_delta": facts.trl("off_policy_mask_threshold"),
                "agg": facts.trl("loss_type")}
    if trainer == "OpenRLHF":
        from .conformance_openrlhf import cli_defaults

        d = cli_defaults()
        return {"dual_clip_c": d["actor.dual_clip"], "agg": d["actor.loss_agg_mode"],
                "policy_loss_type": d["actor.policy_loss_type"]}
    if trainer == "AReaL":
        from .conformance_areal import config_defaults

        d = config_defaults()
        return {"dual_clip_c": d["c_clip"], "agg": AREAL_AGG}
    raise ValueError(f"{trainer!r} is not installed here: its row is cited from its source, "
                     "at the file and release the row names")


def check_installed_defaults() -> list[str]:
    """Assert each installed row of `defaults_across_trainers` against its installed trainer
    (`installed_defaults`); returns the trainers checked (verl and TRL need requirements.txt,
    OpenRLHF and AReaL the optional install; one that is missing is left out)."""
    import importlib.util

    rows = {r["trainer"]: r for r in defaults_across_trainers() if r["installed"]}
    checked = []
    for package, (name, check) in _DEFAULT_CHECKS.items():
        if importlib.util.find_spec(package) is not None:
            check(installed_defaults(name), rows[name])
            checked.append(name)
    return checked


def _check_verl(d, r):
    assert f"[{d['cispo'][0]:g}, {d['cispo'][1]:g}]" in r["cispo"], r["cispo"]
    assert r["dual_clip_c"].startswith(f"{d['dual_clip_c']:.1f}")
    assert r["kl_cov"] == f"kl_cov_ratio {d['kl_cov'][0]}, ppo_kl_coef {d['kl_cov'][1]}"
    assert "opsm" not in d["loss_modes"] and r["opsm_delta"] == _NONE
    assert r["agg"] == d["agg"]


def _check_trl(d, r):
    from .conformance_trl import TRL_AGG

    assert r["cispo"].startswith(f"min(ρ, {d['cispo']:g})")
    assert d["dual_clip_c"] is None and r["dual_clip_c"].startswith("off")
    assert d["opsm_delta"] is None and r["opsm_delta"].startswith("off")
    assert "kl_cov" not in TRL_AGG and r["kl_cov"] == _NONE
    assert r["agg"].startswith(d["agg"] + ":")


def _check_no_such_losses(d, r, loss_text):
    """OpenRLHF and AReaL: no dual-clip by default, their aggregation, and no CISPO, KL-Cov or
    OPSM loss in their loss file."""
    assert d["dual_clip_c"] is None and r["dual_clip_c"].startswith("off")
    assert r["agg"].startswith(d["agg"] + " ")
    text = loss_text.lower()
    for word, col in (("cispo", "cispo"), ("kl_cov", "kl_cov"), ("opsm", "opsm_delta")):
        assert word not in text and r[col] == _NONE, word


def _check_openrlhf(d, r):
    from . import conformance_openrlhf as orl

    _check_no_such_losses(d, r, orl.path(orl.LOSS_FILE).read_text())


def _check_areal(d, r):
    from .conformance_areal import FUNCTIONAL_FILE, path

    _check_no_such_losses(d, r, path(FUNCTIONAL_FILE).read_text())


#: package -> (its row's name, the check of that row against the installed package)
_DEFAULT_CHECKS = {"verl": ("verl", _check_verl), "trl": ("TRL", _check_trl),
                   "openrlhf": ("OpenRLHF", _check_openrlhf), "areal": ("AReaL", _check_areal)}


def defaults_table() -> str:
    """`defaults_across_trainers` as Markdown."""
    from ..tables import markdown

    head = ("trainer (release)", "CISPO's window", "dual-clip c", "KL-Cov fraction",
            "OPSM δ", "default aggregation", "read from")
    return markdown(((f"{r['trainer']} ({r['release']})", *(r[c] for c in DEFAULT_COLUMNS),
                      f"`{r['source']}`" + ("" if r["installed"]
                                            else " (cited; not installed here)"))
                     for r in defaults_across_trainers()), head)


def _local_count(mask, agg):
    if agg == "token-mean":
        return mask.sum()
    return (mask.sum(-1) > 0).sum()


def loss(method, logp, logp_old, adv, mask=None, agg=None, *, norm=None, length=None,
         is_weight=None, side=None):
    """`method.loss` with a trainer's denominators: value and gradient, exactly.

    norm: the count the outer mean divides by. token-mean: a number of tokens (the global token
        count of the optimiser step, over micro-batches and processes); the seq-mean modes: a
        number of sequences. None keeps rlgates' own (this batch's tokens, or its non-empty
        sequences).
    length: seq-mean-token-sum-norm's constant (Dr. GRPO's generation budget); None keeps T.

    is_weight: passed to `method.loss` (a constant per-token factor, such as verl's rollout
        correction weights). side: passed to `method.loss` (an rlgates.SideInfo, for a method
        with side inputs the batch does not give).

    Summing `loss(..., norm=N)` over micro-batches that together hold N tokens gives the
    full batch's token-mean, whatever the split (tests/test_trainers.py checks it).
    """
    agg = agg or method.agg
    m = nx.check_mask(mask, logp.shape, logp.device)  # checked once here: a bool mask from now
    kw = {"side": side} if side is not None else {}  # a hand-written loss need not take it
    out = method.loss(logp, logp_old, adv, m, agg=agg, is_weight=is_weight, **kw)
    if norm is None and length is None:
        return out
    scale = out.new_tensor(1.0)
    if norm is not None:
        scale = scale * _local_count(m, agg).to(out.dtype) / torch.as_tensor(norm).to(out)
    if length is not None:
        if agg != "seq-mean-token-sum-norm":
            raise ValueError(f"length only applies to seq-mean-token-sum-norm, not agg={agg!r}")
        scale = scale * max(m.shape[-1], 1) / float(length)
    return out * scale


def _detached_inputs(logp, logp_old, adv, mask):
    """(log π, log π_old, A as [B, T], bool mask), detached, in the library's compute dtype:
    what the adapters' metrics read."""
    m = nx.check_mask(mask, logp.shape, logp.device)
    dtype = nx.compute_dtype(logp, logp_old)
    lp, old = logp.detach().to(dtype), logp_old.detach().to(dtype)
    a = adv.detach().to(dtype)
    return lp, old, (a[:, None] if a.dim() == 1 else a).expand_as(lp), m


def gate_stats(method, logp, logp_old, adv, mask, side=None):
    """rlgates' own diagnostics of one micro-batch, for a trainer's logs: {key: float} for every
    key `rlgates.diagnostics` registers with log=True whose inputs a loss sees (`gate_mean`, the
    mean f' over the real tokens with A ≠ 0, and `gate_zero`, the share of them the gate shuts,
    at the ratio the gate sees). They are not verl's pg_clipfrac (see rlgates.trainers.verl).
    side: the SideInfo of a method with side inputs; a gate whose fields are missing is left
    out, as any diagnostic whose input is missing."""
    stats = diagnostics.step_stats(method, logp, logp_old, adv, mask, side=side,
                                   keys=diagnostics.keys(logged=True), skip_missing=True)
    return diagnostics.as_floats(stats)


__all__ = ["AREAL_AGG", "DEFAULT_COLUMNS", "EXTRA_VERSIONS", "NORMALISERS", "OPENRLHF_AGGS",
           "OPENRLHF_FIXED_AGG", "TRAINERS", "TRAINER_TITLES", "TESTED_VERSIONS",
           "TRL_CLIP_LOSS_TYPES", "TRL_FIXED_AGG", "check_installed_defaults",
           "TRL_LOSS_TYPE_FOR_AGG", "VERL_FIXED_AGG", "VERL_PREFIX", "defaults_across_trainers",
           "defaults_table", "engine_runs", "flag_rows", "flag_table", "flags", "gate_stats",
           "installed_defaults", "loss"]
