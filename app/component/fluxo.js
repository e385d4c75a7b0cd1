/* Fluxo browser view: a Streamlit component (app/browser_view.py) that draws the lab's charts.
 *
 * Live mode: this browser session opens its own websocket to the engine server (its own client:
 * its own identity and per-client limits), subscribes to the step stream, keeps a bounded ring
 * buffer of step records, and draws its Vega views created ONCE from the named-data specs of
 * app/charts/. New steps become incremental changesets (insert new rows, remove rows that left
 * the window, modify rows that changed, e.g. the open run of a slot), applied at most ~4 times a
 * second, never while the tab is hidden (the subscription is dropped then and taken again with
 * history when the tab shows). Chat goes over the same socket. Nothing reruns Streamlit.
 *
 * Static mode (Step by step, Compare): the records come as component arguments, drawn once per
 * change of the arguments. Replay mode: a recorded run comes as arguments and player.js plays it
 * (play / pause, scrub, step, speed). The rows come from rows.js in every mode. The words come
 * from app/i18n.py with the arguments (English or Portuguese), and so does the number locale.
 *
 * Plain scripts, loaded in order by index.html, sharing one object (window.fluxo, ``S``):
 * this file (state, the Streamlit protocol, arguments, words and numbers), fluxo-views.js (the
 * Vega views and their changesets), fluxo-live.js (the engine connection and headline metrics),
 * fluxo-chat.js (the chat), then player.js (the replay player; it tells Streamlit the component is
 * ready, so the arguments come once every script has run).
 */
(function () {
  "use strict";
  const $ = id => document.getElementById(id);

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
    firstDrawn: 0,
    all: [],
  };
  S.w = w;
  S.post = (type, data) => post(type, data);
  window.fluxo = S;  // for the page tests: state, counters, send()

  // -- Streamlit component protocol (v1) ------------------------------------------------------
  function post(type, data) {
    if (type === "streamlit:setComponentValue" && holding()) {
      if (held === null) setTimeout(retry, 500);
      held = data;
      return;
    }
    window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, data || {}), "*");
  }

  /* A page switch is never undone by this view's value (tests/e2e/test_page_switch.py). Streamlit
   * 1.67 sends a value with the page the browser still shows and folds it into a switch not yet
   * started, the newer page winning: a status report landing just after a click on Aulas ran Ao
   * vivo again (a loaded CI run, 2026-12-03). From a click on a page link, the view's latest value
   * waits: the frame is gone once the switch lands, and the value with it. It goes after HOLD_MS,
   * or on a render of this frame once the address has changed (the page switched, so Streamlit
   * sends values with the new page; a render before then may be the old run's last). */
  const HOLD_MS = 15000;
  const PAGE_LINKS = "[data-testid='stSidebarNav'] a, [data-testid='stTopNav'] a, a[data-testid='stPageLink-NavLink']";
  let leftAt = -Infinity, leftFrom = null, held = null;
  const holding = () => Date.now() - leftAt < HOLD_MS;
  const retry = () => { if (held !== null) { if (holding()) setTimeout(retry, 500); else release(); } };
  function release() {
    leftAt = -Infinity;
    if (held !== null) { const data = held; held = null; post("streamlit:setComponentValue", data); }
  }
  (function watchPageLinks() {
    let doc;
    try { doc = window.parent.document; } catch (e) { return; }  // not same-origin: nothing to watch
    const onClick = ev => {
      if (!ev.target || !ev.target.closest || !ev.target.closest(PAGE_LINKS)) return;
      leftAt = Date.now();
      leftFrom = window.parent.location.pathname;
    };
    doc.addEventListener("click", onClick, true);
    window.addEventListener("pagehide", () => doc.removeEventListener("click", onClick, true));
  })();
  /* The frame as tall as its content. The body's own box, not the document's scrollHeight: that
   * is never less than the frame itself, so a frame taller than its content (one chart alone in
   * a frame sized for four) grew by the 4 px margin on every message, without end (26,709 px
   * after ~30 s, measured 2026-12-07). */
  function setHeight() {
    const h = Math.ceil(document.body.getBoundingClientRect().height) + 4;
    if (Math.abs(h - S.frameHeight) > 2) {
      S.frameHeight = h;
      post("streamlit:setFrameHeight", {height: h});
    }
  }
  S.setHeight = setHeight;
  /* Arguments come from the Streamlit page that holds this frame, and from nothing else: a window
   * of another origin that opened the lab (window.open) can post into this frame too. */
  function fromStreamlit(ev) {
    return ev.source === window.parent && ev.origin === PARENT_ORIGIN;
  }
  const PARENT_ORIGIN = (() => {
    try { return window.parent.location.origin; }  // same-origin with the page (Streamlit serves both)
    catch (e) { try { return new URL(document.referrer).origin; } catch (e2) { return location.origin; } }
  })();
  S.fromStreamlit = fromStreamlit;
  window.addEventListener("message", ev => {
    if (!fromStreamlit(ev) || !ev.data || ev.data.type !== "streamlit:render") return;
    onArgs(ev.data.args || {});
    if (leftAt > -Infinity && window.parent.location.pathname !== leftFrom) release();
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

  /* Static and replay modes: the records are the arguments; no connection of our own. */
  function onRecords(args) {
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
  }

  function onArgs(args) {
    const langChanged = !S.args || S.args.lang !== args.lang || S.args.projector !== args.projector;
    S.args = args;
    if (langChanged) applyWords(args);
    const specsJson = JSON.stringify([args.specs || {}, args.locale || null]);
    const modeChanged = S.mode !== args.mode;
    S.mode = args.mode;
    S.bufferSize = args.buffer || 1000;
    $("fluxo-charts").style.setProperty("--min-col", (args.min_column || 720) + "px");
    $("fluxo-chat").hidden = !args.chat;
    $("fluxo-metrics").hidden = !args.metrics;
    if (specsJson !== S.specsJson) {
      S.specsJson = specsJson;
      S.buildViews(args.specs || {}, args.order || Object.keys(args.specs || {}));
    }
    $("fluxo-player").hidden = args.mode !== "replay";
    if (args.mode === "static" || args.mode === "replay") {
      onRecords(args);
    } else if (modeChanged || !S.ws) {
      S.connect();
    }
    if (args.held !== undefined) showHeld(args.held);
    if (S.drawPolicyErrors) S.drawPolicyErrors();  // presenter or not, language: drawn again
    setHeight();
  }

  function esc(s) {
    return String(s === undefined || s === null ? "" : s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  S.esc = esc;

  /* A number in the page's language: ``v * scale`` with ``digits`` decimals, then ``unit``; a
   * time of 1,000 ms or more in seconds with one decimal ("3,7 s": "3.723 ms" read as 3 ms), as
   * app/i18n.py's ``metric``. */
  function fmt(v, unit, scale, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "—";
    if (unit === " ms" && Math.abs(v * scale) >= 999.5) return fmt(v * scale / 1000, " s", 1, 1);
    const text = (v * scale).toLocaleString(S.args && S.args.lang === "pt-BR" ? "pt-BR" : "en-US",
      {minimumFractionDigits: digits, maximumFractionDigits: digits});
    return text + unit;
  }
  S.fmt = fmt;

  function showHeld(held) {
    const el = $("fluxo-held");
    el.hidden = !held;
    el.textContent = held ? w("v_held") : "";
  }
  S.showHeld = showHeld;

  function setStatus(status, text) {
    S.status = status;
    $("fluxo-dot").className = "dot " + status;
    $("fluxo-status-text").textContent = text;
  }
  S.setStatus = setStatus;
})();
