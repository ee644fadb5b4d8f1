"""Adding a method is one class: a new gate defined here, registered, and then found everywhere
(names, Table 1, the figures, the explorer data, the lab's default aggregation) and put through
every generic test of tests/test_gradients.py without any other edit."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import rlgates  # noqa: E402
from rlgates.explorer_data import explorer_data  # noqa: E402
from tests import test_gradients as generic  # noqa: E402


class HalfGaussian(rlgates.Method):
    """A soft gate on one side: f' = 1 for ρ ≤ 1, exp(−(ρ−1)²/2σ²) above, whatever the sign of A.

    f = ρ for ρ ≤ 1, 1 + σ·√(π/2)·erf((ρ−1)/(σ√2)) above: continuous, with f'(1) = 1 on both sides.
    """

    name, title, date = "half_gauss", "Half-Gaussian gate", "a test"
    paper = "none: a gate made up to test the registry (no arXiv id)"
    defaults = {"sigma": 0.5}
    agg = "seq-mean-token-mean"
    agg_source = "chosen to differ from the base class's default, so the test can see it"
    color = "#123456"
    log_ratio_lim = 1.0
    slider_ranges = {"sigma": (0.05, 2.0, 0.05)}
    explorer = {"gate": "r <= 1 ? 1 : Math.exp(-(r - 1) * (r - 1) / (2 * p.sigma * p.sigma))",
                "bounds": "[]"}
    f_latex = r"\rho_t \wedge \big(1+\sigma\sqrt{\pi/2}\,\mathrm{erf}(\cdot)\big)"
    gate_latex = r"e^{-(\rho_t-1)_+^2/2\sigma^2}"
    insight = "A smooth brake on ratios above 1 only."

    def _validate(self):
        self.hparams["sigma"] = float(self.hparams["sigma"])
        if not self.hparams["sigma"] > 0:
            raise ValueError("half_gauss: sigma must be > 0")

    def _weight(self, ratio, adv):
        s = self.hparams["sigma"]
        above = 1 + s * math.sqrt(math.pi / 2) * torch.erf((ratio - 1) / (s * math.sqrt(2)))
        return torch.where(ratio > 1, above, ratio) * torch.ones_like(adv)

    def _gate(self, ratio, adv):
        s = self.hparams["sigma"]
        g = torch.exp(-((ratio - 1).clamp(min=0) ** 2) / (2 * s * s))
        return g * torch.ones_like(adv)


@pytest.fixture
def registered():
    rlgates.register(HalfGaussian)
    yield "half_gauss"
    rlgates.unregister("half_gauss")


def test_registered_everywhere(registered):
    assert registered in rlgates.names() and rlgates.names()[-1] == registered
    m = rlgates.get(registered, sigma=0.3)
    assert m.hparams == {"sigma": 0.3} and repr(m) == "rlgates.get('half_gauss', sigma=0.3)"
    assert "Half-Gaussian gate (a test)" in rlgates.table()
    assert "Half-Gaussian gate" not in rlgates.table(article=True)
    assert registered in rlgates.defaults_table()
    assert f"| `{registered}` | `sigma` (0.5) | seq-mean-token-mean | $" in (
        rlgates.tables.methods_table())  # the README's table; no gate_text: its LaTeX
    assert rlgates.lab.default_agg(registered) == "seq-mean-token-mean"
    assert rlgates.lab.method_color(registered, "C0") == "#123456"
    entry = {e["name"]: e for e in explorer_data()["methods"]}[registered]
    assert entry["js"] == HalfGaussian.explorer and entry["params"][0]["range"][:2] == [0.05, 2.0]
    assert entry["log_ratio_lim"] == 1.0


def test_figures_take_it(registered):
    fig = rlgates.plot_gate_signal(registered)
    assert fig.axes[0].get_ylim() == pytest.approx((-1.0, 1.0))
    (edges,) = fig.axes[0].collections  # a smooth gate: its half-height contour is drawn
    xy = torch.cat([torch.from_numpy(seg) for seg in edges.get_segments()]).double()
    gate = rlgates.get(registered).gate(xy[:, 1].exp(), xy[:, 0])
    assert len(xy) > 10 and (gate - 0.5).abs().max() < 1e-3
    plt.close(fig)
    plt.close(rlgates.plot_small_multiples(registered, "sigma", [0.2, 0.5]))
    plt.close(rlgates.plot_profiles(registered, "ppo"))
    box = rlgates.explore(registered)
    assert box.sliders["sigma"].max == 2.0
    plt.close("all")


def test_it_passes_every_generic_check(registered):
    for agg in rlgates.AGG_MODES:
        for seed in (0, 1):
            for per_token_adv in (False, True):
                generic.test_autograd_equals_closed_form(registered, agg, seed, per_token_adv)
        generic.test_is_weight_multiplies_the_gradient(registered, agg)
    generic.test_finite_differences_of_f_times_a(registered)
    generic.test_gate_is_the_derivative_of_the_weight(registered)
    generic.test_default_aggregation_is_the_methods_own(registered)
    generic.test_the_defaults_follow_the_papers_and_match_the_trainers(registered)


def test_unregister_undoes_it(registered):
    rlgates.unregister(registered)
    assert registered not in rlgates.names()
    with pytest.raises(ValueError, match="unknown method 'half_gauss'; known methods: ppo"):
        rlgates.get(registered)
    rlgates.register(HalfGaussian)  # so that the fixture's teardown finds it


def test_register_refuses_a_clash_and_a_bad_name():
    with pytest.raises(ValueError, match="already registered"):
        rlgates.register(type("Other", (HalfGaussian,), {"name": "ppo"}))
    with pytest.raises(ValueError, match="lowercase"):
        rlgates.register(type("Bad", (HalfGaussian,), {"name": "Bad"}))
    assert "half_gauss" not in rlgates.names()


def test_shown_source_is_the_code_that_runs(registered):
    """What a chapter shows with `rlgates.show_source` is the running gate: the shown text,
    executed in its module, computes the method's gate bit for bit (the test's method too)."""
    import inspect
    import sys

    from rlgates.notebook import source_text

    ratio = torch.linspace(-3, 3, 241, dtype=torch.float64).exp()[:, None]
    adv = torch.tensor([-1.0, -0.2, 0.0, 0.5, 1.0], dtype=torch.float64)[None, :]
    shown = {}
    for name in rlgates.names():
        m = rlgates.get(name)
        fn = inspect.unwrap(m._gate.__func__)
        text = source_text(m._gate)
        assert text.startswith(f"# {fn.__module__}.{fn.__qualname__}\n") and '"""' not in text
        scope = dict(vars(sys.modules[fn.__module__]))
        exec(compile(text, f"<shown {name}>", "exec"), scope)
        shown[name] = scope["_gate"]
        assert torch.equal(shown[name](m, ratio, adv), m.gate(ratio, adv)), name
    # negative control: another method's shown gate gives other values on this grid
    sapo = rlgates.get("sapo")
    assert not torch.equal(shown["ppo"](rlgates.get("ppo"), ratio, adv), sapo.gate(ratio, adv))
    helper = rlgates.methods.smooth._sech2_half
    assert '"""' in source_text(helper, docstrings=True) and '"""' not in source_text(helper)
    md = rlgates.show_source(sapo._gate, helper)._repr_markdown_()
    assert md.startswith("```python\n# rlgates.methods.smooth.SAPO._gate\n") and md.endswith("```")


def test_the_methods_package_exports_and_names_every_registered_class():
    """rlgates.methods re-exports each class (the API page documents its __all__) and its
    docstring names each method on its module's line: checked here against the registry."""
    import re

    lines = rlgates.methods.__doc__.splitlines()
    for name, cls in rlgates.REGISTRY.items():
        assert getattr(rlgates.methods, cls.__name__) is cls, name
        assert cls.__name__ in rlgates.methods.__all__, name
        module = cls.__module__.rsplit(".", 1)[1] + ".py"
        line = next(ln for ln in lines if ln.strip().startswith(module))
        assert re.search(rf"\b{name}\b", line), (name, line)
    # negative control: a made-up method is on no line
    assert not any(re.search(r"\bhalf_gauss\b", ln) for ln in lines)
