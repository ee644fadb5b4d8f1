"""The reader's path through the built book (the reader-experience review, R1, R2, R5, R6, R7,
R10): the navigation drawers on a phone and the sidebar toggle on a laptop, the launch buttons
of every page against the notebooks branch, a tap on a solution's title, glossary links that
land on their term, Back closing an enlarged figure, and prev/next links that fit a phone.

Run: `python -m pytest tests/browser -m browser -k reader_path` after `python3 tasks.py book`.
"""

from __future__ import annotations

import re
import sys
from html import unescape
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from bookserver import ROOT, SCREENSHOTS
from crawl import DESKTOP, PHONE, Tab, pages

pytestmark = pytest.mark.browser

sys.path.insert(0, str(ROOT / "scripts"))
READER = ROOT / "_build" / "reader"
CHAPTER = "chapters/07_sapo.html"
HREF = re.compile(r'<a\b[^>]*\bhref="([^"]+)"', re.I)
LINK = re.compile(r'<a\b[^>]*\bhref="([^"]+)"[^>]*>(.*?)</a>', re.I | re.S)


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


def _visible_toggle(page, cls: str):
    """The visible sidebar toggle of the page (the article header's), not the hidden one of the
    header bar, which pydata-sphinx-theme 0.17 listens on."""
    toggle = page.locator(f".{cls}:visible").first
    toggle.wait_for()
    return toggle


# ---- R1: navigation on every device -------------------------------------------------------
def test_phone_drawers_open_and_their_links_navigate(base_url, offline):
    """At 390 px a tap on the hamburger opens the navigation drawer, and a tap on a chapter in
    it goes there; a tap on the contents icon opens "On this page", and a tap on a section in it
    goes to that section."""
    ctx = offline(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + CHAPTER, "ch07 phone")
    _visible_toggle(page, "primary-toggle").tap()
    page.wait_for_selector("#pst-primary-sidebar-modal[open]", timeout=10_000)
    link = page.locator("#pst-primary-sidebar-modal a.reference.internal[href*='08_gspo']").first
    link.scroll_into_view_if_needed()
    _shot(page, "nav-phone-drawer.png")
    link.tap()
    page.wait_for_url("**/08_gspo.html", timeout=30_000)
    page.wait_for_load_state("load")
    _visible_toggle(page, "secondary-toggle").tap()
    page.wait_for_selector("#pst-secondary-sidebar-modal[open]", timeout=10_000)
    _shot(page, "nav-phone-on-this-page.png")
    section = page.locator("#pst-secondary-sidebar-modal a.nav-link[href^='#']").nth(1)
    target = section.get_attribute("href")
    section.tap()
    page.wait_for_function("h => location.hash === h", arg=target, timeout=10_000)
    assert not problems, problems


def test_laptop_sidebar_toggle_collapses_and_restores(base_url, offline):
    """At 1280 px a click on the hamburger hides the navigation sidebar (the article widens), a
    second click brings it back, and a chapter link in it navigates."""
    ctx = offline(viewport=DESKTOP)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + CHAPTER, "ch07 desktop")
    article = page.locator(".bd-main")
    sidebar = page.locator("#pst-primary-sidebar")
    width = article.evaluate("e => e.getBoundingClientRect().width")
    toggle = _visible_toggle(page, "primary-toggle")
    toggle.click()
    page.wait_for_function("() => document.querySelector('#pst-primary-sidebar')"
                           ".classList.contains('pst-sidebar-hidden')", timeout=10_000)
    page.wait_for_function("w => document.querySelector('.bd-main').getBoundingClientRect()"
                           ".width > w + 100", arg=width, timeout=10_000)
    _shot(page, "nav-desktop-collapsed.png")
    toggle.click()
    page.wait_for_function("() => !document.querySelector('#pst-primary-sidebar')"
                           ".classList.contains('pst-sidebar-hidden')", timeout=10_000)
    assert sidebar.is_visible()
    assert not page.locator("#pst-primary-sidebar-modal[open]").count()  # no drawer at 1280 px
    sidebar.locator("a.reference.internal[href*='08_gspo']").first.click()
    page.wait_for_url("**/08_gspo.html", timeout=30_000)
    assert not problems, problems


# ---- R2: every launch button opens a notebook -----------------------------------------------
def _launch_links(html: str) -> dict[str, list[str]]:
    """The header's launch and download links of a built page: {"colab", "binder", "ipynb"}."""
    out: dict[str, list[str]] = {"colab": [], "binder": [], "ipynb": []}
    for href in map(unescape, HREF.findall(html)):
        u = urlsplit(href)
        if u.hostname == "colab.research.google.com":
            out["colab"].append(href)
        elif u.hostname == "mybinder.org":
            out["binder"].append(href)
        elif u.path.endswith(".ipynb") and "_sources/" in u.path:
            out["ipynb"].append(href)
    return out


def _branch_path(kind: str, url: str, repo: str, branch: str) -> str:
    """The file of the notebooks branch a launch URL opens (or a description of what is wrong)."""
    u = urlsplit(url)
    if kind == "colab":
        prefix = f"/github/{repo}/blob/{branch}/"
        return u.path[len(prefix):] if u.path.startswith(prefix) else f"(not {prefix}): {url}"
    if not u.path.startswith(f"/v2/gh/{repo}/{branch}"):
        return f"(not /v2/gh/{repo}/{branch}): {url}"
    (urlpath,) = parse_qs(u.query)["urlpath"]
    return urlpath.removeprefix("lab/tree/")


def test_every_launch_button_opens_a_file_of_the_notebooks_branch(book_dir, tmp_path):
    """On every page that has a reader notebook, the Colab and Binder buttons open a file of the
    notebooks branch as the workflow lays it out (scripts/notebooks_branch.py), and the .ipynb
    download serves that same notebook; pages without one (the home page, Conventions, ...) show
    no launch button and no .ipynb download."""
    import notebooks_branch
    import reader_notebooks

    if not (READER / "chapters").is_dir():
        pytest.fail(f"no reader notebooks in {READER}: build the book")
    branch_tree = tmp_path / "branch"
    files = {p.as_posix() for p in notebooks_branch.assemble(branch_tree)}
    url, branch = reader_notebooks.repository(reader_notebooks.read_config(ROOT))
    repo = urlsplit(url).path.strip("/")
    with_notebook = {f"{d}.html" for d in reader_notebooks.chapters(ROOT)}
    assert len(with_notebook) >= 20, with_notebook
    bad, seen = [], 0
    for rel in pages(book_dir):
        links = _launch_links((book_dir / rel).read_text(encoding="utf-8"))
        if rel not in with_notebook:
            extra = [u for kind in links for u in links[kind]]
            if extra:
                bad.append(f"{rel}: no reader notebook, but buttons to {extra}")
            continue
        want = rel.removesuffix(".html") + ".ipynb"
        for kind in ("colab", "binder"):
            if not links[kind]:
                bad.append(f"{rel}: no {kind} button")
            for u in links[kind]:
                seen += 1
                path = _branch_path(kind, u, repo, branch)
                if path not in files:
                    bad.append(f"{rel}: {kind} opens {path!r}, not a file of the branch")
                elif path != want:
                    bad.append(f"{rel}: {kind} opens {path}, not {want}")
        if not links["ipynb"]:
            bad.append(f"{rel}: no .ipynb download")
        for u in links["ipynb"]:
            local = (book_dir / rel).parent / unquote(urlsplit(u).path)
            if not local.resolve().is_file():
                bad.append(f"{rel}: .ipynb download {u} is not in the book")
            elif local.resolve().read_bytes() != (branch_tree / want).read_bytes():
                bad.append(f"{rel}: .ipynb download {u} is not the branch's {want}")
    assert seen >= 2 * len(with_notebook), seen
    assert not bad, "\n".join(bad)


# ---- R5: a solution opens on a tap anywhere on its title -------------------------------------
def test_a_tap_on_a_solution_title_opens_it(base_url, offline):
    """At 390 px a tap at the centre of "Solution to Exercise 7.1" (the link to the exercise)
    opens the solution and stays where it is; folded, the box is no taller than its title."""
    ctx = offline(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + CHAPTER, "ch07 phone solution")
    solution = page.locator(".solution.dropdown").first
    title = solution.locator(":scope > .admonition-title")
    title.scroll_into_view_if_needed()
    folded = solution.evaluate("s => [s.getBoundingClientRect().height, "
                               "s.querySelector('.admonition-title').getBoundingClientRect().height]")
    assert folded[0] <= folded[1] + 4, f"folded solution {folded[0]:.0f} px, title {folded[1]:.0f} px"
    url = page.url
    link = title.locator("a.reference").first
    box = link.bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("s => !s.classList.contains('toggle-hidden')",
                           arg=solution.element_handle(), timeout=10_000)
    assert page.url == url, f"the tap went to {page.url}"
    solution.scroll_into_view_if_needed()
    _shot(page, "solution-phone-open.png")
    assert not problems, problems


# ---- R6: glossary links land on their term --------------------------------------------------
def test_glossary_links_land_on_their_term(book_dir):
    """Every link from a page's text to the glossary names a term's anchor that the glossary
    has; none lands at the top of the 6,000-12,000 px page."""
    glossary = (book_dir / "glossary.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'\bid="([^"]+)"', glossary))
    bad, seen = [], 0
    for rel in pages(book_dir):
        if rel in ("glossary.html", "genindex.html", "search.html"):
            continue
        html = (book_dir / rel).read_text(encoding="utf-8")
        article = html.split('<article class="bd-article"', 1)[-1].split("</article>", 1)[0]
        for href, text in LINK.findall(article):
            href, u = unescape(href), urlsplit(unescape(href))
            if u.scheme or not u.path.endswith("glossary.html"):
                continue
            if not u.fragment and re.sub(r"<[^>]+>", "", text).strip().lower() == "glossary":
                continue  # a link to the glossary itself ("see the Glossary"), not to a term
            seen += 1
            if not u.fragment.startswith("term-") or u.fragment not in ids:
                bad.append(f"{rel}: {href}")
    assert seen >= 10, f"only {seen} glossary links found"
    assert not bad, f"{len(bad)} glossary links without their term:\n" + "\n".join(bad)


# ---- R7: Back closes an enlarged figure ------------------------------------------------------
def test_back_closes_an_enlarged_figure(base_url, offline):
    """At 390 px: a tap enlarges a figure; the phone's Back closes it and stays on the page (and
    a second Back would leave it: the view added one history entry, which its close button also
    removes)."""
    ctx = offline(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + CHAPTER, "ch07 phone zoom")
    figure = page.locator(".bd-article a.image-reference img").first
    figure.scroll_into_view_if_needed()
    url, depth = page.url, page.evaluate("() => history.length")
    figure.tap()
    page.locator(".rlg-zoom").wait_for()
    _shot(page, "zoom-phone-open.png")
    page.evaluate("() => history.back()")
    page.wait_for_function("() => !document.querySelector('.rlg-zoom')", timeout=10_000)
    assert page.url == url
    figure.tap()  # again, closed by its button this time: the entry goes too
    page.locator(".rlg-zoom .rlg-zoom-close").tap()
    page.wait_for_function("() => !document.querySelector('.rlg-zoom')", timeout=10_000)
    page.wait_for_function("() => !(history.state && history.state.rlgZoom)", timeout=10_000)
    assert page.url == url and page.evaluate("() => history.length") == depth + 1
    assert not problems, problems


# ---- R10: prev/next links fit a phone ---------------------------------------------------------
def test_prev_next_links_fit_a_phone(base_url, offline):
    """At 390 px the prev/next links at a page's foot, long titles included, lie inside the
    screen, and no title is cut."""
    ctx = offline(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    problems: list[str] = []
    tab = Tab(ctx, problems)
    bad = []
    for rel in ("chapters/20_moe_routing.html", "which_gate.html"):
        page = tab.open(base_url + rel, f"{rel} phone foot")
        area = page.locator(".prev-next-area")
        area.scroll_into_view_if_needed()
        # where the link's content (text, chevron) is drawn: the union of its contents' boxes
        got = page.evaluate("""() => [...document.querySelectorAll('.prev-next-area a')].map(a => {
          const box = a.getBoundingClientRect(), range = document.createRange();
          range.selectNodeContents(a);
          const r = range.getBoundingClientRect(), t = a.querySelector('.prev-next-title');
          return {cls: a.className, left: r.left, right: r.right,
                  cut: r.left < box.left - 0.5 || r.right > box.right + 0.5
                       || a.scrollWidth > a.clientWidth + 1,
                  title: t ? t.textContent.trim() : ''}; })""")
        width = page.evaluate("() => document.documentElement.clientWidth")
        assert got, f"{rel}: no prev/next links"
        bad += [f"{rel}: {g['cls']} {g['title']!r} at [{g['left']:.0f}, {g['right']:.0f}] "
                f"on a {width} px screen{', cut by its box' if g['cut'] else ''}"
                for g in got if g["left"] < -0.5 or g["right"] > width + 0.5 or g["cut"]]
        _shot(page, f"prev-next-phone-{Path(rel).stem}.png")
    assert not bad, "\n".join(bad)
    assert not problems, problems


# ---- R11: the explorer says which methods it leaves out, and why ------------------------------
def test_explorer_names_the_methods_it_leaves_out(book_dir):
    from rlgates._book.explorer_data import explorer_methods
    from rlgates.methods import REGISTRY, names

    html = (book_dir / "explorer.html").read_text(encoding="utf-8")
    note = html.split('class="rlg-explorer-omitted"', 1)[-1].split("</p>", 1)[0]
    assert 'class="rlg-explorer-omitted"' in html, "no note on the methods left out"
    offered = explorer_methods()
    left = [n for n in names() if n not in offered]
    assert f"offers {len(offered)} of the {len(names())} methods" in note, note
    missing = [REGISTRY[n].title for n in left if unescape(REGISTRY[n].title) not in unescape(note)]
    assert not missing, f"not named: {missing}\n{note}"


# ---- R18 and R19: print, and a reader's own install -----------------------------------------
#: the interactive leftovers a printout should not show: the solutions' "Click to show/hide"
#: buttons (sphinx-togglebutton adds them when the page loads) and "Show code cell source" rows
LEFTOVERS = """() => [...document.querySelectorAll(
    '.bd-article .toggle-button, .bd-article details.hide > summary')]
  .filter(e => e.getClientRects().length > 0).length"""


def test_print_hides_the_interactive_leftovers(base_url, offline):
    """Printed (print media), chapter 7 shows no toggle buttons and no "Show code cell source"
    rows, and a code block is kept on one page; on screen (the control) both show."""
    ctx = offline(viewport=DESKTOP)
    problems: list[str] = []
    page = Tab(ctx, problems).open(base_url + CHAPTER, "ch07 print")
    page.wait_for_selector(".bd-article .toggle-button")
    on_screen = page.evaluate(LEFTOVERS)
    page.emulate_media(media="print")
    printed = page.evaluate(LEFTOVERS)
    breaks = page.evaluate("() => getComputedStyle(document.querySelector("
                           "'.bd-article div.highlight')).breakInside")
    assert on_screen > 0, "no toggles on screen: the control sees nothing to hide"
    assert printed == 0, f"{printed} interactive leftovers print"
    assert breaks == "avoid", breaks
    assert not problems, problems


def test_a_readers_pip_install_leaves_git_status_clean():
    """`pip install .` from a clone builds in place: build/ and *.egg-info/ are ignored."""
    import subprocess

    for path in ("build/lib/rlgates/__init__.py", "rlgates.egg-info/PKG-INFO"):
        rc = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode
        assert rc == 0, f"{path} is not ignored: git status would show it"
    # the control: a source file is not ignored
    assert subprocess.run(["git", "check-ignore", "-q", "rlgates/__init__.py"],
                          cwd=ROOT).returncode == 1
