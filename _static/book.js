/* Site-wide script (Jupyter Book adds every .js in _static/ to every page). Keep it small.
 *
 * 1. Wide math fits its column: once MathJax has typeset the page (and on resize), a display
 *    equation wider than the column is scaled down from MathJax's own size (which matches the
 *    text's x-height), to at most MIN_SCALE of it; beyond that it scrolls.
 *    So does an inline formula wider than its line (book.css: rlg-wide).
 * 2. Table 1 (rlgates.table(), laid out as a grid by book.css) stacks f and f' under the method's
 *    name when side by side they would not fit, instead of cutting a formula.
 * 3. Figures on a phone: a tap opens the figure at its laptop size in a view that scrolls.
 * 4. Search results: the excerpt under each hit is read from the page's article text, with TeX
 *    source turned into readable symbols, not from the sidebar or raw LaTeX.
 * 5. A formula that still scrolls after 1. (a phone) is marked rlg-scrolls: book.css draws a
 *    shadow at the edge that hides more of it, since phones show no scroll bar until one scrolls.
 * 6. The sidebar toggles in the article header (the hamburger and "On this page") work:
 *    pydata-sphinx-theme 0.17 listens only on the first .primary-toggle / .secondary-toggle;
 *    were there a header bar (the book has none: scripts/book_web.py), that would be its hidden
 *    one, and a click on any other is forwarded to it (so the drawer opens on a phone, and the
 *    sidebar collapses at >= 992 px, sphinx-book-theme's own handler).
 * 7. The enlarged figure (3.) is a history entry: Back closes it, as on any phone overlay.
 * 8. Until MathJax has typeset the page, its TeX source is not shown (book.css: rlg-math-pending;
 *    on a slow link that is seconds of "\(|A|\)"); after 20 s without MathJax it shows.
 */
(function () {
  "use strict";
  // ---- 8. no raw TeX while MathJax loads ----
  var root = document.documentElement;
  if (window.MathJax && !root.classList.contains("rlg-math-pending")) {
    root.classList.add("rlg-math-pending");
    var shown = function () { root.classList.remove("rlg-math-pending"); };
    setTimeout(shown, 20000);
    (function wait() {
      var mj = window.MathJax;
      if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(shown, shown);
      else setTimeout(wait, 100);
    })();
  }
  var MIN_SCALE = 0.7;  // eq. 8.2, the widest, fits a laptop's column at 0.72
  var TABLE1 = ".bd-article .cell_output table";

  function isTable1(t) {
    var head = t.querySelectorAll(":scope > thead > tr > th");
    return head.length === 4 && !!t.querySelector("td:nth-child(3) .math");
  }

  // the natural width of a formula: scrollWidth for a display box, the box itself when inline
  function width(el) { return Math.max(el.scrollWidth, el.getBoundingClientRect().width); }

  // MathJax's own size for a formula: the inline font-size it set ("126.6%": its fonts scaled to
  // the text's x-height), read once, before any fit; "" when it set none (100 %)
  function ownSize(el) {
    if (el.dataset.rlgSize === undefined) el.dataset.rlgSize = el.style.fontSize;
    return el.dataset.rlgSize;
  }

  // back to MathJax's size; then, if wider than its box, smaller by up to MIN_SCALE of that size
  function fit(el, box) {
    var own = ownSize(el);
    el.style.fontSize = own;
    var need = Math.max(width(el), box === el ? 0 : box.scrollWidth), have = box.clientWidth;
    if (need > have + 1 && have > 0) {
      var scale = Math.max(MIN_SCALE, (have - 2) / need);
      el.style.fontSize = /%$/.test(own) || !own
        ? ((parseFloat(own) || 100) * scale).toFixed(1) + "%"
        : (parseFloat(getComputedStyle(el).fontSize) * scale).toFixed(2) + "px";
    }
  }

  function layout() {
    document.querySelectorAll(TABLE1).forEach(function (t) {
      if (!isTable1(t)) return;
      t.classList.add("rlg-table1");
      t.classList.remove("rlg-stacked");
      var wide = t.scrollWidth > t.clientWidth + 1;
      t.querySelectorAll("td mjx-container").forEach(function (m) {
        m.style.fontSize = ownSize(m);
        if (width(m) > m.closest("td").clientWidth + 1) wide = true;
      });
      if (wide) t.classList.add("rlg-stacked");
      t.querySelectorAll("td mjx-container").forEach(function (m) { fit(m, m.closest("td")); });
    });
    document.querySelectorAll('.bd-article mjx-container[display="true"]').forEach(function (m) {
      if (!m.closest("table")) fit(m, m);
    });
    // an inline formula wider than its whole line (a phone) gets a box of its own that scrolls
    document.querySelectorAll('.bd-article mjx-container:not([display="true"])').forEach(function (m) {
      if (m.closest("table.rlg-table1")) return;
      m.classList.remove("rlg-wide");  // (its font size stays MathJax's own)
      var line = m.parentElement;
      while (line && getComputedStyle(line).display.indexOf("inline") === 0) line = line.parentElement;
      if (!line) return;
      var cs = getComputedStyle(line);
      var have = line.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      if (width(m) > have + 1) m.classList.add("rlg-wide");
    });
    // whatever still scrolls says so: an edge shadow (book.css), and under a display formula a
    // line in words
    document.querySelectorAll('.bd-article mjx-container').forEach(function (m) {
      var scrolls = m.scrollWidth > m.clientWidth + 1 &&
        ["auto", "scroll"].indexOf(getComputedStyle(m).overflowX) >= 0;
      m.classList.toggle("rlg-scrolls", scrolls);
      if (m.getAttribute("display") !== "true") return;
      // after the equation's block (Sphinx's div.math, a flex row with its number), not in it
      var after = m.parentElement && m.parentElement.matches("div.math") ? m.parentElement : m;
      var hint = after.nextElementSibling;
      hint = hint && hint.classList.contains("rlg-swipe") ? hint : null;
      if (scrolls && !hint) {
        hint = document.createElement("p");
        hint.className = "rlg-swipe";
        hint.setAttribute("aria-hidden", "true");  // the math itself is read out whole
        hint.textContent = "\u2194\uFE0E swipe to see all of it";
        after.insertAdjacentElement("afterend", hint);
      } else if (!scrolls && hint) {
        hint.remove();
      }
    });
  }

  // lay out again when a formula changes size (MathJax's fonts arrive after its first pass)
  var pending = false, observer = null;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; layout(); });
  }
  function observe() {
    if (!window.ResizeObserver || observer) return;
    observer = new ResizeObserver(schedule);
    document.querySelectorAll('.bd-article mjx-container, .bd-article table.rlg-table1 td')
      .forEach(function (e) { observer.observe(e); });
  }

  function whenTypeset() {
    var mj = window.MathJax;
    var ready = mj && mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    ready.then(function () { layout(); observe(); })
      .catch(function () { /* MathJax reports its own errors */ });
    if (document.fonts && document.fonts.ready) document.fonts.ready.then(schedule);
    window.addEventListener("load", schedule);
    var timer = null, width = window.innerWidth;
    window.addEventListener("resize", function () {
      if (window.innerWidth === width) return;
      width = window.innerWidth;
      clearTimeout(timer);
      timer = setTimeout(layout, 150);
    });
  }

  // ---- search excerpts ----------------------------------------------------------------------
  var SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", eta: "η",
    theta: "θ", kappa: "κ", lambda: "λ", mu: "μ", pi: "π", rho: "ρ", sigma: "σ", tau: "τ",
    phi: "φ", chi: "χ", psi: "ψ", omega: "ω", Delta: "Δ", Sigma: "Σ", Pi: "Π", nabla: "∇",
    cdot: "·", times: "×", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠",
    approx: "≈", to: "→", rightarrow: "→", infty: "∞", sum: "Σ", prod: "Π", in: "∈",
    pm: "±", partial: "∂", log: "log", exp: "exp", min: "min", max: "max", quad: " ",
    mid: "|", ldots: "…", cdots: "⋯", dots: "…", sim: "∼", propto: "∝", sqrt: "√", prime: "′",
  };
  // TeX source as plain text: "\nabla_\theta J" -> "∇_θ J"; environments and spacing dropped
  function texToText(tex) {
    return tex
      .replace(/\\\\/g, " ")
      .replace(/\\[()[\]]/g, " ")
      .replace(/\\(begin|end)\{[^}]*\}/g, " ")
      .replace(/\\(?:mathrm|text|mathbf|operatorname|mathbb|mathcal|boldsymbol)\{([^}]*)\}/g, "$1")
      .replace(/\\frac\{([^{}]*)\}\{([^{}]*)\}/g, "($1)/($2)")
      .replace(/\\tag\*?\{([^}]*)\}/g, " ($1)")
      .replace(/\\([A-Za-z]+)/g, function (_, name) { return SYMBOLS[name] || ""; })
      .replace(/\\[,;:!> ]|&/g, " ")
      .replace(/[{}]/g, "")
      .replace(/\s+/g, " ");
  }
  function articleText(htmlString, anchor) {
    var doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".headerlink, script, style, .bd-sidebar-secondary, .bd-header-article, " +
      ".prev-next-area, .bd-footer-article, nav, .cell_input, .copybtn").forEach(function (e) {
      e.remove();
    });
    doc.querySelectorAll(".math").forEach(function (e) {
      e.textContent = " " + texToText(e.textContent) + " ";
    });
    var root = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (anchor && root) {
      var part = root.querySelector(anchor);
      if (part) return part.textContent.replace(/\s+/g, " ");
    }
    return root ? root.textContent.replace(/\s+/g, " ") : "";
  }
  function patchSearch() {
    /* global Search */
    if (typeof Search === "undefined" || !Search.htmlToText || Search.rlgatesPatched) return;
    Search.htmlToText = articleText;
    Search.rlgatesPatched = true;
  }
  // ---- figures on a phone: a tap opens the figure at its laptop size, to scroll and pinch ----
  var ZOOM_BELOW = 600;    // px of screen width: wider screens follow the link to the PNG
  var LAPTOP_COLUMN = 850;  // px: the widest a figure shows at 1280 px (book.css)
  var zoomView = null;
  function closeZoom(fromHistory) {
    if (!zoomView) return;
    zoomView.remove();
    zoomView = null;
    // closed by a tap: drop the history entry the zoom added (its popstate finds no view)
    if (!fromHistory && history.state && history.state.rlgZoom) history.back();
  }
  window.addEventListener("popstate", function () { closeZoom(true); });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") closeZoom(false); });
  function zoomFigure(ev) {
    var a = ev.target.closest && ev.target.closest(".bd-article a.image-reference");
    var img = a && a.querySelector("img");
    if (!img || document.documentElement.clientWidth >= ZOOM_BELOW) return;
    ev.preventDefault();
    var view = document.createElement("div"), big = document.createElement("img");
    var close = document.createElement("button");
    view.className = "rlg-zoom";
    view.setAttribute("role", "dialog");
    view.setAttribute("aria-label", "Figure, enlarged");
    big.src = a.href;
    big.alt = img.alt;
    big.style.width = Math.min(LAPTOP_COLUMN, parseFloat(img.style.width) || img.naturalWidth) + "px";
    close.className = "rlg-zoom-close";
    close.textContent = "\u00d7";
    close.setAttribute("aria-label", "Close");
    view.appendChild(big);
    view.appendChild(close);
    view.addEventListener("click", function (e) { if (e.target !== big) closeZoom(false); });
    closeZoom(false);
    document.body.appendChild(view);
    zoomView = view;
    history.pushState({rlgZoom: true}, "");  // Back closes the view, not the page
    close.focus();
  }
  document.addEventListener("click", zoomFigure);

  // ---- the article header's sidebar toggles (see 6. above) ----------------------------------
  function forwardSidebarToggles() {
    ["primary-toggle", "secondary-toggle"].forEach(function (cls) {
      var listened = document.querySelector("." + cls);  // the one the themes listen on
      if (!listened) return;
      document.querySelectorAll("." + cls).forEach(function (btn) {
        if (btn === listened || btn.dataset.rlgForward) return;
        btn.dataset.rlgForward = "1";
        btn.addEventListener("click", function (ev) {
          ev.preventDefault();
          ev.stopPropagation();
          listened.click();
          btn.blur();
        });
      });
    });
  }

  window.RLGatesBook = { texToText: texToText, articleText: articleText, layout: layout, fit: fit };

  patchSearch();
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      patchSearch(); forwardSidebarToggles(); whenTypeset();
    });
  } else {
    forwardSidebarToggles();
    whenTypeset();
  }
})();
