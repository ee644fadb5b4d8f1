"""Sphinx extension (see _config.yml): the API reference page (api.md) from rlgates' docstrings.

autodoc finds every public name; its docstring is shown as written, in a literal block, so that
the formula-first plain-text style of the docstrings (Σ, ρ, indented cases) needs no reST markup
and can never break the build, which runs with warnings as errors.
"""

from __future__ import annotations


def _verbatim(app, what, name, obj, options, lines):
    if not any(line.strip() for line in lines):
        return
    body = [f"   {line}" if line.strip() else "" for line in lines]
    lines[:] = ["::", "", *body, ""]


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.config.autodoc_typehints = "none"  # the docstrings say the shapes and types in words
    app.config.autodoc_member_order = "bysource"
    app.connect("autodoc-process-docstring", _verbatim)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
