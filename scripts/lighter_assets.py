"""Lighter pages, after the build (scripts/book_web.py calls `lighten` when the build finishes):
the theme's style sheets, icon fonts and scripts, cut to what the built pages use.

    python scripts/lighter_assets.py _build/html      # the same, on a built book (idempotent)

- Style sheets of the theme and its extensions (not the book's own book.css and explorer.css):
  a rule goes when each of its selectors needs a class that no page and no script of the book
  names (classes inside :not(), :is(), :where() and :has() are not counted as needed); custom
  properties (`--x: ...`) that nothing reads go too. Class names a script builds at run time
  from parts (Bootstrap's `bs-tooltip-auto`) are kept by prefix (DYNAMIC_PREFIXES).
- Font Awesome: its three web fonts (275 kB) are replaced by subsets that hold only the icons
  some style sheet, page or script of the book can show (every private-use code point they name),
  written as WOFF (zlib; WOFF2 would need brotli), and the theme's @font-face rules point at them.
- Scripts and style sheets no element of a page uses are not linked from it: sphinx-design's
  (no design components in the book) and sphinx-thebe's (no live-code button).
- The theme's Bootstrap bundle (81 kB) is replaced by scripts/bootstrap_lite.js (2 kB), which
  does what the pages use of it: the dropdown menus, the tooltips (as titles), back to top.
- Figures on a phone (scripts/phone_figures.py, first): a figure with a phone version (its
  panels stacked, drawn when the chapters ran) shows it below 600 px, in a <picture>.
- Math typeset at build time (`typeset_math`, after the rest): each page is opened once in
  headless Chromium, the book's MathJax typesets it as it would in a reader's browser, and the
  typeset formulas and the CHTML style sheet MathJax made for them are written into the page,
  whose MathJax scripts (about 750 kB) go. The page loads only the MathJax fonts it uses. The
  explorer, whose script typesets formulas as the reader moves, keeps MathJax.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: The book's own style sheets: kept whole.
OWN_CSS = {"book.css", "explorer.css"}
#: Class names that scripts assemble from parts at run time (no literal holds the whole name).
DYNAMIC_PREFIXES = ("bs-",)
PAGE_ONLY_ASSETS = [  # (file under _static/, what a page must contain to need it)
    ("design-tabs.js", re.compile(r'class="[^"]*\bsd-tab')),
    ("sphinx-design.min.css", re.compile(r'class="[^"]*\bsd-')),
    ("sphinx-thebe.js", re.compile(r'class="[^"]*\bthebe-launch-button')),
    ("sphinx-thebe.css", re.compile(r'class="[^"]*\bthebe-launch-button')),
]
BOOTSTRAP = re.compile(r'(<script defer src="[^"]*_static/scripts/)bootstrap\.js\?[^"]*'
                       r'("></script>)')
BOOTSTRAP_PRELOAD = re.compile(r'[ \t]*<link rel="preload" as="script" '
                               r'href="[^"]*_static/scripts/bootstrap\.js[^"]*" />\n?')
BOOTSTRAP_LITE = Path(__file__).resolve().parent / "bootstrap_lite.js"
FA_DIR = Path("_static/vendor/fontawesome/webfonts")
FA_FONTS = ("fa-solid-900", "fa-regular-400", "fa-brands-400")
FA_SRC = re.compile(r"src:url\((?P<dir>[^)]*/webfonts/)(?P<font>fa-[a-z]+-\d+)\.woff2\)"
                    r' format\("woff2"\),url\([^)]*\.ttf\) format\("truetype"\)')
#: a private-use code point (Font Awesome's icons live there), as CSS or JS writes it
PUA = re.compile(r"\\u?([ef][0-9a-fA-F]{3})(?![0-9a-fA-F])|([\ue000-\uf8ff])")
CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")
PSEUDO_FN = re.compile(r":(?:not|is|where|has|-webkit-any|-moz-any)\(")
CUSTOM_PROP = re.compile(r"--[\w-]+")


# ---- what the book uses ---------------------------------------------------------------------
def _pages(out: Path) -> list[Path]:
    return [p for p in out.rglob("*.html") if "_static" not in p.relative_to(out).parts]


def _scripts(out: Path) -> list[Path]:
    return [p for p in (out / "_static").rglob("*.js") if "mathjax" not in p.parts]


JS_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'|`([^`]*)`')


def used_classes(out: Path) -> set[str]:
    """Every class a page's markup names, and every word in a string literal of a script (the
    book's, the theme's, inline ones): the classes a script may add."""
    names: set[str] = set()
    for page in _pages(out):
        html = page.read_text(encoding="utf-8", errors="replace")
        for value in re.findall(r'class="([^"]*)"', html):
            names |= set(value.split())
        for body in re.findall(r"<script[^>]*>(.*?)</script>", html, re.S):
            for lit in JS_LITERAL.findall(body):
                names |= set(re.findall(r"[\w-]+", "".join(lit)))
    for script in _scripts(out):
        for lit in JS_LITERAL.findall(script.read_text(encoding="utf-8", errors="replace")):
            names |= set(re.findall(r"[\w-]+", "".join(lit)))
    return names


# ---- style sheets ---------------------------------------------------------------------------
def _split_selectors(prelude: str) -> list[str]:
    """`a, b:is(c, d)` -> ["a", " b:is(c, d)"]: commas outside brackets and strings."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(prelude):
        if quote:
            quote = "" if ch == quote and prelude[i - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(prelude[start:i])
            start = i + 1
    parts.append(prelude[start:])
    return parts


def _needed_classes(selector: str) -> list[str]:
    """The classes an element must have for `selector` to match it (not those in :not() & co.,
    nor in attribute selectors or strings)."""
    out, i = [], 0
    s = re.sub(r"\[[^\]]*\]", "", selector)
    while True:
        m = PSEUDO_FN.search(s, i)
        if not m:
            break
        depth, j = 1, m.end()
        while j < len(s) and depth:
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            j += 1
        s, i = s[:m.start()] + s[j:], m.start()
    for name in CLASS.findall(s):
        out.append(name.replace("\\", ""))
    return out


def _keep_selector(selector: str, used: set[str]) -> bool:
    return all(c in used or c.startswith(DYNAMIC_PREFIXES) for c in _needed_classes(selector))


def prune_css(text: str, used: set[str]) -> str:
    """The style sheet without the rules no element can match, nor unread custom properties."""
    import tinycss2

    def prune(rules):
        kept = []
        for r in rules:
            if r.type == "qualified-rule":
                sels = [s for s in _split_selectors(tinycss2.serialize(r.prelude))
                        if _keep_selector(s, used)]
                if sels:
                    r.prelude = tinycss2.parse_component_value_list(",".join(s.strip()
                                                                             for s in sels))
                    kept.append(r)
            elif r.type == "at-rule" and r.content is not None and r.lower_at_keyword in (
                    "media", "supports", "layer", "container"):
                inner = prune(tinycss2.parse_rule_list(r.content, skip_whitespace=True,
                                                       skip_comments=True))
                if inner:
                    r.content = tinycss2.parse_component_value_list(tinycss2.serialize(inner))
                    kept.append(r)
            elif r.type not in ("comment", "whitespace"):
                kept.append(r)
        return kept

    rules = tinycss2.parse_stylesheet(text, skip_whitespace=True, skip_comments=True)
    return _ascii(tinycss2.serialize(prune(rules)))


def _ascii(css: str) -> str:
    """CSS escapes for what tinycss2 unescaped (an icon's "\\f09b"): the file stays ASCII."""
    return re.sub(r"[^\x00-\x7f]", lambda m: f"\\{ord(m.group()):x} ", css)


DECL = re.compile(r"(?<=[{;])\s*(--[\w-]+)\s*:(?:[^;{}()]|\([^)]*\))*(?:;|(?=}))")


def prune_custom_properties(sheets: dict[str, str], readers: str) -> dict[str, str]:
    """Drop `--x: ...` declarations that no var() in any sheet reads and no script names
    (`readers`: the scripts and pages, which may read or set them), until none is left."""
    while True:
        read = set(CUSTOM_PROP.findall(readers))
        for text in sheets.values():
            read |= set(re.findall(r"var\(\s*(--[\w-]+)", text))
        changed = False
        for name, text in sheets.items():
            new = DECL.sub(lambda m, read=read: m.group(0) if m.group(1) in read else "", text)
            new = re.sub(r"[^{}]*\{\s*\}", "", new)  # rules left empty
            if new != text:
                sheets[name], changed = new, True
        if not changed:
            return sheets


def prune_keyframes(sheets: dict[str, str], readers: str) -> dict[str, str]:
    """Drop @keyframes that no animation in any sheet or script names (Font Awesome's spin,
    beat, shake... go with the icon rules that used them)."""
    import tinycss2

    named = set(re.findall(r"[\w-]+", readers))
    for text in sheets.values():
        for value in re.findall(r"animation(?:-name)?\s*:\s*([^;}]*)", text):
            named |= set(re.findall(r"[\w-]+", value))
    for name, text in sheets.items():
        if "@keyframes" not in text:
            continue
        rules = tinycss2.parse_stylesheet(text, skip_whitespace=True, skip_comments=True)
        kept = [r for r in rules if not (r.type == "at-rule" and r.lower_at_keyword == "keyframes"
                                         and tinycss2.serialize(r.prelude).strip() not in named)]
        if len(kept) != len(rules):
            sheets[name] = _ascii(tinycss2.serialize(kept))
    return sheets


# ---- Font Awesome ---------------------------------------------------------------------------
def icon_code_points(out: Path) -> set[int]:
    """Every private-use code point a style sheet, page or script of the book names."""
    points: set[int] = set()
    files = [*(out / "_static").rglob("*.css"), *_scripts(out), *_pages(out)]
    for f in files:
        for esc, char in PUA.findall(f.read_text(encoding="utf-8", errors="replace")):
            points.add(int(esc, 16) if esc else ord(char))
    return points


def subset_icon_fonts(out: Path, points: set[int]) -> dict[str, tuple[int, int]]:
    """Write FA_DIR/<font>.subset.woff with only `points` (and what they need); the sizes
    before and after."""
    from fontTools import subset

    sizes = {}
    for font in FA_FONTS:
        src = out / FA_DIR / f"{font}.ttf"  # the .woff2 would need brotli to read
        dest = out / FA_DIR / f"{font}.subset.woff"
        if not src.is_file():
            continue
        options = subset.Options()
        options.flavor = "woff"
        options.layout_features = ["*"]
        options.name_IDs = ["*"]
        options.notdef_outline = True
        options.ignore_missing_unicodes = True
        f = subset.load_font(str(src), options, dontLoadGlyphNames=True)
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=sorted(points))
        subsetter.subset(f)
        subset.save_font(f, str(dest), options)
        sizes[font] = (src.stat().st_size, dest.stat().st_size)
    return sizes


def point_fonts_at_subsets(css: str) -> str:
    return FA_SRC.sub(lambda m: f'src:url({m["dir"]}{m["font"]}.subset.woff) format("woff")', css)


# ---- pages ----------------------------------------------------------------------------------
def _asset_tag(name: str) -> re.Pattern:
    """The <script> or <link> tag that loads _static/`name` (with its ?v= suffix)."""
    url = rf'"[^"]*_static/{re.escape(name)}(?:\?[^"]*)?"'
    return re.compile(rf"[ \t]*(?:<script\b[^>]*\bsrc={url}[^>]*></script>"
                      rf"|<link\b[^>]*\bhref={url}[^>]*>)\n?")


def unlink_unused_assets(out: Path) -> int:
    """Per page: the assets it does not need unlinked, Bootstrap's bundle swapped for the lite
    script; returns how many pages changed."""
    n = 0
    lite = out / "_static" / "scripts" / "bootstrap-lite.js"
    lite.parent.mkdir(parents=True, exist_ok=True)
    lite.write_text(BOOTSTRAP_LITE.read_text(encoding="utf-8"), encoding="utf-8")
    for page in _pages(out):
        html = page.read_text(encoding="utf-8")
        new = BOOTSTRAP.sub(r"\1bootstrap-lite.js\2", BOOTSTRAP_PRELOAD.sub("", html))
        for name, needed_if in PAGE_ONLY_ASSETS:
            if not needed_if.search(new):
                new = _asset_tag(name).sub("", new)
        if new != html:
            page.write_text(new, encoding="utf-8")
            n += 1
    if not any("scripts/bootstrap.js" in p.read_text(encoding="utf-8") for p in _pages(out)):
        for name in ("bootstrap.js", "bootstrap.js.map", "bootstrap.js.LICENSE.txt"):
            (out / "_static" / "scripts" / name).unlink(missing_ok=True)
    return n


def lighten(out: Path) -> str:
    """Everything above, on the built book in `out`; a one-line summary."""
    import phone_figures  # scripts/, beside this file

    out = Path(out)
    static = out / "_static"
    phones = phone_figures.add_phone_figures(out)
    n_pages = unlink_unused_assets(out)
    used = used_classes(out)
    sheets = {p: p.read_text(encoding="utf-8") for p in static.rglob("*.css")
              if p.name not in OWN_CSS and "mathjax" not in p.parts and "vendor" not in p.parts}
    before = sum(len(t) for t in sheets.values())
    sheets = {p: prune_css(t, used) for p, t in sheets.items()}
    readers = "".join(f.read_text(encoding="utf-8", errors="replace")
                      for f in [*_scripts(out), *_pages(out),
                                *(static / n for n in OWN_CSS if (static / n).is_file())])
    sheets = prune_custom_properties(prune_keyframes(sheets, readers), readers)
    for p, text in sheets.items():
        p.write_text(text, encoding="utf-8")
    fonts = subset_icon_fonts(out, icon_code_points(out))  # the icons the pruned sheets name
    if fonts:
        for p, text in sheets.items():
            p.write_text(point_fonts_at_subsets(text), encoding="utf-8")
    after = sum(len(t) for t in sheets.values())
    fa = ", ".join(f"{k} {a // 1000} -> {b // 1000} kB" for k, (a, b) in fonts.items())
    return (f"theme style sheets {before // 1000} -> {after // 1000} kB; icon fonts: {fa}; "
            f"{n_pages} pages with bootstrap-lite.js, without sphinx-design's, -thebe's assets; "
            f"{phones}")



# ---- math typeset at build time -------------------------------------------------------------
#: the page's MathJax: its configuration and its loader (Sphinx's mathjax extension)
MATHJAX_TAGS = re.compile(r'[ \t]*<script>window\.MathJax = [^\n]*?</script>\n?'
                          r'|[ \t]*<script defer="defer" src="[^"]*_static/mathjax/startup\.js'
                          r'[^"]*"></script>\n?')
#: a formula as Sphinx writes it, for MathJax to typeset: \(...\) in a span, \[...\] in a div
MATH_ELEMENT = re.compile(r'<(span|div) class="math notranslate nohighlight"([^>]*)>(.*?)</\1>',
                          re.S)
#: pages whose script typesets formulas of its own at run time: they keep MathJax
LIVE_MATH = re.compile(r"RLGATES_EXPLORER")
TYPESET = r"""async () => {
  await MathJax.startup.promise;
  await document.fonts.ready;
  const els = [...document.querySelectorAll(
    'span.math.notranslate.nohighlight, div.math.notranslate.nohighlight')];
  const style = document.getElementById('MJX-CHTML-styles');
  return {math: els.map(e => e.innerHTML), css: style ? style.textContent : null,
          errors: document.querySelectorAll('mjx-merror').length};
}"""


def typeset_math(out: Path, chromium: str | None = None) -> str:
    """Every page's formulas typeset once, at build time, by the same MathJax in headless
    Chromium (the browser tests' Chromium), and written into the page with the CHTML style sheet
    MathJax made for it; the page then loads no MathJax script (about 750 kB), only the MathJax
    fonts its formulas use, and shows no TeX source while a slow link brings MathJax in. A page
    whose own script typesets formulas (the explorer) keeps MathJax; so does every page when no
    Chromium is found. Returns a one-line summary."""
    import functools
    import http.server
    import threading

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    try:
        from bookserver import LAUNCH_ARGS
        from bookserver import chromium as find_chromium
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        return f"math left to MathJax at run time ({err})"
    exe = chromium or find_chromium()
    if exe is None:
        return "math left to MathJax at run time (no Chromium to typeset it at build time)"
    pages = [p for p in _pages(out) if MATHJAX_TAGS.search(p.read_text(encoding="utf-8"))]

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    done, kept = 0, []
    try:
        _typeset_pages(out, pages, base, exe, LAUNCH_ARGS, sync_playwright, kept)
        done = len(pages) - len(kept)
    except Exception as err:  # noqa: BLE001 - a page left as it was still works at run time
        return f"math left to MathJax at run time on the pages not done ({err})"
    finally:
        server.shutdown()
        server.server_close()
    return (f"math typeset at build time on {done} pages (no MathJax script there)"
            + (f"; MathJax at run time on {', '.join(kept)}" if kept else ""))


def _typeset_pages(out, pages, base, exe, launch_args, sync_playwright, kept) -> None:
    """typeset_math's browser part: each page in `pages` rewritten, or named in `kept`."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=launch_args, headless=True)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        # the book's own script changes formulas' sizes for the screen: not at build time
        ctx.route("**/_static/book.js*", lambda route: route.abort())
        page = ctx.new_page()
        page.set_default_timeout(120_000)
        for path in pages:
            rel = path.relative_to(out).as_posix()
            html = path.read_text(encoding="utf-8")
            if LIVE_MATH.search(html):
                kept.append(rel)
                continue
            page.goto(base + rel, wait_until="load")
            got = page.evaluate(TYPESET)
            found = list(MATH_ELEMENT.finditer(html))
            if got["errors"] or not got["css"] or len(found) != len(got["math"]):
                kept.append(rel)
                continue
            parts, last = [], 0
            for m, typeset in zip(found, got["math"], strict=True):
                parts += [html[last:m.start()],
                          f'<{m[1]} class="math notranslate nohighlight"{m[2]}>{typeset}'
                          f"</{m[1]}>"]
                last = m.end()
            parts.append(html[last:])
            static = "../" * rel.count("/") + "_static/"
            css = got["css"].replace(base + "_static/", static)
            new = MATHJAX_TAGS.sub("", "".join(parts)).replace(
                "</head>", f'<style id="MJX-CHTML-styles">{css}</style>\n</head>', 1)
            path.write_text(new, encoding="utf-8")
        browser.close()


if __name__ == "__main__":
    book = Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")
    print(lighten(book))
    print(typeset_math(book))
