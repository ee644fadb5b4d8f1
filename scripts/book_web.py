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
  unused extension assets (see there); then lighter_assets.typeset_math typeset every page's
  formulas in headless Chromium (the browser tests' one), so that no page but the explorer loads
  MathJax's scripts (without Chromium the pages keep MathJax, as before).
- Launch buttons only where there is a notebook: a chapter's download, Colab and Binder buttons
  name its reader notebook, `chapters/NN_name.ipynb`, as the notebooks branch holds it
  (scripts/notebooks_branch.py); a page with no reader notebook (the home page, Conventions,
  the glossary, ...) shows neither the launch buttons nor an .ipynb download.
- Every page's footer says what the book is: its licences (code MIT, text and figures CC BY 4.0),
  how to cite it (from CITATION.cff), the rlgates version and the build's date and commit.
- Every page's <head> has its own description and Open Graph tags, for a link preview (its title,
  its first sentences: page_description); the home page's <title> names the book once. No header
  bar: its only item was a second search field beside the sidebar's.
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
    # navbar_persistent: no header bar. pydata-sphinx-theme 0.17 puts a search field there unless
    # the option is set, and sphinx-book-theme's sidebar has its own: two Search stops (R17)
    config.html_theme_options = {**(config.html_theme_options or {}), "navbar_persistent": [],
                                 "extra_footer": footer_html(Path(app.srcdir))}


def book_version(root: Path) -> str:
    """The rlgates version the book was built with (rlgates/__init__.py's __version__)."""
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', (root / "rlgates" / "__init__.py")
                  .read_text(encoding="utf-8"), re.M)
    return m.group(1) if m else "unknown"


def _build_stamp(root: Path) -> tuple[str, str]:
    """(the build's date, YYYY-MM-DD in UTC, or SOURCE_DATE_EPOCH's; the commit, short, or "")."""
    import datetime as dt
    import os
    import subprocess

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch and epoch.isdigit()
            else dt.datetime.now(dt.UTC))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return when.strftime("%Y-%m-%d"), commit


def footer_html(root: Path) -> str:
    """The footer line of every page: licences, citation, version, build date and commit."""
    from html import escape

    import yaml

    cff = yaml.safe_load((root / "CITATION.cff").read_text(encoding="utf-8"))
    repo = (yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
            .get("repository", {}).get("url", cff.get("repository-code", ""))).rstrip("/")
    version = book_version(root)
    date, commit = _build_stamp(root)
    authors = ", ".join(a.get("name") or f"{a.get('given-names', '')} {a.get('family-names', '')}"
                        .strip() for a in cff.get("authors", []))
    year = date[:4]
    cite = (f"{authors} ({year}). <em>{escape(cff['title'])}</em>, version {escape(version)}. "
            f"{escape(cff.get('url', ''))}")
    made = f"from commit <code>{escape(commit)}</code> " if commit else ""
    return (
        '<div class="rlg-footer">'
        f'<p class="rlg-licence">Text and figures: <a href="{repo}/blob/main/LICENSE-CONTENT" '
        'rel="license">CC BY 4.0</a>; code (rlgates, the chapters\' code cells): '
        f'<a href="{repo}/blob/main/LICENSE" rel="license">MIT</a>.</p>'
        f'<p class="rlg-cite">How to cite: {cite} '
        f'(<a href="{repo}/blob/main/CITATION.cff">CITATION.cff</a>)</p>'
        f'<p class="rlg-version">rlgates <span class="rlg-version-number">{escape(version)}'
        f'</span>; built {made}on <time datetime="{date}">{date}</time>.</p>'
        "</div>")


def _launch_buttons(app, pagename, templatename, context, doctree):
    """Launch buttons (and the .ipynb download) only on pages with a reader notebook, and
    naming it (see the module docstring). After sphinx-book-theme's handlers (priority 501)."""
    buttons = context.get("header_buttons")
    if buttons is None:
        return
    has_notebook = pagename in _reader_docs(app)
    kept = []
    for group in buttons:
        label = group.get("label") if isinstance(group, dict) else None
        if label == "launch-buttons":
            if not has_notebook:
                continue
            for b in group.get("buttons", []):
                if b.get("url"):
                    b["url"] = re.sub(rf"{re.escape(pagename)}\.(?:md|ipynb)\b",
                                      f"{pagename}.ipynb", b["url"])
        elif label == "download-buttons" and not has_notebook:
            group["buttons"] = [b for b in group.get("buttons", [])
                                if b.get("label") != "download-notebook-button"]
        kept.append(group)
    buttons[:] = kept
    if not has_notebook:
        context.pop("ipynb_source", None)


#: TeX in a description (plain text): the book's few symbols, then macros and braces dropped
TEX_SYMBOLS = {"rho": "ρ", "pi": "π", "theta": "θ", "varepsilon": "ε", "epsilon": "ε",
               "nabla": "∇", "cdot": "·", "log": "log ", "beta": "β", "mu": "μ", "sigma": "σ"}
#: pages with no prose of their own: (title, description)
GENERATED_PAGES = {
    "search": ("Search", "Search the book's pages."),
    "genindex": ("Index", "The book's index: every name of the rlgates API and every glossary "
                          "term, in alphabetical order."),
    "py-modindex": ("Python Module Index", "The modules of rlgates, each linked to its API page."),
}
DESCRIPTION_LIMIT = 200


def tex_to_text(tex: str) -> str:
    """$\\pi_{\\text{ref}}$ -> π_ref, $(A, \\log\\rho)$ -> (A, log ρ): math readable as text."""
    tex = re.sub(r"\\(?:text|rm|mathrm|operatorname)\s*\{([^{}]*)\}", r"\1", tex)
    tex = re.sub(r"\\rm\s*", "", tex)
    tex = re.sub(r"\\([A-Za-z]+)\s*", lambda m: TEX_SYMBOLS.get(m.group(1), ""), tex)
    tex = re.sub(r"\\[,;:! ]", " ", tex)
    return " ".join(tex.replace("{", "").replace("}", "").split())


def _prose(node) -> str:
    """A node's text, its math as text (tex_to_text)."""
    return "".join(tex_to_text(n.astext()) if isinstance(n, nodes.math) else
                   n.astext() if isinstance(n, nodes.Text) else _prose(n) for n in node.children)


def page_description(doctree, limit: int = DESCRIPTION_LIMIT) -> str:
    """A page's own summary for link previews: the whole sentences of its first paragraph (of
    the first ones, when that is short) that fit in `limit` characters, or the first sentence cut
    at a word. A paragraph that a display equation continues (", :" at its end) ends there."""
    texts = []
    for p in doctree.findall(nodes.paragraph) if doctree is not None else ():
        if not isinstance(p.parent, nodes.section):  # not in a cell, list, note or API entry
            continue
        text = " ".join(_prose(p).split())
        texts.append(re.sub(r"[,:;]$", ".", text))
        if sum(map(len, texts)) >= limit // 2:
            break
    out = ""
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", " ".join(texts)):
        if len(out) + len(sentence) + 1 > limit:
            break
        out = f"{out} {sentence}".strip()
    if not out and texts:
        out = texts[0][:limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    return out


def _page_meta(app, pagename, templatename, context, doctree):
    """Every page gets a description and Open Graph tags, for a link preview (R17): its title
    and its own description (page_description); the home page's <title> is set in _lighter_pages
    (DOUBLE_TITLE)."""
    from html import escape, unescape

    title, docs = context.get("title") or "", context.get("docstitle") or ""
    generated_title, desc = GENERATED_PAGES.get(pagename, ("", page_description(doctree)))
    if not desc:
        import yaml

        cff = yaml.safe_load((Path(app.srcdir) / "CITATION.cff").read_text(encoding="utf-8"))
        desc = " ".join(str(cff.get("abstract", "")).split())
    page_title = unescape(re.sub(r"<[^>]+>", "", title)) or generated_title or docs
    context["metatags"] = context.get("metatags", "") + (
        f'\n    <meta name="description" content="{escape(desc)}" />'
        f'\n    <meta property="og:title" content="{escape(page_title)}" />'
        f'\n    <meta property="og:site_name" content="{escape(docs)}" />'
        f'\n    <meta property="og:description" content="{escape(desc)}" />'
        '\n    <meta property="og:type" content="book" />')


def _reader_docs(app) -> set[str]:
    """The docnames that have a reader notebook (scripts/reader_notebooks.py: the chapters)."""
    docs = getattr(app, "_rlgates_reader_docs", None)
    if docs is None:
        import reader_notebooks  # scripts/ is on sys.path (_config_inited)

        docs = app._rlgates_reader_docs = set(reader_notebooks.chapters(Path(app.srcdir)))
    return docs


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


#: what a method's side inputs are, for the explorer's note on the methods it leaves out
SIDE_INPUTS = {"probs_old": "the old policy's probability π_old", "picked": "the batch's pick",
               "entropy": "each token's entropy", "sampler_logp": "the sampler's log-probs"}


def explorer_note() -> str:
    """The explorer page's line on the registered methods it does not offer, and why."""
    from rlgates._book.explorer_data import explorer_methods
    from rlgates.methods import REGISTRY, names

    offered = set(explorer_methods())
    left = [n for n in names() if n not in offered]
    if not left:
        return ""
    reads: dict[str, list[str]] = {}  # what the gate also reads -> the methods
    other = []
    for n in left:
        m = REGISTRY[n]
        side = " and ".join(SIDE_INPUTS.get(x, x) for x in getattr(m, "side_inputs", ()))
        if side:
            reads.setdefault(side, []).append(m.title)
        else:
            other.append(f"{m.title}: it has no browser formula")
    parts = [*other]
    if reads:
        n_reads = sum(map(len, reads.values()))
        parts.append(f"{n_reads} methods whose gate reads more than the token's (ρ, A): "
                     + ", ".join(f"{' and '.join(ms)} ({what})" for what, ms in reads.items()))
    return (f"The explorer offers {len(offered)} of the {len(offered) + len(left)} methods in "
            f"rlgates. Not here: {'; '.join(parts)}. Their chapters show their gates as figures.")


def _explorer_note(app, doctree, docname):
    """Under the explorer widget: which methods it leaves out, and why (R11)."""
    if docname != EXPLORER_PAGE:
        return
    text = explorer_note()
    for node in doctree.findall(nodes.raw):
        if "rlgates-explorer" in node.astext() and text:
            note = nodes.paragraph("", text, classes=["rlg-explorer-omitted"])
            node.parent.insert(node.parent.index(node) + 1, note)
            return


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
#: a <title> that says the book's title twice ("T — T": the home page, whose title is the book's)
DOUBLE_TITLE = re.compile(r"<title>(?P<t>[^<]+?) &#8212; (?P=t)</title>")
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
        new = DOUBLE_TITLE.sub(r"<title>\g<t></title>", FONTAWESOME_JS.sub("", html))
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
    # the formulas typeset once, here, instead of in every reader's browser (R9: about 750 kB of
    # MathJax per page, and seconds of TeX source on a slow link)
    logging.getLogger(__name__).info(f"book_web: {lighter_assets.typeset_math(out)}")


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
    app.connect("doctree-resolved", _explorer_note)
    app.connect("html-page-context", _drop_widget_state, priority=400)  # before myst-nb's (500)
    app.connect("html-page-context", _page_context)
    app.connect("html-page-context", _dedupe_scripts, priority=900)  # after everyone's scripts
    app.connect("html-page-context", _launch_buttons, priority=600)  # after the theme's (501)
    app.connect("html-page-context", _page_meta)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
