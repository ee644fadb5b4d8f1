"""rlgates.SideInfo: validated fields, what the loss derives from the batch, and how the lab, the
diagnostics and the trainer adapters pass it to a method that reads it."""

import math

import pytest
import torch

import rlgates
from rlgates import _side, diagnostics, lab
from tests.conftest import make_batch
from tests.test_registry import EntropyBrake


@pytest.mark.parametrize("field, bad, match", [
    ("probs_old", 0.0, r"sideinfo\.probs_old must be in \(0, 1\], got 0$"),
    ("probs_old", 1.5, r"sideinfo\.probs_old must be in \(0, 1\], got 1.5"),
    ("entropy", -0.1, r"sideinfo\.entropy must be ≥ 0, got -0.1"),
    ("sampler_logp", 0.2, r"sideinfo\.sampler_logp must be ≤ 0, got 0.2"),
    ("draw", 1.2, r"sideinfo\.draw must be in \[0, 1\], got 1.2"),
    ("cov", math.nan, r"sideinfo\.cov must be finite, got nan"),
    ("entropy", math.inf, r"sideinfo\.entropy must be finite, got inf"),
    ("picked", 0.5, r"sideinfo\.picked must be bool or hold only 0 and 1, got 0.5"),
    ("entropy", True, r"sideinfo\.entropy must be a real tensor or number"),
])
def test_every_field_is_validated_and_its_error_names_it(field, bad, match):
    edge = {"probs_old": 1.0, "entropy": 0.0, "sampler_logp": 0.0, "draw": 0.0, "cov": -3.0,
            "picked": 1.0}[field]  # a valid value at the edge of its range
    with pytest.raises(ValueError, match=match):
        rlgates.SideInfo(**{field: bad if isinstance(bad, bool) else torch.tensor([edge, bad])})
    assert getattr(rlgates.SideInfo(**{field: edge}), field) is not None


def test_fields_are_the_documented_ones_and_the_info_is_frozen():
    side = rlgates.SideInfo(entropy=torch.ones(2, 3))
    assert set(_side.FIELDS) == {"probs_old", "entropy", "sampler_logp", "cov", "draw", "picked"}
    assert side.given() == ("entropy",) and "entropy=<(2, 3)>" in repr(side)
    with pytest.raises(AttributeError):
        side.entropy = torch.zeros(2, 3)
    assert side.replace(draw=0.5).given() == ("entropy", "draw")
    with pytest.raises(ValueError, match="sideinfo.draw must be in"):
        side.replace(draw=2.0)
    assert rlgates.SideInfo(picked=torch.tensor([0.0, 1.0])).picked.dtype == torch.bool


def test_the_batch_gives_probs_old_and_the_covariance():
    logp, logp_old, adv, mask = make_batch(seed=2)
    logp_old = torch.where(mask, logp_old, torch.nan)  # padding may hold anything
    side = _side.from_batch(None, logp, logp_old, adv[:, None], mask, ("probs_old", "cov"))
    assert torch.equal(side.probs_old[mask], logp_old[mask].exp())
    assert (side.probs_old[~mask] == 1).all()
    # the covariance term, written out: (log π − mean)(A − mean) over the real tokens
    a = adv[:, None].expand_as(logp)[mask]
    lp = logp[mask]
    expected = (lp - lp.mean()) * (a - a.mean())
    assert torch.allclose(side.cov[mask], expected, rtol=1e-13, atol=1e-15)
    assert (side.cov[~mask] == 0).all()
    assert abs(float(side.cov[mask].mean()) - float(torch.cov(torch.stack([lp, a]),
                                                              correction=0)[0, 1])) < 1e-14
    # a field the caller gives is kept, not derived; a field nobody needs is not derived
    given = rlgates.SideInfo(probs_old=0.5)
    kept = _side.from_batch(given, logp, logp_old, adv[:, None], mask, ("probs_old",))
    assert float(kept.probs_old) == 0.5 and kept.cov is None


def test_kl_cov_picks_alike_from_its_own_covariance_and_a_given_one():
    """KL-Cov keeps the real tokens' flat list from the covariance it computes and picks from
    it; given `cov`, it finds the real tokens itself. Both give the same pick and the same
    [B, T] covariance; a different covariance (negated) gives another pick (not vacuous)."""
    m = rlgates.get("kl_cov", cov_ratio=0.05)
    logp, logp_old, adv, mask = make_batch(seed=3)
    adv = adv[:, None]  # as check_loss_inputs gives it
    own = m.side_from_batch(logp, logp_old, adv, mask)
    given = m.side_from_batch(logp, logp_old, adv, mask, side=rlgates.SideInfo(cov=own.cov))
    assert torch.equal(own.cov, _side.batch_cov(logp, adv, mask))
    assert own.picked.any() and torch.equal(own.picked, given.picked)
    other = m.side_from_batch(logp, logp_old, adv, mask, side=rlgates.SideInfo(cov=-own.cov))
    assert not torch.equal(own.picked, other.picked)


class PickedOnly(rlgates.Method):
    """A toy whose gate reads `picked`, which neither the batch nor the lab gives."""

    name, title, date, paper = "picked_only", "Picked only", "a test", "none (no arXiv id)"
    side_inputs = ("picked",)
    agg_source = "the base class's default"

    def _weight(self, ratio, adv, side=None):
        return torch.where(side.picked, 1.0, ratio) * torch.ones_like(adv)

    def _gate(self, ratio, adv, side=None):
        return torch.where(side.picked, 0.0, 1.0) * torch.ones_like(ratio * adv)


def test_the_lab_runs_a_side_input_method_and_names_what_it_lacks():
    cfg = lab.LabConfig.for_device("cpu", prompts=2, group=4, length=6, steps=2)
    res = lab.train(EntropyBrake(), cfg, seeds=[0], progress=False)[0]
    assert math.isfinite(res.metrics["loss"][-1]) and math.isfinite(res.metrics["gate_mean"][-1])
    with pytest.raises(ValueError, match=r"picked_only reads side information that was not "
                                         r"given: sideinfo\.picked"):
        lab.train(PickedOnly(), cfg, seeds=[0], progress=False)
    assert set(lab.loop.LAB_SIDE) <= set(_side.FIELDS)


def test_the_lab_gives_each_run_its_own_draw_and_leaves_its_rollouts_alone():
    """A side-input arm beside PPO leaves PPO's runs as they are alone (the draws come from
    generators apart from the rollouts'), and its own runs are those of a call alone."""
    cfg = lab.LabConfig.for_device("cpu", prompts=2, group=4, length=6, steps=2)
    both = lab.run_many({"ppo": "ppo", "brake": EntropyBrake()}, seeds=[0, 1], config=cfg)
    alone = lab.run_many({"ppo": "ppo"}, seeds=[0, 1], config=cfg)
    brake = lab.run_many({"brake": EntropyBrake()}, seeds=[1], config=cfg)
    for key in ("loss", "grad_norm"):
        assert both["ppo"][1].metrics[key] == alone["ppo"][1].metrics[key]
        assert both["brake"][1].metrics[key] == brake["brake"][0].metrics[key]
    assert both["brake"][0].metrics["loss"] != both["brake"][1].metrics["loss"]


def test_diagnostics_compute_a_side_input_gate_run_by_run():
    m = EntropyBrake()
    logp, logp_old, adv, mask = make_batch(B=4, T=6, seed=1, scale=0.8)
    runs = [torch.stack([x, x.flip(0)]) for x in (logp, logp_old, adv)]
    mask2 = torch.stack([mask, mask.flip(0)])
    ent = torch.rand(2, 4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    side = rlgates.SideInfo(entropy=ent)
    stats = diagnostics.step_stats(m, *runs, mask2, side=side)
    for r in range(2):
        one = diagnostics.step_stats(m, logp if r == 0 else logp.flip(0),
                                     logp_old if r == 0 else logp_old.flip(0),
                                     adv if r == 0 else adv.flip(0), mask2[r],
                                     side=rlgates.SideInfo(entropy=ent[r]))
        for key in ("gate_mean", "loss", "signal_lost"):
            assert float(stats[key][r]) == pytest.approx(float(one[key]), rel=1e-12), key
    gate = m.token_gate(logp, logp_old, adv, mask, rlgates.SideInfo(entropy=ent[0]))
    ratio = (logp - logp_old).exp()
    plane = m.gate(ratio, adv[:, None], rlgates.SideInfo(entropy=ent[0]))
    assert torch.equal(gate[mask], plane[mask]) and (gate[mask] < 1).any()
    missing = diagnostics.step_stats(m, logp, logp_old, adv, mask)  # no entropy: NaN, named
    assert math.isnan(float(missing["gate_mean"])) and math.isnan(float(missing["loss"]))
    assert diagnostics.step_stats(m, logp, logp_old, adv, mask, skip_missing=True).keys() \
        .isdisjoint({"gate_mean", "loss"})


def test_the_trainer_adapters_pass_side_on():
    m = EntropyBrake()
    logp, logp_old, adv, mask = make_batch(B=4, T=6, seed=1, scale=0.8)
    side = rlgates.SideInfo(entropy=torch.full(logp.shape, 0.7, dtype=logp.dtype))
    ours = rlgates.trainers.loss(m, logp, logp_old, adv, mask, norm=10, side=side)
    plain = m.loss(logp, logp_old, adv, mask, side=side)
    assert torch.allclose(ours, plain * mask.sum() / 10, rtol=1e-14)
    stats = rlgates.trainers.gate_stats(m, logp, logp_old, adv, mask, side)
    assert 0 < stats["gate_mean"] < 1
    assert "gate_mean" not in rlgates.trainers.gate_stats(m, logp, logp_old, adv, mask)


def test_each_field_range_is_written_once():
    """The checker, its message and FIELDS' text read one Field per name."""
    f = _side.FIELDS["probs_old"]
    assert (f.low, f.low_open, f.high, f.range) == (0, True, 1, "in (0, 1]")
    assert str(f) == "π_old of each sampled token, in (0, 1]"
    assert _side.FIELDS["cov"].range == "" and _side.FIELDS["sampler_logp"].range == "≤ 0"
    assert _side.Field("x", low=0, high=2, high_open=True).range == "in [0, 2)"


def test_index_takes_one_run_of_a_batched_side():
    R, B, T = 3, 2, 4
    ent = torch.rand(R, B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    side = rlgates.SideInfo(entropy=ent, probs_old=0.5, draw=torch.full((B, T), 0.25))
    one = side.index(1, (R, B, T))
    assert torch.equal(one.entropy, ent[1]) and one.given() == ("probs_old", "entropy", "draw")
    assert torch.equal(one.probs_old, torch.full((B, T), 0.5, dtype=torch.float64))
    assert one.draw.shape == (B, T) and one.sampler_logp is None
    # leading dimensions [2, 3] count as 6 runs; without shape, rows of each field
    two = rlgates.SideInfo(entropy=ent.expand(2, R, B, T)).index(4, (2, R, B, T))
    assert torch.equal(two.entropy, ent[1])
    assert torch.equal(side.replace(probs_old=None, draw=None).index(torch.tensor([0, 2])).entropy,
                       ent[[0, 2]])
