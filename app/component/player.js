/* Fluxo replay player: plays a recorded run (the browser view's replay mode) with no engine.
 *
 * The run's step records come with the component's arguments (S.all). A cursor walks them in the
 * run's own time (t_end of each step, scaled by the speed; a gap over 2 s of recorded idle time
 * is skipped), and the view draws the steps up to the cursor (S.buffer) exactly as it draws live
 * steps. Play / pause, scrub, step back / forward, speed; space plays and pauses (the page's keys
 * call togglePlay). When it pauses or is moved, the player reports the step to the page
 * (setComponentValue), which keeps it in the URL. Views with the same ``sync`` name (Compare's
 * two runs) follow each other through a BroadcastChannel.
 *
 * The view's last script: it tells Streamlit the component is ready, so the first arguments come
 * once every part is there. (When fluxo-chat.js told it, a render could arrive while this file was
 * still loading: the recording's key was taken, FluxoPlayer.load was missing, and the view stayed
 * empty at step 0 for good; the projector test failed about 1 run in 2 that way.)
 */
(function () {
  "use strict";
  const S = window.fluxo;
  const $ = id => document.getElementById(id);
  const MAX_GAP_S = 2.0;
  const P = {cursor: 0, playing: false, speed: 1, clock: 0, last: 0, channel: null, id: Math.random().toString(36)};
  S.player = P;

  function t(i) { return S.all.length ? S.all[i].t_end - S.all[0].t_end : 0; }
  function indexOf(step) {
    if (step === null || step === undefined) return S.all.length - 1;
    let i = 0;
    while (i + 1 < S.all.length && S.all[i + 1].step <= step) i++;
    return i;
  }

  function show() {
    S.buffer = S.all.slice(0, P.cursor + 1);
    S.dirty = true;
    const n = S.all.length;
    const step = n ? S.all[P.cursor].step : 0;
    $("rp-scrub").max = String(Math.max(0, n - 1));
    $("rp-scrub").value = String(P.cursor);
    $("rp-play").textContent = P.playing ? "⏸" : "▶";
    $("rp-play").title = S.w(P.playing ? "v_pause" : "v_play");
    $("rp-play").dataset.playing = P.playing ? "1" : "0";
    const secs = S.fmt(t(P.cursor), " s", 1, 1);
    $("rp-pos").textContent = `${S.w("v_step")} ${step} · ${P.cursor + 1} ${S.w("v_of")} ${n} · ${secs}`;
    $("rp-pos").dataset.step = String(step);
  }

  function report() {
    if (!S.all.length) return;
    S.post("streamlit:setComponentValue", {value: {at: S.all[P.cursor].step, speed: P.speed}, dataType: "json"});
  }

  function broadcast() {
    if (P.channel && S.all.length) {
      P.channel.postMessage({from: P.id, step: S.all[P.cursor].step, playing: P.playing, speed: P.speed});
    }
  }

  function setPlaying(on, quiet) {
    if (on && P.cursor >= S.all.length - 1) P.cursor = 0;  // play again from the start
    P.playing = on && S.all.length > 1;
    P.clock = t(P.cursor);
    P.last = performance.now();
    show();
    if (!quiet) { broadcast(); if (!P.playing) report(); }
  }

  function moveTo(i, quiet) {
    P.cursor = Math.max(0, Math.min(S.all.length - 1, i));
    P.clock = t(P.cursor);
    show();
    if (!quiet) { broadcast(); if (!P.playing) report(); }
  }

  function tick() {
    if (!P.playing) return;
    const now = performance.now();
    P.clock += (now - P.last) / 1000 * P.speed;
    P.last = now;
    let i = P.cursor;
    while (i + 1 < S.all.length && t(i + 1) <= P.clock) i++;
    if (i + 1 < S.all.length && t(i + 1) - t(i) > MAX_GAP_S && P.clock - t(i) > 0.5) {
      i++;  // a long idle gap in the recording: skip it
      P.clock = t(i);
    }
    if (i !== P.cursor) { P.cursor = i; show(); }
    if (P.cursor >= S.all.length - 1) setPlaying(false);
  }
  setInterval(tick, 50);

  window.FluxoPlayer = {
    load(at, speed) {
      P.speed = speed || P.speed;
      $("rp-speed").value = String(P.speed);
      P.playing = false;
      moveTo(indexOf(at), true);
      const name = S.args && S.args.sync;
      if (P.channel) P.channel.close();
      P.channel = name && window.BroadcastChannel ? new BroadcastChannel("fluxo-replay-" + name) : null;
      if (P.channel) P.channel.onmessage = ev => follow(ev.data);
      for (const [id, key] of [["rp-start", "v_start"], ["rp-prev", "v_prev"], ["rp-next", "v_next"]]) {
        $(id).title = S.w(key);
      }
      $("rp-speed-label").firstChild.textContent = S.w("v_speed");
    },
    jump(at) { moveTo(indexOf(at), true); },
  };

  function follow(m) {
    if (!m || m.from === P.id) return;
    P.speed = m.speed;
    $("rp-speed").value = String(m.speed);
    P.cursor = indexOf(m.step);
    setPlaying(m.playing, true);
  }

  S.togglePlay = () => setPlaying(!P.playing);
  S.stepBy = d => { setPlaying(false, true); moveTo(P.cursor + d); };
  $("rp-play").addEventListener("click", () => S.togglePlay());
  $("rp-start").addEventListener("click", () => { setPlaying(false, true); moveTo(0); });
  $("rp-prev").addEventListener("click", () => S.stepBy(-1));
  $("rp-next").addEventListener("click", () => S.stepBy(1));
  $("rp-scrub").addEventListener("input", ev => { P.playing = false; moveTo(+ev.target.value, true); });
  $("rp-scrub").addEventListener("change", ev => moveTo(+ev.target.value));
  $("rp-speed").addEventListener("change", ev => {
    P.speed = +ev.target.value;
    broadcast();
    if (!P.playing) report();
  });
  document.addEventListener("keydown", ev => {  // focus inside this view: the same keys as the page's
    if (ev.target.tagName === "INPUT" && ev.target.type === "text") return;
    if (S.mode === "replay" && ev.key === " ") { ev.preventDefault(); S.togglePlay(); return; }
    try { if (window.parent.__fluxoKeys) window.parent.__fluxoKeys(ev); } catch (e) { /* not the lab page */ }
  });
  S.post("streamlit:componentReady", {apiVersion: 1});
})();
