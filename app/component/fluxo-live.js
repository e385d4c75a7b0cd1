/* Fluxo browser view, live mode: this browser session's own websocket to the engine server
 * (subscribe with history, reconnect with backoff, drop the subscription while the tab is hidden),
 * the step buffer it fills, and the headline metrics of the server's ``metrics`` messages. Loaded
 * after fluxo.js (which holds the shared state, S). */
(function () {
  "use strict";
  const S = window.fluxo;
  const {w, fmt, esc, setStatus} = S;
  const $ = id => document.getElementById(id);

  const METRIC_LABELS = [
    ["m_throughput", "throughput", "", 1, 1], ["m_ttft", "ttft_p50", " ms", 1000, 0],
    ["m_itl50", "itl_p50", " ms", 1000, 0], ["m_itl99", "itl_p99", " ms", 1000, 0],
    ["m_slot_util", "slot_utilization", "%", 100, 0], ["m_dead", "dead_slot_fraction", "%", 100, 0],
    ["m_kv_waste", "kv_waste", "%", 100, 0], ["m_busy", "busy_fraction", "%", 100, 0]];

  // -- headline metrics (the server's metrics messages: engine.metrics.summarize) --------------
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

  // -- the engine connection (live mode) ------------------------------------------------------
  // Two routes to the engine: its own port on the page's host name ("direct"), or the page's own
  // origin, which relays it (app/relay.py: Codespaces, Colab, HTTPS proxies, one forwarded port).
  // The relay is taken first when the page is not on this machine's loopback or is on HTTPS, and
  // after a direct attempt that never opened.
  const LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]", "::1"];
  function route() {
    const a = S.args;
    if (a.engine_public_url) return "public";
    if (!a.relay_path) return "direct";
    if (S.route) return S.route;
    const local = LOOPBACK_HOSTS.includes(location.hostname) && location.protocol !== "https:";
    return local ? "direct" : "relay";
  }

  function engineUrl() {
    const a = S.args;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    switch (route()) {
      case "public": return a.engine_public_url;
      case "relay": return `${scheme}://${location.host}${a.relay_path}`;
      default: return `${scheme}://${location.hostname}:${a.engine_port}`;
    }
  }

  // What this browser sees, told to the page (its sidebar shows it, not the page process's own
  // connection): once per change of status or route, so it costs one rerun per change.
  function report(status) {
    const seen = `${status}|${S.via}`;
    if (S.reported === seen) return;
    S.reported = seen;
    S.browser = {status: status, via: S.via, url: engineUrl()};
    post();
  }
  function post() {
    S.post("streamlit:setComponentValue", {value: {browser: S.browser, engine: S.engineSeen || null}, dataType: "json"});
  }

  /* The presenter's widgets show the engine's configuration and traffic as the page last drew
   * them (``args.engine``). When a state message says otherwise (a lesson's set-up or another
   * presenter tab changed it), the page is told once per new configuration, which reruns it and
   * draws the widgets again. Viewers' pages are not rerun: forty of them would cost the page
   * process forty runs per change. */
  function checkEngine(m) {
    const drawn = S.args.engine;
    if (!S.args.presenter || !drawn) return;
    const config = m.config || {}, traffic = m.traffic || null;
    const differs = (a, b) => Object.keys(a).some(k => a[k] !== b[k]);
    const changed = differs(drawn.config || {}, config) || (drawn.traffic === null) !== (traffic === null) ||
      (traffic !== null && differs(drawn.traffic, traffic));
    const seen = JSON.stringify([config, traffic && Object.keys(drawn.traffic || {}).map(k => traffic[k])]);
    if (!changed || S.engineSeen === seen) return;
    S.engineSeen = seen;
    post();
  }

  function connect() {
    if (S.ws) return;
    clearTimeout(S.reconnectTimer);
    const url = engineUrl();
    S.via = route();
    setStatus("connecting", w("v_connecting", {url: url}));
    let ws, opened = false;
    try { ws = new WebSocket(url); } catch (e) { scheduleReconnect(String(e)); return; }
    S.ws = ws;
    ws.addEventListener("close", () => {
      // a direct route that never opened: the browser cannot reach the engine's port
      if (!opened && S.via === "direct" && S.args.relay_path) S.route = "relay";
    });
    ws.onopen = () => { opened = true; S.backoff = 250; if (!document.hidden) subscribe(); };
    ws.onmessage = ev => onMessage(JSON.parse(ev.data));
    ws.onclose = ev => {
      S.ws = null;
      S.subscribed = false;
      for (const c of S.chats) if (!c.ended) { c.ended = true; c.status = "error"; c.error = "disconnected: the connection to the engine closed"; }
      S.chatDirty = true;
      // the server's reason, e.g. too_many_connections: a refused student sees why
      scheduleReconnect(`closed (${ev.code}${ev.reason ? ": " + ev.reason : ""})`);
    };
  }
  S.connect = connect;

  function scheduleReconnect(why) {
    if (S.mode !== "live") return;
    setStatus("disconnected", w("v_unreachable", {url: engineUrl(), why: why, s: fmt(S.backoff / 1000, "", 1, 1)}));
    report("disconnected");
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

  function onStep(m) {
    const rec = m.record;
    const last = S.buffer.length ? S.buffer[S.buffer.length - 1] : null;
    if (last && rec.step <= last.step) S.buffer = [];  // the engine was reset: a new run
    S.buffer.push(rec);
    S.onPolicySteps([rec], false);  // refused policy decisions: the presenter's notice
    if (S.buffer.length > S.bufferSize) S.buffer.splice(0, S.buffer.length - S.bufferSize);
    S.received++;
    S.skipped += m.skipped || 0;
    S.dirty = true;
  }

  function onMessage(m) {
    if (S.mode !== "live") return;
    switch (m.type) {
      case "hello":
        S.client = m.client; S.role = m.role; S.limits = m.limits; S.state = m.state || {};
        // what this browser sees: the engine directly, or through the page's relay
        setStatus("connected", w("v_connected", {client: m.client, model: m.model}) + (S.via === "relay" ? w("v_via_relay") : ""));
        report("connected");
        checkEngine(S.state);
        break;
      case "state":
        S.state = m;
        S.showHeld(!!m.comparing);
        checkEngine(m);
        break;
      case "history":
        S.buffer = (m.steps || []).slice(-S.bufferSize);
        if (!S.buffer.length) S.onPolicyReset();  // a reset engine sends an empty history
        S.onPolicySteps(S.buffer, true);
        addPeople(m.requests || []);
        S.dirty = true;
        break;
      case "step":
        onStep(m);
        break;
      case "request":
        addPeople([m.record]);
        break;
      case "metrics":
        S.metrics = m;
        if (!document.hidden) showMetrics();
        break;
      case "accepted": case "token": case "done": case "queued":
        S.onChat(m);
        break;
      case "error":
        S.errors.push(m);
        if (S.errors.length > 50) S.errors.shift();
        if (m.ref && S.chatByRef(m.ref)) S.onChat(m);
        break;
      default:
        break;
    }
  }
})();
