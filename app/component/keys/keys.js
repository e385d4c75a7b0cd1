/* Presenter keys for the whole page (a clicker sends Page Down / Page Up):
 *
 *   Page Down / Page Up  Step by step: the next / previous recorded step (its Forward / Back buttons);
 *                        a replay view: one step; Lessons: the next / previous section heading.
 *   space                play / pause every replay view on the page.
 *   ?                    this help, over the page (Esc closes it).
 *
 * It also writes the page's shareable state (its ``query`` argument) into the address bar, and
 * keeps the presenter's session secret in a cookie (its ``cookie`` argument).
 *
 * The component is same-origin with the page (Streamlit serves it), so it listens on the page's
 * document and acts on the page's own buttons; the views forward the keys pressed inside them.
 */
(function () {
  "use strict";
  const top = window.parent;
  const doc = top.document;
  let args = {words: {}};

  function w(k) { return args.words[k] || k; }
  function views() {
    return Array.from(doc.querySelectorAll("iframe[src*='fluxo_view']"))
      .map(f => { try { return f.contentWindow.fluxo; } catch (e) { return null; } })
      .filter(v => v && v.mode === "replay");
  }
  function button(key) { return doc.querySelector(`.st-key-${key} button:not([disabled])`); }

  function section(dir) {
    const heads = Array.from(doc.querySelectorAll("[data-testid='stMain'] h2, [data-testid='stMain'] h3"))
      .filter(h => h.offsetParent !== null);
    if (!heads.length) return false;
    // A heading scrolled to the top lands just under Streamlit's fixed header, not at 0: measure
    // from there, or the heading just scrolled to would be "next" again.
    const bar = doc.querySelector("header[data-testid='stHeader']");
    const line = bar ? bar.getBoundingClientRect().bottom : 0;
    const y = h => h.getBoundingClientRect().top - line;
    const target = dir > 0 ? heads.find(h => y(h) > 24) : heads.slice().reverse().find(h => y(h) < -24);
    (target || heads[dir > 0 ? heads.length - 1 : 0]).scrollIntoView({block: "start", behavior: "instant"});
    return true;
  }

  // Button presses wait for the page's run. A click that lands while Streamlit still runs the
  // previous one interrupts that run, and the interrupted run's press could be lost: a Page Up
  // pressed right after a Page Down went back two steps. So presses queue on the page (the queue
  // outlives this frame, which Streamlit may replace) and one goes out per finished run.
  function scriptState() {
    const el = doc.querySelector("[data-test-script-state]");
    return el ? el.getAttribute("data-test-script-state") : "notRunning";
  }
  function queue() {
    return top.__fluxoKeyQueue || (top.__fluxoKeyQueue = {dirs: [], sent: 0, seen: false});
  }
  const SETTLE_MS = 400;
  const pumpId = Math.random();
  function pump() {
    if (top.__fluxoKeysPump !== pumpId) return;  // a newer keys frame pumps the queue
    const q = queue();
    const st = scriptState();
    if (q.sent) {  // a press is out: wait until its run has started and ended, then settled
      if (st !== "notRunning") { q.seen = true; q.ended = 0; return; }
      if (!q.seen && Date.now() - q.sent < 1500) return;
      // The page applies a run's last values to its widgets a moment after the run ends; a click
      // before that sent the step slider's old value with it, which undid the press (one press
      // in seven lost in a burst). So the next press waits until the page has been idle a while.
      if (!q.ended) q.ended = Date.now();
      if (Date.now() - q.ended < SETTLE_MS) return;
      q.sent = 0;
      q.seen = false;
      q.ended = 0;
    }
    if (st !== "notRunning" || !q.dirs.length) return;
    const b = button(q.dirs[0] > 0 ? "fwd" : "back");
    if (b) {
      q.dirs.shift();
      q.missing = 0;
      b.click();
      q.sent = Date.now();
    } else if (!q.missing) {
      q.missing = Date.now();  // the page may still be drawing its buttons: keep the presses
    } else if (Date.now() - q.missing > (onStep() ? 30000 : 3000)) {
      // No such button for 3 s: the presenter left Step by step. On Step by step itself a loaded
      // laptop can take longer than that to draw them again (a fresh clone's suite at load ~4 lost
      // a Page Down this way), so the presses wait there up to 30 s.
      q.dirs.length = 0;
      q.missing = 0;
    }
  }
  const onStep = () => /\/step\/?$/.test(top.location.pathname);  // Step by step's address
  top.__fluxoKeysPump = pumpId;
  setInterval(pump, 40);

  function stepKey(dir) {
    if (button(dir > 0 ? "fwd" : "back") || queue().dirs.length || queue().sent) {
      queue().dirs.push(dir);
      pump();
      return;
    }
    const vs = views();
    if (vs.length) { vs.forEach(v => v.stepBy(dir)); return; }
    section(dir);
  }

  function overlay(show) {
    let el = doc.getElementById("fluxo-keys-help");
    if (show === undefined) show = !el;
    if (!show) { if (el) el.remove(); return; }
    if (el) return;
    el = doc.createElement("div");
    el.id = "fluxo-keys-help";
    el.setAttribute("role", "dialog");
    el.style.cssText = "position:fixed;inset:0;z-index:1000000;background:rgba(0,0,0,.55);display:flex;" +
      "align-items:center;justify-content:center;font-family:system-ui,sans-serif";
    const rows = [["Page Down", w("k_pgdn")], ["Page Up", w("k_pgup")], ["␣", w("k_space")], ["?", w("k_help")]];
    const esc = t => String(t).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
    el.innerHTML = `<div style="background:#fff;color:#111;padding:28px 36px;border-radius:12px;font-size:24px;` +
      `max-width:900px"><h2 style="margin:0 0 16px 0;font-size:32px">${esc(w("k_title"))}</h2><table>` +
      rows.map(([k, d]) => `<tr><td style="padding:6px 24px 6px 0"><kbd style="border:2px solid #444;` +
        `border-radius:6px;padding:2px 10px;font-weight:700">${esc(k)}</kbd></td><td>${esc(d)}</td></tr>`).join("") +
      `</table><p style="color:#555;font-size:18px;margin:16px 0 0 0">${esc(w("k_close"))}</p></div>`;
    el.addEventListener("click", () => overlay(false));
    doc.body.appendChild(el);
  }

  function onKey(ev) {
    const tag = (ev.target && ev.target.tagName) || "";
    const typing = tag === "INPUT" || tag === "TEXTAREA" || (ev.target && ev.target.isContentEditable);
    if (typing || ev.ctrlKey || ev.metaKey || ev.altKey) return false;
    if (ev.key === "PageDown" || ev.key === "PageUp") {
      ev.preventDefault();
      stepKey(ev.key === "PageDown" ? 1 : -1);
    } else if (ev.key === " " && tag !== "BUTTON" && tag !== "SELECT") {
      const vs = views();
      if (!vs.length) return false;
      ev.preventDefault();
      vs.forEach(v => v.togglePlay());
    } else if (ev.key === "?") {
      overlay();
    } else if (ev.key === "Escape") {
      overlay(false);
    } else {
      return false;
    }
    return true;
  }

  /* The presenter's session secret (app/presenter_session.py), never the token: a session cookie
   * of this origin, sent with the page's websocket on a reload; {name, value}: "" clears it, null
   * leaves it. */
  function presenterCookie(c) {
    if (!c || typeof c.name !== "string" || !/^fluxo_presenter_\d+$/.test(c.name)) return;
    const secret = typeof c.value === "string" ? c.value : "";
    const attrs = "; path=/; SameSite=Strict" + (top.location.protocol === "https:" ? "; Secure" : "");
    doc.cookie = c.name + "=" + (secret ? encodeURIComponent(secret) + attrs : attrs + "; max-age=0");
  }

  /* The page's state in the address bar. Streamlit drops the query string when the sidebar
   * switches pages, and sends this frame no new render when the next page's arguments are the
   * same: written again whenever it differs, so a reload after a page change reopens the same
   * picture (the language, the lesson) rather than the defaults. */
  function writeQuery() {
    if (!top.__fluxoKeysReady) return;
    const q = args.query ? "?" + args.query : "";
    if (top.location.search !== q) top.history.replaceState(top.history.state, "", top.location.pathname + q);
  }
  setInterval(writeQuery, 250);

  top.__fluxoKeys = onKey;  // the latest page's handler (the views forward their keys here)
  // One listener on the page, this frame's: a listener of a frame Streamlit has since removed
  // never fires again, so each keys frame replaces the previous frame's listener with its own.
  const mine = ev => onKey(ev);
  if (top.__fluxoKeysListener) doc.removeEventListener("keydown", top.__fluxoKeysListener);
  top.__fluxoKeysListener = mine;
  doc.addEventListener("keydown", mine);
  window.addEventListener("message", ev => {
    // only the Streamlit page holding this frame (same origin) may set its arguments
    if (ev.source !== window.parent || ev.origin !== location.origin) return;
    if (ev.data && ev.data.type === "streamlit:render") {
      args = ev.data.args || args;
      top.__fluxoKeysReady = true;
      writeQuery();
      top.__fluxoKeysUrl = location.href;  // which page's keys (its streamlitUrl): for the tests
      presenterCookie(args.cookie);
      top.__fluxoKeys = onKey;
    }
  });
  window.parent.postMessage({isStreamlitMessage: true, type: "streamlit:componentReady", apiVersion: 1}, "*");
  window.parent.postMessage({isStreamlitMessage: true, type: "streamlit:setFrameHeight", height: 0}, "*");
})();
