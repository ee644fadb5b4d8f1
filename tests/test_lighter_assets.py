"""scripts/lighter_assets.py: which style rules, custom properties and keyframes go, and which
stay (a rule that could match an element of the book must stay)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
pytest.importorskip("tinycss2")
import lighter_assets as la  # noqa: E402

USED = {"used", "show"}


@pytest.mark.parametrize("css, kept", [
    (".used{a:1}", ".used{a:1}"),
    (".unused{a:1}", ""),
    (".used,.unused{a:1}", ".used{a:1}"),
    (".used .unused>p{a:1}", ""),
    # classes inside :not(), :is(), :where(), :has() are not needed by the element
    (".used:not(.unused){a:1}", ".used:not(.unused){a:1}"),
    (":is(.unused,.used) p{a:1}", ":is(.unused,.used) p{a:1}"),
    ("p:has(.unused){a:1}", "p:has(.unused){a:1}"),
    # no class at all, attribute selectors, class names scripts build from parts
    ("html[data-theme=dark] p{a:1}", "html[data-theme=dark] p{a:1}"),
    ('[class~="unused"]{a:1}', '[class~="unused"]{a:1}'),
    (".bs-tooltip-auto .x{a:1}", ""),
    (".bs-tooltip-auto{a:1}", ".bs-tooltip-auto{a:1}"),
    ("@media (min-width:1px){.unused{a:1}}", ""),
    ("@media (min-width:1px){.used{a:1}.unused{b:2}}", "@media (min-width:1px){.used{a:1}}"),
    ('.used:before{content:"\\f0c9"}', '.used:before{content:"\\f0c9 "}'),  # stays ASCII
])
def test_prune_css(css, kept):
    assert la.prune_css(css, USED) == kept


def test_prune_css_keeps_a_selector_list_with_commas_in_brackets():
    css = ':is(.used, .unused) p, [data-x="a,b"].unused{a:1}'
    assert la.prune_css(css, USED) == ":is(.used, .unused) p{a:1}"


def test_custom_properties_that_nothing_reads_go():
    sheets = {"a": ":root{--read:1;--chain:var(--read);--unread:url(data:x;y);--js:2}"
                   ".used{color:var(--chain)}",
              "b": ".used{margin:var(--other, 1px)}"}
    out = la.prune_custom_properties(sheets, readers="el.style.setProperty('--js', 3)")
    assert out["a"] == ":root{--read:1;--chain:var(--read);--js:2}.used{color:var(--chain)}"
    # nothing reads --read once --chain goes: both go, then the empty rule
    out = la.prune_custom_properties({"a": ":root{--read:1;--chain:var(--read)}"}, readers="")
    assert out["a"] == ""


def test_keyframes_no_animation_names_go():
    sheets = {"a": "@keyframes spin{to{a:1}}@keyframes fade{to{a:1}}.used{animation:fade 1s}"}
    assert la.prune_keyframes(sheets, readers="")["a"] == (
        "@keyframes fade{to{a:1}}.used{animation:fade 1s}")


def test_font_awesome_points_at_the_subsets():
    css = ('@font-face{font-family:x;src:url(../vendor/fontawesome/webfonts/fa-solid-900.woff2)'
           ' format("woff2"),url(../vendor/fontawesome/webfonts/fa-solid-900.ttf)'
           ' format("truetype")}')
    assert la.point_fonts_at_subsets(css) == (
        '@font-face{font-family:x;src:url(../vendor/fontawesome/webfonts/'
        'fa-solid-900.subset.woff) format("woff")}')
