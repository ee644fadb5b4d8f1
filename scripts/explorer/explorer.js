/* The gate explorer: gate and learning signal of one method on the (A, log ρ) plane, redrawn in
 * the browser as its hyperparameters move. No kernel, no network.
 *
 * Everything comes from rlgates at build time (rlgates/_book/explorer_data.py -> window.RLGATES_EXPLORER):
 * methods, defaults, slider ranges, axis limits, colour map, and each method's gate as JavaScript
 * (`Method.explorer`: {"gate": expression in r = ρ, a = A and p = hyperparameters, "bounds":
 * expression giving [[ratio, side], ...], side +1 for A > 0, -1 for A < 0, 0 for both}).
 * tests/browser checks the compiled gates against rlgates at sampled points.
 */
(function () {
  "use strict";

  const DATA = window.RLGATES_EXPLORER;

  // ---- the gates: compiled once from each method's JS expressions ---------------------------
  const GATES = {};
  ((DATA && DATA.methods) || []).forEach(function (m) {
    if (!m.js) return;
    const gate = new Function("r", "a", "p", '"use strict"; return (' + m.js.gate + ");");
    const bounds = new Function("p", '"use strict"; return (' + m.js.bounds + ");");
    GATES[m.name] = function (p) {
      return { gate: function (r, a) { return gate(r, a, p); }, bounds: bounds(p) };
    };
  });

  function build(name, params) {
    const make = GATES[name];
    if (!make) throw new Error("explorer: no gate for method " + name);
    return make(params);
  }
  // Public, for the tests and for curious readers (open the console).
  const api = {
    gate: function (name, params, ratio, adv) { return build(name, params).gate(ratio, adv); },
    signal: function (name, params, ratio, adv) {
      return build(name, params).gate(ratio, adv) * ratio * adv;
    },
    bounds: function (name, params) { return build(name, params).bounds; },
    implemented: Object.keys(GATES),
  };
  window.RLGatesExplorer = api;

  // ---- drawing ----------------------------------------------------------------------------
  const FONT = "12px 'DejaVu Sans', 'Helvetica Neue', Arial, sans-serif";
  const SMALL = "9px 'DejaVu Sans', 'Helvetica Neue', Arial, sans-serif";

  function niceStep(span, target) {
    const raw = span / target, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  }
  function fmt(v) {
    // 3 significant digits, a real minus sign; exponents only for very small or large values
    if (v === 0) return "0";
    const a = Math.abs(v);
    const s = a < 1e-4 || a >= 1e5 ? v.toExponential(1) : String(+v.toPrecision(3));
    return s.replace(/-/g, "−");
  }
  function colour(cmap, v, vmax) {
    // matplotlib's rule: x = (v + vmax) / (2 vmax) in [0, 1], index floor(x N) clipped to N - 1
    const n = cmap.length;
    let i = Math.floor(((v + vmax) / (2 * vmax)) * n);
    if (!(i >= 0)) i = 0; else if (i > n - 1) i = n - 1;
    return cmap[i];
  }
  function hexRgb(h) {
    return [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)];
  }
  // text with a subscript: parts = [["A", false], ["t", true]]
  function richText(ctx, parts, x, y, align) {
    const widths = parts.map(function (p) { ctx.font = p[1] ? SMALL : FONT; return ctx.measureText(p[0]).width; });
    const total = widths.reduce(function (s, w) { return s + w; }, 0);
    let cx = align === "center" ? x - total / 2 : align === "right" ? x - total : x;
    ctx.textAlign = "left";
    parts.forEach(function (p, k) {
      ctx.font = p[1] ? SMALL : FONT;
      ctx.fillText(p[0], cx, p[1] ? y + 4 : y);
      cx += widths[k];
    });
    ctx.font = FONT;
  }

  // Polylines [[A, log ρ], ...] where the gate (an n x n grid, row i = log ρ) crosses 1/2:
  // per column, linear interpolation between rows; the k-th crossings of neighbouring columns
  // on the same side of A = 0 are joined. Enough for gates that vary little along A.
  function halfGateLines(gate, n, advLim, lim) {
    const lines = [], level = 0.5;
    [-1, 1].forEach(function (side) {
      let open = [];
      for (let j = 0; j < n; j++) {
        const a = -advLim + (2 * advLim * j) / (n - 1);
        if (!(a * side > 0)) continue;
        const ys = [];
        for (let i = 0; i + 1 < n; i++) {
          const g0 = gate[i * n + j] - level, g1 = gate[(i + 1) * n + j] - level;
          if ((g0 < 0) !== (g1 < 0) && g0 !== g1) {
            const t = g0 / (g0 - g1), l0 = -lim + (2 * lim * i) / (n - 1);
            ys.push(l0 + (t * 2 * lim) / (n - 1));
          }
        }
        const next = ys.map(function (y, k) {
          const line = k < open.length ? open[k] : [];
          if (k >= open.length) lines.push(line);
          line.push([a, y]);
          return line;
        });
        open = next;
      }
    });
    return lines.filter(function (l) { return l.length > 1; });
  }

  function Panel(canvas, kind) {
    this.canvas = canvas;
    this.kind = kind; // "gate" | "signal"
    this.grid = document.createElement("canvas");
  }
  Panel.prototype.layout = function () {
    const css = this.canvas.clientWidth || 320;
    const h = Math.round(Math.min(css * 0.82, 360));
    this.canvas.style.height = h + "px";
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(css * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.w = css; this.h = h; this.dpr = dpr;
    this.box = { x0: 54, y0: 30, x1: css - 72, y1: h - 40 };
  };
  Panel.prototype.draw = function (s) {
    this.layout();
    const ctx = this.canvas.getContext("2d"), b = this.box, n = DATA.n, m = s.method;
    const vmax = this.kind === "gate" ? 1 : s.signalMax;
    const values = this.kind === "gate" ? s.signedGate : s.signal;
    // the grid as an n x n image, nearest-neighbour scaled (row 0 of the grid is the bottom)
    this.grid.width = n; this.grid.height = n;
    const gctx = this.grid.getContext("2d"), img = gctx.createImageData(n, n);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const rgb = s.rgb(values[i * n + j], vmax), o = ((n - 1 - i) * n + j) * 4;
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    gctx.putImageData(img, 0, 0);
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, this.w, this.h);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.grid, b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
    const X = function (a) { return b.x0 + ((a + DATA.adv_lim) / (2 * DATA.adv_lim)) * (b.x1 - b.x0); };
    const Y = function (l) { return b.y1 - ((l + s.lim) / (2 * s.lim)) * (b.y1 - b.y0); };
    this.X = X; this.Y = Y;
    // zero lines, then the clip bounds (dashed, black), on their side of A = 0
    ctx.strokeStyle = "#666666"; ctx.lineWidth = 0.6; ctx.setLineDash([]);
    ctx.beginPath(); ctx.moveTo(X(0), b.y0); ctx.lineTo(X(0), b.y1);
    ctx.moveTo(b.x0, Y(0)); ctx.lineTo(b.x1, Y(0)); ctx.stroke();
    ctx.strokeStyle = "#000000"; ctx.lineWidth = 1.4; ctx.setLineDash([6, 4]);
    s.bounds.forEach(function (bd) {
      const l = Math.log(bd[0]);
      if (!(Math.abs(l) <= s.lim)) return;
      const xa = bd[1] === -1 ? -DATA.adv_lim : bd[1] === 1 ? 0 : -DATA.adv_lim;
      const xb = bd[1] === -1 ? 0 : DATA.adv_lim;
      ctx.beginPath(); ctx.moveTo(X(xa), Y(l)); ctx.lineTo(X(xb), Y(l)); ctx.stroke();
    });
    // a smooth gate has no clip bounds: dash where it has fallen to one half (as rlgates.plane
    // does), found on the grid separately for A < 0 and A > 0
    this.halfLines = [];
    if (!s.bounds.length) {
      this.halfLines = halfGateLines(s.gate, n, DATA.adv_lim, s.lim);
      this.halfLines.forEach(function (line) {
        ctx.beginPath();
        line.forEach(function (pt, k) { if (k) ctx.lineTo(X(pt[0]), Y(pt[1])); else ctx.moveTo(X(pt[0]), Y(pt[1])); });
        ctx.stroke();
      });
    }
    ctx.setLineDash([]);
    // frame, ticks, labels
    ctx.strokeStyle = "#000000"; ctx.lineWidth = 1;
    ctx.strokeRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
    ctx.fillStyle = "#000000"; ctx.font = FONT; ctx.textBaseline = "middle";
    [-1, -0.5, 0, 0.5, 1].forEach(function (a) {
      ctx.beginPath(); ctx.moveTo(X(a), b.y1); ctx.lineTo(X(a), b.y1 + 4); ctx.stroke();
      ctx.textAlign = "center"; ctx.fillText(fmt(a * DATA.adv_lim), X(a), b.y1 + 12);
    });
    // ticks k·step for integer k (a running sum t += step drifts and can lose the end ticks)
    const step = niceStep(2 * s.lim, 4);
    const k0 = Math.ceil(-s.lim / step - 1e-9), k1 = Math.floor(s.lim / step + 1e-9);
    this.yticks = [];
    for (let k = k0; k <= k1; k++) {
      const tv = k === 0 ? 0 : k * step;
      this.yticks.push(fmt(tv));
      ctx.beginPath(); ctx.moveTo(b.x0 - 4, Y(tv)); ctx.lineTo(b.x0, Y(tv)); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(fmt(tv), b.x0 - 6, Y(tv));
    }
    const A = m.adv_symbol.split("_"), R = m.ratio_symbol.replace("\\rho", "ρ").split("_");
    richText(ctx, [["advantage " + A[0], false], [A[1], true]], (b.x0 + b.x1) / 2, this.h - 10, "center");
    ctx.save(); ctx.translate(13, (b.y0 + b.y1) / 2); ctx.rotate(-Math.PI / 2);
    richText(ctx, [["log " + R[0], false], [R[1], true]], 0, 0, "center"); ctx.restore();
    const title = this.kind === "gate"
      ? [["gate f′(" + R[0], false], [R[1], true], ["; " + A[0], false], [A[1], true], [")", false]]
      : [["learning signal f′·" + R[0], false], [R[1], true], ["·" + A[0], false], [A[1], true]];
    ctx.font = "bold " + FONT;
    richText(ctx, title, (b.x0 + b.x1) / 2, 14, "center");
    // colour bar
    const cx0 = b.x1 + 10, cx1 = b.x1 + 22, cmap = DATA.cmap;
    for (let k = 0; k < cmap.length; k++) {
      ctx.fillStyle = cmap[k];
      const ya = b.y1 - (k / cmap.length) * (b.y1 - b.y0), yb = b.y1 - ((k + 1) / cmap.length) * (b.y1 - b.y0);
      ctx.fillRect(cx0, yb, cx1 - cx0, ya - yb + 0.5);
    }
    ctx.strokeStyle = "#000000"; ctx.strokeRect(cx0, b.y0, cx1 - cx0, b.y1 - b.y0);
    ctx.fillStyle = "#000000"; ctx.textAlign = "left";
    [[vmax, b.y0], [0, (b.y0 + b.y1) / 2], [-vmax, b.y1]].forEach(function (t) {
      ctx.fillText(fmt(t[0]), cx1 + 3, t[1]);
    });
    ctx.save(); ctx.translate(this.w - 6, (b.y0 + b.y1) / 2); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center";
    ctx.fillText(this.kind === "gate" ? "A<0 open  ↔  A>0 open" : "discourage  ↔  encourage", 0, 0);
    ctx.restore();
  };
  // where an event falls in the plot box, as fractions [fx, fy] (0..1, fy = 0 at the top)
  Panel.prototype.at = function (ev) {
    const r = this.canvas.getBoundingClientRect(), b = this.box;
    const x = ev.clientX - r.left, y = ev.clientY - r.top;
    if (x < b.x0 || x > b.x1 || y < b.y0 || y > b.y1) return null;
    return [(x - b.x0) / (b.x1 - b.x0), (y - b.y0) / (b.y1 - b.y0)];
  };

  // ---- the widget ---------------------------------------------------------------------------
  function el(tag, attrs, kids) {
    const e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "html") e.innerHTML = attrs[k]; else if (k === "text") e.textContent = attrs[k];
      else e.setAttribute(k, attrs[k]);
    });
    (kids || []).forEach(function (c) { e.appendChild(c); });
    return e;
  }
  // plain text from rlgates (τ_neg, ε_h) as HTML with subscripts
  function prettify(text) {
    const esc = text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    return esc.replace(/([A-Za-zα-ωΑ-Ω])_([A-Za-z0-9]+)/g, "$1<sub>$2</sub>");
  }
  // A slider's track. Where the default sits in the first 15 % of a wide range (DAPO's ε_h: 0 to
  // 6, default 0.28) the track is a power law that puts the default near 40 % of its length, so
  // that one pixel near the default is about one step; elsewhere it is linear. Values snap to
  // the step; the arrow keys move by exactly one step either way.
  const TRACK = 1000;
  function sliderScale(p) {
    const lo = p.range[0], hi = p.range[1], step = p.range[2];
    const snap = function (v) {
      const k = Math.round((Math.min(hi, Math.max(lo, v)) - lo) / step);
      return parseFloat(Math.min(hi, lo + k * step).toPrecision(12));
    };
    const frac = (p.default - lo) / (hi - lo);
    if (!(frac > 0 && frac < 0.15)) {
      return { min: lo, max: hi, step: step, toValue: function (u) { return snap(+u); },
               toPos: function (v) { return v; }, snap: snap };
    }
    const k = Math.log(frac) / Math.log(0.4);
    return {
      min: 0, max: TRACK, step: 1, snap: snap,
      toValue: function (u) { return snap(lo + (hi - lo) * Math.pow(u / TRACK, k)); },
      toPos: function (v) { return TRACK * Math.pow(Math.max(0, (v - lo) / (hi - lo)), 1 / k); },
    };
  }
  function linspace(a, b, n) {
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = a + ((b - a) * i) / (n - 1);
    return out;
  }

  function Explorer(root) {
    this.root = root;
    this.methods = {};
    DATA.methods.forEach(function (m) { this.methods[m.name] = m; }, this);
    const rgbCache = DATA.cmap.map(hexRgb);
    this.rgb = function (v, vmax) {
      const n = rgbCache.length;
      let i = Math.floor(((v + vmax) / (2 * vmax)) * n);
      if (!(i >= 0)) i = 0; else if (i > n - 1) i = n - 1;
      return rgbCache[i];
    };
    this.buildDom();
    const self = this, fromHash = function () {
      const hash = decodeURIComponent((location.hash || "").slice(1));
      return self.methods[hash] ? hash : null;
    };
    this.select(fromHash() || DATA.methods[0].name);
    // explorer.html#dapo opens DAPO, also when only the hash changes
    window.addEventListener("hashchange", function () {
      const name = fromHash();
      if (name && name !== self.method.name) self.select(name);
    });
  }
  Explorer.prototype.buildDom = function () {
    const self = this;
    this.selectEl = el("select", { id: "gx-method", "aria-label": "method" });
    DATA.methods.forEach(function (m) {
      self.selectEl.appendChild(el("option", { value: m.name, text: m.title + " (" + m.date + ")" }));
    });
    this.selectEl.addEventListener("change", function () { self.select(self.selectEl.value); });
    this.reset = el("button", { type: "button", class: "gx-reset", text: "reset to the paper's defaults" });
    this.reset.addEventListener("click", function () { self.select(self.method.name); });
    this.sliders = el("div", { class: "gx-sliders" });
    this.info = el("div", { class: "gx-info" });
    this.canvases = ["gate", "signal"].map(function (kind) {
      return el("canvas", { class: "gx-canvas", id: "gx-" + kind, role: "img" });
    });
    this.panels = this.canvases.map(function (c, k) { return new Panel(c, k ? "signal" : "gate"); });
    this.readout = el("p", { class: "gx-readout", "aria-live": "polite",
      text: "Point at (or touch) a panel to read the gate and the signal there." });
    this.code = el("code", { class: "gx-code" });
    this.note = el("p", { class: "gx-note" });
    this.root.appendChild(el("div", { class: "gx-controls" }, [
      el("label", { for: "gx-method", text: "method " }), this.selectEl, this.reset]));
    this.root.appendChild(this.sliders);
    this.root.appendChild(this.info);
    // where the reader pointed (or tapped), marked on both panels: they share the (A, log ρ) plane
    this.markers = this.canvases.map(function () { return el("div", { class: "gx-marker", hidden: "" }); });
    // the readout between the panels: under both when they sit side by side, between them when
    // they are one under the other (explorer.css); never sticky, so it covers neither
    this.root.appendChild(el("div", { class: "gx-panels" },
      [this.canvases[0], this.readout, this.canvases[1]].concat(this.markers)));
    this.root.appendChild(this.note);
    this.root.appendChild(el("p", { class: "gx-python" }, [el("span", { text: "in Python: " }), this.code]));
    this.canvases.forEach(function (c, k) {
      c.addEventListener("pointermove", function (ev) { self.hover(ev, k); });
      c.addEventListener("pointerdown", function (ev) { self.hover(ev, k); });
    });
    let width = this.root.clientWidth;
    window.addEventListener("resize", function () {
      if (self.root.clientWidth !== width) { width = self.root.clientWidth; self.draw(); }
    });
  };
  Explorer.prototype.select = function (name) {
    const self = this, m = this.methods[name];
    this.method = m;
    this.selectEl.value = name;
    this.values = {};
    this.sliders.innerHTML = "";
    m.params.forEach(function (p) {
      self.values[p.key] = p.default;
      const id = "gx-" + p.key, out = el("output", { for: id, class: "gx-value" });
      const sc = sliderScale(p);
      const input = el("input", { type: "range", id: id, min: sc.min, max: sc.max,
        step: sc.step, "data-param": p.key });
      // the track is filled up to the thumb (explorer.css: --gx-fill)
      const fill = function () {
        input.style.setProperty("--gx-fill", (100 * (+input.value - sc.min) / (sc.max - sc.min)) + "%");
      };
      input.value = String(sc.toPos(p.default));
      fill();
      out.textContent = fmt(p.default);
      const set = function (v) {
        self.values[p.key] = v;
        fill();
        out.textContent = fmt(v);
        input.setAttribute("aria-valuetext", fmt(v));
        self.schedule();
      };
      input.setAttribute("aria-valuetext", fmt(p.default));
      input.addEventListener("input", function () { set(sc.toValue(input.value)); });
      input.addEventListener("keydown", function (ev) {
        const dir = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[ev.key];
        if (!dir) return;
        ev.preventDefault();
        const v = sc.snap(self.values[p.key] + dir * p.range[2]);
        input.value = String(sc.toPos(v));
        set(v);
      });
      self.sliders.appendChild(el("div", { class: "gx-slider" }, [
        el("label", { for: id, html: p.label }), input, out]));
    });
    if (!m.params.length) {
      this.sliders.appendChild(el("p", { text: m.title + " has no hyperparameters: its gate is fixed." }));
    }
    this.info.innerHTML = "";
    this.info.appendChild(el("p", { class: "gx-title" }, [
      el("strong", { text: m.title }), el("span", { html: " · " + prettify(m.insight) })]));
    this.info.appendChild(el("p", { class: "math gx-formula",
      text: "\\(f'(" + m.ratio_symbol + ";\\, " + m.adv_symbol + ") = " + m.gate_latex + "\\)" }));
    this.info.appendChild(el("p", { class: "gx-paper", text: m.paper }));
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      const node = this.info;
      MathJax.startup.promise.then(function () { return MathJax.typesetPromise([node]); })
        .then(function () {  // a wide formula shrinks to fit (the book's _static/book.js)
          const mj = node.querySelector(".gx-formula mjx-container");
          if (mj && window.RLGatesBook) window.RLGatesBook.fit(mj, mj.parentElement);
        })
        .catch(function (err) { console.error("MathJax:", err); });
    }
    this.signalMax = null; // recomputed below at the defaults: the colour scale stays put
    this.compute();
    let smax = 0;
    for (let k = 0; k < this.signal.length; k++) smax = Math.max(smax, Math.abs(this.signal[k]));
    this.signalMax = smax || 1;
    if (history.replaceState) history.replaceState(null, "", "#" + name);
    this.draw();
  };
  Explorer.prototype.schedule = function () {
    const self = this;
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(function () { self.pending = false; self.compute(); self.draw(); });
  };
  Explorer.prototype.compute = function () {
    const m = this.method, n = DATA.n, g = build(m.name, this.values);
    this.bounds = g.bounds;
    // the axis keeps the book's default range; it grows only when a clip bound leaves it
    let lim = m.log_ratio_lim;
    g.bounds.forEach(function (bd) {
      const l = Math.abs(Math.log(bd[0]));
      if (isFinite(l)) lim = Math.max(lim, 1.15 * l);
    });
    this.extended = lim > m.log_ratio_lim;
    this.lim = lim;
    const adv = linspace(-DATA.adv_lim, DATA.adv_lim, n), logr = linspace(-lim, lim, n);
    this.gate = new Float64Array(n * n);
    this.signedGate = new Float64Array(n * n);
    this.signal = new Float64Array(n * n);
    for (let i = 0; i < n; i++) {
      const r = Math.exp(logr[i]);
      for (let j = 0; j < n; j++) {
        const a = adv[j], f = g.gate(r, a);
        this.gate[i * n + j] = f;
        this.signedGate[i * n + j] = (a > 0 ? 1 : a < 0 ? -1 : 0) * f;
        this.signal[i * n + j] = f * r * a;
      }
    }
  };
  Explorer.prototype.draw = function () {
    const s = {
      method: this.method, lim: this.lim, bounds: this.bounds, gate: this.gate,
      signedGate: this.signedGate,
      signal: this.signal, signalMax: this.signalMax, rgb: this.rgb,
    };
    this.panels.forEach(function (p) { p.draw(s); });
    const m = this.method, vals = this.values;
    const args = m.params.map(function (p) { return p.key + "=" + +vals[p.key].toPrecision(4); });
    this.code.textContent = 'rlgates.get("' + m.name + '"' + (args.length ? ", " + args.join(", ") : "") + ")";
    const desc = m.title + " with " + (args.join(", ") || "no hyperparameters") +
      ": colour map over advantage (x, −1 to 1) and log ratio (y, ±" + fmt(this.lim) + ")" +
      (this.bounds.length ? "; dashed lines at ρ = " + this.bounds.map(function (b) { return fmt(b[0]); }).join(", ") : "");
    this.canvases[0].setAttribute("aria-label", "Gate of " + desc);
    this.canvases[1].setAttribute("aria-label", "Learning signal of " + desc);
    this.updateReadout();
    this.note.textContent = this.extended
      ? "The log ρ axis was widened (to ±" + fmt(this.lim) + ") so that every clip bound stays in view."
      : "";
  };
  Explorer.prototype.hover = function (ev, k) {
    const at = this.panels[k].at(ev);
    if (!at) return;
    this.pointer = at;
    this.updateReadout();
  };
  // The values under the pointer, for the current method, sliders and axes: called on every
  // hover and every redraw, so it never shows a previous method's (or slider's) numbers.
  Explorer.prototype.updateReadout = function () {
    if (!this.pointer) return;
    const a = -DATA.adv_lim + this.pointer[0] * 2 * DATA.adv_lim;
    const l = this.lim - this.pointer[1] * 2 * this.lim;
    const r = Math.exp(l), f = api.gate(this.method.name, this.values, r, a);
    this.readout.textContent = this.method.title + " at A = " + fmt(a) + ", log ρ = " + fmt(l) +
      " (ρ = " + fmt(r) + "): gate f′ = " + fmt(f) + ", signal f′·ρ·A = " + fmt(f * r * a) +
      (f === 0 && a !== 0 ? " — this token gets no gradient." : "");
    this.readoutAt = [a, l];
    const p = this.pointer;
    this.panels.forEach(function (panel, k) {
      const b = panel.box, c = panel.canvas, mark = this.markers[k];
      mark.style.left = (c.offsetLeft + b.x0 + p[0] * (b.x1 - b.x0)) + "px";
      mark.style.top = (c.offsetTop + b.y0 + p[1] * (b.y1 - b.y0)) + "px";
      mark.hidden = false;
    }, this);
  };

  function start() {
    const root = document.getElementById("rlgates-explorer");
    if (!root || !DATA) return;
    root.innerHTML = "";
    root.explorer = new Explorer(root);
    api.explorer = root.explorer;
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
