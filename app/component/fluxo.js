/* Fluxo browser view: a Streamlit component (app/browser_view.py) that draws the lab's charts.
 *
 * Live mode: this browser session opens its own websocket to the engine server (its own client:
 * its own identity and per-client limits), subscribes to the step stream, keeps a bounded ring
 * buffer of step records, and draws four Vega views created ONCE from the named-data specs of
 * app/charts.py. New steps become incremental changesets (insert new rows, remove rows that left
 * the window, modify rows that changed, e.g. the open run of a slot), applied at most ~4 times a
 * second, never while the tab is hidden (the subscription is dropped then and taken again with
 * history when the tab shows). Chat goes over the same socket. Nothing reruns Streamlit.
 *
 * Static mode (Step by step, Compare): the records come as component arguments, drawn once per
 * change of the arguments. Replay mode: a recorded run comes as arguments and player.js plays it
 * (play / pause, scrub, step, speed). The rows come from rows.js in every mode. The words come
 * from app/i18n.py with the arguments (English or Portuguese), and so does the number locale.
 */
(function () {
  "use strict";
  const R = window.FluxoRows;
  const $ = id => document.getElementById(id);

  const MIN_RENDER_MS = 250;     // at most ~4 renders a second
  const METRIC_LABELS = [
    ["m_throughput", "throughput", "", 1, 1], ["m_ttft", "ttft_p50", " ms", 1000, 0],
    ["m_itl50", "itl_p50", " ms", 1000, 0], ["m_itl99", "itl_p99", " ms", 1000, 0],
    ["m_slot_util", "slot_utilization", "%", 100, 0], ["m_dead", "dead_slot_fraction", "%", 100, 0],
    ["m_kv_waste", "kv_waste", "%", 100, 0], ["m_busy", "busy_fraction", "%", 100, 0]];
  /* A word of the page's language (app/i18n.py), with {fields} filled in. */
  function w(key, fields) {
    let text = (S.args && S.args.words && S.args.words[key]) || key;
    for (const k in (fields || {})) text = text.split("{" + k + "}").join(String(fields[k]));
    return text;
  }

  const S = {
    args: null, specsJson: null, dataKey: null, mode: null,
    buffer: [], bufferSize: 1000, people: new Set(), views: {}, rows: {}, dirty: false,
    ws: null, status: "starting", client: null, role: null, state: {}, metrics: null, limits: null,
    backoff: 250, reconnectTimer: null, subscribed: false, lastRender: 0, renderMs: 0,
    renders: 0, received: 0, skipped: 0, chats: [], chatSeq: 0, errors: [], frameHeight: 0,
    all: [],
  };
  S.w = w;
  S.post = (type, data) => post(type, data);
  window.fluxo = S;  // for the page tests: state, counters, send()

  // -- Streamlit component protocol (v1) ------------------------------------------------------
  function post(type, data) {
    window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, data || {}), "*");
  }
  function setHeight() {
    const h = Math.ceil(document.documentElement.scrollHeight) + 4;
    if (Math.abs(h - S.frameHeight) > 2) {
      S.frameHeight = h;
      post("streamlit:setFrameHeight", {height: h});
    }
  }
  window.addEventListener("message", ev => {
    if (!ev.data || ev.data.type !== "streamlit:render") return;
    onArgs(ev.data.args || {});
  });
  new ResizeObserver(setHeight).observe(document.body);

  function applyWords(args) {
    document.documentElement.lang = args.lang || "en";
    document.body.classList.toggle("projector", !!args.projector);
    $("fluxo-chat-title").textContent = w("v_chat");
    $("fluxo-chat-input").placeholder = w("v_ask");
    $("fluxo-chat-send").textContent = w("v_send");
    $("fluxo-chat-max-label").firstChild.textContent = w("v_max_tokens") + " ";
    $("fluxo-metrics").textContent = "";  // rebuilt with the language's labels
  }

  function onArgs(args) {
    const langChanged = !S.args || S.args.lang !== args.lang || S.args.projector !== args.projector;
    S.args = args;
    if (langChanged) applyWords(args);
    const specsJson = JSON.stringify([args.specs || {}, args.locale || null]);
    const modeChanged = S.mode !== args.mode;
    S.mode = args.mode;
    S.bufferSize = args.buffer || 1000;
    S.windows = Object.assign({slots: 300, stalls: 300, kv: 2000, lanes: 12}, args.windows || {});
    $("fluxo-charts").style.setProperty("--min-col", (args.min_column || 720) + "px");
    $("fluxo-chat").hidden = !args.chat;
    $("fluxo-metrics").hidden = !args.metrics;
    if (specsJson !== S.specsJson) {
      S.specsJson = specsJson;
      buildViews(args.specs || {}, args.order || Object.keys(args.specs || {}));
    }
    $("fluxo-player").hidden = args.mode !== "replay";
    if (args.mode === "static" || args.mode === "replay") {
      if (S.ws) { const ws = S.ws; S.ws = null; ws.onclose = null; ws.close(); }
      clearTimeout(S.reconnectTimer);
      setStatus("static", args.caption || "recorded steps");
      if (args.mode === "replay") {
        if (args.data_key !== S.dataKey) {
          S.dataKey = args.data_key;
          S.all = args.steps || [];
          S.people = new Set(args.people || []);
          window.FluxoPlayer.load(args.at, args.speed);
        }
        // A later ``at`` is the page echoing what this view (or its synced twin) reported, maybe
        // late: the view keeps its own position until the run itself changes.
      } else if (args.data_key !== S.dataKey) {
        S.dataKey = args.data_key;
        S.buffer = args.steps || [];
        S.people = new Set(args.people || []);
        S.dirty = true;
      }
    } else if (modeChanged || !S.ws) {
      connect();
    }
    if (args.held !== undefined) showHeld(args.held);
    setHeight();
  }

  // -- views ----------------------------------------------------------------------------------
  let buildGen = 0;
  let builtWidth = 0;

  /* Pixel widths for the spec's "container" widths: single and layered views fit the div
   * (autosize fit-x); concatenated ones (which cannot fit) get the div's width less their axes. */
  function sized(spec, w) {
    spec = JSON.parse(JSON.stringify(spec));
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
      spec.autosize = {type: "fit-x", contains: "padding"};
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
    setHeight();
  }

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

  function render() {
    if (!S.dirty || document.hidden) return;
    const t0 = performance.now();
    S.dirty = false;
    const steps = S.buffer;
    const W = S.windows;
    let changed = 0;
    if (S.views.slots) {
      const budget = R.MAX_ROWS - R.OVERVIEW_BINS * R.PHASES.length - W.slots;
      const [win, spans] = R.fitWindow(steps, W.slots, S.people, budget);
      const rows = spans.map(sp => ({slot: sp.slot, request: sp.request, phase: sp.phase, start: sp.start, end: sp.end,
                                     tokens: sp.tokens, who: sp.who}));
      changed += feed("slots", "spans", rows, r => r.slot + ":" + r.start);
      changed += feed("slots", "queue", R.queueSeries(win), r => r.step);
      if (S.args.overview !== false) changed += feed("slots", "overview", R.overview(steps), r => r.step + ":" + r.phase);
    }
    if (S.views.stalls) {
      let rows = R.itlPerStep(steps);
      rows = W.stalls ? rows.slice(-W.stalls) : rows;
      changed += feed("stalls", "prefill", R.prefillBars(rows), r => r.step);
      changed += feed("stalls", "admissions", R.admissionMarkers(rows), r => r.step);
      changed += feed("stalls", "machine", R.machineMarkers(rows), r => r.step);
      changed += feed("stalls", "itl_lines", R.stallLines(rows), r => r.step + ":" + r.series);
    }
    if (S.views.kv) {
      const win = R.window(steps, W.kv);
      changed += feed("kv", "kv_series", R.kvSeries(win), r => r.step + ":" + r.state);
      changed += feed("kv", "blocks", R.blockMap(win), r => r.cell);
    }
    if (S.views.lanes) {
      const spans = R.laneSpans(steps, W.lanes);
      changed += feed("lanes", "lanes", spans, r => r.step + ":" + r.lane);
      const runner = steps.length ? steps[steps.length - 1].runner : "";
      const busy = fmt(R.deviceBusy(spans), "%", 100, 0);
      const title = `${w("chart_lanes")} · ${runner} · ${w("m_busy")} ${busy}`;
      if (S.views.lanes.signal("lane_title") !== title) { S.views.lanes.signal("lane_title", title); changed++; }
    }
    for (const v of Object.values(S.views)) v.runAsync();
    showLastStep();
    renderChats();
    S.renders++;
    S.changed = changed;
    S.renderMs = performance.now() - t0;
    S.lastRender = performance.now();
  }

  function tick() {
    if (document.hidden) return;
    // Coalesce: at most one render per MIN_RENDER_MS, and slower if a render costs a lot.
    const gap = Math.max(MIN_RENDER_MS, 4 * S.renderMs);
    if ((S.dirty || S.chatDirty) && performance.now() - S.lastRender >= gap) {
      if (S.dirty) render(); else renderChats();
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
    const age = off === undefined ? "" : ` · ${Math.round(Date.now() - 1000 * (last.t_end + off))} ms old at render`;
    el.innerHTML = `${esc(w("v_step"))} <b>${last.step}</b> · ${esc(last.policy)} · ${esc(last.runner)} · ` +
      `${esc(w("v_queue"))} ${last.queue_len}` +
      (S.mode === "live" ? age : "");
    if (S.mode === "live") {
      $("fluxo-foot").textContent = `${S.buffer.length} steps buffered · ${S.received} received, ${S.skipped} skipped ` +
        `by the server · ${S.renders} renders (last ${S.renderMs.toFixed(0)} ms, ${S.changed} rows changed)`;
    }
  }

  function esc(s) {
    return String(s === undefined || s === null ? "" : s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  }

  // -- headline metrics (the server's metrics messages: engine.metrics.summarize) --------------
  function fmt(v, unit, scale, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "—";
    const text = (v * scale).toLocaleString(S.args && S.args.lang === "pt-BR" ? "pt-BR" : "en-US",
      {minimumFractionDigits: digits, maximumFractionDigits: digits});
    return text + unit;
  }
  S.fmt = fmt;
  function showMetrics() {
    const box = $("fluxo-metrics");
    if (box.hidden || !S.metrics) return;
    const sum = S.metrics.summary || {};
    if (!box.childElementCount) {
      for (const [label] of METRIC_LABELS) {
        const d = document.createElement("div");
        d.className = "metric";
        d.innerHTML = `<div class="label">${esc(w(label))}</div><div class="value">—</div>`;
        box.appendChild(d);
      }
    }
    METRIC_LABELS.forEach(([, key, unit, scale, digits], i) => {
      box.children[i].lastChild.textContent = fmt(sum[key], unit, scale, digits);
    });
    $("fluxo-metrics-caption").textContent = w("over_server", {s: Math.round(S.metrics.window_s || 0)});
  }

  function showHeld(held) {
    const el = $("fluxo-held");
    el.hidden = !held;
    el.textContent = held ? w("v_held") : "";
  }

  function setStatus(status, text) {
    S.status = status;
    $("fluxo-dot").className = "dot " + status;
    $("fluxo-status-text").textContent = text;
  }

  // -- the engine connection (live mode) ------------------------------------------------------
  function engineUrl() {
    const a = S.args;
    if (a.engine_public_url) return a.engine_public_url;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    return `${scheme}://${location.hostname}:${a.engine_port}`;
  }

  function connect() {
    if (S.ws) return;
    clearTimeout(S.reconnectTimer);
    const url = engineUrl();
    setStatus("connecting", w("v_connecting", {url: url}));
    let ws;
    try { ws = new WebSocket(url); } catch (e) { scheduleReconnect(String(e)); return; }
    S.ws = ws;
    ws.onopen = () => { S.backoff = 250; if (!document.hidden) subscribe(); };
    ws.onmessage = ev => onMessage(JSON.parse(ev.data));
    ws.onclose = ev => {
      S.ws = null;
      S.subscribed = false;
      for (const c of S.chats) if (!c.ended) { c.ended = true; c.status = "error"; c.error = "disconnected: the connection to the engine closed"; }
      S.chatDirty = true;
      scheduleReconnect(`closed (${ev.code})`);
    };
  }

  function scheduleReconnect(why) {
    if (S.mode !== "live") return;
    setStatus("disconnected", w("v_unreachable", {url: engineUrl(), why: why, s: fmt(S.backoff / 1000, "", 1, 1)}));
    S.reconnectTimer = setTimeout(() => { S.ws = null; connect(); }, S.backoff);
    S.backoff = Math.min(5000, S.backoff * 2);
  }

  function send(msg) {
    if (!S.ws || S.ws.readyState !== WebSocket.OPEN) return false;
    S.ws.send(JSON.stringify(msg));
    return true;
  }
  S.send = send;

  function subscribe() {
    if (send({type: "subscribe", history: S.bufferSize})) S.subscribed = true;
  }

  document.addEventListener("visibilitychange", () => {
    if (S.mode !== "live") return;
    if (document.hidden) {
      if (S.subscribed && send({type: "unsubscribe"})) S.subscribed = false;
    } else {
      if (!S.subscribed) subscribe();
      S.dirty = true;
    }
  });

  function addPeople(requests) {
    for (const r of requests) if (r.client !== undefined && r.client !== null && r.client !== "traffic") S.people.add(r.id);
  }

  function onMessage(m) {
    if (S.mode !== "live") return;
    switch (m.type) {
      case "hello":
        S.client = m.client; S.role = m.role; S.limits = m.limits; S.state = m.state || {};
        setStatus("connected", w("v_connected", {client: m.client, model: m.model}));
        break;
      case "state":
        S.state = m;
        showHeld(!!m.comparing);
        break;
      case "history":
        S.buffer = (m.steps || []).slice(-S.bufferSize);
        addPeople(m.requests || []);
        S.dirty = true;
        break;
      case "step": {
        const rec = m.record;
        const last = S.buffer.length ? S.buffer[S.buffer.length - 1] : null;
        if (last && rec.step <= last.step) S.buffer = [];  // the engine was reset: a new run
        S.buffer.push(rec);
        if (S.buffer.length > S.bufferSize) S.buffer.splice(0, S.buffer.length - S.bufferSize);
        S.received++;
        S.skipped += m.skipped || 0;
        S.dirty = true;
        break;
      }
      case "request":
        addPeople([m.record]);
        break;
      case "metrics":
        S.metrics = m;
        if (!document.hidden) showMetrics();
        break;
      case "accepted": case "token": case "done": case "queued":
        onChat(m);
        break;
      case "error":
        S.errors.push(m);
        if (S.errors.length > 50) S.errors.shift();
        if (m.ref && chatByRef(m.ref)) onChat(m);
        break;
      default:
        break;
    }
  }

  // -- chat -----------------------------------------------------------------------------------
  function chatByRef(ref) { return S.chats.find(c => c.ref === ref); }

  function sendChat(prompt, maxTokens) {
    const ref = `b${++S.chatSeq}`;
    const chat = {ref: ref, prompt: prompt, request: null, text: "", tokens: 0, status: "sent", position: null,
                  error: null, stats: {}, ended: false, sentAt: performance.now()};
    S.chats.push(chat);
    if (S.chats.length > 50) S.chats.shift();
    if (!send({type: "chat", ref: ref, prompt: prompt, max_tokens: maxTokens, temperature: 0})) {
      chat.status = "error"; chat.ended = true; chat.error = w("v_not_connected");
    }
    S.chatDirty = true;
    renderChats();
    return ref;
  }
  S.sendChat = sendChat;

  function onChat(m) {
    const chat = chatByRef(m.ref);
    if (!chat) return;
    if (m.type === "accepted") {
      chat.request = m.request;
      S.people.add(m.request);
      chat.position = m.queue_position || null;
      chat.status = chat.position ? "queued" : "accepted";
    } else if (m.type === "queued") {
      chat.position = m.position;
      chat.status = m.position ? "queued" : "accepted";
    } else if (m.type === "token") {
      chat.text += m.text || "";
      chat.tokens++;
      chat.position = null;
      chat.status = "streaming";
    } else if (m.type === "done") {
      chat.status = m.status || "finished";
      chat.stats = m.stats || {};
      chat.ended = true;
    } else if (m.type === "error") {
      chat.status = chat.request === null ? "refused" : "error";
      chat.error = `${m.code}: ${m.message}`;
      chat.code = m.code;
      chat.ended = true;
    }
    S.chatDirty = true;
  }

  function renderChats() {
    S.chatDirty = false;
    const log = $("fluxo-chat-log");
    if ($("fluxo-chat").hidden) return;
    const shown = S.chats.slice(-6);
    while (log.childElementCount > shown.length) log.removeChild(log.firstChild);
    while (log.childElementCount < shown.length) {
      const d = document.createElement("div");
      d.className = "turn";
      log.appendChild(d);
    }
    shown.forEach((c, i) => {
      const d = log.children[i];
      let body;
      if (c.status === "refused") {
        body = `<div class="refused">${esc(w("v_refused"))} · ${esc(c.error)}</div>`;
      } else if (c.error) {
        body = `<div class="bot">${esc(c.text)}</div><div class="refused">${esc(w("v_failed"))} · ${esc(c.error)}</div>`;
      } else {
        const wait = c.status === "queued" ? `<span class="queued">${esc(w("v_queued", {n: c.position}))}</span> · ` : "";
        const ttft = c.stats.ttft_s ? ` · TTFT ${Math.round(1000 * c.stats.ttft_s)} ms` : "";
        const req = c.request !== null ? `request #${c.request} · ` : "";
        body = `<div class="bot">${esc(c.text)}${c.ended ? "" : " …"}</div>` +
          `<div class="meta">${wait}${req}${esc(c.status)} · ${c.tokens} tokens${ttft}</div>`;
      }
      const html = `<div class="user">${esc(c.prompt)}</div>${body}`;
      if (d.dataset.html !== html) { d.innerHTML = html; d.dataset.html = html; d.dataset.ref = c.ref; d.dataset.status = c.status; }
    });
  }

  $("fluxo-chat-form").addEventListener("submit", ev => {
    ev.preventDefault();
    const box = $("fluxo-chat-input");
    const prompt = box.value.trim();
    if (!prompt) return;
    box.value = "";
    sendChat(prompt, parseInt($("fluxo-chat-max").value, 10));
  });

  post("streamlit:componentReady", {apiVersion: 1});
})();
