"""Adding a method is one class: a new gate defined here, registered, and then found everywhere
(names, Table 1, the figures, the explorer data, the lab's default aggregation) and put through
every generic test of tests/test_gradients.py without any other edit. A method that reads side
information (an entropy, π_old, a batch statistic) is one class too (`EntropyBrake`)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import rlgates  # noqa: E402
from rlgates._book.explorer_data import explorer_data  # noqa: E402
from tests import test_gradients as generic  # noqa: E402
from tests.conftest import make_batch, side_for  # noqa: E402


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

    def _weight(self, ratio, adv, side=None):
        s = self.hparams["sigma"]
        above = 1 + s * math.sqrt(math.pi / 2) * torch.erf((ratio - 1) / (s * math.sqrt(2)))
        return torch.where(ratio > 1, above, ratio) * torch.ones_like(adv)

    def _gate(self, ratio, adv, side=None):
        s = self.hparams["sigma"]
        g = torch.exp(-((ratio - 1).clamp(min=0) ** 2) / (2 * s * s))
        return g * torch.ones_like(adv)


class EntropyBrake(rlgates.Method):
    """HalfGaussian's brake, its width set by each token's entropy: σ = s·(1 + H). It reads H,
    which no (ρ, A) gives: a side input, declared in `side_inputs` and nowhere else."""

    name, title, date = "entropy_brake", "Entropy brake", "a test"
    paper = "none: a gate made up to test side information (no arXiv id)"
    defaults = {"s": 0.3}
    side_inputs = ("entropy",)
    agg_source = "the base class's default, token-mean"
    color = "#654321"
    slider_ranges = {"s": (0.05, 2.0, 0.05)}
    f_latex = r"\rho_t \wedge \big(1+\sigma\sqrt{\pi/2}\,\mathrm{erf}(\cdot)\big),\ \sigma=s(1+H_t)"
    gate_latex = r"e^{-(\rho_t-1)_+^2/2\sigma^2}"
    insight = "A brake on ratios above 1 that lets high-entropy tokens move further."

    def _validate(self):
        self.hparams["s"] = rlgates.methods._base._hparam(self.name, "s", self.hparams["s"],
                                                         low=0, low_open=True)

    def _sigma(self, side):
        return self.hparams["s"] * (1 + side.entropy)

    def _weight(self, ratio, adv, side=None):
        s = self._sigma(side)
        above = 1 + s * math.sqrt(math.pi / 2) * torch.erf((ratio - 1) / (s * math.sqrt(2)))
        return torch.where(ratio > 1, above, ratio) * torch.ones_like(adv)

    def _gate(self, ratio, adv, side=None):
        s = self._sigma(side)
        return torch.exp(-((ratio - 1).clamp(min=0) ** 2) / (2 * s * s)) * torch.ones_like(adv)


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
        side = side_for(m, torch.broadcast_shapes(ratio.shape, adv.shape), plane=True)
        extra = (side.to(ratio),) if side is not None else ()  # a side-input gate's argument
        want = m.gate(ratio, adv, side)  # the base class broadcasts the shown gate's result
        assert torch.equal(shown[name](m, ratio, adv, *extra).expand(want.shape), want), name
    # negative control: another method's shown gate gives other values on this grid
    sapo = rlgates.get("sapo")
    assert not torch.equal(shown["ppo"](rlgates.get("ppo"), ratio, adv), sapo.gate(ratio, adv))
    helper = rlgates.methods.smooth._sech2_half
    assert '"""' in source_text(helper, docstrings=True) and '"""' not in source_text(helper)
    md = rlgates.show_source(sapo._gate, helper)._repr_markdown_()
    assert md.startswith("```python\n# rlgates.methods.smooth.SAPO._gate\n") and md.endswith("```")


def test_the_methods_package_exports_every_built_in_class():
    """rlgates.methods re-exports each class defined in it (the API page documents its
    __all__); a method registered elsewhere (a test's, a contributor's module) is not its."""
    built_in = {name: cls for name, cls in rlgates.REGISTRY.items()
                if cls.__module__.startswith("rlgates.methods.")}
    assert "ppo" in built_in and "half_gauss" not in rlgates.methods.__all__
    for name, cls in built_in.items():
        assert getattr(rlgates.methods, cls.__name__) is cls, name
        assert cls.__name__ in rlgates.methods.__all__, name


@pytest.fixture
def brake():
    rlgates.register(EntropyBrake)
    yield "entropy_brake"
    rlgates.unregister("entropy_brake")


def test_a_side_input_method_is_one_class_too(brake):
    """Registered, it passes every generic check with its entropy given, and the loss, gate,
    expected_grad and check_gradient all take the same `side`."""
    for agg in rlgates.AGG_MODES:
        for per_token_adv in (False, True):
            generic.test_autograd_equals_closed_form(brake, agg, 0, per_token_adv)
        generic.test_is_weight_multiplies_the_gradient(brake, agg)
    generic.test_finite_differences_of_f_times_a(brake)
    generic.test_gate_is_the_derivative_of_the_weight(brake)
    generic.test_default_aggregation_is_the_methods_own(brake)
    assert brake in rlgates.names() and brake in rlgates.tables.methods_table()
    # its entropy matters: a higher entropy opens the gate above ρ = 1 further
    m = rlgates.get(brake)
    ratio, adv = torch.tensor([1.5], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    low, high = (m.gate(ratio, adv, rlgates.SideInfo(entropy=h)) for h in (0.0, 2.0))
    assert float(low) < float(high) < 1
    logp, logp_old, adv, mask = make_batch(seed=3, scale=0.6)
    side = side_for(m, logp.shape)
    flat = rlgates.SideInfo(entropy=torch.zeros_like(logp))
    assert not torch.allclose(m.expected_grad(logp, logp_old, adv, mask, side=side),
                              m.expected_grad(logp, logp_old, adv, mask, side=flat))


def test_a_missing_side_input_is_named(brake):
    m = rlgates.get(brake)
    logp, logp_old, adv, mask = make_batch(seed=3)
    ratio = torch.ones(3, dtype=torch.float64)
    calls = [lambda: m.loss(logp, logp_old, adv, mask),
             lambda: m.expected_grad(logp, logp_old, adv, mask),
             lambda: rlgates.check_gradient(m, logp, logp_old, adv, mask),
             lambda: m.gate(ratio, ratio), lambda: m.weight(ratio, ratio, rlgates.SideInfo()),
             lambda: rlgates.plot_gate_signal(brake)]
    for call in calls:
        with pytest.raises(ValueError, match=r"entropy_brake reads side information that was "
                                             r"not given: sideinfo\.entropy"):
            call()
    with pytest.raises(ValueError, match="does not broadcast"):
        m.gate(ratio, ratio, rlgates.SideInfo(entropy=torch.ones(2)))
    with pytest.raises(ValueError, match="side must be an rlgates.SideInfo"):
        m.gate(ratio, ratio, {"entropy": 1.0})
    # a gate of (ρ, A) alone ignores side, given or not
    ppo = rlgates.get("ppo")
    assert torch.equal(ppo.gate(ratio, ratio, rlgates.SideInfo(entropy=1.0)),
                       ppo.gate(ratio, ratio))


def test_figures_hold_the_side_information_fixed_and_say_so(brake):
    side = rlgates.SideInfo(entropy=1.5)
    panels = rlgates.GatePanels(brake, side=side)
    assert panels.caption.endswith("holding entropy = 1.5")
    p = rlgates.plane(brake, side=side)
    q = rlgates.plane(brake, side=rlgates.SideInfo(entropy=0.0))
    assert (p.gate >= q.gate).all() and (p.gate > q.gate).any()
    plt.close("all")

