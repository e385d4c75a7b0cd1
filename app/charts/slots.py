"""Slot occupancy: the slots x steps Gantt, run-length encoded (one bar per (slot, request, phase)
span, not one per step), the queue length below it, and an overview of the whole buffer binned
into at most ``OVERVIEW_BINS`` buckets."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.common import (
    CHAT_COLOR,
    FONT,
    MAX_ROWS,
    OVERVIEW_BINS,
    PHASE_COLORS,
    color_scale,
    dataset,
    spec,
    step_bins,
    step_scale,
    step_x,
    tooltip,
    window,
)
from engine.core.metrics import slot_phase
from engine.core.records import PHASES, Record, StepRecord

SPAN_FIELDS = ("slot", "request", "phase", "start", "end", "tokens", "who")


def _open_span(rec: StepRecord, s: Record, phase: str, people: set[int] | frozenset[int]) -> Record:
    """A new run of slot ``s`` starting at step record ``rec``."""
    req = s["request"]
    return {
        "slot": s["slot"],
        "request": req,
        "phase": phase,
        "start": rec["step"],
        "end": rec["step"] + 1,
        "tokens": s["tokens"],
        "who": "idle" if req is None else ("person" if req in people else "traffic"),
        "t_start": rec["t_start"],
        "t_end": rec["t_end"],
    }


def slot_spans(
    steps: Iterable[StepRecord], people: set[int] | frozenset[int] = frozenset()
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
            slot, phase = s["slot"], slot_phase(s)
            seen.add(slot)
            cur = open_.get(slot)
            if (
                cur is not None
                and cur["request"] == s["request"]
                and cur["phase"] == phase
                and cur["end"] == step
            ):
                cur["end"] = step + 1
                cur["tokens"] += s["tokens"]
                cur["t_end"] = rec["t_end"]
                continue
            open_[slot] = cur = _open_span(rec, s, phase, people)
            spans.append(cur)
        for slot in list(open_):
            if slot not in seen:
                del open_[slot]
        prev_step = step
    return spans


def queue_series(steps: Iterable[StepRecord]) -> list[Record]:
    return [{"step": r["step"], "queue": r["queue_len"]} for r in steps]


def overview(steps: Sequence[StepRecord], bins: int = OVERVIEW_BINS) -> list[Record]:
    """The whole buffer, binned: per bucket of steps, the mean number of slots in each phase."""
    rows: list[Record] = []
    if not steps:
        return rows
    for chunk in step_bins(steps, bins):
        counts = dict.fromkeys(PHASES, 0)
        for rec in chunk:
            for s in rec["slots"]:
                counts[slot_phase(s)] += 1
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


def fit_window(
    steps: Sequence[StepRecord], last: int, people: set[int], budget: int
) -> tuple[list[Record], list[Record]]:
    """The last ``last`` steps, shrunk until their spans fit in ``budget`` rows."""
    win = window(steps, last)
    spans = slot_spans(win, people)
    while len(spans) > budget and len(win) > 10:
        win = win[len(win) // 2 :]
        spans = slot_spans(win, people)
    return win, spans


def _slot_rows(
    steps: Sequence[StepRecord], people: set[int], last: int, with_overview: bool
) -> tuple[list[Record], list[Record], list[Record], dict, bool]:
    """Inline data: the window's span rows and queue rows, the window, the x scale (the window's
    steps) and whether the slots are many (smaller labels)."""
    budget = MAX_ROWS - (OVERVIEW_BINS * len(PHASES) if with_overview else 0) - last
    win, spans = fit_window(steps, last, people, budget)
    rows = [{k: sp[k] for k in SPAN_FIELDS} for sp in spans]
    lo = win[0]["step"] if win else 0
    hi = (win[-1]["step"] + 1) if win else 1
    many = max((r["slot"] for r in rows), default=0) > 16
    return rows, queue_series(win), win, step_scale([lo, hi]), many


def slot_rows(
    steps: Sequence[StepRecord], people: Iterable[int], last: int, with_overview: bool
) -> dict[str, list[Record]]:
    """The datasets the browser view feeds (``rows.js`` ``CHART_ROWS.slots``, held equal)."""
    rows, queue_rows, *_ = _slot_rows(steps, set(people), last, with_overview)
    out = {"spans": rows, "queue": queue_rows}
    if with_overview:
        out["overview"] = overview(list(steps))
    return out


def _gantt(rows, named: bool, height: int, title: str, xs: dict, many: bool) -> dict:
    person = "datum.who === 'person'"
    return {
        "data": dataset(rows, "spans", named),
        "height": height,
        "width": "container",
        "title": {
            "text": title,
            "subtitle": "one bar per (slot, request, phase) span · black outline: people's chats",
        },
        "mark": {"type": "bar", "height": {"band": 0.85}},
        "encoding": {
            "x": step_x(xs, "start"),
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
                "scale": color_scale(PHASE_COLORS, PHASES),
                "title": "phase",
            },
            "stroke": {"condition": {"test": person, "value": CHAT_COLOR}, "value": None},
            "strokeWidth": {"condition": {"test": person, "value": 3}, "value": 0},
            "tooltip": tooltip(
                "slot:O", "request:Q", "phase:N", "who:N", "start:Q", "end:Q", "tokens:Q"
            ),
        },
    }


def _queue(rows, named: bool, xs: dict) -> dict:
    return {
        "data": dataset(rows, "queue", named),
        "height": 80,
        "width": "container",
        "mark": {"type": "area", "color": "#868E96", "opacity": 0.6, "interpolate": "step-after"},
        "encoding": {
            "x": step_x(xs),
            "y": {
                "field": "queue",
                "type": "quantitative",
                "title": "queue",
                "axis": {"format": "d", "tickMinStep": 1},
                "scale": {"domainMin": 0, "nice": True},
            },
            "tooltip": tooltip("step:Q", "queue:Q"),
        },
    }


def _overview_area(rows, named: bool) -> dict:
    return {
        "data": dataset(rows, "overview", named),
        "height": 70,
        "width": "container",
        "mark": {"type": "area", "interpolate": "step-after"},
        "encoding": {
            "x": {
                "field": "step",
                "type": "quantitative",
                "title": "whole buffer (binned): slots per phase",
                "scale": step_scale(),
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
                "scale": color_scale(PHASE_COLORS, PHASES),
                "title": "phase",
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": tooltip("step:Q", "phase:N", "slots:Q"),
        },
    }


def slot_chart(
    steps: Sequence[StepRecord],
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
    if named:
        rows, queue_rows, win, xs, many = None, None, [], step_scale(), slots > 16
    else:
        rows, queue_rows, win, xs, many = _slot_rows(steps, set(people), last, with_overview)
    bars = _gantt(rows, named, height, title, xs, many)
    queue = _queue(queue_rows, named, xs)
    # Named: the Gantt and the queue share one x scale (the data's extent: the window's steps).
    parts: list[dict] = (
        [{"vconcat": [bars, queue], "spacing": 8, "resolve": {"scale": {"x": "shared"}}}]
        if named
        else [bars, queue]
    )
    if with_overview and (named or len(steps) > len(win)):
        parts.append(_overview_area(None if named else overview(list(steps)), named))
    return spec({"vconcat": parts, "spacing": 8, "resolve": {"scale": {"x": "independent"}}})
