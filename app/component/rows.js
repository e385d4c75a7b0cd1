/* Fluxo browser view: the chart rows, derived from step records in the browser.
 *
 * The page draws only from these rows. app/charts/ holds their Python twins, line for line, as an
 * independent oracle: tests/app/test_rows_js.py loads recorded telemetry into Chromium and
 * compares every row with the Python functions'. Keep the two in step: change one, change the
 * other. ``CHART_ROWS`` at the end gives each chart of app/charts/registry.py its datasets.
 * Python None is null here; integer division is Math.floor; sums run left to right as in Python.
 */
(function (root) {
  "use strict";

  const MAX_ROWS = 3000;
  const OVERVIEW_BINS = 300;
  const PHASES = root.FluxoRecords.PHASES;  // from engine/core/records.py (records.js)
  const KV_STATES = ["stored", "shared", "allocated, unused", "cached", "free"];
  const SLOW_FACTOR = 1.5;
  const STALL_FACTOR = 1.5;

  function window_(steps, last) {
    return last && steps.length > last ? steps.slice(steps.length - last) : steps.slice();
  }

  function phase(slot) {
    if ((slot.phase === "prefill" || slot.phase === "decode") && !slot.tokens) return "idle";
    return slot.phase;
  }

  // -- slot occupancy -------------------------------------------------------------------------
  function slotSpans(steps, people) {
    people = people || new Set();
    const spans = [];
    let open = new Map();
    let prev = null;
    for (const rec of steps) {
      const step = rec.step;
      if (prev !== null && step !== prev + 1) open = new Map();
      const seen = new Set();
      for (const s of rec.slots) {
        const slot = s.slot, req = s.request, ph = phase(s);
        seen.add(slot);
        let cur = open.get(slot);
        if (cur !== undefined && cur.request === req && cur.phase === ph && cur.end === step) {
          cur.end = step + 1;
          cur.tokens += s.tokens;
          cur.t_end = rec.t_end;
          continue;
        }
        cur = {slot: slot, request: req, phase: ph, start: step, end: step + 1, tokens: s.tokens,
               who: req === null ? "idle" : (people.has(req) ? "person" : "traffic"),
               t_start: rec.t_start, t_end: rec.t_end};
        open.set(slot, cur);
        spans.push(cur);
      }
      for (const slot of Array.from(open.keys())) if (!seen.has(slot)) open.delete(slot);
      prev = step;
    }
    return spans;
  }

  function queueSeries(steps) {
    return steps.map(r => ({step: r.step, queue: r.queue_len}));
  }

  function bins(steps, n) {
    const k = Math.max(1, Math.ceil(steps.length / n));
    const out = [];
    let key = null;
    for (const rec of steps) {
      const b = Math.floor(rec.step / k);
      if (b !== key) { out.push([]); key = b; }
      out[out.length - 1].push(rec);
    }
    return out;
  }

  function overview(steps, n) {
    const rows = [];
    if (!steps.length) return rows;
    for (const chunk of bins(steps, n || OVERVIEW_BINS)) {
      const counts = {prefill: 0, decode: 0, dead: 0, idle: 0};
      for (const rec of chunk) for (const s of rec.slots) counts[phase(s)] += 1;
      for (const ph of PHASES) {
        rows.push({step: chunk[0].step, step_end: chunk[chunk.length - 1].step + 1, phase: ph,
                   slots: counts[ph] / chunk.length, order: PHASES.indexOf(ph)});
      }
    }
    return rows;
  }

  function fitWindow(steps, last, people, budget) {
    let win = window_(steps, last);
    let spans = slotSpans(win, people);
    while (spans.length > budget && win.length > 10) {
      win = win.slice(Math.floor(win.length / 2));
      spans = slotSpans(win, people);
    }
    return [win, spans];
  }

  // -- admission stalls -----------------------------------------------------------------------
  function itlPerStep(steps) {
    const lastToken = new Map();
    let quietMs = null;
    const rows = [];
    for (const rec of steps) {
      const gaps = [];
      for (const s of rec.slots) {
        const rid = s.request;
        if (rid === null || (s.phase !== "prefill" && s.phase !== "decode") || !s.tokens) continue;
        if (s.phase === "decode" && lastToken.has(rid)) gaps.push(rec.t_end - lastToken.get(rid));
        lastToken.set(rid, rec.t_end);
      }
      for (const rid of rec.finished) lastToken.delete(rid);
      gaps.sort((a, b) => a - b);
      let prefill;
      if ("tokens" in rec) prefill = rec.tokens.prefill;
      else { prefill = 0; for (const s of rec.slots) if (s.phase === "prefill") prefill += s.tokens; }
      const stepMs = 1000 * (rec.t_end - rec.t_start);
      const exp = rec.expected_s === undefined ? null : rec.expected_s;
      const expectedMs = exp === null ? null : 1000 * exp;
      const admitted = rec.admitted.length;
      const slow = expectedMs !== null && !admitted && stepMs > SLOW_FACTOR * expectedMs;
      let stall;
      if (!admitted) stall = false;
      else if (expectedMs === null || quietMs === null) stall = prefill > 0;
      else stall = expectedMs > STALL_FACTOR * quietMs;
      if (expectedMs !== null && prefill === 0) quietMs = expectedMs;
      rows.push({
        step: rec.step,
        itl_ms: gaps.length ? 1000 * gaps[Math.floor(gaps.length / 2)] : null,
        itl_max_ms: gaps.length ? 1000 * gaps[gaps.length - 1] : null,
        running: gaps.length,
        admitted: admitted,
        admitted_ids: rec.admitted.slice(),
        prefill_tokens: prefill,
        cached_tokens: rec.cached_tokens || 0,
        step_ms: stepMs,
        expected_ms: expectedMs,
        slow: slow,
        stall: stall,
      });
    }
    return rows;
  }

  function admissionMarkers(rows) {
    return rows.filter(r => r.admitted).map(r => ({
      step: r.step, admitted: r.admitted, prefill_tokens: r.prefill_tokens, cached_tokens: r.cached_tokens,
      stall: r.stall ? "yes" : "no", requests: r.admitted_ids.map(i => "#" + i).join(", ")}));
  }

  function machineMarkers(rows) {
    return rows.filter(r => r.slow).map(r => ({
      step: r.step, step_end: r.step + 1, step_ms: r.step_ms, expected_ms: r.expected_ms,
      times_expected: r.expected_ms ? r.step_ms / r.expected_ms : null}));
  }

  const STALL_KEYS = [["ITL median", "itl_ms"], ["ITL max", "itl_max_ms"], ["step measured", "step_ms"],
                      ["step expected", "expected_ms"]];

  function stallLines(rows) {
    const out = [];
    for (const r of rows) for (const [name, key] of STALL_KEYS) if (r[key] !== null) out.push({step: r.step, series: name, ms: r[key]});
    return out;
  }

  function prefillBars(rows) {
    return rows.filter(r => r.prefill_tokens).map(r => ({step: r.step, prefill_tokens: r.prefill_tokens}));
  }

  // -- KV memory ------------------------------------------------------------------------------
  function blockSize(rec, dflt) {
    const kv = rec.kv;
    return kv.blocks_used ? Math.floor(kv.tokens_allocated / kv.blocks_used) : (dflt || 16);
  }

  function kvSplit(kv, bs) {
    const total = kv.blocks_total * bs;
    const alloc = kv.tokens_allocated;
    const stored = Math.min(kv.tokens_stored, alloc);
    const shared = Math.min((kv.blocks_shared || 0) * bs, stored);
    const free = Math.max(0, total - alloc);
    const cached = Math.min((kv.blocks_cached || 0) * bs, free);
    return [stored - shared, shared, alloc - stored, cached, free - cached];
  }

  function kvSeries(steps, n, blockSize_) {
    const rows = [];
    if (!steps.length) return rows;
    let bs = blockSize_;
    if (!bs) {
      bs = 16;
      for (let i = steps.length - 1; i >= 0; i--) if (steps[i].kv.blocks_used) { bs = blockSize(steps[i]); break; }
    }
    for (const chunk of bins(steps, n || 300)) {
      const sums = KV_STATES.map(() => 0);
      for (const r of chunk) {
        const v = kvSplit(r.kv, bs);
        for (let j = 0; j < v.length; j++) sums[j] += v[j];
      }
      for (let j = 0; j < KV_STATES.length; j++) {
        rows.push({step: chunk[0].step, state: KV_STATES[j], tokens: sums[j] / chunk.length, order: j});
      }
    }
    return rows;
  }

  function requestKvTokens(steps) {
    const held = new Map();
    for (const rec of steps) {
      for (const rid of rec.preempted) held.delete(rid);
      for (const s of rec.slots) {
        if (s.request !== null && (s.phase === "prefill" || s.phase === "decode")) {
          held.set(s.request, (held.has(s.request) ? held.get(s.request) : 0) + s.tokens);
        }
      }
      for (const rid of rec.finished) if (rec.policy !== "static") held.delete(rid);
    }
    const last = steps.length ? steps[steps.length - 1] : null;
    const running = new Set();
    if (last) for (const s of last.slots) if (s.request !== null) running.add(s.request);
    const out = new Map();
    for (const [rid, n] of held) if (running.has(rid)) out.set(rid, n);
    return out;
  }

  function blockMap(steps, maxCells) {
    if (!steps.length) return [];
    maxCells = maxCells || 1024;
    const rec = steps[steps.length - 1];
    const kv = rec.kv;
    const bs = blockSize(rec);
    const total = kv.blocks_total, used = kv.blocks_used;
    const shared = Math.min(used, kv.blocks_shared || 0);
    const cached = Math.min(Math.max(0, total - used), kv.blocks_cached || 0);
    const per = Math.max(1, Math.ceil(total / maxCells));
    const slotOf = new Map();
    for (const s of rec.slots) if (s.request !== null) slotOf.set(s.request, s.slot);
    const owners = [];  // runs: [state, request, slot, count]
    let left = used - shared;
    const held = Array.from(requestKvTokens(steps).entries());
    held.sort((a, b) => (slotOf.has(a[0]) ? slotOf.get(a[0]) : 0) - (slotOf.has(b[0]) ? slotOf.get(b[0]) : 0));
    for (const [rid, ntok] of held) {
      const nblk = Math.min(left, Math.ceil(ntok / bs));
      owners.push(["stored", rid, slotOf.has(rid) ? slotOf.get(rid) : null, nblk]);
      left -= nblk;
    }
    owners.push(["shared", null, null, shared]);
    owners.push(["allocated, unused", null, null, left]);
    owners.push(["cached", null, null, cached]);
    owners.push(["free", null, null, Math.max(0, total - used - cached)]);
    const flat = [];
    for (const [state, rid, slot, n] of owners) for (let i = 0; i < n; i++) flat.push([state, rid, slot]);
    const cols = Math.max(1, Math.min(64, Math.ceil(Math.sqrt(flat.length / per) * 2)));
    const cells = [];
    for (let i = 0; i < flat.length; i += per) {
      const [state, rid, slot] = flat[i];
      const c = Math.floor(i / per);
      cells.push({cell: c, row: Math.floor(c / cols), col: c % cols, state: state, request: rid, slot: slot,
                  blocks: Math.min(per, flat.length - i)});
    }
    return cells;
  }

  // -- CPU / device lanes ---------------------------------------------------------------------
  function laneSpans(steps, last) {
    const win = window_(steps, last === undefined ? 12 : last);
    if (!win.length) return [];
    let t0 = null;
    for (const r of win) for (const s of r.spans) if (t0 === null || s.start < t0) t0 = s.start;
    if (t0 === null) t0 = win[0].t_start;
    const out = [];
    for (const r of win) for (const s of r.spans) {
      out.push({lane: s.lane, step: r.step, start_ms: 1000 * (s.start - t0), end_ms: 1000 * (s.end - t0),
                ms: 1000 * (s.end - s.start)});
    }
    return out;
  }

  function deviceBusy(spans) {
    if (!spans.length) return 0;
    let lo = Infinity, hi = -Infinity, busy = 0;
    for (const s of spans) {
      if (s.start_ms < lo) lo = s.start_ms;
      if (s.end_ms > hi) hi = s.end_ms;
      if (s.lane === "compute") busy += s.ms;
    }
    const wall = hi - lo;
    return wall > 0 ? busy / wall : 0;
  }

  // -- tokens per step ------------------------------------------------------------------------
  const TOKEN_PHASES = ["prefill", "decode", "dead"];

  function stepTokens(steps) {
    const out = [];
    for (const r of steps) {
      const t = r.tokens || {};
      TOKEN_PHASES.forEach((p, i) => out.push({step: r.step, phase: p, order: i, tokens: t[p] || 0}));
    }
    return out;
  }

  // -- every chart's datasets -------------------------------------------------------------------
  /* What the view feeds each chart app/charts/registry.py declares: {dataset: rows} from the
   * buffer, ``last`` steps drawn (the twins of the registry's ``rows``, held equal by
   * tests/app/test_rows_js.py). The view keys each dataset's rows by the fields declared there. */
  const SPAN_FIELDS = ["slot", "request", "phase", "start", "end", "tokens", "who"];
  const CHART_ROWS = {
    slots(steps, last, people, withOverview) {
      const budget = MAX_ROWS - (withOverview ? OVERVIEW_BINS * PHASES.length : 0) - last;
      const [win, spans] = fitWindow(steps, last, people, budget);
      const out = {spans: spans.map(sp => Object.fromEntries(SPAN_FIELDS.map(f => [f, sp[f]]))),
                   queue: queueSeries(win)};
      if (withOverview) out.overview = overview(steps);
      return out;
    },
    stalls(steps, last) {
      let rows = itlPerStep(steps);
      rows = last ? rows.slice(-last) : rows;
      return {prefill: prefillBars(rows), admissions: admissionMarkers(rows), machine: machineMarkers(rows),
              itl_lines: stallLines(rows)};
    },
    kv(steps, last) {
      const win = window_(steps, last);
      return {kv_series: kvSeries(win), blocks: blockMap(win)};
    },
    lanes(steps, last) { return {lanes: laneSpans(steps, last)}; },
    tokens(steps, last) { return {step_tokens: stepTokens(window_(steps, last))}; },
  };

  root.FluxoRows = {
    CHART_ROWS, stepTokens,
    MAX_ROWS, OVERVIEW_BINS, PHASES, KV_STATES, SLOW_FACTOR, STALL_FACTOR,
    window: window_, phase, slotSpans, queueSeries, bins, overview, fitWindow, itlPerStep, admissionMarkers,
    machineMarkers, stallLines, prefillBars, blockSize, kvSeries, requestKvTokens, blockMap, laneSpans, deviceBusy,
  };
})(typeof window !== "undefined" ? window : globalThis);
