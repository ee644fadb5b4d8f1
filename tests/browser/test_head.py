"""What a page says about itself, and where a reader lands (the reader-experience review, R12 and
R17):

- every page has a description and Open Graph tags of its own, for a link preview: og:title its
  title, og:description and <meta name="description"> its first sentences
  (scripts/book_web.py: page_description); the home page's <title> names the book once;
- one search control in the Tab order, at 1280 px and at 390 px, on every top-level page and the
  first and last page of each folder, and Enter on it opens the search (no header bar holding a
  second one: scripts/book_web.py, _static/book.css);
- the API reference is an index page linking one page per module, none of them near the old
  single page's 795 kB.

The first tests need no book (they run with the unit tests); the others read the built pages.
"""

from __future__ import annotations

import re
import sys
from html import unescape

import pytest
import yaml
from bookserver import ROOT, SCREENSHOTS, Offline
from crawl import DESKTOP, PHONE, pages

sys.path.insert(0, str(ROOT / "scripts"))
import book_web  # noqa: E402

BOOK_TITLE = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["title"]
META = re.compile(r'<meta (name|property)="(description|og:[a-z_]+)" content="([^"]*)"')
API_PAGE_LIMIT = 300_000  # bytes; the one API page was 795 kB (96,310 px tall on a laptop)


# ----------------------------------------------------------------------------- no book needed
def _doctree(rst: str):
    from docutils.core import publish_doctree

    # as Sphinx reads a page: the title stays a section, the prose its children
    return publish_doctree(rst, settings_overrides={"doctitle_xform": False,
                                                    "report_level": 5})


def test_tex_reads_as_text():
    assert book_web.tex_to_text(r"\pi_{\text{ref}}") == "π_ref"
    assert book_web.tex_to_text(r"(A, \log\rho)") == "(A, log ρ)"
    assert book_web.tex_to_text(r"J = f(\rho; A)\,A") == "J = f(ρ; A) A"


def test_description_is_the_first_whole_sentences():
    tree = _doctree("Title\n=====\n\nFirst sentence. Second one, with :math:`\\rho_t`.\n\n"
                    ".. note:: Not this.\n\nThird, in the next paragraph, continued by math:\n")
    assert book_web.page_description(tree) == (
        "First sentence. Second one, with ρ_t. Third, in the next paragraph, continued by math.")
    assert book_web.page_description(tree, limit=40) == "First sentence. Second one, with ρ_t."
    long = _doctree("Title\n=====\n\n" + "word " * 80 + "end.\n")
    got = book_web.page_description(long)
    assert got.endswith("…") and len(got) <= book_web.DESCRIPTION_LIMIT
    assert book_web.page_description(_doctree("Title\n=====\n\n- only a list\n")) == ""
    assert book_web.page_description(None) == ""


# ----------------------------------------------------------------------------- the built pages
def _head(html: str) -> dict[str, list[str]]:
    head = html.split("</head>", 1)[0]
    found: dict[str, list[str]] = {}
    for _, key, content in META.findall(head):
        found.setdefault(key, []).append(unescape(content))
    title = re.search(r"<title>([^<]*)</title>", head)
    found["title"] = [unescape(title.group(1))] if title else []
    return found


@pytest.mark.browser
def test_every_page_has_its_own_description_and_open_graph_tags(book_dir):
    bad, descriptions = [], {}
    for rel in pages(book_dir):
        head = _head((book_dir / rel).read_text(encoding="utf-8"))
        missing = [f"{key}: {head.get(key)}" for key in
                   ("title", "description", "og:title", "og:description", "og:type")
                   if len(head.get(key, [])) != 1 or not head[key][0].strip()]
        if missing:
            bad.append(f"{rel}: not one, non-empty: {', '.join(missing)}")
            continue
        title, og_title = head["title"][0], head["og:title"][0]
        if not title.startswith(og_title):
            bad.append(f"{rel}: og:title {og_title!r} is not the page's title {title!r}")
        if head["og:description"] != head["description"]:
            bad.append(f"{rel}: og:description and description differ")
        descriptions.setdefault(head["description"][0], []).append(rel)
    shared = {d: rels for d, rels in descriptions.items() if len(rels) > 1}
    assert not bad, "\n".join(bad)
    assert not shared, f"pages sharing a description (not their own): {shared}"
    index = _head((book_dir / "index.html").read_text(encoding="utf-8"))
    assert index["title"][0].count(BOOK_TITLE) == 1, index["title"]  # not "T — T"
    assert index["description"][0].startswith("PPO, GRPO, DAPO, SAO, SAPO and GSPO")


@pytest.mark.browser
def test_api_reference_is_an_index_of_module_pages(book_dir):
    index = (book_dir / "api.html").read_text(encoding="utf-8")
    article = index.split('<article class="bd-article">', 1)[-1].split("</article>", 1)[0]
    linked = set(re.findall(r'href="(api/[\w.]+\.html)"', article))
    sources = {f"api/{p.stem}.html" for p in (ROOT / "api").glob("*.md")}
    assert sources and linked == sources, (linked, sources)
    sizes = {rel: (book_dir / rel).stat().st_size for rel in sorted(sources) + ["api.html"]}
    largest = max(sizes, key=sizes.get)
    assert sizes[largest] <= API_PAGE_LIMIT, f"{largest}: {sizes[largest]} bytes"
    for rel in sources:  # each module page documents its names (autodoc's signatures)
        assert 'class="sig-name descname"' in (book_dir / rel).read_text(encoding="utf-8"), rel


#: the docstring blocks wider than their box (they would scroll sideways)
WIDE_DOCSTRINGS = """() => [...document.querySelectorAll('.rlg-docstring pre')]
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1).length"""


@pytest.mark.browser
def test_api_docstrings_wrap_on_a_phone(book_dir, base_url, browser):
    """R12: at 390 px no docstring block scrolls sideways (422 of 434 did), module docstrings
    included. Negative control: at 1280 px, where they keep their lines, some do."""
    rels = ["api.html", *sorted(f"api/{p.name}" for p in (book_dir / "api").glob("*.html"))]
    counts = {}
    for label, viewport, phone in [("phone", PHONE, True), ("desktop", DESKTOP, False)]:
        ctx = Offline(browser, viewport=viewport, is_mobile=phone, has_touch=phone)
        page = ctx.context.new_page()
        try:
            for rel in rels:
                page.goto(base_url + rel, wait_until="load")
                counts[label, rel] = page.evaluate(WIDE_DOCSTRINGS)
                if rel in ("api.html", "api/methods.html"):  # for a person to look at
                    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                    name = rel.replace("/", "-").removesuffix(".html")
                    page.screenshot(path=str(SCREENSHOTS / f"{name}-{label}.png"))
        finally:
            ctx.close()
    wide = {rel: n for (label, rel), n in counts.items() if label == "phone" and n}
    assert not wide, f"docstrings that scroll sideways at 390 px: {wide}"
    assert sum(n for (label, _), n in counts.items() if label == "desktop") > 0


#: the focused element, when it is a search control (a button that opens the search, or a field)
SEARCH_STOP = r"""() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const search = e.matches('.search-button__button, input[type=search], input[name=q]');
  // the page's own content: its article (search.html: its search form and results)
  return {search, inArticle: !!e.closest('.bd-article, .bd-search-container'),
          where: (e.closest('header, nav, .bd-sidebar-primary, .bd-header-article') || {}).className
                 || e.tagName};
}"""
MAX_TABS = 150  # more stops than the header, the sidebar and the article header hold


def _search_stops(page) -> list[str]:
    """Tab from the top of the page to the article's first stop: the search controls passed."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); "
                  "window.scrollTo(0, 0); }")
    stops = []
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        got = page.evaluate(SEARCH_STOP)
        if got is None:
            continue
        if got["inArticle"]:
            return stops
        if got["search"]:
            stops.append(got["where"])
    raise AssertionError(f"no article stop after {MAX_TABS} Tabs")


def _one_of_each_kind(rels: list[str]) -> list[str]:
    """Every top-level page, and the first and last page of each folder (chapters/, api/): a
    folder's pages share one template, and a real Tab through a page takes a second or more."""
    folders: dict[str, list[str]] = {}
    for rel in rels:
        folders.setdefault(rel.rpartition("/")[0], []).append(rel)
    return [rel for folder, got in folders.items()
            for rel in (got if not folder else sorted({got[0], got[-1]}))]


def test_one_of_each_kind_keeps_every_top_level_page():
    rels = ["index.html", "search.html", "api/a.html", "api/b.html", "api/c.html",
            "chapters/01.html"]
    assert _one_of_each_kind(rels) == ["index.html", "search.html", "api/a.html", "api/c.html",
                                       "chapters/01.html"]


@pytest.mark.browser
@pytest.mark.parametrize("label", ["desktop", "phone"])
def test_one_search_in_the_tab_order(book_dir, base_url, browser, label):
    viewport, phone = {"desktop": (DESKTOP, False), "phone": (PHONE, True)}[label]
    ctx = Offline(browser, viewport=viewport, is_mobile=phone, has_touch=phone)
    page, bad = ctx.context.new_page(), []
    try:
        for rel in _one_of_each_kind(pages(book_dir)):
            page.goto(base_url + rel, wait_until="load")
            stops = _search_stops(page)
            if len(stops) != 1:
                bad.append(f"{rel}: {len(stops)} search stops before the article: {stops}")
        # the one stop opens the search: its dialog, with the cursor in its field
        page.goto(base_url + "index.html", wait_until="load")
        for _ in range(MAX_TABS):
            page.keyboard.press("Tab")
            if (page.evaluate(SEARCH_STOP) or {}).get("search"):
                break
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#pst-search-dialog').open")
        assert page.evaluate("() => document.activeElement.closest('#pst-search-dialog') "
                             "!== null && document.activeElement.name === 'q'")
    finally:
        ctx.close()
    assert not bad, "\n".join(bad)
