"""Bring your own gate: rlgates.byo."""


import pytest
import torch

import rlgates
from rlgates import byo
from tests.conftest import held, make_batch

F64 = torch.float64

def t(x):
    return torch.as_tensor(x, dtype=F64)

NORM = "seq-mean-token-sum-norm"


def ppo_weight(r, a, eps=0.2):
    return torch.where(a > 0, torch.where(r < 1 + eps, r, 1 + eps),
                       torch.where(r > 1 - eps, r, 1 - eps))


def test_byo_reproduces_ppo():
    mine = byo.make(ppo_weight, "my_ppo", bounds=lambda eps: [(1 + eps, 1), (1 - eps, -1)],
                    eps=0.2)
    ppo = rlgates.get("ppo")
    ratio = torch.cat([torch.linspace(-1, 1, 401, dtype=F64).exp(), t([1.2, 0.8])])[:, None]
    adv = torch.tensor([[-2.0, -1.0, -1e-3, 1e-3, 0.5, 1.0]], dtype=F64)
    assert torch.equal(mine.gate(ratio, adv), ppo.gate(ratio, adv))  # edges included
    assert torch.equal(mine.weight(ratio, adv), ppo.weight(ratio, adv))
    adv0 = torch.tensor([[-1.0, 0.0, 1.0]], dtype=F64)
    assert torch.equal(mine.signal(ratio, adv0), ppo.signal(ratio, adv0))  # A = 0 too
    assert mine.bounds() == ppo.bounds()
    for agg in rlgates.AGG_MODES:
        logp, logp_old, adv_b, mask = make_batch(seed=1, scale=0.5)
        a, _, diff = rlgates.check_gradient(mine, logp, logp_old, adv_b, mask, agg)
        b, _, _ = rlgates.check_gradient(ppo, logp, logp_old, adv_b, mask, agg)
        assert diff < 1e-14 and torch.equal(a, b)
    v = byo.verify(mine)
    assert v.ok, str(v)
    assert v.gate_at_one == (1.0, 1.0)


def test_byo_hyperparameters_and_registry():
    m = byo.make(ppo_weight, "byo_test_ppo", register=True, eps=0.2,
                 check=lambda eps: None if 0 < eps < 1 else (_ for _ in ()).throw(
                     ValueError("eps must be in (0, 1)")))
    try:
        assert rlgates.get("byo_test_ppo", eps=0.3).hparams == {"eps": 0.3}
        assert float(rlgates.get("byo_test_ppo", eps=0.3).gate(t(1.25), t(1.0))) == 1.0
        assert float(m.gate(t(1.25), t(1.0))) == 0.0
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", eps=1.5)
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", tau=1.0)
        with pytest.raises(ValueError):
            rlgates.get("byo_test_ppo", eps="x")
    finally:
        rlgates.methods.REGISTRY.pop("byo_test_ppo", None)
    with pytest.raises(ValueError):
        byo.make(ppo_weight, "ppo", register=True)
    with pytest.raises(ValueError):
        byo.make("not a function")


def test_byo_catches_broken_weights():
    # a .detach() inside f: the gate autograd sees is 0, but f really does depend on ρ
    detached = byo.make(lambda r, a: r.detach() * 1.0, "detached")
    v = byo.verify(detached)
    assert not v.ok and v.fd_kinks > 0.5
    # a gate that turns negative: f = ρ·exp(−(log ρ)²/2) falls beyond ρ = e
    falling = byo.make(lambda r, a: r * torch.exp(-r.log() ** 2 / 2), "falling")
    v = byo.verify(falling, grid_lim=2.0)
    assert not v.ok and v.gate_range[0] < 0 and v.notes
    # not elementwise: the weight mixes tokens
    with pytest.raises(ValueError):
        byo.make(lambda r, a: r.sum(), "mixing").gate(t([1.0, 2.0]), t([1.0, 1.0]))
    # constant in ρ: the gate is 0 everywhere (and the signal with it)
    const = byo.make(lambda r, a: torch.ones_like(r), "const")
    assert torch.equal(const.gate(t([0.5, 2.0]), t([1.0, -1.0])), t([0.0, 0.0]))


def test_byo_verify_on_the_built_in_methods(name):
    v = byo.verify(held(name))
    assert max(v.eq5.values()) < 1e-13
    # every built-in gate is ≥ 0 but those with a (log ρ)² pull, which push a token back by
    # design: DRO's past ρ = e^{A/β}, IPO's outside its window
    pulls = name in ("dro", "ipo")
    assert (v.gate_range[0] < 0) == pulls, str(v)
    assert v.ok == (not pulls), str(v)


def test_byo_is_usable_by_the_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    smooth = byo.make(lambda r, a, w=0.5: torch.where(a > 0, r, r) * 1.0, "id", w=0.5)
    fig = rlgates.plot_gate_signal(smooth, n=21)
    gate = np.asarray(fig.axes[0].images[0].get_array())  # sign(A)·f': f = ρ has f' = 1
    assert np.allclose(np.abs(gate[:, np.abs(np.linspace(-1, 1, 21)) > 0]), 1.0)
    plt.close(fig)
    fig = byo.plot_profiles(smooth, "ppo", "cispo")
    labels = " ".join(line.get_label() for ax in fig.axes for line in ax.get_lines())
    assert all(name in labels for name in ("id", "PPO", "CISPO")), labels
    plt.close(fig)
    panels = rlgates.GatePanels(smooth, n=21)
    shown = np.asarray(panels._images[0].get_array()).copy()
    panels.update(rlgates.get("dual_clip"))
    assert panels.method.name == "dual_clip"
    assert not np.allclose(shown, np.asarray(panels._images[0].get_array()))  # redrawn
    plt.close(panels.fig)
    panels.close()

