"""The conformance matrix: every policy loss the installed trainers name, and its rlgates method.

One `Row` per name in verl's policy-loss registry (`POLICY_LOSS_REGISTRY`, with one row per
configuration that needs its own method) and per TRL `loss_type`. Each row says which rlgates
method, hyperparameters and aggregation compute that trainer's loss, which side inputs the loss
reads beyond (ρ, A), and whether the two agree in value and gradient (float64) on the hard batch
of the differential tests (tests/test_conformance_verl.py, tests/test_conformance_trl.py); a row
that cannot fully agree says why in `note`, and its test checks what it can.

    matrix()      the rows: verl's (conformance_verl), TRL's (conformance_trl), then the rows of
                  losses that read side information (conformance_side), where those modules exist
    markdown()    the matrix as a Markdown table, for the book

This module imports neither trainer: the rows are data, the tests run the trainers.
"""

from __future__ import annotations

import importlib
import math

from ._row import STATUSES, Row


def _rows(module: str, attr: str) -> list[Row]:
    """The rows `attr` of rlgates.trainers.<module>: a function or a list; [] while that module
    does not exist yet (any other import error is raised)."""
    name = f"{__package__}.{module}"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return []
    rows = getattr(mod, attr)
    return list(rows() if callable(rows) else rows)


def matrix() -> list[Row]:
    """Every row: verl's, then TRL's, then those of losses that read side information, then
    OpenRLHF's and AReaL's (rows are data: neither needs its trainer installed)."""
    return (_rows("conformance_verl", "verl_rows") + _rows("conformance_trl", "trl_rows")
            + _rows("conformance_side", "SIDE_ROWS")
            + _rows("conformance_openrlhf", "openrlhf_rows")
            + _rows("conformance_areal", "areal_rows"))


# --- settings -> row: the matrix read backwards (rlgates.inspect's method_for) --------------------

#: Settings that set the aggregation, not the gate: a row whose other settings match is the
#: method whatever these say (TRL's clip loss types are aggregations of one gate, see below).
AGG_SETTINGS = ("loss_agg_mode", "max_completion_length")


def method_settings(method, trainer) -> dict | None:
    """The settings that make `trainer`'s built-in loss compute `method`, as rows write them
    (verl's policy-loss fields under "policy_loss."); None: no built-in."""
    from . import flags

    if trainer == "areal":  # AReaL has one aggregation: its settings compute the gate there
        from . import AREAL_AGG

        return flags(method, agg=AREAL_AGG)["areal"]
    f = flags(method)[trainer]
    if f is None or trainer != "verl":  # the others' flags are written as rows write them
        return f
    from .conformance_verl import verl_settings

    return verl_settings(f)


def candidates(trainer) -> list[Row]:
    """The matrix's rows of `trainer`, then a row for each other registered method that the
    trainer's built-in loss computes (its trainer flags; e.g. TRL's `delta` is dual_clip)."""
    from ..methods import get, names

    rows = [r for r in matrix() if r.trainer == trainer]
    have = {r.method for r in rows}
    for name in names():
        if name in have or method_settings(get(name), trainer) is None:
            continue
        if trainer == "trl":
            from .conformance_trl import trl_row

            rows.append(trl_row(method_settings(get(name), "trl")["loss_type"], name))
        else:
            from .conformance_verl import method_row

            rows.append(method_row(name))
    return rows


def _defaults(trainer) -> dict:
    mod = importlib.import_module(f"{__package__}.conformance_{trainer}")
    return mod.SETTING_DEFAULTS


def _plain(v):
    """A setting as a value: "inf" (as a capture's JSON writes it) is a float."""
    if isinstance(v, str) and v.lower() in ("inf", "-inf", "infinity", "-infinity", "nan"):
        return float(v)
    return v


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(a, b) -> bool:
    a, b = _plain(a), _plain(b)
    if _number(a) and _number(b):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def _driven(row, trainer):
    """{hyperparameter: (setting, slope, offset)} for each hyperparameter of the row's method
    that its trainer flags set (setting = offset + slope·h, found by moving h), and every
    setting so set."""
    from ..methods import get

    m = get(row.method, **row.hparams)
    base = method_settings(m, trainer) or {}
    out, keys = {}, set()
    for p, v in m.hparams.items():
        if not _number(v) or not math.isfinite(v):
            continue
        step = 0.25 * max(abs(v), 0.1)
        for d in (step, -step):
            try:
                moved = method_settings(get(row.method, **{**m.hparams, p: v + d}), trainer)
            except ValueError:  # out of the hyperparameter's range: try the other way
                continue
            if moved is None:
                continue
            changed = [k for k in row.settings if _number(base.get(k)) and _number(moved.get(k))
                       and moved[k] != base[k]]
            keys.update(changed)
            if changed:
                k = changed[0]
                slope = round((moved[k] - base[k]) / d, 9)
                out[p] = (k, slope, base[k] - slope * v)
            break
    return out, keys


def _solve(row, trainer, settings, clip_types):
    """(hyperparameters, settings taken at the row's value, for each aggregation setting whether
    it agrees) of `row` at `settings`, or None where the settings are not the row's."""
    defaults = _defaults(trainer)
    given = {k: _plain(v) for k, v in settings.items()}
    if not _unset_knobs_off(row, defaults, given):
        return None
    driven, driven_keys = _driven(row, trainer) if row.method else ({}, set())
    agg_same = _fixed_settings(row, defaults, given, driven_keys, clip_types)
    if agg_same is None:
        return None
    if row.method is None:
        return {}, [], agg_same
    got = _read_hparams(row, trainer, given, driven, driven_keys)
    return None if got is None else (*got, agg_same)


def _unset_knobs_off(row, defaults, given) -> bool:
    """Whether every knob the row does not set is at its trainer default."""
    return all(k in row.settings or given.get(k) is None or _same(given[k], off)
               for k, off in defaults.items())


def _fixed_settings(row, defaults, given, driven_keys, clip_types):
    """For each aggregation setting of the row, whether `given` agrees; None where another
    setting the row fixes (not one a hyperparameter drives) differs."""
    agg_same = []
    for k, want in row.settings.items():
        if k in driven_keys:
            continue
        have = defaults.get(k) if given.get(k) is None else given[k]
        if k in AGG_SETTINGS or (k == "loss_type" and want in clip_types and have in clip_types):
            agg_same.append(_same(want, have))
        elif not _same(want, have):
            return None
    return agg_same


def _read_hparams(row, trainer, given, driven, driven_keys):
    """(hyperparameters, settings assumed at the row's value): each driven hyperparameter
    solved from its setting, then checked by writing the flags again; None where they
    disagree (e.g. one ε for two different clip ratios)."""
    from ..methods import get

    hparams, assumed = dict(row.hparams), []
    for p, (k, slope, offset) in driven.items():
        if given.get(k) is None:
            assumed.append(k)
        elif not _number(given[k]):
            return None
        else:
            hparams[p] = (given[k] - offset) / slope if slope != 1 else given[k] - offset
    try:
        again = method_settings(get(row.method, **hparams), trainer)
    except ValueError:
        return None
    if again is None or any(given.get(k) is not None and not _same(again.get(k), given[k])
                            for k in driven_keys):
        return None
    return get(row.method, **hparams).hparams, assumed


def find(trainer, settings):
    """The row whose trainer settings `settings` are (keys as rows write them), with its method's
    hyperparameters read back from them: (row, hparams, assumed, same_agg), or None where no row
    matches. Each hyperparameter a method's trainer flags set is solved from that setting and
    checked by writing the flags again; the other settings must equal the row's, except those of
    the aggregation (`AGG_SETTINGS`, and TRL's clip loss types, one gate aggregated five ways),
    on which an exact row wins. A setting the row needs and `settings` lacks is taken at the
    row's value and listed in `assumed` (a row that needs fewer wins); a knob a row does not set
    must be at its default (`SETTING_DEFAULTS` of conformance_trl / conformance_verl). Among
    rows that match alike, the one with more aggregation settings equal wins, then the method
    first in reading order (`names()`: ppo before dapo at ε_low = ε_high), then the row first
    in the matrix."""
    from ..methods import names
    from . import TRL_CLIP_LOSS_TYPES

    order = {n: i for i, n in enumerate(names())}
    best = None
    for i, row in enumerate(candidates(trainer)):
        got = _solve(row, trainer, settings, TRL_CLIP_LOSS_TYPES if trainer == "trl" else ())
        if got is None:
            continue
        hparams, assumed, agg = got
        score = (all(agg), -len(assumed), sum(agg), -order.get(row.method, len(order)), -i)
        if best is None or score > best[0]:
            best = (score, (row, hparams, assumed, all(agg)))
    return None if best is None else best[1]


def _value(v) -> str:
    if v is None:
        return "null"  # as a Hydra override writes it
    if isinstance(v, float):
        return "inf" if v == float("inf") else f"{v:g}"
    return str(v)


def _pairs(d: dict) -> str:
    return "; ".join(f"{k}={_value(v)}" for k, v in d.items()) or "—"


def markdown(rows=None) -> str:
    """The matrix as a Markdown table: trainer, name, settings, method (hyperparameters),
    aggregation, side inputs, status and note."""
    from ..tables import markdown as table

    rows = matrix() if rows is None else rows
    head = ("trainer", "name", "settings", "rlgates method", "agg", "side inputs", "status",
            "note")
    return table(((r.trainer, f"`{r.name}`", _pairs(r.settings),
                   f"`{r.method}` ({_pairs(r.hparams)})" if r.method else "—", f"`{r.agg}`",
                   ", ".join(r.side) or "—", r.status, r.note or "—") for r in rows), head)


__all__ = ["AGG_SETTINGS", "Row", "STATUSES", "candidates", "find", "markdown", "matrix",
           "method_settings"]
