/* What the book's pages use of the theme's Bootstrap bundle (81 kB), in 2 kB: served instead of
 * _static/scripts/bootstrap.js (scripts/lighter_assets.py swaps the tag on every page).
 *
 * - Dropdowns (the download and launch buttons): a click on a [data-bs-toggle="dropdown"] button
 *   opens its menu below it, kept on screen; a click elsewhere, or Escape, closes it.
 * - Tooltips: the buttons keep their `title`, which the browser shows (Bootstrap drew its own);
 *   a button with only `data-bs-title` gets it as its title. `bootstrap.Tooltip` is there for the
 *   theme's script, which makes one for an optional sidebar button.
 * - The theme's "back to top" button, as Bootstrap's bundle wired it.
 */
(function () {
  "use strict";
  function Tooltip(el, options) {
    var title = options && options.title;
    if (el && title && !el.getAttribute("title")) el.setAttribute("title", title);
  }
  ["show", "hide", "toggle", "dispose", "enable", "disable", "update", "setContent"]
    .forEach(function (name) { Tooltip.prototype[name] = function () {}; });
  window.bootstrap = window.bootstrap || { Tooltip: Tooltip };

  function menuOf(toggle) { return toggle.parentElement.querySelector(".dropdown-menu"); }
  function close(toggle) {
    menuOf(toggle).classList.remove("show");
    toggle.classList.remove("show");
    toggle.setAttribute("aria-expanded", "false");
  }
  function open(toggle) {
    var menu = menuOf(toggle);
    menu.setAttribute("data-bs-popper", "static");  // Bootstrap's CSS: below the button
    menu.classList.add("show");
    toggle.classList.add("show");
    toggle.setAttribute("aria-expanded", "true");
    menu.style.left = menu.style.right = "";
    var box = menu.getBoundingClientRect(), width = document.documentElement.clientWidth;
    if (box.right > width) { menu.style.left = "auto"; menu.style.right = "0"; }
  }
  function openToggles() {
    return document.querySelectorAll('[data-bs-toggle="dropdown"][aria-expanded="true"]');
  }
  document.addEventListener("click", function (ev) {
    var toggle = ev.target.closest && ev.target.closest('[data-bs-toggle="dropdown"]');
    openToggles().forEach(function (t) { if (t !== toggle) close(t); });
    if (!toggle) return;
    ev.preventDefault();
    if (toggle.getAttribute("aria-expanded") === "true") close(toggle); else open(toggle);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key !== "Escape") return;
    openToggles().forEach(function (t) { close(t); t.focus(); });
  });

  function ready() {
    document.querySelectorAll('[data-bs-toggle="tooltip"][data-bs-title]:not([title])')
      .forEach(function (el) { el.setAttribute("title", el.getAttribute("data-bs-title")); });
    var top = document.getElementById("pst-back-to-top");
    var header = document.getElementsByClassName("bd-header")[0];
    if (!top || !header) return;
    top.addEventListener("click", function () {
      document.body.scrollTop = 0;
      document.documentElement.scrollTop = 0;
    });
    var below = header.getBoundingClientRect().bottom, last = window.scrollY;
    window.addEventListener("scroll", function () {
      top.style.display = last > window.scrollY && window.scrollY > below ? "block" : "none";
      last = window.scrollY;
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
