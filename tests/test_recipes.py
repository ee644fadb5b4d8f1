"""CONTRIBUTING's recipes, followed literally: a new method ("Add a method") and a new logged
diagnostic ("Adding a diagnostic") are written into a module of their own in a temporary
directory, imported, and then found everywhere the recipe promises, with no other edit. Each
test unregisters what it registered, even when it fails."""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import textwrap

import pytest
import torch

import rlgates
from rlgates import diagnostics, lab, trainers
from tests import test_gradients as generic
from tests.conftest import make_batch

METHOD_MODULE = '''
import torch

from rlgates.methods import Method, register


@register
class TanhGate(Method):
    """f = 1 + ε·tanh((ρ − 1)/ε): a soft clip whose gate sech²((ρ − 1)/ε) fades on both sides."""

    name, title, date, order = "tanh_gate", "Tanh gate", "2026", 10
    paper = "none: a gate made up to test CONTRIBUTING's recipe (no arXiv id)"
    defaults = {"eps": 0.5}                    # hyperparameters and their defaults
    agg, agg_source = "token-mean", "the recipe's example: every token weighs the same"
    color, log_ratio_lim = "#8c564b", 1.0
    slider_ranges = {"eps": (0.05, 2.0, 0.05)}
    hard = False
    explorer = None
    f_latex, gate_latex, insight = r"1+\\epsilon\\tanh", r"\\mathrm{sech}^2", "A soft clip."
    gate_text = "sech²((ρ − 1)/ε)"

    def _validate(self):
        if not self.hparams["eps"] > 0:
            raise ValueError("tanh_gate: eps must be > 0")

    def _weight(self, ratio, adv, side=None):
        eps = self.hparams["eps"]
        return 1 + eps * torch.tanh((ratio - 1) / eps)

    def _gate(self, ratio, adv, side=None):
        return torch.cosh((ratio - 1) / self.hparams["eps"]) ** -2

    def bounds(self):
        return []
'''

DIAGNOSTIC_MODULE = '''
from rlgates.diagnostics import register, share


@register("shut_pos", "share of the real tokens with A > 0 whose gate is zero",
          trl=None, verl=None, log=True)   # the trainers' own names for it, if any
def _shut_pos(b):
    return share(b.shut & b.pos, b.mask)
'''


def _import(tmp_path, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


@contextlib.contextmanager
def _registered(tmp_path, module, source, registered, unregister):
    """Import `source` as `module`, and on the way out unregister whatever it registered (even
    after a failure) and forget the module."""
    before = set(registered())
    try:
        _import(tmp_path, module, source)
        yield
    finally:
        for name in set(registered()) - before:
            unregister(name)
        sys.modules.pop(module, None)


@pytest.fixture
def new_method(tmp_path):
    with _registered(tmp_path, "recipe_method", METHOD_MODULE, rlgates.names, rlgates.unregister):
        yield "tanh_gate"


@pytest.fixture
def new_diagnostic(tmp_path):
    with _registered(tmp_path, "recipe_diagnostic", DIAGNOSTIC_MODULE, diagnostics.keys,
                     diagnostics.unregister):
        yield "shut_pos"


def test_add_a_method_is_one_class(new_method):
    name = new_method
    assert name in rlgates.names() and "Tanh gate" in rlgates.table()
    assert f"`{name}`" in rlgates.tables.methods_table()
    for agg in rlgates.AGG_MODES:  # autograd against the closed form, every aggregation
        for per_token_adv in (False, True):
            generic.test_autograd_equals_closed_form(name, agg, 0, per_token_adv)
        generic.test_is_weight_multiplies_the_gradient(name, agg)
    generic.test_finite_differences_of_f_times_a(name)
    generic.test_gate_is_the_derivative_of_the_weight(name)  # by autograd and differences
    generic.test_default_aggregation_is_the_methods_own(name)
    generic.test_the_defaults_follow_the_papers_and_match_the_trainers(name)
    # not vacuous: the gate is its own, neither 0 nor 1 off ρ = 1
    g = rlgates.get(name).gate(torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64),
                               torch.ones(3, dtype=torch.float64))
    assert 0 < float(g[0]) < 1 == float(g[1]) and 0 < float(g[2]) < 1
    assert rlgates.lab.default_agg(name) == "token-mean"


def test_the_method_is_gone_after_the_recipe(new_method):
    rlgates.unregister(new_method)
    assert new_method not in rlgates.names()
    with pytest.raises(ValueError, match="unknown method"):
        rlgates.get(new_method)


def test_add_a_logged_diagnostic_is_one_function(new_diagnostic):
    key = new_diagnostic
    assert key in diagnostics.keys(logged=True)
    m = rlgates.get("dapo")
    logp, logp_old, adv, mask = make_batch(seed=1, scale=0.8)
    stats = diagnostics.step_stats(m, logp, logp_old, adv, mask)
    gate = m.token_gate(logp, logp_old, adv, mask)
    pos = mask & (adv[:, None] > 0)
    want = float(((gate == 0) & pos).sum() / mask.sum())
    assert want > 0 and math.isclose(float(stats[key]), want, rel_tol=1e-12)
    assert f"| `{key}` | share of the real tokens with A > 0" in diagnostics.table()
    assert key in lab.metric_doc()
    logged = trainers.gate_stats(m, logp, logp_old, adv, mask)
    assert set(logged) == set(diagnostics.keys(logged=True)) and logged[key] == pytest.approx(want)
    cfg = lab.LabConfig.for_device("cpu", prompts=2, group=4, length=6, steps=2)
    res = lab.train("dapo", cfg, seeds=[0], progress=False)[0]
    assert len(res.metrics[key]) == 2


def test_the_trainer_tests_take_a_logged_diagnostic(new_diagnostic):
    """tests/test_trainers.py reads the logged set from the registry, not a list of its own."""
    pytest.importorskip("trl")
    pytest.importorskip("verl")
    from tests.test_trainers import trl_logged, verl_logged

    assert f"rlgates/{new_diagnostic}" in trl_logged()
    assert f"actor/rlgates_{new_diagnostic}" in verl_logged()


def test_the_registries_are_clean():
    """Whatever the tests above did, nothing of theirs is left registered."""
    assert "tanh_gate" not in rlgates.names() and "shut_pos" not in diagnostics.keys()
