"""Chart builders: pure functions from telemetry records to Altair charts.

Every mark is a measured fact of the engine: a step record (``slots``, ``kv``, ``spans``,
``admitted``...) or a request record, as ``engine/telemetry.py`` writes them. Nothing is
interpolated or smoothed. Two rules keep the page fast with 64 slots and thousands of steps:

- run-length encoding: the slot Gantt draws one bar per (slot, request, phase) span, not one per
  step; the other per-step series are aggregated per step (max/median), never per request;
- windowing: the detailed charts show the last ``window`` steps; an overview binned into at most
  ``OVERVIEW_BINS`` buckets shows the whole buffer. No chart sends more than ``MAX_ROWS`` rows.

The data functions (``slot_spans``, ``itl_per_step``, ``kv_series``, ``block_map``,
``lane_spans``, ``overview``) return plain lists of dicts so they can be tested without Altair.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import altair as alt
import pandas as pd

Record = dict[str, Any]

MAX_ROWS = 3000  # per chart, all datasets together
OVERVIEW_BINS = 300

# One colour per phase, the same in every chart (and in the legend of each).
PHASES = ("prefill", "decode", "dead", "idle")
PHASE_COLORS = {"prefill": "#F08C00", "decode": "#1C7ED6", "dead": "#E03131", "idle": "#DEE2E6"}
KV_STATES = ("stored", "allocated, unused", "free")
KV_COLORS = {"stored": "#1C7ED6", "allocated, unused": "#F08C00", "free": "#E9ECEF"}
LANES = ("cpu_prepare", "h2d", "compute", "d2h", "cpu_update")
LANE_COLORS = {"cpu_prepare": "#7048E8", "h2d": "#0CA678", "compute": "#2F9E44", "d2h": "#1098AD", "cpu_update": "#AE3EC9"}
CHAT_COLOR = "#212529"  # outline of people's own chat requests

FONT = 16  # readable from the back of a classroom


def _scale(colors: dict[str, str], domain: Sequence[str]) -> alt.Scale:
    return alt.Scale(domain=list(domain), range=[colors[k] for k in domain])


def style(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """Large fonts everywhere; applied to every top-level chart this module returns."""
    return (chart.configure_axis(labelFontSize=FONT, titleFontSize=FONT + 2, grid=False)
            .configure_legend(labelFontSize=FONT, titleFontSize=FONT + 1, orient="top", symbolSize=220)
            .configure_title(fontSize=FONT + 4, anchor="start")
            .configure_view(strokeWidth=0))


def window(steps: Sequence[Record], last: int) -> list[Record]:
    steps = list(steps)
    return steps[-last:] if last and len(steps) > last else steps


def _phase(slot: Record) -> str:
    """As ``engine.metrics.slot_counts`` counts it: a running request that computed nothing is idle."""
    if slot["phase"] in ("prefill", "decode") and not slot["tokens"]:
        return "idle"
    return slot["phase"]


# -- slot occupancy ------------------------------------------------------------------------------
def slot_spans(steps: Iterable[Record], people: set[int] | frozenset[int] = frozenset()) -> list[Record]:
    """Run-length encode the slots: one row per maximal run of consecutive steps in which a slot
    holds the same request in the same phase. ``start``/``end`` are step numbers, ``end``
    exclusive; a gap in step numbers (records skipped) ends every run."""
    spans: list[Record] = []
    open_: dict[int, Record] = {}
    prev_step = None
    for rec in steps:
        step = rec["step"]
        if prev_step is not None and step != prev_step + 1:
            open_.clear()
        seen = set()
        for s in rec["slots"]:
            slot, req, phase = s["slot"], s["request"], _phase(s)
            seen.add(slot)
            cur = open_.get(slot)
            if cur is not None and cur["request"] == req and cur["phase"] == phase and cur["end"] == step:
                cur["end"] = step + 1
                cur["tokens"] += s["tokens"]
                cur["t_end"] = rec["t_end"]
                continue
            cur = {"slot": slot, "request": req, "phase": phase, "start": step, "end": step + 1,
                   "tokens": s["tokens"], "who": "idle" if req is None else ("person" if req in people else "traffic"),
                   "t_start": rec["t_start"], "t_end": rec["t_end"]}
            open_[slot] = cur
            spans.append(cur)
        for slot in list(open_):
            if slot not in seen:
                del open_[slot]
        prev_step = step
    return spans


def queue_series(steps: Iterable[Record]) -> list[Record]:
    return [{"step": r["step"], "queue": r["queue_len"]} for r in steps]


def overview(steps: Sequence[Record], bins: int = OVERVIEW_BINS) -> list[Record]:
    """The whole buffer, binned: per bucket of steps, the mean number of slots in each phase."""
    rows: list[Record] = []
    if not steps:
        return rows
    k = max(1, math.ceil(len(steps) / bins))
    for i in range(0, len(steps), k):
        chunk = steps[i:i + k]
        counts = dict.fromkeys(PHASES, 0)
        for rec in chunk:
            for s in rec["slots"]:
                counts[_phase(s)] += 1
        for phase in PHASES:
            rows.append({"step": chunk[0]["step"], "step_end": chunk[-1]["step"] + 1, "phase": phase,
                         "slots": counts[phase] / len(chunk)})
    return rows


def _fit_window(steps: Sequence[Record], last: int, people: set[int], budget: int) -> tuple[list[Record], list[Record]]:
    """The last ``last`` steps, shrunk until their spans fit in ``budget`` rows."""
    win = window(steps, last)
    spans = slot_spans(win, people)
    while len(spans) > budget and len(win) > 10:
        win = win[len(win) // 2:]
        spans = slot_spans(win, people)
    return win, spans


def slot_chart(steps: Sequence[Record], people: Iterable[int] = (), last: int = 300, height: int = 320,
               with_overview: bool = True, title: str = "Slot occupancy") -> alt.TopLevelMixin:
    """Slots x steps Gantt (one bar per span; people's chats outlined), queue length below it, and
    an overview of the whole buffer."""
    people = set(people)
    budget = MAX_ROWS - (OVERVIEW_BINS * len(PHASES) if with_overview else 0) - last
    win, spans = _fit_window(steps, last, people, budget)
    df = pd.DataFrame(spans or [{"slot": 0, "request": None, "phase": "idle", "start": 0, "end": 0, "tokens": 0, "who": "idle"}])
    df["label"] = df["request"].map(lambda r: "" if r is None or pd.isna(r) else f"#{int(r)}")
    lo = win[0]["step"] if win else 0
    hi = (win[-1]["step"] + 1) if win else 1
    x = alt.X("start:Q", title="step", scale=alt.Scale(domain=[lo, hi], nice=False))
    bars = alt.Chart(df).mark_bar(height={"band": 0.85}).encode(
        x=x, x2="end:Q",
        y=alt.Y("slot:O", title="slot", axis=alt.Axis(labelFontSize=FONT - 2 if df["slot"].max() > 16 else FONT)),
        color=alt.Color("phase:N", scale=_scale(PHASE_COLORS, PHASES), title="phase"),
        stroke=alt.condition(alt.datum.who == "person", alt.value(CHAT_COLOR), alt.value(None)),
        strokeWidth=alt.condition(alt.datum.who == "person", alt.value(3), alt.value(0)),
        tooltip=["slot:O", "request:Q", "phase:N", "who:N", "start:Q", "end:Q", "tokens:Q"],
    ).properties(height=height, width="container", title=title)
    q = pd.DataFrame(queue_series(win) or [{"step": 0, "queue": 0}])
    queue = alt.Chart(q).mark_area(color="#868E96", opacity=0.6, interpolate="step-after").encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(domain=[lo, hi], nice=False)),
        y=alt.Y("queue:Q", title="queue"),
        tooltip=["step:Q", "queue:Q"],
    ).properties(height=80, width="container")
    parts = [bars, queue]
    if with_overview and len(steps) > len(win):
        ov = pd.DataFrame(overview(list(steps)))
        parts.append(alt.Chart(ov).mark_bar().encode(
            x=alt.X("step:Q", title="whole run (binned)"), x2="step_end:Q",
            y=alt.Y("slots:Q", stack="zero", title="slots"),
            color=alt.Color("phase:N", scale=_scale(PHASE_COLORS, PHASES), title="phase"),
            tooltip=["step:Q", "phase:N", alt.Tooltip("slots:Q", format=".1f")],
        ).properties(height=70, width="container"))
    return style(alt.vconcat(*parts, spacing=8).resolve_scale(x="independent"))


# -- admission stalls ----------------------------------------------------------------------------
def itl_per_step(steps: Iterable[Record]) -> list[Record]:
    """Per step, the inter-token latency of the running requests that got a token in it: the
    step's ``t_end`` minus that request's previous token time (the ``t_end`` of the last step
    that gave it a token), aggregated (median, max) over requests. Plus what the step admitted
    and how many prefill tokens it computed, so a spike lines up with its cause."""
    last_token: dict[int, float] = {}
    rows: list[Record] = []
    for rec in steps:
        gaps = []
        for s in rec["slots"]:
            rid = s["request"]
            if rid is None or s["phase"] not in ("prefill", "decode") or not s["tokens"]:
                continue
            if s["phase"] == "decode" and rid in last_token:
                gaps.append(rec["t_end"] - last_token[rid])
            last_token[rid] = rec["t_end"]
        for rid in rec["finished"]:
            last_token.pop(rid, None)
        gaps.sort()
        rows.append({
            "step": rec["step"],
            "itl_ms": 1000 * gaps[len(gaps) // 2] if gaps else None,
            "itl_max_ms": 1000 * gaps[-1] if gaps else None,
            "running": len(gaps),
            "admitted": len(rec["admitted"]),
            "admitted_ids": list(rec["admitted"]),
            "prefill_tokens": rec["tokens"]["prefill"] if "tokens" in rec else
            sum(s["tokens"] for s in rec["slots"] if s["phase"] == "prefill"),
            "step_ms": 1000 * (rec["t_end"] - rec["t_start"]),
        })
    return rows


def admission_markers(rows: Iterable[Record]) -> list[Record]:
    return [{"step": r["step"], "admitted": r["admitted"], "prefill_tokens": r["prefill_tokens"],
             "requests": ", ".join(f"#{i}" for i in r["admitted_ids"])} for r in rows if r["admitted"]]


def stall_chart(steps: Sequence[Record], last: int = 300, height: int = 300, title: str = "Admission stalls") -> alt.TopLevelMixin:
    """ITL of running requests per step (median and max), prefill tokens of the step as bars on
    their own axis, and a rule on every step that admitted a request."""
    rows = itl_per_step(steps)[-last:] if last else itl_per_step(steps)
    df = pd.DataFrame(rows or [{"step": 0, "itl_ms": None, "itl_max_ms": None, "prefill_tokens": 0, "admitted": 0, "step_ms": 0}])
    df = df.drop(columns=["admitted_ids"], errors="ignore")
    lo, hi = (rows[0]["step"], rows[-1]["step"] + 1) if rows else (0, 1)
    x = alt.X("step:Q", title="step", scale=alt.Scale(domain=[lo, hi], nice=False))
    long = df.melt(id_vars=["step"], value_vars=["itl_ms", "itl_max_ms"], var_name="series", value_name="ms").dropna()
    long["series"] = long["series"].map({"itl_ms": "ITL median", "itl_max_ms": "ITL max"})
    lines = alt.Chart(long).mark_line(strokeWidth=2.5, point=alt.OverlayMarkDef(size=18)).encode(
        x=x, y=alt.Y("ms:Q", title="inter-token latency (ms)"),
        color=alt.Color("series:N", scale=alt.Scale(domain=["ITL median", "ITL max"], range=["#1C7ED6", "#C92A2A"]), title=None),
        tooltip=["step:Q", "series:N", alt.Tooltip("ms:Q", format=".1f")],
    )
    pre = alt.Chart(df[df["prefill_tokens"] > 0]).mark_bar(color=PHASE_COLORS["prefill"], opacity=0.35, width=4).encode(
        x=x, y=alt.Y("prefill_tokens:Q", title="prefill tokens in the step", axis=alt.Axis(orient="right", titleColor=PHASE_COLORS["prefill"])),
        tooltip=["step:Q", "prefill_tokens:Q"],
    )
    marks = pd.DataFrame(admission_markers(rows) or [{"step": None, "admitted": 0, "prefill_tokens": 0, "requests": ""}]).dropna()
    rules = alt.Chart(marks).mark_rule(color=PHASE_COLORS["prefill"], strokeDash=[4, 3], strokeWidth=1.5).encode(
        x=x, tooltip=["step:Q", "admitted:Q", "requests:N", "prefill_tokens:Q"])
    ticks = alt.Chart(marks).mark_point(shape="triangle-down", size=160, filled=True, color=PHASE_COLORS["prefill"]).encode(
        x=x, y=alt.value(0), tooltip=["step:Q", "admitted:Q", "requests:N", "prefill_tokens:Q"])
    chart = alt.layer(pre, alt.layer(rules, lines, ticks)).resolve_scale(y="independent")
    return style(chart.properties(height=height, width="container", title=title))


# -- KV memory -----------------------------------------------------------------------------------
def _block_size(rec: Record, default: int = 16) -> int:
    kv = rec["kv"]
    return kv["tokens_allocated"] // kv["blocks_used"] if kv["blocks_used"] else default


def kv_series(steps: Sequence[Record], bins: int = 300, block_size: int | None = None) -> list[Record]:
    """KV tokens per step, split into stored / allocated-but-unused / free; binned (mean) to at
    most ``bins`` points so a long buffer stays a few thousand rows."""
    rows: list[Record] = []
    if not steps:
        return rows
    bs = block_size or next((_block_size(r) for r in reversed(steps) if r["kv"]["blocks_used"]), 16)
    k = max(1, math.ceil(len(steps) / bins))
    for i in range(0, len(steps), k):
        chunk = steps[i:i + k]
        n = len(chunk)
        stored = sum(r["kv"]["tokens_stored"] for r in chunk) / n
        alloc = sum(r["kv"]["tokens_allocated"] for r in chunk) / n
        total = sum(r["kv"]["blocks_total"] * bs for r in chunk) / n
        for state, v in (("stored", stored), ("allocated, unused", alloc - stored), ("free", max(0.0, total - alloc))):
            rows.append({"step": chunk[0]["step"], "state": state, "tokens": v, "order": KV_STATES.index(state)})
    return rows


def request_kv_tokens(steps: Sequence[Record]) -> dict[int, int]:
    """Tokens each request running at the last step has computed since its (re)admission, summed
    from the step records (a preemption drops its KV, so it restarts from zero)."""
    held: dict[int, int] = {}
    for rec in steps:
        for rid in rec["preempted"]:
            held.pop(rid, None)
        for s in rec["slots"]:
            if s["request"] is not None and s["phase"] in ("prefill", "decode"):
                held[s["request"]] = held.get(s["request"], 0) + s["tokens"]
        for rid in rec["finished"]:
            if rec["policy"] != "static":
                held.pop(rid, None)
    last = steps[-1] if steps else None
    running = {s["request"]: s["slot"] for s in last["slots"] if s["request"] is not None} if last else {}
    return {rid: n for rid, n in held.items() if rid in running}


def block_map(steps: Sequence[Record], max_cells: int = 1024) -> list[Record]:
    """The pool at the last step, one cell per block (or per group of blocks in a big pool),
    grouped by owner: blocks that hold each running request's KV (estimated from its tokens
    in the buffer; exact when its admission is in the buffer), then the rest of the allocated
    blocks (reserved ahead, not yet written), then free blocks. Counts match ``kv`` exactly."""
    if not steps:
        return []
    rec = steps[-1]
    kv = rec["kv"]
    bs = _block_size(rec)
    total, used = kv["blocks_total"], kv["blocks_used"]
    per = max(1, math.ceil(total / max_cells))
    slot_of = {s["request"]: s["slot"] for s in rec["slots"] if s["request"] is not None}
    owners: list[tuple[str, int | None, int | None]] = []
    left = used
    for rid, ntok in sorted(request_kv_tokens(steps).items(), key=lambda kv_: slot_of.get(kv_[0], 0)):
        nblk = min(left, math.ceil(ntok / bs))
        owners += [("stored", rid, slot_of.get(rid))] * nblk
        left -= nblk
    owners += [("allocated, unused", None, None)] * left
    owners += [("free", None, None)] * max(0, total - used)
    cols = max(1, min(64, math.ceil(math.sqrt(len(owners) / per) * 2)))
    cells = []
    for i in range(0, len(owners), per):
        state, rid, slot = owners[i]
        c = i // per
        cells.append({"cell": c, "row": c // cols, "col": c % cols, "state": state, "request": rid, "slot": slot,
                      "blocks": min(per, len(owners) - i)})
    return cells


def kv_chart(steps: Sequence[Record], last: int = 2000, height: int = 260, title: str = "KV memory") -> alt.TopLevelMixin:
    """Stored / allocated-unused / free KV tokens over time, beside the block map of the pool now."""
    win = window(steps, last)
    df = pd.DataFrame(kv_series(win) or [{"step": 0, "state": "free", "tokens": 0, "order": 2}])
    area = alt.Chart(df).mark_area(interpolate="step-after").encode(
        x=alt.X("step:Q", title="step", scale=alt.Scale(nice=False)),
        y=alt.Y("tokens:Q", stack="zero", title="KV tokens"),
        color=alt.Color("state:N", scale=_scale(KV_COLORS, KV_STATES), title="KV"),
        order=alt.Order("order:Q"),
        tooltip=["step:Q", "state:N", alt.Tooltip("tokens:Q", format=".0f")],
    ).properties(height=height, width=520, title=title)
    cells = pd.DataFrame(block_map(win) or [{"row": 0, "col": 0, "state": "free", "request": None, "slot": None, "blocks": 0}])
    grid = alt.Chart(cells).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("col:O", axis=None), y=alt.Y("row:O", axis=None),
        color=alt.Color("state:N", scale=_scale(KV_COLORS, KV_STATES), title="KV"),
        tooltip=["state:N", "request:Q", "slot:Q", "blocks:Q"],
    ).properties(height=height, width=height, title="block pool now")
    return style(alt.hconcat(area, grid, spacing=24))


# -- CPU / device lanes --------------------------------------------------------------------------
def lane_spans(steps: Sequence[Record], last: int = 12) -> list[Record]:
    """The measured spans of the last ``last`` steps, in ms from the first one's start."""
    win = window(steps, last)
    if not win:
        return []
    t0 = min(s["start"] for r in win for s in r["spans"]) if any(r["spans"] for r in win) else win[0]["t_start"]
    return [{"lane": s["lane"], "step": r["step"], "start_ms": 1000 * (s["start"] - t0), "end_ms": 1000 * (s["end"] - t0),
             "ms": 1000 * (s["end"] - s["start"])} for r in win for s in r["spans"]]


def device_busy(spans: Sequence[Record]) -> float:
    """Fraction of the window's wall time in which the compute lane was busy."""
    if not spans:
        return 0.0
    wall = max(s["end_ms"] for s in spans) - min(s["start_ms"] for s in spans)
    busy = sum(s["ms"] for s in spans if s["lane"] == "compute")
    return busy / wall if wall > 0 else 0.0


def lane_chart(steps: Sequence[Record], last: int = 12, height: int = 230, title: str = "CPU / device timeline") -> alt.TopLevelMixin:
    spans = lane_spans(steps, last)
    df = pd.DataFrame(spans or [{"lane": "compute", "step": 0, "start_ms": 0.0, "end_ms": 0.0, "ms": 0.0}])
    runner = steps[-1]["runner"] if steps else ""
    bars = alt.Chart(df).mark_bar(height={"band": 0.7}).encode(
        x=alt.X("start_ms:Q", title="time (ms)"), x2="end_ms:Q",
        y=alt.Y("lane:N", sort=list(LANES), scale=alt.Scale(domain=list(LANES)), title=None),
        color=alt.Color("lane:N", scale=_scale(LANE_COLORS, LANES), legend=None),
        tooltip=["lane:N", "step:Q", alt.Tooltip("ms:Q", format=".2f")],
    )
    labels = alt.Chart(df[df["lane"] == "compute"]).mark_text(dy=-16, fontSize=FONT - 3, color="#495057").encode(
        x=alt.X("start_ms:Q"), y=alt.Y("lane:N", sort=list(LANES)), text=alt.Text("step:Q"))
    sub = f"{runner} runner · last {last} steps · device busy {100 * device_busy(spans):.0f}% of the time"
    return style(alt.layer(bars, labels).properties(height=height, width="container",
                                                     title=alt.TitleParams(title, subtitle=sub, subtitleFontSize=FONT - 1)))


# -- helpers for pages and tests -----------------------------------------------------------------
def rows_sent(chart: alt.TopLevelMixin) -> int:
    """How many data rows the chart's spec carries to the browser (all datasets together)."""
    spec = chart.to_dict()
    n = sum(len(v) for v in spec.get("datasets", {}).values())

    def walk(node: Any) -> int:
        if isinstance(node, dict):
            k = len(node["data"]["values"]) if isinstance(node.get("data"), dict) and "values" in node["data"] else 0
            return k + sum(walk(v) for key, v in node.items() if key != "data")
        if isinstance(node, list):
            return sum(walk(v) for v in node)
        return 0

    return n + walk(spec)


def all_charts(steps: Sequence[Record], people: Iterable[int] = (), last: int = 300) -> dict[str, alt.TopLevelMixin]:
    steps = list(steps)
    return {"slots": slot_chart(steps, people, last), "stalls": stall_chart(steps, last),
            "kv": kv_chart(steps), "lanes": lane_chart(steps)}
