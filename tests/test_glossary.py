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
    """{term: its definition} from glossary.md's {glossary} block. Terms on consecutive lines
    ("k1", "k2", "k3") share the definition that follows them."""
    block = (ROOT / "glossary.md").read_text().split("```{glossary}")[1].split("\n```")[0]
    entries, terms, body = {}, [], False
    for line in block.splitlines():
        if line and not line.startswith(" "):
            if body:
                terms, body = [], False
            terms.append(line.strip())
            entries[line.strip()] = ""
        elif terms and line.strip():
            body = True
            for term in terms:
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


# ------------------------------------------------------------------ complete by construction
# Every term the glossary defines is linked ({term}) where a chapter first uses it, and every
# {term} names a glossary entry (the strict build checks that too). "First use" is the first
# match, in the chapter's prose (tests/test_crossrefs.py's `prose`: no code, math, headings or
# other roles), of the term's forms below: the term itself, capitalised at a sentence's start,
# with a plural s, unless FORMS gives other words for it.
import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from test_crossrefs import prose  # noqa: E402

#: words that are not always the glossary's sense ("the model's weights", "a training signal"):
#: linked by hand where they are meant, never required
EVERYDAY = {"weight", "signal"}
#: the words that count as a use of a term, where they are not the term and its plural
FORMS = {
    "MoE routing": r"MoE routing|[Mm]ixture-of-experts routing",
    "whitening": r"[Ww]hiten(?:ing|ed|s)?",
    "Holm's correction": r"Holm['’]s correction",
    "minibatch": r"[Mm]inibatch(?:es)?",
    "micro-batch": r"[Mm]icro-batch(?:es)?",
    "dual-clip PPO": r"[Dd]ual-clip PPO",
    "R3": r"R3|Rollout Routing Replay",
    "routing replay": r"[Rr]outing [Rr]eplay",
    "side information": r"[Ss]ide information",
    "kept mass": r"[Kk]ept mass",
    "no difference detected": r"no difference detected",
    "entropy collapse": r"[Ee]ntropy collapse",
    "value clipping": r"[Vv]alue clipping|clipped value loss",
    "GA": r"GA",
    "k1": r"k1", "k2": r"k2", "k3": r"k3",  # lower case: "Kimi K2" is a model
    "aggregation": r"[Aa]ggregation",
}


def term_pattern(term: str) -> str:
    if term in FORMS:
        return FORMS[term]
    if term[0].islower():
        first = f"[{term[0].upper()}{term[0]}]{re.escape(term[1:])}"
        return first + r"(?:s|es)?"
    return re.escape(term) + (r"s?" if term.isupper() and len(term) > 3 else "")


def term_regex(terms) -> tuple[re.Pattern, list[str]]:
    """One regex for the forms of all the terms, longest first, each in a named group t{i}
    (the i-th of the list returned with it)."""
    ordered = sorted(terms, key=lambda t: -len(term_pattern(t)))
    groups = "|".join(f"(?P<t{i}>{term_pattern(t)})" for i, t in enumerate(ordered))
    return re.compile(rf"(?<![\w-])(?:{groups})(?![\w-])"), ordered


def matched_term(ordered, m) -> str:
    return ordered[int(m.lastgroup[1:])]


TERM_ROLE = re.compile(r"\{term\}`(?:(?P<text>[^`<]*?)\s*<(?P<target>[^`<>]+)>|(?P<plain>[^`<]+))`")


def term_roles(text: str):
    """(position, target) of every {term} in the prose of a text (not in code or math)."""
    kept = prose(text, keep_roles=("term",))
    for m in TERM_ROLE.finditer(kept):
        yield m.start(), " ".join((m.group("target") or m.group("plain")).split())


def chapters():
    return sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))


def book_pages():
    from test_crossrefs import sources

    return sources()


def first_uses(text: str, terms) -> dict:
    """{term: position of its first plain use} in a text's prose."""
    (rx, ordered), first = term_regex(terms), {}
    for m in rx.finditer(prose(text)):
        first.setdefault(matched_term(ordered, m), m.start())
    return first


def test_every_term_role_names_an_entry():
    terms = {t.lower() for t in glossary_entries()}
    bad = [(page.name, target) for page in book_pages() for _, target in
           term_roles(page.read_text()) if target.lower() not in terms]
    assert not bad, bad


def glossary_groups() -> list[list[str]]:
    """The entries as lists of their terms (["gradient accumulation", "GA"], ["k1", "k2", "k3"])."""
    block = (ROOT / "glossary.md").read_text().split("```{glossary}")[1].split("\n```")[0]
    groups, body = [], True
    for line in block.splitlines():
        if line and not line.startswith(" "):
            if body:
                groups.append([])
            groups[-1].append(line.strip())
            body = False
        elif line.strip():
            body = True
    return groups


def test_every_entry_is_linked_from_the_book():
    linked = {target.lower() for page in book_pages() if page.name != "glossary.md"
              for _, target in term_roles(page.read_text())}
    missing = [g for g in glossary_groups()
               if not any(t.lower() in linked or t in EVERYDAY for t in g)]
    assert not missing, f"glossary entries no page links with {{term}}: {missing}"


def test_each_chapter_links_the_first_use_of_each_term():
    terms = [t for t in glossary_entries() if t not in EVERYDAY]
    bad = []
    for chapter in chapters():
        text = chapter.read_text()
        links: dict[str, int] = {}
        for pos, target in term_roles(text):
            links.setdefault(target.lower(), pos)
        for term, pos in first_uses(text, terms).items():
            link = links.get(term.lower())
            if link is None or link > pos:
                line = text.count("\n", 0, pos) + 1
                bad.append(f"{chapter.name}:{line}: first use of {term!r} is not a {{term}} link")
    assert not bad, "\n".join(bad)


def test_the_glossary_rules_see_each_case():
    terms = ["gate", "PPO", "dual-clip PPO", "MoE routing", "Holm's correction"]
    text = ("Intro.\n\nGates shut. `gate` in code, $gate$ in math, {term}`PPO` linked, then "
            "dual-clip PPO and PPO again, mixture-of-experts routing, Holm's correction.\n")
    first = first_uses(text, terms)
    assert set(first) == {"gate", "PPO", "dual-clip PPO", "MoE routing", "Holm's correction"}
    assert text[first["gate"]:].startswith("Gates")
    assert text[first["PPO"]:].startswith("PPO again")  # not the one inside dual-clip PPO
    assert dict((t, p) for p, t in term_roles(text)) == {"PPO": text.index("{term}")}
    # the index's promise
    index = (ROOT / "index.md").read_text()
    assert "{doc}`glossary` defines every" in " ".join(index.split())
