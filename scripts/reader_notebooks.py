"""Reader notebooks: the chapters as plain Jupyter notebooks, for JupyterLab, Colab and Binder.

The chapters are written in MyST (glue roles, admonitions, exercises, figure captions in cell
metadata); plain Jupyter shows that markup raw. This module turns each chapter into a notebook
that reads well anywhere:

- every `{glue:text}` role becomes its number as text, from the values the build's single
  execution glued (`<build>/jupyter_execute/chapters/NN.glue.json`, written by myst-nb);
- every MyST role and directive is converted: {eq} {numref} {ref} {doc} {cite} {math}
  {explorer} {term} (a link to the glossary's entry) {repo} (a link to the file in the
  repository) ..., admonitions (a `:class: dropdown` one as a folded `<details>`), sphinx-exercise's
  {exercise} {solution} {solution-start} {solution-end}, {glue:md}, {figure}, {code-block};
- a figure's caption (cell metadata `mystnb.figure`) is shown in a Markdown cell after it;
- a solution's code is not a code cell: it is shown, with the output it gave in the build
  (the book's jupyter-cache, `<build>/.jupyter_cache`), in a folded Markdown cell, so that
  "Run All" shows no answer (JupyterLab and Colab show a folded cell's output again when it
  runs); the solution's hidden checks are left out (the book's execution runs them);
- `hide-input` and `remove-cell` cells are folded the way Jupyter folds cells
  (`jupyter.source_hidden`, `jupyter.outputs_hidden`; Colab reads `cellView: form`);
- a first code cell installs rlgates from the repository (`repository.url` in _config.yml) when it
  is missing (when that fails it stops "Run All" with one line: the local alternative), warns
  when the installed rlgates is not the version the notebook was made with, turns on Colab's
  widget manager, and makes `from myst_nb import glue` work where myst-nb is not installed;
- a chapter that guards its trainer cells (rlgates.trainers.guard_notebook, chapter 14) is run
  once more where TRL and verl cannot be imported, as on Colab or Binder: the cells that then
  only print what to install are counted in the notebook's header, and the output each gave in
  the build (which had the trainers; their versions read from the installed distributions) is
  folded under it, as solutions are.

Code cells outside solutions are copied unchanged (outputs dropped), so the chapter's own
execution (nbval's, once per check) executes them; the added first cell is tested on its own
(tests/test_reader_notebooks.py).

As a Sphinx extension (_config.yml, sphinx.local_extensions), it defines the role
{repo}`tests/test_x.py` (a link to that file of the repository, `repository.url` in _config.yml,
branch main; a path that is not in the repository fails the strict build), and it runs when the
book build finishes: it writes the reader notebooks to <build>/reader/chapters/ and puts them
where the page's download button points (<html>/_sources/chapters/NN.ipynb). As a script:

    python scripts/reader_notebooks.py [BUILD_DIR]       (default _build; needs a built book)
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import chapter_sources
import nbformat

ROOT = Path(__file__).resolve().parents[1]

ROLE = re.compile(r"\{([A-Za-z][\w:.+-]*)\}`([^`]*)`")
ROLE_OR_CODE = re.compile(ROLE.pattern + r"|(`+)[^`]+\3")
FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|:{3,})\s*\{(?P<name>[\w:.+-]+)\}"
                        r"\s*(?P<arg>.*?)\s*$")
TARGET = re.compile(r"^\((?P<label>[^()\s]+)\)=\s*$")
MATH_LABEL = re.compile(r"^\$\$\s*\((?P<label>[^()\s]+)\)\s*$")
TAG = re.compile(r"\\tag\*?\{([^{}]*)\}")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
REF_WITH_TEXT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
FOLD_THEN_TEXT = re.compile(r"^</details>\n\s*\n(?=\S)", re.M)

ADMONITIONS = {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger",
               "error", "seealso", "admonition", "dropdown", "margin", "sidebar", "topic"}
EXERCISE_DIRECTIVES = {"exercise", "exercise-start", "exercise-end", "solution",
                       "solution-start", "solution-end"}

INSTALL_TAG = "rlgates-reader-setup"
SOURCE_BRANCH = "main"  # the branch that holds the sources: {repo} links point there
REPLACED_GLUE = "application/papermill.record/"


# ----------------------------------------------------------------------------- configuration
def read_config(root: Path = ROOT) -> dict:
    import yaml

    return yaml.safe_load((root / "_config.yml").read_text())


def repository(config: dict) -> tuple[str, str]:
    """(repository URL, the branch the launch buttons open): set once, in _config.yml."""
    repo = config.get("repository", {})
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def source_url(repo_url: str, path: str) -> str:
    """The web page of one file of the repository's sources: {repo}`PATH` links here."""
    return f"{repo_url.rstrip('/')}/blob/{SOURCE_BRANCH}/{path.strip().lstrip('/')}"


def term_anchor(term: str) -> str:
    """The id Sphinx gives a glossary entry ("term-importance-ratio")."""
    try:
        from sphinx.util.nodes import _make_id
    except ImportError:  # pragma: no cover - Sphinx is installed with the book
        return "term-" + re.sub(r"[^A-Za-z0-9_]+", "-", term).strip("-")
    return _make_id("term-" + term)


def glossary_terms(root: Path = ROOT) -> set[str]:
    """The terms glossary.md's {glossary} block defines, lower-cased (Sphinx matches a {term}
    case-insensitively)."""
    path = root / "glossary.md"
    if not path.is_file():
        return set()
    text = path.read_text()
    if "```{glossary}" not in text:
        return set()
    block = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    return {line.strip().lower() for line in block.splitlines()
            if line.strip() and not line.startswith((" ", "\t", ":"))}


def pages_url(repo_url: str) -> str:
    """Where GitHub Pages publishes the book: https://ORG.github.io/REPO/."""
    m = re.match(r"https://github\.com/([^/]+)/([^/]+)", repo_url)
    if not m:
        return repo_url + "/"
    return f"https://{m.group(1).lower()}.github.io/{m.group(2)}/"


def install_cell_source(repo_url: str, branch: str, version: str) -> str:
    """The reader notebook's first code cell. Where rlgates is missing (Colab, Binder's first
    run) it installs it from the repository's `branch`, saying so first; when that fails
    (offline, or before the workflow has published the branch) it stops "Run All" with one line,
    the local alternative, instead of pip's message and a traceback in every later cell (IPython
    shows an exception's `_render_traceback_()` lines as its traceback). It warns when the
    installed rlgates is not the `version` the notebook was made with, turns on Colab's widget
    manager (the sliders are ipywidgets 8), and stands in for myst_nb.glue."""
    source = f"git+{repo_url}@{branch}"
    folder = repo_url.rstrip("/").rsplit("/", 1)[-1]
    return f'''# Set-up for Colab and Binder: installs rlgates where it is missing
import importlib.util
import subprocess
import sys
import types

BUILT_WITH = "{version}"  # the rlgates this notebook was made with
SOURCE = "{source}"

if importlib.util.find_spec("rlgates") is None:
    print(f"installing rlgates from {{SOURCE}} (a minute or two)", flush=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                          f"rlgates[widgets] @ {{SOURCE}}"], capture_output=True, text=True)
    if pip.returncode != 0:
        class SetupFailed(Exception):
            def _render_traceback_(self):  # one line in the notebook, not a traceback
                return [str(self)]

        raise SetupFailed(
            "rlgates could not be installed (offline, or the branch is not reachable; "
            "print(pip.stderr) says why). Instead run it locally: git clone {repo_url} "
            "&& cd {folder} && python3 tasks.py lab")
    importlib.invalidate_caches()
import rlgates

if rlgates.__version__ != BUILT_WITH:
    print(f"warning: rlgates {{rlgates.__version__}} is installed, this notebook was made with "
          f"{{BUILT_WITH}}: pip install --force-reinstall 'rlgates[widgets] @ {{SOURCE}}'")
try:  # Colab draws ipywidgets 8 (the sliders) with its custom widget manager
    from google.colab import output as colab_output

    colab_output.enable_custom_widget_manager()
except ImportError:
    pass
if importlib.util.find_spec("myst_nb") is None:
    # the chapters glue numbers into the book's text with myst_nb.glue; here they are
    # already in the text, so a stand-in that only shows what it is asked to show
    def _glue(name, value, display=True):
        if display:
            from IPython.display import display as show
            show(value)

    sys.modules["myst_nb"] = types.SimpleNamespace(glue=_glue)'''


# ----------------------------------------------------------------------------- labels
@dataclass
class Label:
    kind: str  # section, figure, equation, exercise
    doc: str  # docname, e.g. chapters/07_sapo
    title: str
    number: str = ""


@dataclass
class Book:
    """What the conversion needs to know about the whole book."""

    repo_url: str
    branch: str
    glue: dict[str, dict] = field(default_factory=dict)  # docname -> {key: output}
    labels: dict[str, Label] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)  # docname -> first heading
    problems: list[str] = field(default_factory=list)
    terms: set[str] = field(default_factory=set)  # glossary terms, lower-cased; empty: unchecked
    version: str = ""  # rlgates's __version__: the set-up cell compares with it
    #: the trainers installed when the book was built ({"trl": ..., "verl": ...}, read from
    #: their distributions), which ran the chapters: empty when either was missing
    trainers: dict[str, str] = field(default_factory=dict)

    @property
    def web(self) -> str:
        return pages_url(self.repo_url)

    def page(self, doc: str, anchor: str = "") -> str:
        return f"{self.web}{doc}.html" + (f"#{anchor}" if anchor else "")


def _strip_markup(text: str) -> str:
    return re.sub(r"[*_`]", "", ROLE.sub(lambda m: m.group(2), text)).strip()


def collect_labels(doc: str, nb, book: Book) -> None:
    """Section targets, figure names, equation labels and exercise labels of one notebook."""
    figures = equations = exercises = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            fig = cell.metadata.get("mystnb", {}).get("figure", {})
            if fig.get("name"):
                figures += 1
                caption = " ".join(str(fig.get("caption", "")).split())
                book.labels[fig["name"]] = Label("figure", doc, caption, str(figures))
            continue
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.splitlines()
        for i, line in enumerate(lines):
            h = HEADING.match(line)
            if h and doc not in book.titles and len(h.group(1)) == 1:
                book.titles[doc] = _strip_markup(h.group(2))
            t = TARGET.match(line)
            if t:
                title = next((HEADING.match(x).group(2) for x in lines[i + 1:]
                              if HEADING.match(x)), t.group("label"))
                book.labels[t.group("label")] = Label("section", doc, _strip_markup(title))
            m = MATH_LABEL.match(line.strip()) or (
                re.match(r"^\s*:label:\s*(?P<label>\S+)", line)
                if i and FENCE_OPEN.match(_last_fence(lines[:i])) and
                "{math}" in _last_fence(lines[:i]) else None)
            if m:
                equations += 1
                block = "\n".join(lines[max(0, i - 12):i + 12])
                tag = TAG.search(block)
                book.labels[m.group("label")] = Label(
                    "equation", doc, "", tag.group(1) if tag else str(equations))
            f = FENCE_OPEN.match(line)
            if f and f.group("name") in ("exercise", "exercise-start"):
                exercises += 1
                lab = next((re.match(r"^\s*:label:\s*(\S+)", x).group(1) for x in lines[i + 1:]
                            if re.match(r"^\s*:label:\s*(\S+)", x)), None)
                if lab:
                    number = exercise_number(doc, exercises)
                    book.labels[lab] = Label("exercise", doc, f"Exercise {number}", number)


def web_anchor(target: str, label: Label) -> str:
    """The id a label has on the web page: docutils normalises a target's or a figure's name
    ("eq-03_generalized_objective-5" -> "eq-03-generalized-objective-5"); sphinx-exercise keeps an
    exercise's label as it is. (In a reader notebook the anchors keep the label as written.)"""
    if label.kind == "exercise":
        return target
    from docutils.nodes import make_id

    return make_id(target)


def exercise_number(doc: str, k: int) -> str:
    """"8.1" for the first exercise of chapters/08_...: the web book's numbering
    (scripts/book_web.py numbers exercises per chapter)."""
    chapter = re.match(r"chapters/(\d+)_", doc)
    return f"{int(chapter.group(1))}.{k}" if chapter else str(k)


def _last_fence(lines: list[str]) -> str:
    for line in reversed(lines):
        if FENCE_OPEN.match(line):
            return line
    return ""


# ----------------------------------------------------------------------------- Markdown
class Page:
    """Converts the Markdown of one chapter, cell by cell (state: the open solution, counters)."""

    def __init__(self, doc: str, book: Book):
        self.doc, self.book = doc, book
        self.glue = book.glue.get(doc, {})
        self.exercises = 0
        self.in_solution: str | None = None  # title of the open gated solution
        self.equations = 0

    # --- roles
    def problem(self, what: str) -> None:
        self.book.problems.append(f"{self.doc}: {what}")

    def glue_output(self, key: str) -> dict | None:
        doc = self.doc
        if "::" in key:
            other, key = key.split("::", 1)
            other = other.removesuffix(".ipynb").removesuffix(".md")
            doc = str(Path(self.doc).parent.joinpath(other)).replace("\\", "/")
            doc = re.sub(r"[^/]+/\.\./", "", doc)
        out = self.book.glue.get(doc, {}).get(key)
        if out is None:
            self.problem(f"glue name {key!r} not found")
        return out

    def glue_text(self, content: str) -> str:
        from myst_nb.core.variables import format_plain_text

        key, spec = content.rsplit(":", 1) if ":" in content.replace("::", "") else (content, "s")
        if "::" in content and content.count(":") == 2:  # doc::key, no format
            key, spec = content, "s"
        out = self.glue_output(key)
        if out is None:
            return f"[{key}?]"
        data = _data(out)
        if "text/plain" not in data:
            self.problem(f"glue {key!r} has no text/plain")
            return f"[{key}?]"
        return format_plain_text(data["text/plain"], spec)

    def glue_markdown(self, key: str) -> str:
        out = self.glue_output(key)
        if out is None:
            return f"[{key}?]"
        data = _data(out)
        if "text/markdown" in data:
            return data["text/markdown"]
        if "image/png" in data:
            return f'<img src="data:image/png;base64,{data["image/png"]}" alt="{key}"/>'
        return data.get("text/plain", f"[{key}?]")

    def ref(self, content: str, kind: str) -> str:
        m = REF_WITH_TEXT.match(content)
        text, target = (m.group("text"), m.group("target")) if m else ("", content)
        label = self.book.labels.get(target)
        if label is None:
            self.problem(f"{{{kind}}} target {target!r} not found")
            return text or target
        if kind == "numref":
            name = {"figure": "Fig. {}", "equation": "Eq. {}", "exercise": "Exercise {}",
                    "section": "Section {}"}[label.kind]
            text = (text.replace("%s", label.number).replace("{number}", label.number)
                    if text else name.format(label.number))
        elif kind == "eq":
            text = text or f"({label.number})"
        elif not text:
            text = label.title if label.kind != "figure" else f"Fig. {label.number}"
        href = f"#{target}" if label.doc == self.doc else self.book.page(label.doc,
                                                                         web_anchor(target, label))
        return f"[{text}]({href})"

    def doc_link(self, content: str) -> str:
        m = REF_WITH_TEXT.match(content)
        text, target = (m.group("text"), m.group("target")) if m else ("", content)
        target = target.removesuffix(".ipynb").removesuffix(".md")
        if target.startswith("/"):
            doc = target.lstrip("/")
        else:
            doc = str(Path(self.doc).parent / target).replace("\\", "/")
            while re.search(r"[^/.]+/\.\./", doc):
                doc = re.sub(r"[^/.]+/\.\./", "", doc, count=1)
        return f"[{text or self.book.titles.get(doc, doc)}]({self.book.page(doc)})"

    def role(self, m: re.Match) -> str:
        name, content = m.group(1), m.group(2)
        if name in ("glue:text", "glue", "glue:any"):
            return self.glue_text(content)
        if name == "glue:md":
            return self.glue_markdown(content)
        if name in ("ref", "numref", "eq"):
            return self.ref(content, name)
        if name == "doc":
            return self.doc_link(content)
        if name.startswith("cite"):
            return "[" + "; ".join(k.strip() for k in content.split(",")) + "]"
        if name == "math":
            return f"${content}$"
        if name == "explorer":
            tm = REF_WITH_TEXT.match(content)
            text, method = (tm.group("text"), tm.group("target")) if tm else ("", content)
            text = text or f"the gate explorer ({method})"
            return f"[{text}]({self.book.web}explorer.html#{method})"
        if name == "term":
            tm = REF_WITH_TEXT.match(content)
            text, term = (tm.group("text"), tm.group("target")) if tm else (content, content)
            term = " ".join(term.split())
            if self.book.terms and term.lower() not in self.book.terms:
                self.problem(f"{{term}} {term!r} is not in the glossary")
            return f"[{text}]({self.book.page('glossary', term_anchor(term))})"
        if name == "repo":
            tm = REF_WITH_TEXT.match(content)
            text, path = (tm.group("text"), tm.group("target")) if tm else (f"`{content}`", content)
            return f"[{text}]({source_url(self.book.repo_url, path)})"
        if name in ("sub", "sup"):
            return f"<{name}>{content}</{name}>"
        if name in ("abbr",):
            return re.sub(r"\s*\(.*\)$", "", content)
        if name in ("code", "literal", "samp", "file", "command", "kbd"):
            return f"`{content}`"
        if name == "download":
            tm = REF_WITH_TEXT.match(content)
            return f"[{tm.group('text')}]({tm.group('target')})" if tm else content
        self.problem(f"unknown role {{{name}}}")
        return content

    def roles(self, text: str) -> str:
        # left to right, a role or an inline code span (copied as it is), whichever starts first
        return ROLE_OR_CODE.sub(lambda m: self.role(m) if m.group(1) else m.group(0), text)

    # --- directives
    def markdown(self, source: str, top: bool = True) -> str:
        """Convert one Markdown text. At the top level, the prose of a gated solution (between
        {solution-start} and {solution-end}, possibly across cells) is folded in <details>."""
        lines = source.splitlines()
        out: list[tuple[str, str | None]] = []  # (line, title of the solution it belongs to)

        def emit(new_lines, fold="same"):
            fold = self.in_solution if fold == "same" else fold
            out.extend((x, fold) for x in new_lines)

        i = 0
        in_code = None
        math: list[str] | None = None
        while i < len(lines):
            line = lines[i]
            if in_code is not None:  # a plain code fence: copy verbatim
                emit([line])
                if line.strip().startswith(in_code):
                    in_code = None
                i += 1
                continue
            if math is not None:  # inside $$ ... $$: roles are LaTeX here, copy verbatim
                math.append(line)
                if line.strip().startswith("$$"):
                    emit(self.math_block(math))
                    math = None
                i += 1
                continue
            f = FENCE_OPEN.match(line)
            if f:
                j, body = self.fence_body(lines, i, f.group("fence"))
                before = self.in_solution
                converted = self.directive(f.group("name"), f.group("arg"), body)
                emit(converted, None if f.group("name") in EXERCISE_DIRECTIVES else before)
                i = j
                continue
            plain = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
            if plain:
                in_code = plain.group(1)
                emit([line])
                i += 1
                continue
            stripped = line.strip()
            if stripped.startswith("$$") and not (stripped.endswith("$$") and len(stripped) > 2
                                                   and not MATH_LABEL.match(stripped)):
                math = [line]
                if MATH_LABEL.match(stripped) or stripped == "$$":
                    i += 1
                    continue
            t = TARGET.match(line)
            if t:
                emit([f'<a id="{t.group("label")}"></a>'])
                i += 1
                continue
            if re.match(r"^%", line):  # a MyST comment
                i += 1
                continue
            emit([self.roles(line)])
            i += 1
        if math is not None:
            emit(math)
        if not top:
            return "\n".join(x for x, _ in out)
        result: list[str] = []
        k = 0
        while k < len(out):
            title = out[k][1]
            run = []
            while k < len(out) and out[k][1] == title:
                run.append(out[k][0])
                k += 1
            if title and any(x.strip() for x in run):
                result.extend(self.details(title, _trim(run)))
            elif not title:
                result.extend(run)
        if not any(x.strip() for x in result):
            return ""
        # a folded block has no margin in JupyterLab: text after it in the same cell would touch
        # its summary line ("Solution to Exercise 7.2" right above "Exercise 7.3")
        return FOLD_THEN_TEXT.sub("</details>\n<br>\n\n", "\n".join(result).strip("\n"))

    def math_block(self, block: list[str]) -> list[str]:
        """`$$ ... $$ (label)` or a block opened by `$$`: drop the label, keep or add a tag."""
        first, last = block[0].strip(), block[-1].strip()
        label = MATH_LABEL.match(last) or MATH_LABEL.match(first)
        body = block[1:-1]
        latex = "\n".join(body)
        if label:
            lab = self.book.labels.get(label.group("label"))
            number = lab.number if lab else ""
            if number and not TAG.search(latex):
                body = [*body, rf"\tag{{{number}}}"]
            return ["$$", *body, "$$"]
        return block

    def fence_body(self, lines: list[str], i: int, fence: str) -> tuple[int, list[str]]:
        """The lines of a directive opened at i (nested fences included); returns (next i, body)."""
        char, n = fence[0], len(fence)
        depth = 0
        body = []
        j = i + 1
        while j < len(lines):
            s = lines[j].strip()
            inner = FENCE_OPEN.match(lines[j])
            if inner and inner.group("fence")[0] == char and len(inner.group("fence")) >= n:
                depth += 1
            elif re.fullmatch(re.escape(char) + f"{{{n},}}", s):
                if depth == 0:
                    return j + 1, body
                depth -= 1
            body.append(lines[j])
            j += 1
        self.problem("unclosed directive")
        return j, body

    @staticmethod
    def options(body: list[str]) -> tuple[dict[str, str], list[str]]:
        opts: dict[str, str] = {}
        k = 0
        if body and body[0].strip() == "---":  # YAML options block
            end = next((x for x in range(1, len(body)) if body[x].strip() == "---"), 0)
            for line in body[1:end]:
                if ":" in line:
                    key, val = line.split(":", 1)
                    opts[key.strip()] = val.strip()
            return opts, body[end + 1:]
        while k < len(body) and re.match(r"^\s*:[\w-]+:", body[k]):
            key, val = re.match(r"^\s*:([\w-]+):\s*(.*)$", body[k]).groups()
            opts[key] = val
            k += 1
        return opts, body[k:]

    def directive(self, name: str, arg: str, body: list[str]) -> list[str]:
        opts, content = self.options(body)
        inner = self.markdown("\n".join(content), top=False).splitlines()
        label = opts.get("label") or opts.get("name")
        anchor = [f'<a id="{label}"></a>'] if label else []
        folded = "dropdown" in opts.get("class", "").split() or name == "dropdown"
        if name in EXERCISE_DIRECTIVES:
            return self.exercise(name, arg, opts, inner, anchor)
        if name in ADMONITIONS:
            default = {"admonition": "", "seealso": "See also"}.get(name, name.title())
            title = self.roles(arg) if arg else default
            if folded:
                return self.details(title or "Details", inner)
            return anchor + self.quote(title, inner)
        if name == "math":
            lab = self.book.labels.get(label) if label else None
            tag = [rf"\tag{{{lab.number}}}"] if lab and not TAG.search("\n".join(content)) else []
            return anchor + ["$$", *content, *tag, "$$"]
        if name in ("glue:md", "glue:markdown", "glue", "glue:any", "glue:figure"):
            text = self.glue_markdown(arg)
            if name == "glue:figure" and inner:
                text += "\n\n*" + " ".join(inner).strip() + "*"
            return anchor + text.splitlines()
        if name in ("figure", "image"):
            alt = opts.get("alt", "")
            img = [f"![{alt}]({arg})"]
            caption = [x for x in inner if x.strip()]
            text = ["", "*" + " ".join(caption).strip() + "*"] if caption else []
            return anchor + img + text
        if name in ("code-block", "code", "sourcecode", "code-cell"):
            return ["```" + arg, *content, "```"]
        if name in ("epigraph", "pull-quote", "highlights"):
            return self.quote("", inner)
        if name in ("raw",):
            return content if arg.strip() == "html" else []
        if name in ("list-table",):
            return self.list_table(arg, opts, inner)
        self.problem(f"unknown directive {{{name}}}")
        return anchor + inner

    @staticmethod
    def quote(title: str, inner: list[str]) -> list[str]:
        head = [f"> **{title}**", ">"] if title else []
        return head + [f"> {x}" if x.strip() else ">" for x in inner]

    @staticmethod
    def details(title: str, inner: list[str]) -> list[str]:
        # blank lines around the body: JupyterLab and Colab render Markdown inside <details>
        return ["<details>", f"<summary><b>{title}</b></summary>", "", *inner, "", "</details>"]

    def exercise(self, name, arg, opts, inner, anchor) -> list[str]:
        if name in ("exercise", "exercise-start"):
            self.exercises += 1
            number = exercise_number(self.doc, self.exercises)
            title = f"**Exercise {number}**" + (f" ({self.roles(arg)})" if arg else "")
            return anchor + [title, "", *inner]
        if name == "exercise-end":
            return inner
        target = self.book.labels.get(arg.strip())
        what = target.title if target else "the exercise"
        title = f"Solution to {what}"
        if name == "solution":
            return self.details(title, inner)
        if name == "solution-start":
            self.in_solution = title
            return self.details(title, inner) if any(x.strip() for x in inner) else [
                f"*{title}: folded below (click to open).*"]
        # solution-end
        self.in_solution = None
        return inner


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _data(out: dict) -> dict:
    """Glue outputs keep their mime types under application/papermill.record/."""
    return {k.removeprefix(REPLACED_GLUE): v for k, v in out.get("data", {}).items()}


# ----------------------------------------------------------------------------- checks
LEFTOVERS = {
    "role": re.compile(r"\{[A-Za-z][\w:.+-]*\}`"),
    "directive": re.compile(r"^\s*(`{3,}|:{3,})\s*\{[\w:.+-]+\}", re.M),
    "target": re.compile(r"^\([^()\s]+\)=\s*$", re.M),
    "option": re.compile(r"^\s*:(class|label|name|tags|format|alt|width|align):", re.M),
    "labelled math": re.compile(r"^\$\$\s*\([^()\s]+\)\s*$", re.M),
    "colon fence": re.compile(r"^:{3,}\s*$", re.M),
}


def myst_leftovers(markdown: str) -> list[str]:
    """The kinds of MyST syntax still in a Markdown text (code blocks and code spans ignored)."""
    prose = re.sub(r"^(`{3,}|~{3,})(?![^\n]*\{)[^\n]*\n.*?^\1\s*$", "", markdown,
                   flags=re.M | re.S)
    prose = re.sub(r"(?<![}\w])(`+)(?!\s)[^`]+\1", "", prose)
    return [kind for kind, rx in LEFTOVERS.items() if rx.search(prose)]


# ----------------------------------------------------------------------------- notebooks
def _fold(cell, source=True, outputs=True) -> None:
    jup = cell.metadata.setdefault("jupyter", {})
    if source:
        jup["source_hidden"] = True
        cell.metadata["cellView"] = "form"  # Colab's way of hiding a cell's code
    if outputs:
        jup["outputs_hidden"] = True


#: A folded cell shows its first line in JupyterLab: a check's first line says what it is.
FOLD_SIGNPOST = "# Checks the numbers in the text above (folded; it runs with the rest)\n"


def signposted(source: str) -> str:
    """A folded check's source, led by a comment line unless it already starts with one."""
    return source if source.lstrip().startswith("#") else FOLD_SIGNPOST + source


def unsignposted(source: str) -> str:
    """The chapter's own source of a reader-notebook cell (the fold's signpost taken off)."""
    return source.removeprefix(FOLD_SIGNPOST)


SOLUTION_TAG = "rlgates-solution"  # a solution's code, shown as text: Run All does not run it
RECORDED_TAG = "rlgates-recorded"  # a trainer cell's output in the build, shown as text
OUTPUT_LABEL = "**Output:**"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def output_markdown(outputs: list) -> list[str]:
    """A code cell's outputs as Markdown lines: text in a code block, Markdown as it is, images
    inline (data: URL), HTML as it is; widgets and glue records (not shown in the book) left out."""
    lines: list[str] = []
    for out in outputs:
        if out.get("output_type") == "stream":
            text = ANSI.sub("", "".join(out.get("text", ""))).rstrip("\n")
            lines += ["", "```text", *text.splitlines(), "```"] if text.strip() else []
            continue
        data = out.get("data", {})
        if any(k.startswith(REPLACED_GLUE) for k in data):
            continue
        if "text/markdown" in data:
            lines += ["", *"".join(data["text/markdown"]).splitlines()]
        elif "image/png" in data:
            png = "".join(data["image/png"]).replace("\n", "")
            lines += ["", f'<img src="data:image/png;base64,{png}" alt="output"/>']
        elif "text/html" in data:
            lines += ["", *"".join(data["text/html"]).splitlines()]
        elif "text/plain" in data and "application/vnd.jupyter.widget-view+json" not in data:
            lines += ["", "```text", *ANSI.sub("", "".join(data["text/plain"])).splitlines(),
                      "```"]
    return lines


def solution_cell(cell, outputs: list | None, title: str):
    """A solution's code cell as a folded Markdown cell: its code, and the output it gave when
    the book was built. Run All runs no solution, so no answer shows before the reader opens
    one, in JupyterLab and in Colab alike (both show a cell's output again when it runs); the
    reader runs one by copying its code into a cell."""
    shown = output_markdown(outputs or [])
    what = "its code (copy it into a cell to run it)" + (" and its output" if shown else "")
    # the output labelled: JupyterLab draws code and text output alike, one monospace block
    body = ["```python", *cell.source.splitlines(), "```", *(["", OUTPUT_LABEL, *shown]
                                                             if shown else [])]
    md = nbformat.v4.new_markdown_cell("\n".join(Page.details(f"{title}: {what}", body)))
    md.metadata["tags"] = [SOLUTION_TAG]
    if getattr(cell, "id", None):
        md.id = cell.id
    return md


def _executed_outputs(nb, executed) -> list:
    """The outputs of each cell of `nb` in the build's execution of it (`executed`: the same
    notebook run by the book build), or no outputs where it is missing or differs."""
    if executed is None or [c.source for c in executed.cells] != [c.source for c in nb.cells]:
        return [[] for _ in nb.cells]
    return [c.get("outputs", []) for c in executed.cells]


def trainer_names(versions: dict[str, str]) -> str:
    """"TRL 1.16.0 and verl 0.9.1": the trainers' names as the book writes them."""
    titles = {"trl": "TRL", "verl": "verl"}
    return " and ".join(f"{titles.get(k, k)} {v}" for k, v in sorted(versions.items()))


def recorded_cell(cell, outputs: list, versions: dict[str, str]):
    """A trainer cell's output in the book's build (which had the trainers), as a folded
    Markdown cell under it: where they are missing (Colab, Binder) the cell only says so."""
    body = output_markdown(outputs)
    if not body or not versions:
        return None
    title = f"Output recorded when the book was built, with {trainer_names(versions)}"
    md = nbformat.v4.new_markdown_cell("\n".join(Page.details(title, _trim(body))))
    md.metadata["tags"] = [RECORDED_TAG]
    if getattr(cell, "id", None):
        md.id = f"{cell.id}-recorded"[:64]
    return md


def reader_notebook(doc: str, nb, book: Book, executed=None, trainer_cells=None):
    """The reader notebook of one chapter (nb: the chapter as stored, without outputs;
    executed: the book build's run of it, for the outputs of solutions; trainer_cells: the ids
    of its code cells that need TRL and verl, `needs_trainers`, or None where none do)."""
    page = Page(doc, book)
    new = copy.deepcopy(nb)
    ran = _executed_outputs(nb, executed)
    cells = []
    setup = nbformat.v4.new_code_cell(install_cell_source(book.repo_url, book.branch,
                                                          book.version))
    setup.metadata["tags"] = [INSTALL_TAG]
    _fold(setup, outputs=False)  # its first line says what it is; a click shows the rest
    setup.id = "reader-setup"
    intro = (f"*This notebook is the chapter [{book.titles.get(doc, doc)}]({book.page(doc)}) "
             f"of the book, made to run in Jupyter, Colab or Binder. Run the cells in order; "
             f"the first one installs `rlgates` when it is missing, from the repository's "
             f"`{book.branch}` branch.*")
    trainer_cells = set(trainer_cells or ())
    exercises = False  # inside "## Exercises": a worked solution's output is an answer too
    for cell, outputs in zip(new.cells, ran, strict=True):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "markdown":
            for h in re.finditer(r"^##\s+(.*)$", cell.source, re.M):
                exercises = h.group(1).strip().lower().startswith("exercise")
            cell.source = page.markdown(cell.source)
            if cell.source.strip():  # a cell that held only {solution-end} goes
                cells.append(cell)
            continue
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        cell.outputs = []
        cell.execution_count = None
        if page.in_solution and "remove-cell" in tags:
            continue  # a check of the solution's numbers: the book's execution runs it
        if page.in_solution:
            cells.append(solution_cell(cell, outputs, page.in_solution))
        elif "remove-cell" in tags:
            _fold(cell)  # checks and glue: they run, folded out of the way
            cell.source = signposted(cell.source)
        elif "hide-input" in tags or "remove-input" in tags:
            _fold(cell, outputs=exercises)
        elif "hide-output" in tags:
            _fold(cell, source=False)
        if not page.in_solution:
            cells.append(cell)
            if cell.get("id") in trainer_cells and not tags & {"remove-cell", "remove-output"}:
                shown = recorded_cell(cell, outputs, book.trainers)
                cells.extend([shown] if shown else [])
        fig = cell.metadata.get("mystnb", {}).get("figure", {})
        if fig.get("caption"):
            anchor = f'<a id="{fig["name"]}"></a>' if fig.get("name") else ""
            caption = page.markdown(str(fig["caption"]).strip())
            quoted = "\n".join(f"> {x}" if x.strip() else ">" for x in caption.splitlines())
            cap = nbformat.v4.new_markdown_cell(f"{anchor}\n\n{quoted}".strip())
            cap.id = f"{cell.id}-caption"[:64] if getattr(cell, "id", None) else None
            if page.in_solution:
                cap.source = "\n".join(Page.details("Figure", cap.source.splitlines()))
            cells.append(cap)
    if page.in_solution:
        page.problem("a {solution-start} without {solution-end}")
    if trainer_cells:
        code = [c for c in cells if c.cell_type == "code"]
        mine = [c for c in code if c.get("id") in trainer_cells]
        checks = sum("remove-cell" in c.metadata.get("tags", []) for c in mine)
        recorded = (f" Where one gave an output when the book was built, with "
                    f"{trainer_names(book.trainers)}, that output is folded under it."
                    if book.trainers else "")
        intro += (f"\n\n*{len(mine)} of its {len(code)} code cells ({checks} of them folded "
                  f"checks) need TRL and verl, which Colab and Binder do not install: there "
                  f"each of them prints what to install, and the others run.{recorded}*")
    header = nbformat.v4.new_markdown_cell(intro)
    header.id = "reader-header"
    new.cells = [header, setup, *cells]
    new.metadata.pop("jupytext", None)
    new.metadata.pop("mystnb", None)
    new.metadata.setdefault("colab", {"provenance": []})
    new.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                  "name": "python3"}
    return new


def chapters(root: Path = ROOT) -> list[str]:
    """Docnames of the notebook chapters in the table of contents, in reading order."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    docs = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                docs.append(str(node["file"]).removesuffix(".ipynb").removesuffix(".md"))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    sources = set(chapter_sources.sources(root))
    return [d for d in docs if root / f"{d}.md" in sources]


def installed_trainers() -> dict[str, str]:
    """{"trl": ..., "verl": ...}: the versions installed here (the book's build runs the chapters
    with them), or {} when either is missing."""
    import importlib.metadata

    from rlgates.trainers import _guard

    try:
        return {name: importlib.metadata.version(name) for name in _guard.TRAINER_PACKAGES}
    except importlib.metadata.PackageNotFoundError:
        return {}


def guards_trainers(nb) -> bool:
    """The chapter runs rlgates.trainers.guard_notebook(): some of its cells need the trainers."""
    return any(c.cell_type == "code" and "guard_notebook(" in c.source for c in nb.cells)


def needs_trainers(reader, folder: Path) -> set[str]:
    """The ids of the code cells of a reader notebook that need TRL and verl: run it (in
    `folder`) where they cannot be imported, as on Colab or Binder, and keep the cells that print
    the guard's line (rlgates/trainers/_guard.py) instead of their output."""
    from nbclient import NotebookClient

    from rlgates import trainers
    from rlgates.trainers import _guard

    nb = copy.deepcopy(reader)
    hidden = sorted(_guard.TRAINER_PACKAGES | _guard.COMES_WITH_THEM)
    hide = nbformat.v4.new_code_cell(f"import sys\nfor _name in {hidden!r}:\n"
                                     f"    sys.modules[_name] = None  # cannot be imported")
    nb.cells.insert(0, hide)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    line = "This cell " + _guard.install_line(trainers.TESTED_VERSIONS)
    return {c.get("id") for c in nb.cells[1:] if c.cell_type == "code" and any(
        line in "".join(o.get("text", "")) for o in c.outputs)}


def load_book(root: Path, executed: Path) -> tuple[Book, dict[str, object]]:
    from book_web import book_version  # scripts/, beside this file: the footer's version

    config = read_config(root)
    url, branch = repository(config)
    book = Book(url, branch, terms=glossary_terms(root), version=book_version(root),
                trainers=installed_trainers())
    notebooks = {}
    for doc in chapters(root):
        nb = chapter_sources.read(root / f"{doc}.md")
        notebooks[doc] = nb
        glue_file = executed / f"{doc}.glue.json"
        book.glue[doc] = json.loads(glue_file.read_text()) if glue_file.is_file() else {}
        collect_labels(doc, nb, book)
    return book, notebooks


def executed_notebook(build_dir: Path, nb):
    """The chapter with the outputs the book rendered: from the book's jupyter-cache
    (<build>/.jupyter_cache, _config.yml), or None when it holds no run of this exact code."""
    cache_dir = build_dir / ".jupyter_cache"
    if not cache_dir.is_dir():
        return None
    from jupyter_cache import get_cache

    try:
        _, merged = get_cache(str(cache_dir)).merge_match_into_notebook(copy.deepcopy(nb))
    except KeyError:  # no cached run of this code
        return None
    return merged


def build(root: Path = ROOT, build_dir: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write <build>/reader/<doc>.ipynb for every chapter; returns (paths, problems)."""
    build_dir = build_dir or root / "_build"
    book, notebooks = load_book(root, build_dir / "jupyter_execute")
    out_dir = build_dir / "reader"
    shutil.rmtree(out_dir, ignore_errors=True)
    written = []
    for doc, nb in notebooks.items():
        executed = executed_notebook(build_dir, nb)
        reader = reader_notebook(doc, nb, book, executed)
        if guards_trainers(nb):
            try:
                ids = needs_trainers(reader, (root / doc).parent)
            except Exception as e:  # a problem: the strict build fails on it
                book.problems.append(f"{doc}: run without the trainers failed: {e}"[:2000])
                ids = set()
            reader = reader_notebook(doc, nb, book, executed, ids)
        nbformat.validate(reader)
        path = out_dir / f"{doc}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(reader, str(path))
        written.append(path)
    (out_dir / "problems.json").write_text(json.dumps(book.problems, indent=1))
    return written, book.problems


def serve(written: list[Path], build_dir: Path, html: Path) -> None:
    """Put the reader notebooks where each page's download button points."""
    for path in written:
        target = html / "_sources" / path.relative_to(build_dir / "reader")
        if target.parent.is_dir():
            shutil.copy2(path, target)


# ----------------------------------------------------------------------------- Sphinx
def _build_finished(app, exception):
    if exception is not None or app.builder.name not in ("html", "dirhtml"):
        return
    from sphinx.util import logging

    log = logging.getLogger(__name__)
    build_dir = Path(app.outdir).parent
    written, problems = build(Path(app.srcdir), build_dir)
    serve(written, build_dir, Path(app.outdir))
    for p in problems:
        log.warning(f"reader notebook: {p}")
    log.info(f"reader notebooks: {len(written)} written to {build_dir / 'reader'}")


def repo_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{repo}`tests/test_x.py` (or {repo}`the test <tests/test_x.py>`): a link to that file of
    the repository's sources, for prose that cites a file a reader of the web book cannot open.
    A path that is not in the repository is an error (the strict build fails on it)."""
    from docutils import nodes

    m = REF_WITH_TEXT.match(text)
    label, path = (m.group("text"), m.group("target")) if m else ("", text)
    path = path.strip()
    env = inliner.document.settings.env
    srcdir = Path(env.srcdir)
    if not path or path.startswith(("/", "..")) or not (srcdir / path).exists():
        msg = inliner.reporter.error(f"repo role: {path!r} is not a file of the repository",
                                     line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    url, _ = repository(read_config(srcdir))
    child = nodes.Text(label) if label else nodes.literal(path, path)
    return [nodes.reference(rawtext, "", child, refuri=source_url(url, path),
                            classes=["rlgates-repo-link"])], []


def setup(app):
    app.add_role("repo", repo_role)
    app.connect("build-finished", _build_finished)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build"
    paths, problems = build(ROOT, target.resolve())
    serve(paths, target.resolve(), target.resolve() / "html")
    print(f"{len(paths)} reader notebooks in {target / 'reader'}")
    for p in problems:
        print("problem:", p)
    sys.exit(1 if problems else 0)
