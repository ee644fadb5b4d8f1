"""Sphinx extension (see _config.yml): the API reference (one page per module, api/*.md, which
api.md links) from rlgates' docstrings.

autodoc finds every public name; its docstring is shown as written, in literal blocks, so that
the formula-first plain-text style of the docstrings (Σ, ρ, indented cases) needs no reST markup
and can never break the build, which runs with warnings as errors. The prose is plain text (no
colours: Sphinx's default would colour it as Python); a doctest example (`>>>` lines, up to the
next blank line) is Python, coloured as a Python session. Signatures are autodoc's own.
"""

from __future__ import annotations

PROSE = "text"  # Pygments' plain-text lexer: no token colours
EXAMPLE = "pycon"  # a Python session: prompts, names, strings and comments coloured
DOCSTRING_CLASS = "rlg-docstring"  # on every block of a docstring (the browser tests find them)


def docstring_blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Split a docstring into (language, lines) runs: EXAMPLE for a doctest block (a `>>>` line
    and the lines after it up to a blank line, as reST reads one), PROSE for the rest. Blank lines
    at the ends of a run are dropped."""
    blocks: list[tuple[str, list[str]]] = []
    example = False
    for line in lines:
        if not line.strip():
            example = False
        elif line.lstrip().startswith(">>>"):
            example = True
        language = EXAMPLE if example else PROSE
        if not blocks or blocks[-1][0] != language:
            blocks.append((language, []))
        blocks[-1][1].append(line)
    out = []
    for language, run in blocks:
        while run and not run[-1].strip():
            run.pop()
        while run and not run[0].strip():
            run.pop(0)
        if run:
            out.append((language, run))
    return out


def _verbatim(app, what, name, obj, options, lines):
    rst: list[str] = []
    for language, run in docstring_blocks(lines):
        indent = min(len(line) - len(line.lstrip()) for line in run if line.strip())
        body = [f"   {line[indent:]}" if line.strip() else "" for line in run]
        rst += [f".. code-block:: {language}", f"   :class: {DOCSTRING_CLASS}", "", *body, ""]
    lines[:] = rst


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.config.autodoc_typehints = "none"  # the docstrings say the shapes and types in words
    app.config.autodoc_member_order = "bysource"
    app.connect("autodoc-process-docstring", _verbatim)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
