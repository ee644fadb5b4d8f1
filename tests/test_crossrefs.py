"""Cross-references the build checks: every pointer the book's prose makes to a chapter, an
exercise, a numbered equation or figure, or a file of the repository is a role (CONTRIBUTING,
"Cross-references"), so that the strict build (`jupyter-book build . -W -n`) fails on a broken one.

The rules, on the prose of the chapters and the book's pages (Markdown cells; code cells, code
spans, math, headings, links and roles are not prose):

- a chapter named by its number ("chapter 14", "chapters 6 and 12") is a {doc} link;
- an exercise is a {ref} to its label `ex-<chapter stem>-<n>`, with no text of its own: the
  build writes "Exercise 14.2", so no exercise number is ever typed ("Exercise 2", "Ex. 1");
- an equation the book tags (`\\tag{5}`) is a {ref} to the target `(eq-<chapter stem>-<tag>)=`
  just above it, whose text names that tag ("{ref}`eq. (5) <eq-03_generalized_objective-5>`");
- a figure the book numbers in its caption ("Figure 3: ...") is a {ref} to the figure's name,
  whose text names that number;
- a file of the repository is a {repo} link, never a bare path: the web reader cannot open it.

An equation or figure number after "its", "the article's" or "the paper's" is another work's
(the article Part I follows numbers its equations and figures as the book does), and stays text.
Fast and text-only: it reads the Markdown sources, nothing is built or executed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["index.md", "glossary.md", "conventions.md", "which_gate.md", "references.md",
         "explorer.md", "api.md"]

ROLE = re.compile(r"\{(?P<name>[A-Za-z][\w:.+-]*)\}`(?P<body>[^`]*)`")
WITH_TEXT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)


def sources() -> list[Path]:
    """The chapters, the book's other pages, and the API reference's module pages (api/)."""
    return (sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md")) + [ROOT / p for p in PAGES]
            + sorted((ROOT / "api").glob("*.md")))


# ----------------------------------------------------------------------------- the prose
INLINE = re.compile(
    r"(?P<role>\{[A-Za-z][\w:.+-]*\}`[^`]*`)"          # a role, with its content
    r"|(?P<code>(`+)(?:(?!\3).)+?\3)"                    # a code span
    r"|(?P<math>\$(?!\$)(?:[^$\\\n]|\\.|\n(?!\s*\n))+?\$)"  # inline math (never across a blank line)
    r"|(?P<link>!?\[[^\]\n]*\]\([^)\s]*\))"               # a Markdown link or image
    r"|(?P<url>https?://\S+)"
    r"|(?P<html><[^>\n]+>)", re.S)


def _blank(text: str, start: int, end: int, keep: str = "") -> str:
    """Text with [start, end) replaced by NULs of the same length (newlines kept)."""
    return text[:start] + re.sub(r"[^\n]", "\0", text[start:end]) + text[end:]


def prose(text: str, keep_code: bool = False, keep_roles: tuple[str, ...] = ()) -> str:
    """The text with everything that is not prose blanked out (same length and lines): front
    matter, code cells and code blocks, math blocks, cell separators, targets, comments,
    directive lines and options, headings, then roles, code spans (unless keep_code), inline
    math, links, URLs and HTML (keep_roles: the names of roles left as they are)."""
    lines = text.split("\n")
    out: list[str] = []
    fence = None  # the closing fence of a code block being skipped
    math = False
    front = lines[0].strip() == "---"
    for k, line in enumerate(lines):
        s = line.strip()
        blank = "\0" * len(line)
        if front:
            out.append(blank)
            if k and s == "---":
                front = False
            continue
        if fence:
            out.append(blank)
            if s.startswith(fence) and set(s) <= set(fence[0]):
                fence = None
            continue
        if math:
            out.append(blank)
            if s.endswith("$$"):
                math = False
            continue
        opened = re.match(r"^(`{3,}|~{3,})(.*)$", s)
        if opened and (not opened.group(2).startswith("{") or "code-cell" in opened.group(2)
                       or opened.group(2).startswith(("{code", "{literalinclude"))):
            fence = opened.group(1)
            out.append(blank)
            continue
        if s.startswith("$$"):
            math = not (len(s) > 2 and s.endswith("$$")) and not re.match(r"^\$\$\s*\(", s)
            out.append(blank)
            continue
        if (re.match(r"^(`{3,}|:{3,})", s) or s.startswith(("+++", "%", "#"))
                or re.match(r"^\([^()\s]+\)=$", s) or re.match(r"^:[\w-]+:", s)):
            out.append(blank)
            continue
        out.append(line)
    masked = "\n".join(out)
    masked = re.sub(r"<!--.*?-->", lambda m: re.sub(r"[^\n]", "\0", m.group(0)), masked, flags=re.S)
    pieces, last = [], 0
    for m in INLINE.finditer(masked):
        if keep_code and m.group("code"):
            continue
        if m.group("role") and m.group("role")[1:].split("}")[0] in keep_roles:
            continue
        pieces += [masked[last:m.start()], re.sub(r"[^\n]", "\0", m.group(0))]
        last = m.end()
    return "".join(pieces) + masked[last:]


# ----------------------------------------------------------------------------- the rules
OTHER_WORK = r"(?:\b[Ii]ts|article['’]s|paper['’]s)(?:\s+own)?\s+$"
RULES = {
    "a chapter by its number, not a {doc} link":
        re.compile(r"\b[Cc]hapters?\s+(?=\d|\0)"),  # then checked by _names_a_number
    "an exercise number typed by hand, not a {ref} to the exercise's label":
        re.compile(r"\b(?:[Ee]xercises?|Ex\.)\s+\d"),
    "an equation number of the book's, not a {ref} to its eq- target":
        re.compile(r"\b(?:[Ee]qs?\.|[Ee]quations?)\s*\(?\s*\d"),
    "a figure number of the book's, not a {ref} to the figure's name":
        re.compile(r"\b(?:Fig\.|Figures?)\s+\d"),
}
REPO_PATH = re.compile(r"(?<![\w/.-])(?:tests|rlgates|scripts|benchmarks|binder|_static)/"
                       r"[\w./-]*?(?:\.(?:py|md|ya?ml|toml|json|sh|js|txt|cfg|ipynb)\b|/(?=[\s`]))")


def _names_a_number(rest: str) -> bool:
    """After "chapters ": does a bare number follow, past the links already made and the words
    that join a list ("chapters {doc}`6 <06_sao>` and 12")?"""
    rest = rest.replace("\0", " ")
    return re.match(r"(?:\s|,|–|-|\band\b|\bor\b|\bto\b)*\d", rest) is not None


def violations(text: str) -> list[tuple[int, str, str]]:
    """(line, rule, the words) for every breach of the rules in one source's text."""
    found = []
    masked = prose(text)
    for rule, rx in RULES.items():
        for m in rx.finditer(masked):
            if "chapter" in rule and not _names_a_number(masked[m.end():m.end() + 160]):
                continue
            if "equation" in rule or "figure" in rule:
                if re.search(OTHER_WORK, masked[max(0, m.start() - 40):m.start()]):
                    continue
            line = masked.count("\n", 0, m.start()) + 1
            found.append((line, rule, text[m.start():m.end() + 12].replace("\n", " ")))
    for m in REPO_PATH.finditer(prose(text, keep_code=True)):
        line = text.count("\n", 0, m.start()) + 1
        found.append((line, "a repository path a web reader cannot open, not a {repo} link",
                      m.group(0)))
    return sorted(found)


# ----------------------------------------------------------------------------- the labels
def labels() -> dict[str, tuple[str, str]]:
    """label -> (kind, what its {ref} text must name): exercises ("Exercise 8.1"), equation
    targets (their tag), figures (their caption's number, or "" when the caption has none)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sources():
        text = path.read_text()
        chapter = re.match(r"(\d+)_", path.name)
        k = 0
        for m in re.finditer(r":::\{exercise\}[^\n]*\n\s*:label:\s*(\S+)", text):
            k += 1
            number = f"{int(chapter.group(1))}.{k}" if chapter else str(k)
            found[m.group(1)] = ("exercise", number)
        for m in re.finditer(r"^\((eq-[^()\s]+)\)=\s*\n+\$\$\n(.*?)\$\$", text, re.M | re.S):
            tag = re.search(r"\\tag\{([^{}]*)\}", m.group(2))
            found[m.group(1)] = ("equation", tag.group(1) if tag else "")
        for m in re.finditer(r"caption:\s*['\"]?(?:Figure (\d+):)?.*?\n\s*name:\s*(fig-\S+)",
                             text, re.S):
            found[m.group(2)] = ("figure", m.group(1) or "")
        for m in re.finditer(r"^\(([^()\s]+)\)=\s*$", text, re.M):
            found.setdefault(m.group(1), ("target", ""))
        for m in re.finditer(r"^\s*:(?:label|name):\s*(\S+)", text, re.M):
            found.setdefault(m.group(1), ("target", ""))
    return found


def refs():
    """(source, line, role, text, target) of every {ref}, {numref} and {eq} in the book."""
    for path in sources():
        text = path.read_text()
        for m in ROLE.finditer(text):
            if m.group("name") not in ("ref", "numref", "eq"):
                continue
            w = WITH_TEXT.match(m.group("body"))
            body_text, target = (w.group("text"), w.group("target")) if w else ("", m.group("body"))
            yield (path.name, text.count("\n", 0, m.start()) + 1, m.group("name"),
                   " ".join(body_text.split()), target.strip())


# ----------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("path", sources(), ids=lambda p: p.name)
def test_the_prose_points_with_roles(path):
    found = violations(path.read_text())
    assert not found, "\n".join(f"{path.name}:{line}: {rule}: {words!r}"
                                for line, rule, words in found)


def test_every_reference_names_what_it_points_at():
    """Each {ref} target exists; an exercise's {ref} carries no text (the build numbers it);
    an equation's or figure's names the number the book gives it."""
    known = labels()
    bad = []
    for name, line, role, text, target in refs():
        where = f"{name}:{line}: {{{role}}}`{text} <{target}>`"
        if target not in known:
            bad.append(f"{where}: no such label")
            continue
        kind, number = known[target]
        if kind == "exercise" and text and re.search(r"\d", text):
            bad.append(f"{where}: an exercise's number is the build's (write {{ref}}`{target}`)")
        if kind in ("equation", "figure") and number:
            if not text:
                bad.append(f"{where}: give the text, naming {kind} {number}")
            elif not re.search(rf"(?<![\w.]){re.escape(number)}(?![\w.])", text):
                bad.append(f"{where}: the text does not name {kind} {number}")
    assert not bad, "\n".join(bad)


def test_exercise_and_equation_labels_follow_the_convention():
    for label, (kind, number) in labels().items():
        if kind == "exercise":
            assert re.fullmatch(r"ex-\d\d_[a-z0-9_]+-\d+", label), label
        if kind == "equation":
            assert re.fullmatch(r"eq-\d\d_[a-z0-9_]+-[\w.]+", label), label
            assert number and label.endswith("-" + number), (label, number)


def test_every_repo_link_is_a_file_of_the_repository():
    for path in sources():
        for m in ROLE.finditer(path.read_text()):
            if m.group("name") == "repo":
                w = WITH_TEXT.match(m.group("body"))
                target = (w.group("target") if w else m.group("body")).strip()
                assert (ROOT / target).exists(), (path.name, target)


@pytest.mark.parametrize("text, rule", [
    ("as chapter 14 shows", "chapter"),
    ("in chapters {doc}`6 <06_sao>` and 12", "chapter"),
    ("Chapter 3 says", "chapter"),
    ("(Exercise 2)", "exercise"),
    ("exercise 1 below", "exercise"),
    ("(Ex. 4)", "exercise"),
    ("Exercise 1.2 says", "exercise"),
    ("by eq. (5)", "equation"),
    ("eq. 14.1 says", "equation"),
    ("Compare Figure 2, whose", "figure"),
    ("run `tests/test_per_token.py` to see", "repository"),
    ("(tests/test_trainer_facts.py runs verl)", "repository"),
])
def test_the_rules_catch_each_kind(text, rule):
    found = violations(f"Some prose.\n\n{text}\n")
    assert any(rule in r for _, r, _ in found), (text, found)


@pytest.mark.parametrize("text", [
    "as {doc}`chapter 14 <14_real_trainers>` shows",
    "in chapters {doc}`6 <06_sao>` and {doc}`12 <12_stale_rollouts>`",
    "({ref}`ex-01_importance_ratio-2`)",
    "by {ref}`eq. (5) <eq-03_generalized_objective-5>`",
    "the article's Figure 1 and its eq. (1)",
    "the PPO paper's own Figure 1",
    "the {repo}`tests/test_per_token.py` checks it",
    "a metric `rlgates/gate_mean` is no path",
    "```python\n# chapter 14, exercise 2, tests/test_x.py\n```",
    "$$\nx \\tag{5}\n$$",
    "### Figure 1: the four regions",
    "the two exercises below",
    "$\\text{chapter 3}$ in math",
])
def test_the_rules_pass_the_allowed_forms(text):
    assert violations(f"Some prose.\n\n{text}\n") == []
