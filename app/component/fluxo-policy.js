/* Fluxo browser view, live mode: the presenter's notice of refused policy decisions. A loaded
 * policy whose hook breaks a rule, raises or is too slow is refused by the engine
 * (engine/core/policy/check.py): that step falls back to continuous and its record's events carry
 * a ``policy_error`` {policy, hook, code, error}. Here they are counted by (policy, hook, code),
 * with the latest message, over the steps this view received since it opened (or the engine was reset), and drawn
 * as one small box above the charts, at most 4 times a second, never blocking anything: a
 * policy refused on every step is one line whose count grows, not a flood. Only when the page
 * says this session presents (``args.presenter``); viewers never see it. Loaded after
 * fluxo-live.js, which hands it every step record (S.onPolicySteps). */
(function () {
  "use strict";
  const S = window.fluxo;
  const {w, esc} = S;
  const $ = id => document.getElementById(id);
  const MAX_KINDS = 32;   // distinct (policy, hook, code): beyond, only counted
  const SHOWN = 4;        // lines drawn, the most recent first

  const P = {kinds: new Map(), others: 0, total: 0, lastStep: 0, dismissed: 0, dirty: false};
  S.policyErrors = P;  // for the page tests

  function clear() {
    P.kinds.clear(); P.others = 0; P.total = 0; P.lastStep = 0; P.dismissed = 0; P.dirty = true;
  }

  /* Step records, in order; a step already counted (history sent again) is skipped, and a step
   * number going backwards is a reset engine: the counts start again. */
  S.onPolicySteps = function (records, fromHistory) {
    for (const rec of records) {
      if (!rec || typeof rec.step !== "number") continue;
      if (rec.step <= P.lastStep) {
        if (fromHistory) continue;
        clear();
      }
      P.lastStep = rec.step;
      for (const ev of rec.events || []) {
        if (!ev || ev.kind !== "policy_error") continue;
        const key = [ev.policy, ev.hook, ev.code].join("\u0000");  // the message: the latest
        let agg = P.kinds.get(key);
        if (!agg && P.kinds.size >= MAX_KINDS) { P.others++; P.total++; continue; }
        if (!agg) {
          agg = {policy: ev.policy, hook: ev.hook, code: ev.code, error: ev.error, n: 0, step: 0};
          P.kinds.set(key, agg);
        }
        agg.n++; agg.step = rec.step; agg.error = ev.error; P.total++; P.dirty = true;
      }
    }
  };
  S.onPolicyReset = clear;

  const kindsSeen = () => P.kinds.size + (P.others ? 1 : 0);

  function draw() {
    const box = $("fluxo-policy-errors");
    if (!box || !P.dirty) return;
    P.dirty = false;
    // dismissed: hidden until a kind of refusal not seen before comes
    const show = !!(S.args && S.args.presenter) && S.mode === "live" && kindsSeen() > P.dismissed;
    box.hidden = !show;
    if (!show) return;
    const kinds = [...P.kinds.values()].sort((a, b) => b.step - a.step);
    const lines = kinds.slice(0, SHOWN).map(k => `<li>${esc(w("v_perr_line", {
      policy: k.policy, hook: k.hook, code: k.code, error: k.error, n: k.n, step: k.step}))}</li>`);
    const more = kinds.length - SHOWN + (P.others ? 1 : 0);
    if (more > 0) lines.push(`<li class="caption">${esc(w("v_perr_more", {n: more}))}</li>`);
    if (!box.firstChild) {  // built once: the button stays put while the counts change
      box.innerHTML = '<button type="button" id="fluxo-perr-dismiss"></button><b></b><ul></ul>' +
        '<div class="caption"></div>';
      box.firstChild.onclick = () => { P.dismissed = kindsSeen(); P.dirty = true; draw(); };
    }
    const [button, title, list, note] = box.children;
    button.textContent = w("v_perr_dismiss");
    title.textContent = w("v_perr_title");
    list.innerHTML = lines.join("");
    note.textContent = w("v_perr_note");
    S.setHeight();
  }
  S.drawPolicyErrors = () => { P.dirty = true; draw(); };  // the page's arguments changed
  setInterval(draw, 250);
})();
