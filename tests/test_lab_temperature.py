"""The lab's sampling temperature (LabConfig.temperature, LabPolicy(temperature=)): the policy
sampled, scored and trained is softmax(logits / T), as in TRL, where T divides the logits before
the log-probabilities and the entropy are computed."""

from __future__ import annotations

import pytest
import torch

from rlgates import lab
from rlgates.policy import LabPolicy
from rlgates.regularisers import entropy

SEEDS = [0, 1]


def _batch(pol, generators):
    prompt = torch.randint(0, pol.vocab, (len(SEEDS), 6, pol.motif),
                           generator=torch.Generator().manual_seed(5))
    return prompt, pol.sample(prompt, pol.length, generators)


def test_temperature_divides_the_logits_in_scoring_and_in_sampling():
    cold = LabPolicy(SEEDS, temperature=0.5)
    plain = LabPolicy(SEEDS)  # same seeds: the same weights
    prompt, (tokens, logp) = _batch(cold, [torch.Generator().manual_seed(s) for s in SEEDS])
    assert torch.equal(cold.logits(prompt, tokens), plain.logits(prompt, tokens) / 0.5)
    # the sampler's log-probs are the tempered policy's, as the trainer scores them
    torch.testing.assert_close(logp, cold.log_probs(tokens, prompt), rtol=0, atol=1e-5)
    # negative control: the untempered policy scores the same tokens differently
    assert (logp - plain.log_probs(tokens, prompt)).abs().max() > 1e-2
    # a colder policy has a lower entropy on every position
    assert (entropy(cold.logits(prompt, tokens)) < entropy(plain.logits(prompt, tokens))).all()


def test_temperature_one_changes_nothing():
    a, b = LabPolicy(SEEDS), LabPolicy(SEEDS, temperature=1.0)
    gens = lambda: [torch.Generator().manual_seed(s) for s in SEEDS]  # noqa: E731
    (pa, (ta, la)), (pb, (tb, lb)) = _batch(a, gens()), _batch(b, gens())
    assert torch.equal(ta, tb) and torch.equal(la, lb)
    assert torch.equal(a.logits(pa, ta), b.logits(pb, tb))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "hot"])
def test_bad_temperature_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="temperature"):
        LabPolicy([0], temperature=bad)
    with pytest.raises(ValueError, match="temperature"):
        lab.train("dapo", lab.LabConfig(temperature=bad, steps=1), seeds=[0], progress=False)


def test_the_lab_samples_and_logs_the_tempered_policy():
    cfg = lab.LabConfig(steps=2)
    assert cfg.policy(SEEDS).temperature == 1.0
    assert cfg.replace(temperature=0.5).policy(SEEDS).temperature == 0.5
    runs = {t: lab.train("dapo", cfg.replace(temperature=t), seeds=SEEDS, progress=False)
            for t in (1.0, 0.5)}
    first = {t: [r.metrics["entropy"][0] for r in rs] for t, rs in runs.items()}
    assert all(c < h for c, h in zip(first[0.5], first[1.0], strict=True)), first
    # at T = 1 the run is the default configuration's, number for number
    default = lab.train("dapo", cfg, seeds=SEEDS, progress=False)
    assert [r.metrics for r in default] == [r.metrics for r in runs[1.0]]
