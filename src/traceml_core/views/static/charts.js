// TraceML's line charts over uPlot, shared by the live dashboard and the HTML report.
// Axes: y starts at 0 unless told otherwise (a flat 325 MiB line must not look like a cliff
// because the scale was autoscaled to half a MiB), the axis is as wide as its longest label
// (no "25.75" for 325.75), and labels carry the unit. Every chart registers itself in
// window.TraceCharts.registry so tests can read back what was drawn.
"use strict";
(function () {
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                  "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#ad494a", "#637939", "#e7969c"];
  const registry = {};
  const STEP_INCRS = [];
  for (let m = 1; m <= 1e9; m *= 10) STEP_INCRS.push(m, 2 * m, 5 * m);

  function fmtNum(v) {
    if (v == null || !isFinite(v)) return "";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(a >= 1e5 ? 0 : 1) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1).replace(/\.0$/, "");
    if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
    if (a === 0) return "0";
    return v.toPrecision(2);
  }

  function axisSize(self, values) {
    // wide enough for the longest tick label (7 px per character at 11-12 px fonts) + ticks
    if (!values) return 40;
    let longest = 0;
    for (const s of values) if (s != null) longest = Math.max(longest, String(s).length);
    return Math.max(40, 14 + 7.5 * longest);
  }

  // data: [xs, ys1, ys2, ...]; opts: {xlabel, ylabel, labels, height, yzero (default true),
  // ymax (fixed upper bound, e.g. 100 for percent), widths (per series), dash (per series),
  // colors (per series)}
  function line(el, data, opts) {
    opts = opts || {};
    el.style.minWidth = "0";
    const width = Math.max(280, el.clientWidth || 520);
    const height = opts.height || 220;
    const labels = opts.labels || [];
    const yzero = opts.yzero !== false;
    const ymax = opts.ymax;
    const series = [{ label: opts.xlabel || "x", value: (u, v) => v == null ? "-" : fmtNum(v) }].concat(
      labels.map((l, i) => ({
        label: l,
        stroke: (opts.colors && opts.colors[i]) || COLORS[i % COLORS.length],
        width: (opts.widths && opts.widths[i]) || 1.5,
        dash: opts.dash && opts.dash[i] ? opts.dash[i] : undefined,
        spanGaps: true,
        points: { show: false },
        value: (u, v) => v == null ? "-" : fmtNum(v) + (opts.unit ? " " + opts.unit : ""),
      })));
    const uopts = {
      width, height, legend: { show: true },
      scales: {
        x: { time: false },
        y: { range: (u, min, max) => {
          const hi = ymax != null ? ymax : (max == null || !isFinite(max) ? 1 : (max > 0 ? max * 1.08 : 1));
          const lo = yzero ? Math.min(0, min == null || !isFinite(min) ? 0 : min) : (min == null ? 0 : min - (hi - min) * 0.05);
          return [lo, hi];
        } },
      },
      axes: [
        // steps are whole numbers: no tick at step 2.5
        Object.assign({ label: opts.xlabel || "", values: (u, vals) => vals.map(fmtNum), size: 42 },
                      opts.xlabel === "step" ? { incrs: STEP_INCRS } : {}),
        { label: opts.ylabel || "", values: (u, vals) => vals.map(fmtNum), size: axisSize, labelSize: 20 },
      ],
      series,
    };
    const key = labels.join("|") + "#" + (opts.ylabel || "");
    let c = registry[el.id];
    if (!c || c.key !== key) {
      if (c) c.plot.destroy();
      el.innerHTML = "";
      c = registry[el.id] = { key, labels, plot: new uPlot(uopts, data, el) };
    } else {
      c.plot.setData(data);
      if (Math.abs(c.plot.width - width) > 4) c.plot.setSize({ width, height });
    }
    let pts = 0;
    for (let i = 1; i < data.length; i++) for (const v of data[i]) if (v != null) pts++;
    el.dataset.points = pts;
    el.dataset.series = labels.length;
    return c.plot;
  }

  // One x axis for several series given as [{x: [...], y: [...]}]: the union of their xs.
  function align(list) {
    const xs = Array.from(new Set([].concat(...list.map(s => s.x)))).sort((a, b) => a - b);
    const ys = list.map(s => { const m = new Map(s.x.map((x, i) => [x, s.y[i]])); return xs.map(x => m.has(x) ? m.get(x) : null); });
    return [xs].concat(ys);
  }

  // Mean of the non-null values of series i of a registered chart (tests read this).
  function seriesMeans(id) {
    const c = registry[id];
    if (!c) return null;
    return c.plot.data.slice(1).map(ys => {
      const v = ys.filter(y => y != null);
      return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
    });
  }

  // Size every chart to its box (after the page is laid out, and on resize).
  function fitAll() {
    for (const id of Object.keys(registry)) {
      const el = document.getElementById(id);
      const c = registry[id];
      if (!el || !c) continue;
      const w = Math.max(280, el.clientWidth);
      if (Math.abs(c.plot.width - w) > 4) c.plot.setSize({ width: w, height: c.plot.height });
    }
  }

  window.TraceCharts = { line, align, fmtNum, registry, seriesMeans, fitAll, COLORS };
})();
