"""Sphinx extension (see _config.yml, sphinx.local_extensions): the web book's own assets.

- Serves MathJax from the book's `_static/mathjax/` (installed by scripts/offline_assets.py at
  set-up time; installed here too if missing), so that no page fetches anything from a CDN.
- Adds the gate explorer's script, style and data (from rlgates at build time) to explorer.html
  only. Its files live in scripts/explorer/, outside `_static/`, because Jupyter Book adds every
  .js and .css under `_static/` to every page.
- The role {explorer}`sapo`: a link "open SAPO in the gate explorer" to explorer.html#sapo,
  relative to the page it is on (the explorer opens at that method).
- Lighter pages (after the build, in every page): no fontawesome.js (1.4 MB; the theme's CSS
  already draws its icons from the Font Awesome web fonts, and the JS only serves custom icons),
  no search index and search scripts outside search.html (search-as-you-type is off), and the
  theme CSS keeps only the Font Awesome icon rules that some page or script uses; then
  scripts/lighter_assets.py prunes the theme's style sheets, subsets the icon fonts and unlinks
  unused extension assets (see there).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from docutils import nodes

HERE = Path(__file__).resolve().parent
EXPLORER_STATIC = HERE / "explorer"
EXPLORER_PAGE = "explorer"


def _config_inited(app, config):
    sys.path.insert(0, str(HERE))
    import offline_assets

    offline_assets.ensure_mathjax(quiet=True)
    # pydata-sphinx-theme logs a console error ("Got invalid theme mode") on a reader's first visit
    # when no default mode is set; "auto" follows the reader's system light/dark preference.
    config.html_context = {"default_mode": "auto", **(config.html_context or {})}
    # absolute paths: Sphinx joins them to the conf dir unchanged
    config.html_static_path = [*config.html_static_path, str(offline_assets.VENDOR),
                               str(EXPLORER_STATIC)]


TAG = re.compile(r"\\tag\*?\{[^{}]*\}")


def _tag_outside_split(app, doctree, docname):
    """A display equation with a line break (`\\\\`, e.g. in `cases`) and a `\\tag{7.1}`: Sphinx
    wraps its body in `split`, where MathJax forbids \\tag ("\\tag not allowed in split
    environment"). Move the tag outside the split, so the equation renders with its number."""
    for node in doctree.findall(nodes.math_block):
        latex = node.astext()
        tags = TAG.findall(latex)
        if node.get("nowrap") or "\\\\" not in latex or len(tags) != 1 or "\n\n" in latex.strip():
            continue
        body = TAG.sub("", latex).strip()
        node[:] = [nodes.Text(rf"\[\begin{{split}}{body}\end{{split}}{tags[0]}\]")]
        node["nowrap"] = True


def _drop_widget_state(app, pagename, templatename, context, doctree):
    """Drop the ipywidgets state myst-nb embeds (tens of kB per slider): with no widget manager
    on the page (nb_ipywidgets_js is empty, so nothing comes from a CDN) nothing could use it."""
    meta = getattr(app.env, "nb_metadata", {}).get(pagename, {})
    meta.get("js_files", {}).pop("ipywidgets_state", None)


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated inline scripts: sphinx-thebe's config line (`const THEBE_JS_URL = ...`)
    is added twice (once with filename None, once with ""), a SyntaxError on every page."""
    seen, kept = set(), []
    for js in context.get("script_files", []):
        key = (getattr(js, "filename", str(js)) or "", getattr(js, "attributes", {}).get("body"))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    if "script_files" in context:
        context["script_files"][:] = kept


def _page_context(app, pagename, templatename, context, doctree):
    if pagename != EXPLORER_PAGE:
        return
    from rlgates._book.explorer_data import explorer_json

    data = explorer_json().replace("</", "<\\/")
    app.add_css_file("explorer.css")
    app.add_js_file(None, body=f"window.RLGATES_EXPLORER = {data};")
    app.add_js_file("explorer.js", defer="defer")


class explorer_link(nodes.reference):
    """A link to the explorer at one method; its URI is set per builder in _resolve_explorer."""


def explorer_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """{explorer}`sapo` -> "open SAPO in the gate explorer", linking explorer.html#sapo."""
    method = text.strip()
    try:
        from rlgates._book.explorer_data import explorer_methods, method_entry

        offered = explorer_methods()
    except Exception as err:  # pragma: no cover - rlgates is installed with the book
        msg = inliner.reporter.error(f"explorer role: cannot import rlgates ({err})", line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    if method not in offered:
        msg = inliner.reporter.error(
            f"explorer role: {method!r} is not in the gate explorer (offered: {offered})",
            line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    title = method_entry(method)["title"]
    node = explorer_link(rawtext, "", nodes.Text(f"open {title} in the gate explorer"),
                         method=method, internal=True, classes=["rlgates-explorer-link"])
    return [node], []


def _resolve_explorer(app, doctree, docname):
    """Give every {explorer} link its URI relative to the page it is on."""
    for node in list(doctree.findall(explorer_link)):
        try:
            uri = app.builder.get_relative_uri(docname, EXPLORER_PAGE)
        except Exception:  # a builder without page URIs (e.g. LaTeX): keep the text only
            node.replace_self(nodes.Text(node.astext()))
            continue
        ref = nodes.reference(node.rawsource, "", *node.children, internal=True,
                              refuri=f"{uri}#{node['method']}", classes=node["classes"])
        node.replace_self(ref)


FONTAWESOME_JS = re.compile(r'[ \t]*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*">'
                            r"</script>\n?")
SEARCH_JS = re.compile(r'[ \t]*<script src="[^"]*(?:_static/searchtools\.js|'
                       r'_static/language_data\.js|searchindex\.js)"></script>\n?')
FA_RULE = re.compile(r'((?:\.fa-[a-z0-9-]+:(?::)?before,?)+)\{content:"[^"]*"\}')
FA_NAME = re.compile(r"\bfa-[a-z0-9-]+")


def _lighter_pages(app, exc):
    """Drop what no page needs (see the module docstring); logs what it removed."""
    if exc is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    static = out / "_static"
    used, n_pages = set(), 0
    for page in out.rglob("*.html"):
        if static in page.parents:
            continue
        html = page.read_text(encoding="utf-8")
        new = FONTAWESOME_JS.sub("", html)
        if page.name != "search.html" or page.parent != out:
            new = SEARCH_JS.sub("", new)
        used |= set(FA_NAME.findall(new))
        if new != html:
            page.write_text(new, encoding="utf-8")
            n_pages += 1
    for script in static.rglob("*.js"):  # icons a script may add (theme switch, full screen)
        if script.name != "fontawesome.js":
            used |= set(FA_NAME.findall(script.read_text(encoding="utf-8", errors="replace")))
    for name in ("fontawesome.js", "fontawesome.js.map", "fontawesome.js.LICENSE.txt"):
        (static / "scripts" / name).unlink(missing_ok=True)
    css = static / "styles" / "pydata-sphinx-theme.css"
    before = after = 0
    if css.is_file():
        text = css.read_text(encoding="utf-8")

        def keep(m):
            sels = [s for s in m.group(1).split(",") if s and FA_NAME.search(s).group(0) in used]
            return f"{','.join(sels)}{{{m.group(0).split('{', 1)[1]}" if sels else ""

        new = FA_RULE.sub(keep, text)
        before, after = len(text), len(new)
        css.write_text(new, encoding="utf-8")
    from sphinx.util import logging

    logging.getLogger(__name__).info(
        f"book_web: lighter pages: {n_pages} pages without fontawesome.js and (but search.html) "
        f"the search index; theme CSS {before // 1024} -> {after // 1024} kB "
        f"({len(used)} icon names kept)")
    import lighter_assets  # scripts/ is on sys.path (_config_inited)

    logging.getLogger(__name__).info(f"book_web: {lighter_assets.lighten(out)}")


def _exercise_numbers_only(app, env):
    """Number the exercises per chapter ("Exercise 8.1", and "Solution to Exercise 8.1"), and
    nothing else that numfig numbers: the captions name the article's figures themselves
    ("Figure 3: ..."), so a second, book-wide number would only confuse. sphinx-exercise needs
    numfig on for any number; Sphinx numbers every enumerable node book-wide, in reading order."""
    for docname, numbers in env.toc_fignumbers.items():
        for kind in ("figure", "table", "code-block"):
            numbers.pop(kind, None)
        exercises = numbers.get("exercise", {})
        chapter = re.match(r"chapters/(\d+)_", docname)
        prefix = (int(chapter.group(1)),) if chapter else ()
        for k, ident in enumerate(sorted(exercises, key=exercises.get), 1):
            exercises[ident] = (*prefix, k)
    return []


def setup(app):
    app.connect("config-inited", _config_inited)
    # after Sphinx's toctree collector numbered them (priority 500)
    app.connect("env-get-updated", _exercise_numbers_only, priority=900)
    app.add_role("explorer", explorer_role)
    app.connect("build-finished", _lighter_pages)
    app.connect("doctree-resolved", _tag_outside_split)
    app.connect("doctree-resolved", _resolve_explorer)
    app.connect("html-page-context", _drop_widget_state, priority=400)  # before myst-nb's (500)
    app.connect("html-page-context", _page_context)
    app.connect("html-page-context", _dedupe_scripts, priority=900)  # after everyone's scripts
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
