/* Fluxo browser view, the charts: the Vega views created once from the named-data specs, fed
 * incremental changesets of the rows rows.js derives from the buffer, at most ~4 renders a second
 * and none while the tab is hidden. Loaded after fluxo.js (which holds the shared state, S). */
(function () {
  "use strict";
  const S = window.fluxo;
  const R = window.FluxoRows;
  const {w, fmt, esc} = S;
  const $ = id => document.getElementById(id);

  const MIN_RENDER_MS = 250;     // at most ~4 renders a second
  let buildGen = 0;
  let builtWidth = 0;

  /* Pixel widths for the spec's "container" widths: single and layered views fit the div
   * (autosize fit-x); concatenated ones (which cannot fit) get the div's width less their axes.
   * Every view re-lays itself out when its data changes (resize): laid out once, on the empty
   * named datasets, the slot chart's canvas stopped ~60 px short and cut off its overview strip,
   * which then showed under the next chart's title. */
  function sized(spec, w) {
    spec = JSON.parse(JSON.stringify(spec));
    spec.autosize = {type: "pad", resize: true};
    if (spec.hconcat) {
      const fixed = spec.hconcat.slice(1).reduce((a, c) => a + (typeof c.width === "number" ? c.width : 0), 0);
      spec.hconcat[0].width = Math.max(240, w - fixed - (spec.spacing || 0) * spec.hconcat.length - 110);
    } else if (spec.vconcat) {
      const walk = node => {
        if (node.vconcat) node.vconcat.forEach(walk);
        else if (node.width === "container") node.width = Math.max(240, w - 110);
      };
      walk(spec);
    } else {
      spec.width = w;
      spec.autosize = {type: "fit-x", contains: "padding", resize: true};
    }
    return spec;
  }

  async function buildViews(specs, order) {
    const gen = ++buildGen;
    for (const v of Object.values(S.views)) v.finalize();
    S.views = {};
    S.rows = {};
    const box = $("fluxo-charts");
    box.textContent = "";
    const opts = {renderer: "canvas", actions: {export: true, source: false, compiled: false, editor: false}};
    if (S.args && S.args.locale) opts.formatLocale = S.args.locale;  // decimal comma in pt-BR
    const divs = order.map(name => {
      const div = document.createElement("div");
      div.className = "chart";
      div.id = "chart-" + name;
      box.appendChild(div);
      return div;
    });
    builtWidth = box.clientWidth;
    await Promise.all(order.map(async (name, i) => {
      const res = await vegaEmbed(divs[i], sized(specs[name], divs[i].clientWidth - 8), opts);
      if (gen === buildGen) S.views[name] = res.view;
      else res.finalize();
    }));
    if (gen !== buildGen) return;
    S.dirty = true;
    render();
    S.setHeight();
  }
  S.buildViews = buildViews;

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (S.args && Math.abs($("fluxo-charts").clientWidth - builtWidth) > 40) {
        buildViews(S.args.specs || {}, S.args.order || Object.keys(S.args.specs || {}));
      }
    }, 400);
  });

  /* Feed one named dataset: rows keyed by ``key``; new keys are inserted, keys gone are
   * removed, and fields that changed are modified in place on the tuple the view holds. */
  function apply(viewName, data, rows, key, cs) {
    const id = viewName + "/" + data;
    const prev = S.rows[id] || new Map();
    const next = new Map();
    let n = 0;
    for (const r of rows) {
      const k = key(r);
      const old = prev.get(k);
      if (old !== undefined) {
        for (const f in r) if (old[f] !== r[f]) { cs.modify(old, f, r[f]); n++; }
        next.set(k, old);
        prev.delete(k);
      } else if (!next.has(k)) {
        cs.insert(r);
        next.set(k, r);
        n++;
      }
    }
    for (const old of prev.values()) { cs.remove(old); n++; }
    S.rows[id] = next;
    return n;
  }

  function feed(viewName, data, rows, key) {
    const view = S.views[viewName];
    if (!view) return 0;
    const cs = vega.changeset();
    const n = apply(viewName, data, rows, key, cs);
    if (n) view.change(data, cs);
    return n;
  }

  /* A dataset's rows keyed by the fields app/charts/registry.py declares for it. */
  const keyOf = fields => fields.length === 1 ? (r => r[fields[0]]) : (r => fields.map(f => r[f]).join(":"));

  /* Signals a view sets from its rows besides its datasets: the lane chart's title. */
  const SIGNALS = {
    lanes(steps, rows) {
      const runner = steps.length ? steps[steps.length - 1].runner : "";
      const busy = fmt(R.deviceBusy(rows.lanes), "%", 100, 0);
      return {lane_title: `${w("chart_lanes")} · ${runner} · ${w("m_busy")} ${busy}`};
    },
  };

  /* One chart: its datasets from the buffer (rows.js CHART_ROWS, the registry's windows), fed
   * by their declared keys; a dataset the chart does not return (no overview) is left alone. */
  function feedChart(name, meta) {
    const rows = R.CHART_ROWS[name](S.buffer, meta.window, S.people, S.args.overview !== false);
    let changed = 0;
    for (const [data, fields] of Object.entries(meta.datasets)) {
      if (rows[data] !== undefined) changed += feed(name, data, rows[data], keyOf(fields));
    }
    const signals = SIGNALS[name] ? SIGNALS[name](S.buffer, rows) : {};
    for (const [sig, value] of Object.entries(signals)) {
      if (S.views[name].signal(sig) !== value) { S.views[name].signal(sig, value); changed++; }
    }
    return changed;
  }

  function render() {
    if (!S.dirty || document.hidden) return;
    const t0 = performance.now();
    S.dirty = false;
    let changed = 0;
    for (const [name, meta] of Object.entries(S.args.charts || {})) {
      if (S.views[name]) changed += feedChart(name, meta);
    }
    for (const v of Object.values(S.views)) v.runAsync();
    showLastStep();
    S.renderChats();
    S.renders++;
    // the first render that drew any rows, on the epoch clock the page shares (engine/lab/
    // page_latency.py times a page change from the click, in the browser, to this)
    if (!S.firstDrawn && changed && S.buffer.length) S.firstDrawn = performance.timeOrigin + performance.now();
    S.changed = changed;
    S.renderMs = performance.now() - t0;
    S.lastRender = performance.now();
  }

  function tick() {
    if (document.hidden) return;
    // Coalesce: at most one render per MIN_RENDER_MS, and slower if a render costs a lot.
    const gap = Math.max(MIN_RENDER_MS, 4 * S.renderMs);
    if ((S.dirty || S.chatDirty) && performance.now() - S.lastRender >= gap) {
      if (S.dirty) render(); else S.renderChats();
    }
  }
  setInterval(tick, 100);

  function showLastStep() {
    const el = $("fluxo-last-step");
    const last = S.buffer.length ? S.buffer[S.buffer.length - 1] : null;
    if (!last) { el.textContent = S.mode === "live" ? w("v_no_steps") : ""; return; }
    const off = S.state.wall_offset;
    el.dataset.step = String(last.step);
    el.dataset.tEnd = off === undefined ? "" : (last.t_end + off).toFixed(4);
    const age = off === undefined ? "" : " · " + w("v_age", {ms: Math.round(Date.now() - 1000 * (last.t_end + off))});
    // Every field escaped: a recording (or a crafted render) may hold anything in any field.
    el.innerHTML = `${esc(w("v_step"))} <b>${esc(last.step)}</b> · ${esc(last.policy)} · ${esc(last.runner)} · ` +
      `${esc(w("v_queue"))} ${esc(last.queue_len)}` +
      (S.mode === "live" ? esc(age) : "");
    if (S.mode === "live") {
      $("fluxo-foot").textContent = w("v_foot", {n: S.buffer.length, r: S.received, s: S.skipped, k: S.renders,
        ms: S.renderMs.toFixed(0), c: S.changed});
    }
  }
})();
