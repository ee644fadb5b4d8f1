"""The plane grids and the figures: values, colours, labels, bounds, sliders and Table 1."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import rlgates  # noqa: E402
from tests.conftest import METHODS, held  # noqa: E402


def test_plane_grid_matches_the_elementwise_functions(name):
    p = rlgates.plane(held(name), adv_lim=2.0, log_ratio_lim=0.5, n=41)
    assert p.gate.shape == p.signal.shape == (41, 41)
    assert p.adv[0] == -2.0 and p.log_ratio[-1] == 0.5
    ratio = np.exp(p.log_ratio)[:, None]
    assert np.allclose(p.signal, p.gate * ratio * p.adv[None, :], rtol=1e-15, atol=0)


def test_plane_is_computed_on_one_torch_thread(monkeypatch):
    """A plane is small: its gate is computed on one torch thread (on a busy machine a second
    one waits for a core), and torch's thread count is restored afterwards."""
    method = rlgates.get("sapo")
    seen, gate = [], type(method)._gate

    def counting_gate(self, ratio, adv, side=None):
        seen.append(torch.get_num_threads())
        return gate(self, ratio, adv, side)

    monkeypatch.setattr(type(method), "_gate", counting_gate)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # more than one, so that the check can fail
    try:
        rlgates.plane(method, n=21)
        assert seen == [1, 1] and torch.get_num_threads() == 2  # gate and signal
    finally:
        torch.set_num_threads(threads)


def test_ppo_plane_has_its_four_regions():
    p = rlgates.plane("ppo", log_ratio_lim=0.6, n=61)
    A, lr = np.meshgrid(p.adv, p.log_ratio)
    assert (p.signal[(A > 0) & (lr < np.log(1.2) - 1e-9)] > 0).all()  # encourage
    assert (p.signal[(A < 0) & (lr > np.log(0.8) + 1e-9)] < 0).all()  # discourage
    assert (p.gate[(A > 0) & (lr > np.log(1.2))] == 0).all()
    assert (p.gate[(A < 0) & (lr < np.log(0.8))] == 0).all()


def _dashed_levels(ax):
    return sorted({round(float(y), 12) for line in ax.lines if line.get_linestyle() == "--"
                   for y in line.get_ydata()})


def test_gate_signal_figure_is_labelled_and_draws_the_bounds(name):
    fig = rlgates.plot_gate_signal(held(name))
    left, right = fig.axes[:2]
    m = held(name)
    A, r = ("A_t", r"\rho_t") if m.level == "token" else ("A_s", r"\rho_s")
    assert A in left.get_xlabel() and r in left.get_ylabel() and A in right.get_xlabel()
    assert left.get_shared_y_axes().joined(left, right)
    bars = [ax for ax in fig.axes[2:]]
    assert len(bars) == 2 and all(ax.get_ylabel() for ax in bars)
    if m.bounds():
        expected = sorted({round(float(np.log(b)), 12) for b, _ in m.bounds()})
        assert _dashed_levels(left) == expected and _dashed_levels(right) == expected
    else:  # SAPO: the gate's half-height contour stands in, where the gate crosses 1/2
        gate = rlgates.plane(m).gate
        crosses = bool(gate.min() < 0.5 < gate.max())
        assert crosses or name != "sapo"
        for ax in (left, right) if crosses else ():
            _assert_half_gate_edges(ax, m)
    plt.close(fig)


def _assert_half_gate_edges(ax, method):
    """`ax` holds one dashed LineCollection, on both sides of A = 0, where the gate is 1/2."""
    (edges,) = ax.collections
    assert edges.get_linestyle()[0][1] is not None  # dashed
    xy = np.concatenate(edges.get_segments())
    assert (xy[:, 0] < 0).any() and (xy[:, 0] > 0).any() and (xy[:, 0] != 0).all()
    gate = method.gate(torch.from_numpy(np.exp(xy[:, 1])), torch.from_numpy(xy[:, 0])).numpy()
    assert np.abs(gate - 0.5).max() < 1e-3 or _brackets_half(method, xy)
    lim = np.abs(xy[:, 1]).max()  # negative control: the grid is not 1/2 everywhere nearby
    assert not np.allclose(rlgates.plane(method, log_ratio_lim=lim).gate, 0.5, atol=0.02)


def _brackets_half(method, xy, n=201):
    """Each vertex's grid cell holds a gate value on each side of 1/2: the linear interpolation
    is right where the gate is too steep for a fixed tolerance (DRO's and IPO's, near A = 0).
    The corners stay on the vertex's side of A = 0, as `half_gate_lines` traces each side
    apart (the grid's middle column is a tiny A of one sign, not 0)."""
    lim = rlgates.figures.default_lim(method)
    da, dr = 2.0 / (n - 1), 2 * lim / (n - 1)
    corners = [(sa * da, sr * dr) for sa in (-1, 1) for sr in (-1, 1)]
    tiny = np.finfo(np.float64).tiny

    def same_side(a):
        return np.where(xy[:, 0] < 0, np.minimum(a, -tiny), np.maximum(a, tiny))

    g = np.stack([method.gate(torch.from_numpy(np.exp(xy[:, 1] + r)),
                              torch.from_numpy(same_side(xy[:, 0] + a))).numpy()
                  for a, r in corners])
    return bool(((g.min(0) <= 0.5) & (g.max(0) >= 0.5)).all())


def test_half_gate_lines_are_matplotlibs_contour():
    """The edges are the vertices `ax.contour` traces at 1/2, on each side of A = 0."""
    p = rlgates.plane(rlgates.get("sapo", tau_pos=0.3, tau_neg=3.0), log_ratio_lim=3.0)
    ours = np.concatenate(rlgates.figures.half_gate_lines(p))
    fig, ax = plt.subplots()
    theirs = []
    for side in (p.adv < 0, p.adv > 0):
        cs = ax.contour(p.adv[side], p.log_ratio, p.gate[:, side], levels=[0.5])
        theirs += [path.vertices for path in cs.get_paths()]
    plt.close(fig)
    theirs = np.concatenate(theirs)
    assert ours.shape == theirs.shape and len(ours) > 100
    assert np.array_equal(np.sort(ours, axis=0), np.sort(theirs, axis=0))


def test_live_panels_move_their_edges_in_place():
    """A live update replaces the edges (never stacks them) and follows the hyperparameters."""
    panels = rlgates.GatePanels("sapo", log_ratio_lim=3.0, live=True)
    before = np.concatenate(panels.axes[0].collections[0].get_segments())
    for tau in (0.5, 2.0, 0.3):
        m = rlgates.get("sapo", tau_pos=tau, tau_neg=1.05)
        panels.update(m)
        for ax in panels.axes:
            _assert_half_gate_edges(ax, m)
    after = np.concatenate(panels.axes[0].collections[0].get_segments())
    assert after.shape != before.shape or not np.allclose(after, before)
    assert panels.caption.startswith("SAPO") and "tau_pos=0.3" in panels.caption
    assert not panels.fig._suptitle or not panels.fig._suptitle.get_text()  # shown as text
    panels.close()


def test_live_panels_move_hard_edges_in_place():
    """Live, a hard gate's edge lines are the same artists, moved to the new bounds on their
    side of A = 0 (never stacked); a static figure draws its edges anew."""
    panels = rlgates.GatePanels("dapo", live=True)
    lines = list(panels._moving)
    for eps_high in (0.4, 0.1):
        m = rlgates.get("dapo", eps_high=eps_high)
        panels.update(m)
        assert all(a is b for a, b in zip(panels._moving, lines, strict=True))
        want = sorted((float(np.log(r)), (0.0, 1.0) if side > 0 else (-1.0, 0.0))
                      for r, side in m.bounds())
        for ax in panels.axes:
            drawn = sorted((float(line.get_ydata()[0]), tuple(line.get_xdata()))
                           for line in ax.lines if line.get_linestyle() == "--")
            assert drawn == want
    panels.close()
    static = rlgates.GatePanels("dapo")
    lines = list(static._moving)
    static.update(rlgates.get("dapo", eps_high=0.4))
    assert not any(a is b for a, b in zip(static._moving, lines, strict=True))
    assert _dashed_levels(static.axes[0]) == sorted(
        round(float(np.log(r)), 12) for r in (0.8, 1.4))
    static.close()


def test_colours_encourage_red_discourage_blue():
    fig = rlgates.plot_gate_signal("ppo")
    signal = fig.axes[1].images[0]
    cmap = signal.get_cmap()
    red, blue, white = cmap(1.0), cmap(0.0), cmap(0.5)
    assert red[0] > red[2] and blue[2] > blue[0] and min(white[:3]) > 0.9
    assert signal.get_clim()[0] == -signal.get_clim()[1]  # zero sits at white
    plt.close(fig)


def test_ppo_regions_figure():
    fig = rlgates.plot_ppo_regions(eps=0.2)
    ax = fig.axes[0]
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "encourage" in texts and "discourage" in texts and texts.count("zero") == 2
    assert _dashed_levels(ax) == sorted([round(np.log(0.8), 12), round(np.log(1.2), 12)])
    assert ax.get_legend() is not None and "A_t" in ax.get_xlabel()
    plt.close(fig)


def test_sliders_redraw_the_figure():
    box = rlgates.explore("dapo")
    before = box.children[-1].value
    box.sliders["eps_high"].value = 0.5
    assert box.children[-1].value != before
    assert box.panels.method.hparams["eps_high"] == 0.5
    slider = box.sliders["eps_low"]
    slider.min, slider.value = -0.5, -0.2  # invalid for rlgates: an error message, no crash
    assert "eps_low must be ≥ 0" in box.children[1].value
    slider.value = 0.3
    assert box.children[1].value == "" and box.panels.method.hparams["eps_low"] == 0.3


def test_small_multiples_share_one_scale():
    fig = rlgates.plot_small_multiples("sapo", "tau_neg", [0.5, 1.05, 3.0])
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3 and len({im.get_clim() for im in images}) == 1
    assert [ax.get_title() for ax in fig.axes[:3]] == ["tau_neg = 0.5", "tau_neg = 1.05", "tau_neg = 3"]
    with pytest.raises(ValueError, match="panel"):
        rlgates.plot_small_multiples("sapo", "tau_neg", [1.0], panel="weight")
    plt.close("all")


def test_table_one_is_generated_from_the_methods():
    md = rlgates.table(article=True)
    lines = md.splitlines()
    assert len(lines) == 2 + 5  # header, rule, PPO/GRPO, DAPO, GSPO, SAPO, SAO
    assert [line.split(" (")[0].strip("| ") for line in lines[2:]] == [
        "PPO", "DAPO", "GSPO", "SAPO", "SAO"]  # the article's order
    for name in ("ppo", "grpo", "dapo", "gspo", "sapo", "sao"):
        m = rlgates.get(name)
        assert m.title in md and m.date in md
        if name != "grpo":
            assert m.f_latex in md and m.gate_latex in md and m.insight in md
    assert all(line.count("|") == 5 for line in lines)
    everything = rlgates.table().splitlines()  # every registered method, GRPO in PPO's row
    assert len(everything) == 2 + len(METHODS) - 1 and everything[:7] == lines


def test_methods_carry_their_paper_and_latex():
    for name in METHODS:
        m = rlgates.get(name)
        assert ("arXiv:" in m.paper or "no arXiv id" in m.paper) and m.f_latex and m.gate_latex and m.insight


def test_gspo_sliders_keep_its_tiny_defaults():
    box = rlgates.explore("gspo")
    assert box.sliders["eps_low"].value == 3e-4 and box.sliders["eps_high"].value == 4e-4
    assert box.sliders["eps_high"].step <= 1e-5


def test_conventions_tables_have_one_cell_per_column():
    import re

    for md in (rlgates.defaults_table(), rlgates.aggregation_table()):
        lines = md.splitlines()
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in lines}
        assert len(cells) == 1, md  # an unescaped | in a cell would add a column
    for name in METHODS:
        assert f"`{name}`" in rlgates.defaults_table()
    for mode in rlgates.AGG_MODES:
        assert f"`{mode}`" in rlgates.aggregation_table()


def test_markdown_table_escapes_pipes_and_checks_widths():
    import re

    from rlgates import tables

    md = tables.markdown([("`ppo`", "$|A|$ > 0", 3), ("x", "", 0.5)], ("a", "b", "c"))
    lines = md.splitlines()
    assert lines[0] == "| a | b | c |" and lines[1] == "| --- | --- | --- |"
    assert lines[2] == "| `ppo` | $\\|A\\|$ > 0 | 3 |"
    assert {len(re.findall(r"(?<!\\)\|", line)) for line in lines} == {4}
    with pytest.raises(ValueError, match="2 cells"):
        tables.markdown([("only", "two")], ("a", "b", "c"))


def test_markdown_table_formats_numbers_and_escapes_once():
    md = rlgates.tables.markdown([(1, "x | y"), (0.12345, r"already \| escaped")], ["a", "b|c"],
                                 fmt=".2f")
    assert md.splitlines() == ["| a | b\\|c |", "| --- | --- |", "| 1.00 | x \\| y |",
                               "| 0.12 | already \\| escaped |"]
    assert rlgates.tables.markdown([(3, True)], ["n", "flag"]).splitlines()[2] == "| 3 | True |"
    # negative control: a row with a missing cell is refused, not silently shifted
    with pytest.raises(ValueError, match="row 1 has 1 cells"):
        rlgates.tables.markdown([(1, 2), (3,)], ["a", "b"])


def test_readme_method_table_is_generated_from_the_registry():
    """README.md's method table is scripts/readme_methods.py's output: one row per registered
    method, in `names()` order; a stale README fails here."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    import readme_methods

    text = (root / "README.md").read_text(encoding="utf-8")
    assert readme_methods.generated(text) == text, "run python scripts/readme_methods.py"
    table = rlgates.tables.methods_table().splitlines()
    assert [row.split(" | ")[0].strip("| `") for row in table[2:]] == METHODS
    for name in METHODS:
        assert rlgates.get(name).gate_text in text
    # negative control: a README whose table lost a row is not the generated one
    stale = text.replace(table[-1] + "\n", "")
    assert stale != text and readme_methods.generated(stale) == text
