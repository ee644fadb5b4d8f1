"""One number, one definition: each quantity the glossary defines is computed by one library
function, its entry names it, and the clip shares say which tokens they divide by."""

import re
from pathlib import Path

import torch

import rlgates
from rlgates import diagnostics

ROOT = Path(__file__).resolve().parents[1]

#: glossary term → the code its entry names (each one function of the library).
QUANTITIES = {
    "clip fraction": ["pg_clipfrac", "clipfrac_pos", "clipfrac_neg", "gate_zero"],
    "gate": ["m.gate(ratio, adv)"],
    "weight": ["m.weight(ratio, adv)"],
    "signal": ["m.signal(ratio, adv)"],
    "group advantage": ["rlgates.group_advantages(rewards)"],
    "aggregation": ["rlgates.aggregation_weight(mask, agg)"],
    "GAE": ["rlgates.advantages.gae(rewards, values, mask, gamma, lam)"],
    "value model": ["rlgates.advantages.value_loss(values, values_old, returns, mask)"],
    "value clipping": ["rlgates.advantages.value_gate(values, values_old, returns, clip_range)"],
    "value clip fraction": [
        "rlgates.advantages.value_clip_fraction(values, values_old, returns, mask)"],
}
#: the entries whose one named call is checked against the library's signature
SIGNATURES = ("GAE", "value model", "value clipping", "value clip fraction")


def glossary_entries() -> dict:
    """{term: its definition} from glossary.md's {glossary} block."""
    block = (ROOT / "glossary.md").read_text().split("```{glossary}")[1].split("```")[0]
    entries, term = {}, None
    for line in block.splitlines():
        if line and not line.startswith(" "):
            term = line.strip()
            entries[term] = ""
        elif term:
            entries[term] += " " + line.strip()
    return entries


def test_each_quantity_names_its_one_function():
    entries = glossary_entries()
    for term, names in QUANTITIES.items():
        assert term in entries, term
        for name in names:
            assert f"`{name}`" in entries[term], (term, name)
    # the shares are registered diagnostics, defined once (the lab's metric table reads them)
    doc = rlgates.lab.metric_doc()
    for key in QUANTITIES["clip fraction"]:
        assert doc[key] == diagnostics.REGISTRY[key].doc
    # the elementwise quantities live in Method alone: no method class redefines them
    for cls in rlgates.REGISTRY.values():
        for attr in ("gate", "weight", "signal"):
            assert attr not in vars(cls), (cls.name, attr)
    assert rlgates.group_advantages is rlgates.advantages.group_advantages


def test_the_clip_shares_differ_by_their_denominators():
    # four A > 0 tokens (one shut), four A < 0 (two shut), four A = 0: the three shares differ
    ppo = rlgates.get("ppo")
    logp_old = torch.zeros(3, 4, dtype=torch.float64)
    log_ratio = torch.tensor([[0.5, 0.0, 0.0, 0.0], [-0.5, -0.5, 0.0, 0.0], [0.5, -0.5, 0, 0]],
                             dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    s = diagnostics.as_floats(diagnostics.step_stats(ppo, logp_old + log_ratio, logp_old, adv))
    assert s["clipfrac_pos"] == 1 / 4 and s["clipfrac_neg"] == 2 / 4
    assert s["gate_zero"] == 3 / 8 and s["pg_clipfrac"] == 3 / 12
    assert s["pg_clipfrac"] < s["gate_zero"]  # the A = 0 row counts only in pg_clipfrac
    # negative control: with no A = 0 row, pg_clipfrac and gate_zero agree
    s2 = diagnostics.as_floats(diagnostics.step_stats(
        ppo, (logp_old + log_ratio)[:2], logp_old[:2], adv[:2]))
    assert s2["pg_clipfrac"] == s2["gate_zero"] == 3 / 8


def test_no_chapter_averages_the_shares_by_sign_by_hand():
    # an unweighted mean of the two by-sign shares is none of the glossary's quantities
    pattern = re.compile(r"clipfrac_pos[^\n]*\)\s*\n?\s*\+[^\n]*clipfrac_neg")
    old_form = ('(lab.curves(runs[label], "clipfrac_pos")\n'
                '     + lab.curves(runs[label], "clipfrac_neg")).mean() / 2')
    assert pattern.search(old_form)  # the pattern finds the form it forbids
    for chapter in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md")):
        assert not pattern.search(chapter.read_text()), chapter.name


def test_the_advantage_entries_name_real_signatures():
    """The calls the GAE and value-model entries write are the library's own: the function
    exists and its first parameters are the ones named, in that order."""
    import inspect

    entries = glossary_entries()
    for term in SIGNATURES:
        (call,) = QUANTITIES[term]
        dotted, args = call[:-1].split("(")
        obj = rlgates
        for part in dotted.split(".")[1:]:
            obj = getattr(obj, part)
        names = [a.strip() for a in args.split(",")]
        assert list(inspect.signature(obj).parameters)[:len(names)] == names, call
        assert "chapter 19" in entries[term]
    # negative control: a misnamed argument is caught
    assert list(inspect.signature(rlgates.advantages.gae).parameters)[:2] != ["rewards", "value"]


def test_the_value_clipping_entries_say_what_verl_and_the_library_do():
    """The value clipping entry's default is the library's and verl's; the clip fraction entry
    names verl's metric and the lab's, and the policy's clip fraction points to it."""
    import inspect

    from rlgates._book import facts
    from rlgates.lab.critic import CRITIC_METRICS as critic_docs

    entries = glossary_entries()
    clipping, fraction = entries["value clipping"], entries["value clip fraction"]
    default = inspect.signature(rlgates.advantages.value_loss).parameters["clip_range"].default
    assert default == rlgates.lab.LabConfig().cliprange_value == 0.5
    assert "`critic.cliprange_value`, 0.5 by default" in clipping
    if facts.installed():
        assert facts.verl("critic.cliprange_value") == default
        facts.says("verl/workers/utils/losses.py",
                   '"critic/vf_clipfrac": vf_clipfrac.detach().item(),')
    assert "`critic/vf_clipfrac`" in fraction and "`vf_clipfrac`" in fraction
    assert "vf_clipfrac" in critic_docs
    assert "{term}`value clip fraction`" in entries["clip fraction"]
    # one definition per term: each term heads exactly one entry
    block = (ROOT / "glossary.md").read_text().split("```{glossary}")[1].split("```")[0]
    heads = [line.strip() for line in block.splitlines() if line and not line.startswith(" ")]
    assert len(heads) == len(set(heads))
    assert heads.count("value clipping") == heads.count("value clip fraction") == 1
