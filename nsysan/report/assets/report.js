/* nsysan report.html timeline: a canvas timeline in plain JavaScript (no library, no network).
 * Data: the JSON payload of nsysan/report/html_data.py in #nsysan-data. Times there are ns
 * offsets from data.t0 (the first GPU op, session time). Zoomed out, every lane draws its
 * precomputed busy share per bin; once the view is narrower than the bins, it draws the raw
 * ops (inflated from the base64 #nsysan-ops element, which follows this script, so the
 * overview draws while the parser still reads it), merging ops under one pixel into one
 * column. */
(function () {
  "use strict";
  var CLASSES = [["compute", "#2e7d32"], ["nccl", "#1565c0"], ["h2d", "#ef6c00"],
    ["d2h", "#8e24aa"], ["d2d", "#6d4c41"], ["p2p", "#00838f"], ["memset", "#757575"],
    ["other", "#455a64"]];
  var STATE_COLORS = {"compute": "#2e7d32", "nccl": "#1565c0", "h2d": "#ef6c00",
    "d2h": "#8e24aa", "d2d": "#6d4c41", "p2p": "#00838f", "memset": "#757575",
    "exposed nccl": "#c62828", "idle": "#9e9e9e"};
  // gap causes: warm colours, apart from the op classes' greens and blues
  var CAUSE_COLORS = ["#e53935", "#d81b60", "#fb8c00", "#c0ca33", "#8d6e63", "#ab47bc",
    "#f06292", "#ff7043", "#a1887f"];
  var LEFT = 130, ROW = 16, STEP_H = 14, GAP_H = 10, STATE_H = 9, AXIS_H = 18, NVTX_H = 12;
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message)); });

  var data = JSON.parse(document.getElementById("nsysan-data").textContent);
  var S = data.strings;
  var SPAN = Math.max(data.t1, 1);
  var view = [0, SPAN];
  var highlight = null;
  var ops = null, nvtx = null;
  var blocks = [];
  var firstPaintMs = null;
  var root = document.getElementById("tl-root");
  var tip = document.getElementById("tl-tip");
  var causeColor = {};

  function colorOfCause(idx) {
    if (!(idx in causeColor)) {
      var name = S[idx] || "", h = 0;
      for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      causeColor[idx] = CAUSE_COLORS[h % CAUSE_COLORS.length];
    }
    return causeColor[idx];
  }
  function b64bytes(text) {
    var bin = atob(text), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function fmtNs(ns) {
    var a = Math.abs(ns);
    if (a >= 1e9) return (ns / 1e9).toPrecision(4) + " s";
    if (a >= 1e6) return (ns / 1e6).toPrecision(4) + " ms";
    if (a >= 1e3) return (ns / 1e3).toPrecision(4) + " µs";
    return Math.round(ns) + " ns";
  }
  function fmtT(rel) { return ((data.t0 + rel) / 1e9).toFixed(6) + " s"; }
  function lowerBound(arr, lo, hi, value) {
    while (lo < hi) { var mid = (lo + hi) >>> 1; if (arr[mid] < value) lo = mid + 1; else hi = mid; }
    return lo;
  }

  // ---- blocks (one canvas per device, one for the NVTX threads) ----------------------------
  function makeBlock(title, rows, kind, dev) {
    var div = document.createElement("div");
    div.className = "block";
    var h = document.createElement("h3");
    h.textContent = title;
    var canvas = document.createElement("canvas");
    canvas.dataset.kind = kind;
    if (dev !== null) canvas.dataset.device = String(dev.id);
    div.appendChild(h); div.appendChild(canvas); root.appendChild(div);
    var height = AXIS_H;
    rows.forEach(function (r) { r.y = height; height += r.h; });
    var b = {canvas: canvas, rows: rows, height: height + 4, kind: kind, dev: dev, rects: 0,
      mode: "overview", hits: []};
    blocks.push(b);
    attach(b);
    return b;
  }
  function buildBlocks() {
    if (data.notes && data.notes.length)
      document.getElementById("tl-notes").textContent = data.notes.join(" ");
    data.devices.forEach(function (dev) {
      var rows = [];
      if (data.steps.length) rows.push({type: "steps", label: "steps", h: STEP_H});
      dev.lanes.forEach(function (lane, k) {
        lane.bins = b64bytes(lane.overview);
        rows.push({type: "lane", label: lane.label, lane: k, h: ROW});
      });
      rows.push({type: "gaps", label: "gaps (cause)", h: GAP_H + 2});
      if (dev.state) dev.state.rows.forEach(function (st) {
        st.bins = b64bytes(st.share); st.t0 = dev.state.t0; st.t1 = dev.state.t1;
        rows.push({type: "state", label: "state: " + st.name, state: st, h: STATE_H});
      });
      var busy = dev.busy === null ? "" : " — busy " + (100 * dev.busy).toFixed(1) + "%";
      makeBlock("Device " + dev.id + busy, rows, "device", dev);
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    CLASSES.forEach(function (c) {
      var s = document.createElement("span"); s.style.background = c[1];
      legend.appendChild(s); legend.appendChild(document.createTextNode(c[0]));
    });
    var causes = {};
    data.devices.forEach(function (dev) { dev.gaps.forEach(function (g) { causes[g[2]] = 1; }); });
    Object.keys(causes).map(Number).sort(function (a, b) {
      return S[a] < S[b] ? -1 : S[a] > S[b] ? 1 : 0;
    }).forEach(function (idx) {
      var s = document.createElement("span"); s.style.background = colorOfCause(idx);
      legend.appendChild(s); legend.appendChild(document.createTextNode("gap: " + S[idx]));
    });
    root.insertBefore(legend, root.firstChild);
    if (data.nvtx) {
      var rows = data.nvtx.threads.map(function (th, k) {
        return {type: "nvtx", label: th.label, thread: k, depth: th.depth,
          h: th.depth * NVTX_H + 2};
      });
      makeBlock("NVTX ranges of the launching threads (" + data.nvtx.n + ")", rows, "nvtx", null);
    }
  }

  // ---- drawing -------------------------------------------------------------------------------
  function xOf(b, t) { return LEFT + (t - view[0]) * (b.w - LEFT) / (view[1] - view[0]); }
  function detailMode() {
    // raw ops once an overview bin is wider than two pixels
    var w = (blocks.length ? blocks[0].w : 1000) - LEFT;
    return ops !== null && (SPAN / data.n_bins) * w / (view[1] - view[0]) > 2;
  }
  function drawBins(ctx, b, bins, t0, t1, y, h, color, asHeight) {
    var n = bins.length, width = (t1 - t0) / n;
    var i0 = Math.max(0, Math.floor((view[0] - t0) / width));
    var i1 = Math.min(n, Math.ceil((view[1] - t0) / width));
    ctx.fillStyle = color;
    var count = 0;
    for (var i = i0; i < i1; i++) {
      var v = bins[i];
      if (!v) continue;
      var x0 = Math.max(xOf(b, t0 + i * width), LEFT), x1 = xOf(b, t0 + (i + 1) * width);
      if (asHeight) { var hh = h * v / 255; ctx.fillRect(x0, y + h - hh, Math.max(x1 - x0, 1), hh); }
      else { ctx.globalAlpha = v / 255; ctx.fillRect(x0, y, Math.max(x1 - x0, 1), h); }
      count++;
    }
    ctx.globalAlpha = 1;
    return count;
  }
  function drawRaw(ctx, b, idx, y, h, cls) {
    var L = idx, start = L.start, dur = L.dur, klass = L.klass;
    var i = lowerBound(start, L.lo, L.hi, view[0] - L.maxDur);
    var scale = (b.w - LEFT) / (view[1] - view[0]);
    var cov = new Float32Array(Math.ceil(b.w) + 1), count = 0, last = -1;
    for (; i < L.hi && start[i] <= view[1]; i++) {
      var s = start[i], e = s + dur[i];
      if (e < view[0]) continue;
      var x0 = LEFT + (s - view[0]) * scale, x1 = LEFT + (e - view[0]) * scale;
      if (x1 - x0 >= 1) {
        if (klass[i] !== last) { last = klass[i]; ctx.fillStyle = CLASSES[last][1]; }
        var xa = Math.max(x0, LEFT);
        ctx.fillRect(xa, y + 1, Math.max(x1 - xa, 1), h - 2);
        count++;
      } else {
        var px = Math.floor(x0);
        if (px >= LEFT && px < cov.length) cov[px] += (x1 - x0);
      }
    }
    ctx.fillStyle = CLASSES[cls][1];
    for (var p = LEFT; p < cov.length; p++) {
      if (cov[p] > 0) {
        ctx.globalAlpha = Math.min(1, 0.35 + cov[p]);
        ctx.fillRect(p, y + 1, 1, h - 2);
        count++;
      }
    }
    ctx.globalAlpha = 1;
    return count;
  }
  function drawAxis(ctx, b) {
    var span = view[1] - view[0], target = span * 110 / Math.max(b.w - LEFT, 200);
    var step = Math.pow(10, Math.floor(Math.log10(Math.max(target, 1))));
    if (target / step > 5) step *= 5; else if (target / step > 2) step *= 2;
    ctx.fillStyle = "#555"; ctx.font = "10px sans-serif"; ctx.textAlign = "center";
    ctx.strokeStyle = "#eee";
    var first = Math.ceil((data.t0 + view[0]) / step) * step - data.t0;
    for (var t = first; t <= view[1]; t += step) {
      var x = xOf(b, t);
      if (x < LEFT) continue;
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS_H - 4); ctx.lineTo(x + 0.5, b.height); ctx.stroke();
      var digits = Math.max(0, Math.min(9, Math.ceil(-Math.log10(step / 1e9))));
      ctx.fillText(((data.t0 + t) / 1e9).toFixed(digits) + " s", x, 10);
    }
  }
  function drawBlock(b) {
    var canvas = b.canvas, ratio = window.devicePixelRatio || 1;
    b.w = Math.max(canvas.clientWidth || root.clientWidth || 1000, LEFT + 100);
    canvas.width = Math.round(b.w * ratio); canvas.height = Math.round(b.height * ratio);
    canvas.style.height = b.height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, b.w, b.height);
    drawAxis(ctx, b);
    var detail = detailMode(), rects = 0;
    ctx.save();
    ctx.beginPath(); ctx.rect(LEFT, 0, b.w - LEFT, b.height); ctx.clip();
    b.rows.forEach(function (r) {
      var before = rects;
      drawRow(r);
      r.rects = rects - before;
    });
    function drawRow(r) {
      if (r.type === "lane") {
        var lane = b.dev.lanes[r.lane];
        if (detail && ops.lanes[b.dev.id] && ops.lanes[b.dev.id][r.lane])
          rects += drawRaw(ctx, b, ops.lanes[b.dev.id][r.lane], r.y, r.h, lane.cls);
        else rects += drawBins(ctx, b, lane.bins, 0, SPAN, r.y + 1, r.h - 2,
          CLASSES[lane.cls][1], true);
      } else if (r.type === "state") {
        rects += drawBins(ctx, b, r.state.bins, r.state.t0, r.state.t1, r.y, r.h - 1,
          STATE_COLORS[r.state.name] || "#555", false);
      } else if (r.type === "gaps") {
        b.dev.gaps.forEach(function (g) {
          if (g[1] < view[0] || g[0] > view[1]) return;
          var x0 = Math.max(xOf(b, g[0]), LEFT), x1 = xOf(b, g[1]);
          ctx.fillStyle = colorOfCause(g[2]);
          ctx.fillRect(x0, r.y + 1, Math.max(x1 - x0, 1), r.h - 2);
          rects++;
        });
      } else if (r.type === "steps") {
        data.steps.forEach(function (st, k) {
          if (st[1] < view[0] || st[0] > view[1]) return;
          var x0 = Math.max(xOf(b, st[0]), LEFT), x1 = xOf(b, st[1]);
          ctx.fillStyle = k % 2 ? "#cfd8dc" : "#b0bec5";
          ctx.fillRect(x0, r.y + 1, Math.max(x1 - x0, 1), r.h - 2);
          if (x1 - x0 > 40) {
            ctx.fillStyle = "#263238"; ctx.font = "10px sans-serif"; ctx.textAlign = "left";
            ctx.fillText("step " + st[2], x0 + 3, r.y + 11);
          }
          rects++;
        });
      } else if (r.type === "nvtx" && nvtx) {
        rects += drawNvtx(ctx, b, r);
      }
    }
    if (highlight && (highlight.dev === null || b.kind !== "device" ||
                      highlight.dev === b.dev.id)) {
      var hx0 = xOf(b, highlight.t0), hx1 = xOf(b, highlight.t1);
      ctx.fillStyle = "rgba(255,213,79,0.35)";
      ctx.fillRect(hx0, AXIS_H, Math.max(hx1 - hx0, 2), b.height - AXIS_H);
      ctx.strokeStyle = "#ff6f00"; ctx.lineWidth = 2;
      ctx.strokeRect(hx0, AXIS_H, Math.max(hx1 - hx0, 2), b.height - AXIS_H - 1);
      ctx.lineWidth = 1;
    }
    ctx.restore();
    ctx.fillStyle = "#fff"; ctx.fillRect(0, AXIS_H, LEFT - 2, b.height);
    ctx.fillStyle = "#333"; ctx.font = "10px sans-serif"; ctx.textAlign = "right";
    b.rows.forEach(function (r) {
      if (r.h >= 9) ctx.fillText(r.label.slice(0, 24), LEFT - 6, r.y + Math.min(r.h, 14) - 3);
    });
    b.rects = rects;
    b.mode = detail ? "detail" : "overview";
  }
  function drawNvtx(ctx, b, r) {
    var T = nvtx.threads[r.thread];
    if (!T) return 0;
    var i = lowerBound(nvtx.start, T.lo, T.hi, view[0] - T.maxDur), count = 0;
    var scale = (b.w - LEFT) / (view[1] - view[0]);
    ctx.font = "9px sans-serif"; ctx.textAlign = "left";
    for (; i < T.hi && nvtx.start[i] <= view[1]; i++) {
      var s = nvtx.start[i], e = s + nvtx.dur[i];
      if (e < view[0]) continue;
      var x0 = Math.max(LEFT + (s - view[0]) * scale, LEFT), x1 = LEFT + (e - view[0]) * scale;
      var y = r.y + nvtx.depth[i] * NVTX_H;
      ctx.fillStyle = nvtx.depth[i] % 2 ? "#ffcc80" : "#ffb74d";
      ctx.fillRect(x0, y + 1, Math.max(x1 - x0, 0.5), NVTX_H - 1);
      if (x1 - x0 > 30) {
        ctx.fillStyle = "#3e2723";
        ctx.fillText(S[nvtx.name[i]].slice(0, Math.floor((x1 - x0) / 5)), x0 + 2, y + 10);
      }
      count++;
    }
    return count;
  }
  var pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; drawAll(); });
  }
  function drawAll() {
    blocks.forEach(drawBlock);
    document.getElementById("tl-range").textContent =
      fmtT(view[0]) + " – " + fmtT(view[1]) + " (" + fmtNs(view[1] - view[0]) + ")" +
      (detailMode() ? ", every op" : ", busy share per bin");
    if (firstPaintMs === null) {
      firstPaintMs = performance.now();  // since navigation start: parse + first draw
      document.body.dataset.drawn = String(blocks.length);
    }
  }

  // ---- interaction ---------------------------------------------------------------------------
  function setView(a, bEnd) {
    var minSpan = 200;
    if (bEnd - a < minSpan) { var mid = (a + bEnd) / 2; a = mid - minSpan / 2; bEnd = mid + minSpan / 2; }
    var pad = SPAN * 0.05;
    var width = Math.min(bEnd - a, SPAN + 2 * pad);
    a = Math.max(-pad, Math.min(a, SPAN + pad - width));
    view = [a, a + width];
    redraw();
  }
  function attach(b) {
    var c = b.canvas, drag = null;
    c.addEventListener("wheel", function (e) {
      e.preventDefault();
      var rect = c.getBoundingClientRect();
      // (positions inside the border, in the canvas' own CSS pixels, as drawn)
      var frac = Math.max(0, (e.clientX - rect.left - c.clientLeft - LEFT) / (b.w - LEFT));
      var t = view[0] + frac * (view[1] - view[0]);
      var k = Math.exp(e.deltaY * 0.0015);
      setView(t - (t - view[0]) * k, t + (view[1] - t) * k);
    }, {passive: false});
    c.addEventListener("mousedown", function (e) {
      drag = {x: e.clientX, view: view.slice()}; c.classList.add("dragging");
    });
    window.addEventListener("mouseup", function () { drag = null; c.classList.remove("dragging"); });
    window.addEventListener("mousemove", function (e) {
      if (!drag) return;
      var dt = (e.clientX - drag.x) * (drag.view[1] - drag.view[0]) / (b.w - LEFT);
      setView(drag.view[0] - dt, drag.view[1] - dt);
    });
    c.addEventListener("dblclick", function () { highlight = null; setView(0, SPAN); });
    c.addEventListener("mousemove", function (e) {
      if (drag) { tip.hidden = true; return; }
      var rect = c.getBoundingClientRect();
      var text = hit(b, e.clientX - rect.left - c.clientLeft, e.clientY - rect.top - c.clientTop);
      if (!text) { tip.hidden = true; return; }
      tip.textContent = text; tip.hidden = false;
      tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 400) + "px";
      tip.style.top = (e.clientY + 14) + "px";
    });
    c.addEventListener("mouseleave", function () { tip.hidden = true; });
  }
  function hit(b, px, py) {
    if (px < LEFT) return null;
    var t = view[0] + (px - LEFT) * (view[1] - view[0]) / (b.w - LEFT);
    var tol = 3 * (view[1] - view[0]) / (b.w - LEFT);
    var r = null;
    b.rows.forEach(function (row) { if (py >= row.y && py < row.y + row.h) r = row; });
    if (!r) return null;
    if (r.type === "lane") {
      var lane = b.dev.lanes[r.lane];
      var L = ops && ops.lanes[b.dev.id] && ops.lanes[b.dev.id][r.lane];
      if (detailMode() && L) {
        var i = lowerBound(L.start, L.lo, L.hi, t - L.maxDur - tol), best = -1, bestD = Infinity;
        for (; i < L.hi && L.start[i] <= t + tol; i++) {
          var s = L.start[i], e = s + L.dur[i];
          var d = t < s ? s - t : (t > e ? t - e : 0);
          if (d <= tol && d < bestD) { best = i; bestD = d; }
        }
        if (best < 0) return lane.label + ": idle at " + fmtT(t);
        return S[L.name[best]] + "\n" + fmtNs(L.dur[best]) + " at " + fmtT(L.start[best]) +
          "\n" + CLASSES[L.klass[best]][0] + " · " + lane.label + " · device " + b.dev.id +
          "\nlaunched by " + (S[L.api[best]] || "(no launch call recorded)");
      }
      var k = Math.floor(t / (SPAN / lane.bins.length));
      if (k < 0 || k >= lane.bins.length) return null;
      return lane.label + " (" + lane.n_ops + " ops): busy " +
        (100 * lane.bins[k] / 255).toFixed(0) + "% of the bin at " + fmtT(t) +
        "\nzoom in to see every op";
    }
    if (r.type === "gaps") {
      var g = b.dev.gaps.find(function (g) { return g[0] - tol <= t && t <= g[1] + tol; });
      return g ? "gap " + fmtNs(g[1] - g[0]) + " at " + fmtT(g[0]) + "\ncause: " + S[g[2]] +
        (S[g[3]] ? "\n" + S[g[3]] : "") : null;
    }
    if (r.type === "steps") {
      var st = data.steps.find(function (s) { return s[0] <= t && t < s[1]; });
      return st ? "step " + st[2] + ": " + fmtNs(st[1] - st[0]) + " from " + fmtT(st[0]) : null;
    }
    if (r.type === "state") {
      var n = r.state.bins.length, w = (r.state.t1 - r.state.t0) / n;
      var j = Math.floor((t - r.state.t0) / w);
      if (j < 0 || j >= n) return null;
      return r.state.name + ": " + (100 * r.state.bins[j] / 255).toFixed(0) + "% of the bin at " +
        fmtT(t);
    }
    if (r.type === "nvtx" && nvtx) {
      var T = nvtx.threads[r.thread], depth = Math.floor((py - r.y) / NVTX_H), found = -1;
      if (!T) return null;
      for (var q = lowerBound(nvtx.start, T.lo, T.hi, t - T.maxDur); q < T.hi && nvtx.start[q] <= t; q++)
        if (nvtx.depth[q] === depth && nvtx.start[q] + nvtx.dur[q] >= t) found = q;
      if (found < 0) return null;
      return S[nvtx.name[found]] + "\n" + fmtNs(nvtx.dur[found]) + " at " +
        fmtT(nvtx.start[found]) + "\n" + r.label + ", depth " + depth;
    }
    return null;
  }
  function zoomTo(absT0, absT1, dev) {
    var t0 = absT0 - data.t0, t1 = absT1 - data.t0;
    var pad = Math.max((t1 - t0) * 0.15, 500);
    highlight = {t0: t0, t1: t1, dev: dev === undefined ? null : dev};
    setView(t0 - pad, t1 + pad);
    var target = null;
    blocks.forEach(function (b) {
      if (!target && b.kind === "device" && (highlight.dev === null || b.dev.id === highlight.dev))
        target = b.canvas;
    });
    (target || root).scrollIntoView({block: "center"});
  }

  // ---- raw data (inflated after the first paint) ---------------------------------------------
  function column(buf, name) {
    var l = data.layout[name];
    var T = {uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array,
      float64: Float64Array}[l.type];
    return new T(buf, l.offset, l.length);
  }
  function parsed() {  // the raw ops element follows this script: wait for the parser
    if (document.readyState !== "loading") return Promise.resolve();
    return new Promise(function (resolve) {
      document.addEventListener("DOMContentLoaded", function () { resolve(); });
    });
  }
  function inflate() {
    return parsed().then(function () {
      var el = document.getElementById("nsysan-ops");
      var text = el ? el.textContent.trim() : "";
      if (!text || typeof DecompressionStream === "undefined") return null;
      var stream = new Blob([b64bytes(text)]).stream()
        .pipeThrough(new DecompressionStream("deflate"));
      return new Response(stream).arrayBuffer();
    });
  }
  function index(buf) {
    var dev = column(buf, "op_device"), lane = column(buf, "op_lane");
    var delta = column(buf, "op_start"), dur = column(buf, "op_dur");
    var n = dev.length, start = new Float64Array(n), durs = Float64Array.from(dur);
    var klass = column(buf, "op_class"), name = column(buf, "op_name"), api = column(buf, "op_api");
    var lanes = {};
    var lo = 0;
    for (var i = 0; i <= n; i++) {
      var boundary = i === n || (i > 0 && (dev[i] !== dev[i - 1] || lane[i] !== lane[i - 1]));
      if (boundary && i > lo) {
        var maxDur = 0;
        for (var k = lo; k < i; k++) if (durs[k] > maxDur) maxDur = durs[k];
        (lanes[dev[lo]] = lanes[dev[lo]] || {})[lane[lo]] = {lo: lo, hi: i, maxDur: maxDur,
          start: start, dur: durs, klass: klass, name: name, api: api};
        lo = i;
      }
      if (i < n) start[i] = (i === lo) ? delta[i] : start[i - 1] + delta[i];
    }
    ops = {lanes: lanes, n: n};
    if (data.nvtx && data.layout.nvtx_thread) {
      var th = column(buf, "nvtx_thread"), ns = Float64Array.from(column(buf, "nvtx_start"));
      var nd = Float64Array.from(column(buf, "nvtx_dur")), threads = [];
      var m = th.length, j0 = 0;
      for (var j = 0; j <= m; j++) {
        if (j === m || (j > 0 && th[j] !== th[j - 1])) {
          if (j > j0) {
            var md = 0;
            for (var q = j0; q < j; q++) if (nd[q] > md) md = nd[q];
            threads[th[j0]] = {lo: j0, hi: j, maxDur: md};
          }
          j0 = j;
        }
      }
      nvtx = {threads: threads, start: ns, dur: nd, depth: column(buf, "nvtx_depth"),
        name: column(buf, "nvtx_name")};
    }
  }

  // ---- the rest of the page: finding windows, sortable tables --------------------------------
  function wirePage() {
    document.querySelectorAll("button.win").forEach(function (btn) {
      btn.addEventListener("click", function () {
        document.querySelectorAll("button.win.active").forEach(function (o) {
          o.classList.remove("active");
        });
        btn.classList.add("active");
        var dev = btn.dataset.device === undefined ? null : Number(btn.dataset.device);
        zoomTo(Number(btn.dataset.t0), Number(btn.dataset.t1), dev);
      });
    });
    document.querySelectorAll("tr.zoom").forEach(function (tr) {
      tr.addEventListener("click", function () {
        var dev = tr.dataset.device === undefined ? null : Number(tr.dataset.device);
        zoomTo(Number(tr.dataset.t0), Number(tr.dataset.t1), dev);
      });
    });
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var ths = table.querySelectorAll("th");
      ths.forEach(function (th, col) {
        th.addEventListener("click", function () {
          var asc = th.dataset.sorted !== "asc";
          ths.forEach(function (o) { delete o.dataset.sorted; });
          th.dataset.sorted = asc ? "asc" : "desc";
          var numeric = th.dataset.kind !== "text";
          var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
          var keyed = rows.map(function (row, k) {
            var cell = row.cells[col];
            var v = numeric ? (cell.dataset.v === "" ? NaN : Number(cell.dataset.v))
              : cell.textContent;
            return {row: row, v: v, k: k};
          });
          keyed.sort(function (a, b) {
            var c;
            if (numeric) {
              var an = isNaN(a.v), bn = isNaN(b.v);
              c = an || bn ? (an - bn) : (asc ? a.v - b.v : b.v - a.v);
            } else c = asc ? (a.v < b.v ? -1 : a.v > b.v ? 1 : 0) : (a.v > b.v ? -1 : a.v < b.v ? 1 : 0);
            return c || a.k - b.k;
          });
          keyed.forEach(function (x) { body.appendChild(x.row); });
        });
      });
    });
    document.getElementById("tl-reset").addEventListener("click", function () {
      highlight = null; setView(0, SPAN);
    });
    window.addEventListener("resize", redraw);
  }

  var ready = (function () {
    buildBlocks();
    wirePage();
    drawAll();
    return inflate().then(function (buf) {
      if (buf) index(buf);
      drawAll();
      document.body.dataset.ops = ops ? "ready" : "none";
    }).catch(function (e) {
      errors.push(String(e));
      document.body.dataset.ops = "failed";
      throw e;
    });
  })();

  window.nsysanReport = {
    ready: ready,
    zoomTo: zoomTo,
    setView: function (a, b) { setView(a - data.t0, b - data.t0); drawAll(); },
    state: function () {
      return {
        view: [data.t0 + view[0], data.t0 + view[1]],
        highlight: highlight && {t0: data.t0 + highlight.t0, t1: data.t0 + highlight.t1,
          device: highlight.dev},
        devices: blocks.filter(function (b) { return b.kind === "device"; }).map(function (b) {
          return {id: b.dev.id, rects: b.rects, mode: b.mode, lanes: b.dev.lanes.length,
            width: b.w, left: LEFT,
            rows: b.rows.map(function (r) {
              return {type: r.type, label: r.label, rects: r.rects, y: r.y, h: r.h};
            })};
        }),
        nvtxRects: blocks.filter(function (b) { return b.kind === "nvtx"; })
          .reduce(function (s, b) { return s + b.rects; }, 0),
        opsLoaded: ops ? ops.n : 0,
        firstPaintMs: firstPaintMs,
        errors: errors.slice()
      };
    }
  };
})();
