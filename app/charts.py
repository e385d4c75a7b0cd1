"""Chart builders: pure functions from telemetry records to Vega-Lite charts.

Each builder returns a Vega-Lite spec as a plain dict (what Altair's ``to_dict`` would give;
``as_altair`` turns one back into an Altair chart, validating it). Building the dicts directly
costs a few milliseconds where Altair's object layer cost ~100 ms per chart, and the page
redraws four of them every refresh.

Every mark is a measured fact of the engine: a step record (``slots``, ``kv``, ``spans``,
``admitted``...) or a request record, as ``engine/core/telemetry.py`` writes them. Nothing is
interpolated or smoothed. Two rules keep the page fast with 64 slots and thousands of steps:

- run-length encoding: the slot Gantt draws one bar per (slot, request, phase) span, not one per
  step; the other per-step series are aggregated per step (max/median), never per request;
- windowing: the detailed charts show the last ``window`` steps; an overview binned into at most
  ``OVERVIEW_BINS`` buckets shows the whole buffer. No chart sends more than ``MAX_ROWS`` rows.

The data functions (``slot_spans``, ``itl_per_step``, ``kv_series``, ``block_map``,
``lane_spans``, ``overview``) return plain lists of dicts so they can be tested without Altair.

Every builder also emits the same chart with *named* datasets (``named=True``: ``{"data": {"name":
"spans"}}``, no values): the browser view (``app/component/``) creates each Vega view once from
that spec and feeds it rows derived in JavaScript by ports of these data functions
(``app/component/rows.js``, tested equal to these on recorded telemetry), as incremental
changesets. ``DATASETS`` lists the names per chart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import altair as alt

from engine.core.metrics import slot_phase, step_window

Record = dict[str, Any]

MAX_ROWS = 3000  # per chart, all datasets together
OVERVIEW_BINS = 300

# One colour per phase, the same in every chart (and in the legend of each).
PHASES = ("prefill", "decode", "dead", "idle")
# Colour-blind safe (app/palette.py): the closest pair is 40 Delta E apart under protanopia,
# deuteranopia and tritanopia alike (the old red "dead" and orange "prefill": 28.6 under
# deuteranopia, a pair such viewers confuse); tests/app/test_palette.py holds it.
PHASE_COLORS = {"prefill": "#F5B700", "decode": "#1F5FBF", "dead": "#A3195B", "idle": "#E5E5E5"}
# "shared" (blocks referenced by more than one sequence) and "cached" (free blocks whose content a
# prefix lookup can still find) come from prefix caching; records without them count zero.
KV_STATES = ("stored", "shared", "allocated, unused", "cached", "free")
KV_COLORS = {
    "stored": "#1C7ED6",
    "shared": "#0CA678",
    "allocated, unused": "#F08C00",
    "cached": "#B197FC",
    "free": "#E9ECEF",
}
LANES = ("cpu_prepare", "h2d", "compute", "d2h", "cpu_update")
LANE_COLORS = {
    "cpu_prepare": "#7048E8",
    "h2d": "#0CA678",
    "compute": "#2F9E44",
    "d2h": "#1098AD",
    "cpu_update": "#AE3EC9",
}
CHAT_COLOR = "#212529"  # outline of people's own chat requests
MACHINE_COLOR = "#7048E8"  # steps slowed by the machine, not by their own work
# A step is "slowed by the machine" when it took over SLOW_FACTOR x the duration the engine's cost
# model expected for its work (``expected_s``) and admitted nothing; an admission is a "stall" when
# its own expected duration is over STALL_FACTOR x that of the latest step without prefill work.
SLOW_FACTOR = 1.5
STALL_FACTOR = 1.5
# Dataset names of the named-data specs, per chart (what the browser view feeds).
DATASETS = {
    "slots": ("spans", "queue", "overview"),
    "stalls": ("prefill", "admissions", "machine", "itl_lines"),
    "kv": ("kv_series", "blocks"),
    "lanes": ("lanes",),
}

FONT = 16  # readable from the back of a classroom


# Steps are whole numbers: integer ticks, never "1,0 2,0" (pt-BR) or "1.5".
STEP_AXIS = {"format": "d", "tickMinStep": 1}


def _scale(colors: dict[str, str], domain: Sequence[str]) -> dict:
    return {"domain": list(domain), "range": [colors[k] for k in domain]}


CONFIG = {
    "axis": {"labelFontSize": FONT, "titleFontSize": FONT + 2, "grid": False},
    "legend": {
        "labelFontSize": FONT,
        "titleFontSize": FONT + 1,
        "orient": "top",
        "symbolSize": 220,
    },
    "title": {"fontSize": FONT + 4, "anchor": "start", "subtitleFontSize": FONT - 1},
    "view": {"strokeWidth": 0},
}
SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"


def spec(body: dict) -> dict:
    """A top-level Vega-Lite spec with the shared styling (large fonts for the classroom)."""
    return {"$schema": SCHEMA, "config": CONFIG, **body}


def as_altair(vl: dict, validate: bool = True):
    """The same chart as an Altair object (validated against Vega-Lite's schema by Altair)."""
    kind = next((k for k in ("vconcat", "hconcat", "layer") if k in vl), None)
    cls = {"vconcat": alt.VConcatChart, "hconcat": alt.HConcatChart, "layer": alt.LayerChart}.get(
        kind, alt.Chart
    )
    return cls.from_dict(vl, validate=validate)


def _data(rows: list[Record] | None, name: str = "", named: bool = False) -> dict:
    """Inline values, or (``named``) a named dataset the browser view fills."""
    return {"name": name} if named else {"values": rows}


def _tip(*fields: str) -> list[dict]:
    out = []
    for f in fields:
        name, _, typ = f.partition(":")
        out.append(
            {
                "field": name,
                "type": {"Q": "quantitative", "O": "ordinal", "N": "nominal"}[typ or "N"],
            }
        )
    return out


def window(steps: Sequence[Record], last: int) -> list[Record]:
    steps = list(steps)
    return steps[-last:] if last and len(steps) > last else steps


_phase = slot_phase  # as ``engine.core.metrics.slot_counts`` counts it (one definition)


# -- slot occupancy ------------------------------------------------------------------------------
def slot_spans(
    steps: Iterable[Record], people: set[int] | frozenset[int] = frozenset()
) -> list[Record]:
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
            if (
                cur is not None
                and cur["request"] == req
                and cur["phase"] == phase
                and cur["end"] == step
            ):
                cur["end"] = step + 1
                cur["tokens"] += s["tokens"]
                cur["t_end"] = rec["t_end"]
                continue
            cur = {
                "slot": slot,
                "request": req,
                "phase": phase,
                "start": step,
                "end": step + 1,
                "tokens": s["tokens"],
                "who": "idle" if req is None else ("person" if req in people else "traffic"),
                "t_start": rec["t_start"],
                "t_end": rec["t_end"],
            }
            open_[slot] = cur
            spans.append(cur)
        for slot in list(open_):
            if slot not in seen:
                del open_[slot]
        prev_step = step
    return spans


def queue_series(steps: Iterable[Record]) -> list[Record]:
    return [{"step": r["step"], "queue": r["queue_len"]} for r in steps]


def _bins(steps: Sequence[Record], bins: int) -> list[Sequence[Record]]:
    """Consecutive records grouped by ``step // k`` (k = ceil(len / bins)): buckets aligned to step
    numbers, so appending steps changes only the last bucket (the browser view updates in place)."""
    k = max(1, math.ceil(len(steps) / bins))
    out: list[list[Record]] = []
    key = None
    for rec in steps:
        b = rec["step"] // k
        if b != key:
            out.append([])
            key = b
        out[-1].append(rec)
    return out


def overview(steps: Sequence[Record], bins: int = OVERVIEW_BINS) -> list[Record]:
    """The whole buffer, binned: per bucket of steps, the mean number of slots in each phase."""
    rows: list[Record] = []
    if not steps:
        return rows
    for chunk in _bins(steps, bins):
        counts = dict.fromkeys(PHASES, 0)
        for rec in chunk:
            for s in rec["slots"]:
                counts[_phase(s)] += 1
        for phase in PHASES:
            rows.append(
                {
                    "step": chunk[0]["step"],
                    "step_end": chunk[-1]["step"] + 1,
                    "phase": phase,
                    "slots": counts[phase] / len(chunk),
                    "order": PHASES.index(phase),
                }
            )
    return rows


def _fit_window(
    steps: Sequence[Record], last: int, people: set[int], budget: int
) -> tuple[list[Record], list[Record]]:
    """The last ``last`` steps, shrunk until their spans fit in ``budget`` rows."""
    win = window(steps, last)
    spans = slot_spans(win, people)
    while len(spans) > budget and len(win) > 10:
        win = win[len(win) // 2 :]
        spans = slot_spans(win, people)
    return win, spans


def slot_chart(
    steps: Sequence[Record],
    people: Iterable[int] = (),
    last: int = 300,
    height: int = 320,
    with_overview: bool = True,
    title: str = "Slot occupancy",
    named: bool = False,
    slots: int = 8,
) -> dict:
    """Slots x steps Gantt (one bar per span; people's chats outlined in black), queue length below
    it, and an overview of the whole buffer. ``named``: datasets ``spans``, ``queue``, ``overview``
    (``slots`` sizes the slot labels then, as no rows are known)."""
    people = set(people)
    if named:
        rows, queue_rows, win = None, None, []
        many = slots > 16
        xs: dict = {"nice": False, "zero": False}
    else:
        budget = MAX_ROWS - (OVERVIEW_BINS * len(PHASES) if with_overview else 0) - last
        win, spans = _fit_window(steps, last, people, budget)
        rows = [
            {k: sp[k] for k in ("slot", "request", "phase", "start", "end", "tokens", "who")}
            for sp in spans
        ]
        queue_rows = queue_series(win)
        lo = win[0]["step"] if win else 0
        hi = (win[-1]["step"] + 1) if win else 1
        xs = {"domain": [lo, hi], "nice": False, "zero": False}
        many = max((r["slot"] for r in rows), default=0) > 16
    person = "datum.who === 'person'"
    bars = {
        "data": _data(rows, "spans", named),
        "height": height,
        "width": "container",
        "title": {
            "text": title,
            "subtitle": "one bar per (slot, request, phase) span · black outline: people's chats",
        },
        "mark": {"type": "bar", "height": {"band": 0.85}},
        "encoding": {
            "x": {
                "field": "start",
                "type": "quantitative",
                "title": "step",
                "axis": STEP_AXIS,
                "scale": xs,
            },
            "x2": {"field": "end"},
            "y": {
                "field": "slot",
                "type": "ordinal",
                "title": "slot",
                "axis": {"labelFontSize": FONT - 4 if many else FONT},
            },
            "color": {
                "field": "phase",
                "type": "nominal",
                "scale": _scale(PHASE_COLORS, PHASES),
                "title": "phase",
            },
            "stroke": {"condition": {"test": person, "value": CHAT_COLOR}, "value": None},
            "strokeWidth": {"condition": {"test": person, "value": 3}, "value": 0},
            "tooltip": _tip(
                "slot:O", "request:Q", "phase:N", "who:N", "start:Q", "end:Q", "tokens:Q"
            ),
        },
    }
    queue = {
        "data": _data(queue_rows, "queue", named),
        "height": 80,
        "width": "container",
        "mark": {"type": "area", "color": "#868E96", "opacity": 0.6, "interpolate": "step-after"},
        "encoding": {
            "x": {
                "field": "step",
                "type": "quantitative",
                "title": "step",
                "axis": STEP_AXIS,
                "scale": xs,
            },
            "y": {
                "field": "queue",
                "type": "quantitative",
                "title": "queue",
                "axis": {"format": "d", "tickMinStep": 1},
                "scale": {"domainMin": 0, "nice": True},
            },
            "tooltip": _tip("step:Q", "queue:Q"),
        },
    }
    # Named: the Gantt and the queue share one x scale (the data's extent: the window's steps).
    parts: list[dict] = (
        [{"vconcat": [bars, queue], "spacing": 8, "resolve": {"scale": {"x": "shared"}}}]
        if named
        else [bars, queue]
    )
    if with_overview and (named or len(steps) > len(win)):
        parts.append(
            {
                "data": _data(None if named else overview(list(steps)), "overview", named),
                "height": 70,
                "width": "container",
                "mark": {"type": "area", "interpolate": "step-after"},
                "encoding": {
                    "x": {
                        "field": "step",
                        "type": "quantitative",
                        "title": "whole buffer (binned): slots per phase",
                        "scale": {"nice": False, "zero": False},
                    },
                    "y": {
                        "field": "slots",
                        "type": "quantitative",
                        "stack": "zero",
                        "title": None,
                        "axis": {"tickCount": 2},
                    },
                    "color": {
                        "field": "phase",
                        "type": "nominal",
                        "scale": _scale(PHASE_COLORS, PHASES),
                        "title": "phase",
                    },
                    "order": {"field": "order", "type": "quantitative"},
                    "tooltip": _tip("step:Q", "phase:N", "slots:Q"),
                },
            }
        )
    return spec({"vconcat": parts, "spacing": 8, "resolve": {"scale": {"x": "independent"}}})


# -- admission stalls ----------------------------------------------------------------------------
def itl_per_step(steps: Iterable[Record]) -> list[Record]:
    """Per step, the inter-token latency of the running requests that got a token in it: the
    step's ``t_end`` minus that request's previous token time (the ``t_end`` of the last step
    that gave it a token), aggregated (median, max) over requests. Plus what the step admitted
    and how many prefill tokens it computed, so a spike lines up with its cause.

    Honest stalls: ``expected_ms`` is the duration the engine's cost model predicted for the
    step's work (``expected_s``; None in records without it). ``slow`` marks a step that took over
    ``SLOW_FACTOR`` x that and admitted nothing: the machine slowed it, not an admission. ``stall``
    marks an admission whose own expected duration is over ``STALL_FACTOR`` x that of the latest
    step without prefill work (without ``expected_s``: any admission that prefilled)."""
    last_token: dict[int, float] = {}
    quiet_ms: float | None = None
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
        prefill = (
            rec["tokens"]["prefill"]
            if "tokens" in rec
            else sum(s["tokens"] for s in rec["slots"] if s["phase"] == "prefill")
        )
        step_ms = 1000 * step_window(rec)
        exp = rec.get("expected_s")
        expected_ms = None if exp is None else 1000 * exp
        admitted = len(rec["admitted"])
        slow = expected_ms is not None and not admitted and step_ms > SLOW_FACTOR * expected_ms
        if not admitted:
            stall = False
        elif expected_ms is None or quiet_ms is None:
            stall = prefill > 0
        else:
            stall = expected_ms > STALL_FACTOR * quiet_ms
        if expected_ms is not None and prefill == 0:
            quiet_ms = expected_ms
        rows.append(
            {
                "step": rec["step"],
                "itl_ms": 1000 * gaps[len(gaps) // 2] if gaps else None,
                "itl_max_ms": 1000 * gaps[-1] if gaps else None,
                "running": len(gaps),
                "admitted": admitted,
                "admitted_ids": list(rec["admitted"]),
                "prefill_tokens": prefill,
                "cached_tokens": rec.get("cached_tokens") or 0,
                "step_ms": step_ms,
                "expected_ms": expected_ms,
                "slow": slow,
                "stall": stall,
            }
        )
    return rows


def admission_markers(rows: Iterable[Record]) -> list[Record]:
    return [
        {
            "step": r["step"],
            "admitted": r["admitted"],
            "prefill_tokens": r["prefill_tokens"],
            "cached_tokens": r["cached_tokens"],
            "stall": "yes" if r["stall"] else "no",
            "requests": ", ".join(f"#{i}" for i in r["admitted_ids"]),
        }
        for r in rows
        if r["admitted"]
    ]


def machine_markers(rows: Iterable[Record]) -> list[Record]:
    """Steps slowed by the machine: a band over the step, measured against expected."""
    return [
        {
            "step": r["step"],
            "step_end": r["step"] + 1,
            "step_ms": r["step_ms"],
            "expected_ms": r["expected_ms"],
            "times_expected": r["step_ms"] / r["expected_ms"] if r["expected_ms"] else None,
        }
        for r in rows
        if r["slow"]
    ]


STALL_SERIES = ("ITL median", "ITL max", "step measured", "step expected")


def stall_lines(rows: Iterable[Record]) -> list[Record]:
    keys = (
        ("ITL median", "itl_ms"),
        ("ITL max", "itl_max_ms"),
        ("step measured", "step_ms"),
        ("step expected", "expected_ms"),
    )
    return [
        {"step": r["step"], "series": name, "ms": r[key]}
        for r in rows
        for name, key in keys
        if r[key] is not None
    ]


def prefill_bars(rows: Iterable[Record]) -> list[Record]:
    return [
        {"step": r["step"], "prefill_tokens": r["prefill_tokens"]}
        for r in rows
        if r["prefill_tokens"]
    ]


def stall_chart(
    steps: Sequence[Record],
    last: int = 300,
    height: int = 300,
    title: str = "Admission stalls",
    named: bool = False,
) -> dict:
    """ITL of running requests per step (median and max) and the step's measured duration against
    the duration expected for its work; prefill tokens of the step as bars on their own axis; a
    rule on every step that admitted a request, a purple band on every step the machine slowed.
    ``named``: datasets ``prefill``, ``admissions``, ``machine``, ``itl_lines``."""
    if named:
        rows: list[Record] = []
        x = {
            "field": "step",
            "type": "quantitative",
            "title": "step",
            "axis": STEP_AXIS,
            "scale": {"nice": False, "zero": False},
        }
    else:
        rows = itl_per_step(steps)
        rows = rows[-last:] if last else rows
        lo, hi = (rows[0]["step"], rows[-1]["step"] + 1) if rows else (0, 1)
        x = {
            "field": "step",
            "type": "quantitative",
            "title": "step",
            "axis": STEP_AXIS,
            "scale": {"domain": [lo, hi], "nice": False, "zero": False},
        }
    marks = None if named else admission_markers(rows)
    tip = _tip(
        "step:Q", "admitted:Q", "requests:N", "prefill_tokens:Q", "cached_tokens:Q", "stall:N"
    )
    orange = PHASE_COLORS["prefill"]
    return spec(
        {
            "title": {
                "text": title,
                "subtitle": [
                    "▼ (prefill colour): a step that admitted "
                    "(bars: its prefill tokens, right axis)",
                    f"purple band: slowed by the machine (over {SLOW_FACTOR:g}x its expected time, "
                    "nothing admitted)",
                ],
            },
            "height": height,
            "width": "container",
            "resolve": {"scale": {"y": "independent"}},
            "layer": [
                {
                    "data": _data(None if named else prefill_bars(rows), "prefill", named),
                    "mark": {"type": "bar", "color": orange, "opacity": 0.3, "width": 4},
                    "encoding": {
                        "x": x,
                        "y": {
                            "field": "prefill_tokens",
                            "type": "quantitative",
                            "title": "prefill tokens in the step",
                            "axis": {"orient": "right", "titleColor": orange},
                        },
                        "tooltip": _tip("step:Q", "prefill_tokens:Q"),
                    },
                },
                {
                    "layer": [
                        {
                            "data": _data(marks, "admissions", named),
                            "mark": {
                                "type": "rule",
                                "color": orange,
                                "strokeDash": [4, 3],
                                "strokeWidth": 1.5,
                            },
                            "encoding": {"x": x, "tooltip": tip},
                        },
                        {
                            "data": _data(
                                None if named else machine_markers(rows), "machine", named
                            ),
                            "mark": {"type": "rect", "color": MACHINE_COLOR, "opacity": 0.25},
                            "encoding": {
                                "x": x,
                                "x2": {"field": "step_end"},
                                "tooltip": _tip(
                                    "step:Q", "step_ms:Q", "expected_ms:Q", "times_expected:Q"
                                ),
                            },
                        },
                        {
                            "data": _data(None if named else stall_lines(rows), "itl_lines", named),
                            "mark": {"type": "line", "strokeWidth": 2.5, "point": {"size": 18}},
                            "encoding": {
                                "x": x,
                                "y": {
                                    "field": "ms",
                                    "type": "quantitative",
                                    "title": "ms (ITL, step time)",
                                },
                                "color": {
                                    "field": "series",
                                    "type": "nominal",
                                    "title": None,
                                    "scale": {
                                        "domain": list(STALL_SERIES),
                                        "range": ["#1C7ED6", "#C92A2A", "#343A40", "#868E96"],
                                    },
                                },
                                "strokeDash": {
                                    "field": "series",
                                    "type": "nominal",
                                    "legend": None,
                                    "scale": {
                                        "domain": list(STALL_SERIES),
                                        "range": [[1, 0], [1, 0], [1, 0], [6, 4]],
                                    },
                                },
                                "tooltip": _tip("step:Q", "series:N", "ms:Q"),
                            },
                        },
                        {
                            "data": _data(marks, "admissions", named),
                            "mark": {
                                "type": "point",
                                "shape": "triangle-down",
                                "size": 200,
                                "filled": True,
                                "color": orange,
                            },
                            "encoding": {"x": x, "y": {"value": 0}, "tooltip": tip},
                        },
                    ]
                },
            ],
        }
    )


# -- KV memory -----------------------------------------------------------------------------------
def _block_size(rec: Record, default: int = 16) -> int:
    kv = rec["kv"]
    return kv["tokens_allocated"] // kv["blocks_used"] if kv["blocks_used"] else default


def _kv_split(kv: Record, bs: int) -> tuple[float, float, float, float, float]:
    """One step's pool in tokens: stored, shared, allocated-unused, cached, free (summing to the
    budget). Shared blocks are carved out of the stored tokens, cached ones out of the free."""
    total = kv["blocks_total"] * bs
    alloc = kv["tokens_allocated"]
    stored = min(kv["tokens_stored"], alloc)
    shared = min((kv.get("blocks_shared") or 0) * bs, stored)
    free = max(0, total - alloc)
    cached = min((kv.get("blocks_cached") or 0) * bs, free)
    return stored - shared, shared, alloc - stored, cached, free - cached


def kv_series(
    steps: Sequence[Record], bins: int = 300, block_size: int | None = None
) -> list[Record]:
    """KV tokens per step, split into ``KV_STATES`` (stored / shared / allocated-but-unused /
    cached / free); binned (mean, buckets aligned to step numbers) to at most ``bins`` points so a
    long buffer stays a few thousand rows."""
    rows: list[Record] = []
    if not steps:
        return rows
    bs = block_size or next((_block_size(r) for r in reversed(steps) if r["kv"]["blocks_used"]), 16)
    for chunk in _bins(steps, bins):
        n = len(chunk)
        sums = [0.0] * len(KV_STATES)
        for r in chunk:
            for j, v in enumerate(_kv_split(r["kv"], bs)):
                sums[j] += v
        for j, state in enumerate(KV_STATES):
            rows.append(
                {"step": chunk[0]["step"], "state": state, "tokens": sums[j] / n, "order": j}
            )
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
    running = (
        {s["request"]: s["slot"] for s in last["slots"] if s["request"] is not None} if last else {}
    )
    return {rid: n for rid, n in held.items() if rid in running}


def block_map(steps: Sequence[Record], max_cells: int = 1024) -> list[Record]:
    """The pool at the last step, one cell per block (or per group of blocks in a big pool),
    grouped by owner: blocks that hold each running request's KV (estimated from its tokens
    in the buffer; exact when its admission is in the buffer), blocks shared by several
    sequences (prefix caching), then the rest of the allocated blocks (reserved ahead, not yet
    written), free blocks whose content is still cached, then free blocks. Counts match ``kv``."""
    if not steps:
        return []
    rec = steps[-1]
    kv = rec["kv"]
    bs = _block_size(rec)
    total, used = kv["blocks_total"], kv["blocks_used"]
    shared = min(used, kv.get("blocks_shared") or 0)
    cached = min(max(0, total - used), kv.get("blocks_cached") or 0)
    per = max(1, math.ceil(total / max_cells))
    slot_of = {s["request"]: s["slot"] for s in rec["slots"] if s["request"] is not None}
    owners: list[tuple[str, int | None, int | None]] = []
    left = used - shared
    for rid, ntok in sorted(
        request_kv_tokens(steps).items(), key=lambda kv_: slot_of.get(kv_[0], 0)
    ):
        nblk = min(left, math.ceil(ntok / bs))
        owners += [("stored", rid, slot_of.get(rid))] * nblk
        left -= nblk
    owners += [("shared", None, None)] * shared
    owners += [("allocated, unused", None, None)] * left
    owners += [("cached", None, None)] * cached
    owners += [("free", None, None)] * max(0, total - used - cached)
    cols = max(1, min(64, math.ceil(math.sqrt(len(owners) / per) * 2)))
    cells = []
    for i in range(0, len(owners), per):
        state, rid, slot = owners[i]
        c = i // per
        cells.append(
            {
                "cell": c,
                "row": c // cols,
                "col": c % cols,
                "state": state,
                "request": rid,
                "slot": slot,
                "blocks": min(per, len(owners) - i),
            }
        )
    return cells


def kv_chart(
    steps: Sequence[Record],
    last: int = 2000,
    height: int = 260,
    title: str = "KV memory",
    named: bool = False,
) -> dict:
    """KV tokens over time by state, beside the block map of the pool now. ``named``: datasets
    ``kv_series``, ``blocks``."""
    win = [] if named else window(steps, last)
    kv_color = {
        "field": "state",
        "type": "nominal",
        "scale": _scale(KV_COLORS, KV_STATES),
        "title": "KV",
    }
    area = {
        "data": _data(None if named else kv_series(win), "kv_series", named),
        "height": height,
        "width": 520,
        "title": {
            "text": title,
            "subtitle": "tokens stored · shared · allocated but unused · cached · free",
        },
        "mark": {"type": "area", "interpolate": "step-after"},
        "encoding": {
            "x": {
                "field": "step",
                "type": "quantitative",
                "title": "step",
                "axis": STEP_AXIS,
                "scale": {"nice": False, "zero": False},
            },
            "y": {"field": "tokens", "type": "quantitative", "stack": "zero", "title": "KV tokens"},
            "color": kv_color,
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": _tip("step:Q", "state:N", "tokens:Q"),
        },
    }
    grid = {
        "data": _data(None if named else block_map(win), "blocks", named),
        "height": height,
        "width": height,
        "title": {"text": "block pool now", "subtitle": "one cell per block, grouped by owner"},
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "axis": None},
            "y": {"field": "row", "type": "ordinal", "axis": None},
            "color": kv_color,
            "tooltip": _tip("state:N", "request:Q", "slot:Q", "blocks:Q"),
        },
    }
    return spec({"hconcat": [area, grid], "spacing": 24})


# -- CPU / device lanes --------------------------------------------------------------------------
def lane_spans(steps: Sequence[Record], last: int = 12) -> list[Record]:
    """The measured spans of the last ``last`` steps, in ms from the first one's start."""
    win = window(steps, last)
    if not win:
        return []
    t0 = (
        min(s["start"] for r in win for s in r["spans"])
        if any(r["spans"] for r in win)
        else win[0]["t_start"]
    )
    return [
        {
            "lane": s["lane"],
            "step": r["step"],
            "start_ms": 1000 * (s["start"] - t0),
            "end_ms": 1000 * (s["end"] - t0),
            "ms": 1000 * (s["end"] - s["start"]),
        }
        for r in win
        for s in r["spans"]
    ]


def device_busy(spans: Sequence[Record]) -> float:
    """Fraction of the window's wall time in which the compute lane was busy."""
    if not spans:
        return 0.0
    wall = max(s["end_ms"] for s in spans) - min(s["start_ms"] for s in spans)
    busy = sum(s["ms"] for s in spans if s["lane"] == "compute")
    return busy / wall if wall > 0 else 0.0


def lane_chart(
    steps: Sequence[Record],
    last: int = 12,
    height: int = 230,
    title: str = "CPU / device timeline",
    named: bool = False,
) -> dict:
    """Measured spans per lane over the last steps: gaps in the compute lane are the device idle.
    ``named``: dataset ``lanes``; the title is the signal ``lane_title``, which the view sets to
    the title, runner and device-busy fraction of the steps it shows."""
    spans = [] if named else lane_spans(steps, last)
    runner = steps[-1]["runner"] if steps else ""
    sub = (
        f"{runner} runner · last {last} steps · "
        f"device busy {100 * device_busy(spans):.0f}% of the time"
    )
    body: dict = {
        "data": _data(spans, "lanes", named),
        "height": height,
        "width": "container",
        "title": {
            "text": {"expr": "lane_title"},
            "subtitle": f"last {last} steps · gaps in compute: the device idle",
        }
        if named
        else {"text": title, "subtitle": sub},
        "mark": {"type": "bar", "height": {"band": 0.7}},
        "encoding": {
            "x": {"field": "start_ms", "type": "quantitative", "title": "time (ms)"},
            "x2": {"field": "end_ms"},
            "y": {
                "field": "lane",
                "type": "nominal",
                "sort": list(LANES),
                "scale": {"domain": list(LANES)},
                "title": None,
            },
            "color": {
                "field": "lane",
                "type": "nominal",
                "scale": _scale(LANE_COLORS, LANES),
                "legend": None,
            },
            "tooltip": _tip("lane:N", "step:Q", "ms:Q"),
        },
    }
    if named:
        body["params"] = [{"name": "lane_title", "value": title}]
    return spec(body)


# -- helpers for pages and tests -----------------------------------------------------------------
def rows_sent(vl: dict) -> int:
    """How many data rows a spec carries to the browser (all datasets together)."""

    def walk(node: Any) -> int:
        if isinstance(node, dict):
            here = (
                len(node["data"]["values"])
                if isinstance(node.get("data"), dict) and "values" in node["data"]
                else 0
            )
            return (
                here
                + sum(len(v) for v in node.get("datasets", {}).values())
                + sum(walk(v) for k, v in node.items() if k not in ("data", "datasets"))
            )
        if isinstance(node, list):
            return sum(walk(v) for v in node)
        return 0

    return walk(vl)


def all_charts(
    steps: Sequence[Record], people: Iterable[int] = (), last: int = 300
) -> dict[str, dict]:
    steps = list(steps)
    return {
        "slots": slot_chart(steps, people, last),
        "stalls": stall_chart(steps, last),
        "kv": kv_chart(steps),
        "lanes": lane_chart(steps),
    }


def named_charts(
    slots: int = 8,
    slot_height: int = 320,
    stall_height: int = 300,
    kv_height: int = 260,
    lane_height: int = 230,
    with_overview: bool = True,
    slot_title: str = "Slot occupancy",
) -> dict[str, dict]:
    """The four charts with named datasets and no rows: what the browser view creates once."""
    return {
        "slots": slot_chart(
            [],
            named=True,
            slots=slots,
            height=slot_height,
            with_overview=with_overview,
            title=slot_title,
        ),
        "stalls": stall_chart([], named=True, height=stall_height),
        "kv": kv_chart([], named=True, height=kv_height),
        "lanes": lane_chart([], named=True, height=lane_height),
    }
