"""Admission stalls: per step, the inter-token latency of the running requests (median and max)
and the step's measured duration against the duration the cost model expected for its work;
prefill tokens as bars on their own axis, a marker on every admitting step, a band on every step
the machine slowed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.common import (
    MACHINE_COLOR,
    PHASE_COLORS,
    SLOW_FACTOR,
    STALL_FACTOR,
    dataset,
    spec,
    step_scale,
    step_x,
    tooltip,
)
from engine.core.metrics import step_window
from engine.core.records import Record, StepRecord

STALL_SERIES = ("ITL median", "ITL max", "step measured", "step expected")


def _token_gaps(rec: StepRecord, last_token: dict[int, float]) -> list[float]:
    """The step's inter-token gaps (sorted), updating each request's previous token time."""
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
    return gaps


def _is_stall(admitted: int, prefill: int, expected_ms: float | None, quiet_ms) -> bool:
    if not admitted:
        return False
    if expected_ms is None or quiet_ms is None:
        return prefill > 0
    return expected_ms > STALL_FACTOR * quiet_ms


def _step_row(rec: StepRecord, gaps: list[float], quiet_ms: float | None) -> Record:
    prefill = (
        rec["tokens"]["prefill"]
        if "tokens" in rec
        else sum(s["tokens"] for s in rec["slots"] if s["phase"] == "prefill")
    )
    step_ms = 1000 * step_window(rec)
    exp = rec.get("expected_s")
    expected_ms = None if exp is None else 1000 * exp
    admitted = len(rec["admitted"])
    return {
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
        "slow": expected_ms is not None and not admitted and step_ms > SLOW_FACTOR * expected_ms,
        "stall": _is_stall(admitted, prefill, expected_ms, quiet_ms),
    }


def itl_per_step(steps: Iterable[StepRecord]) -> list[Record]:
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
        row = _step_row(rec, _token_gaps(rec, last_token), quiet_ms)
        if row["expected_ms"] is not None and row["prefill_tokens"] == 0:
            quiet_ms = row["expected_ms"]
        rows.append(row)
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


def stall_rows(
    steps: Sequence[StepRecord], people: Iterable[int], last: int, with_overview: bool
) -> dict[str, list[Record]]:
    """The datasets the browser view feeds (``rows.js`` ``CHART_ROWS.stalls``, held equal)."""
    rows = itl_per_step(steps)
    rows = rows[-last:] if last else rows
    return {
        "prefill": prefill_bars(rows),
        "admissions": admission_markers(rows),
        "machine": machine_markers(rows),
        "itl_lines": stall_lines(rows),
    }


ORANGE = PHASE_COLORS["prefill"]  # admissions are drawn in the prefill colour
ADMISSION_TIP = ("step:Q", "admitted:Q", "requests:N", "prefill_tokens:Q", "cached_tokens:Q")


def _prefill_layer(rows, named: bool, x: dict) -> dict:
    return {
        "data": dataset(None if named else prefill_bars(rows), "prefill", named),
        "mark": {"type": "bar", "color": ORANGE, "opacity": 0.3, "width": 4},
        "encoding": {
            "x": x,
            "y": {
                "field": "prefill_tokens",
                "type": "quantitative",
                "title": "prefill tokens in the step",
                "axis": {"orient": "right", "titleColor": ORANGE},
            },
            "tooltip": tooltip("step:Q", "prefill_tokens:Q"),
        },
    }


def _machine_layer(rows, named: bool, x: dict) -> dict:
    return {
        "data": dataset(None if named else machine_markers(rows), "machine", named),
        "mark": {"type": "rect", "color": MACHINE_COLOR, "opacity": 0.25},
        "encoding": {
            "x": x,
            "x2": {"field": "step_end"},
            "tooltip": tooltip("step:Q", "step_ms:Q", "expected_ms:Q", "times_expected:Q"),
        },
    }


def _series_channel(channel: dict, values: list) -> dict:
    """A channel (colour, dash) over the four series, its ``values`` in ``STALL_SERIES`` order."""
    return {
        "field": "series",
        "type": "nominal",
        **channel,
        "scale": {"domain": list(STALL_SERIES), "range": values},
    }


def _lines_layer(rows, named: bool, x: dict, y_max_ms: float | None = None) -> dict:
    y = {"field": "ms", "type": "quantitative", "title": "ms (ITL, step time)"}
    if y_max_ms:  # a fixed scale: a drop from 3,000 to 80 ms looks like one
        y["scale"] = {"domain": [0, y_max_ms], "clamp": True}
    return {
        "data": dataset(None if named else stall_lines(rows), "itl_lines", named),
        "mark": {"type": "line", "strokeWidth": 2.5, "point": {"size": 18}},
        "encoding": {
            "x": x,
            "y": y,
            "color": _series_channel({"title": None}, ["#1C7ED6", "#C92A2A", "#343A40", "#868E96"]),
            "strokeDash": _series_channel({"legend": None}, [[1, 0], [1, 0], [1, 0], [6, 4]]),
            "tooltip": tooltip("step:Q", "series:N", "ms:Q"),
        },
    }


def _admission_layers(marks, named: bool, x: dict) -> tuple[dict, dict]:
    """A dashed rule over each admitting step, and a ▼ at its foot."""
    tip = tooltip(*ADMISSION_TIP, "stall:N")
    rule = {
        "data": dataset(marks, "admissions", named),
        "mark": {"type": "rule", "color": ORANGE, "strokeDash": [4, 3], "strokeWidth": 1.5},
        "encoding": {"x": x, "tooltip": tip},
    }
    point = {
        "data": dataset(marks, "admissions", named),
        "mark": {
            "type": "point",
            "shape": "triangle-down",
            "size": 200,
            "filled": True,
            "color": ORANGE,
        },
        "encoding": {"x": x, "y": {"value": 0}, "tooltip": tip},
    }
    return rule, point


def stall_chart(
    steps: Sequence[StepRecord],
    last: int = 300,
    height: int = 300,
    title: str = "Admission stalls",
    named: bool = False,
    y_max_ms: float | None = None,
) -> dict:
    """ITL of running requests per step (median and max) and the step's measured duration against
    the duration expected for its work; prefill tokens of the step as bars on their own axis; a
    rule on every step that admitted a request, a purple band on every step the machine slowed.
    ``named``: datasets ``prefill``, ``admissions``, ``machine``, ``itl_lines``; ``y_max_ms``: a
    fixed time axis from 0 to it (else it follows the data)."""
    rows: list[Record] = []
    x = step_x(step_scale())
    if not named:
        rows = itl_per_step(steps)
        rows = rows[-last:] if last else rows
        lo, hi = (rows[0]["step"], rows[-1]["step"] + 1) if rows else (0, 1)
        x = step_x(step_scale([lo, hi]))
    rule, point = _admission_layers(None if named else admission_markers(rows), named, x)
    subtitle = [
        "▼ (prefill colour): a step that admitted (bars: its prefill tokens, right axis)",
        f"purple band: slowed by the machine (over {SLOW_FACTOR:g}x its expected time, "
        "nothing admitted)",
    ]
    lines = [rule, _machine_layer(rows, named, x), _lines_layer(rows, named, x, y_max_ms), point]
    return spec(
        {
            "title": {"text": title, "subtitle": subtitle},
            "height": height,
            "width": "container",
            "resolve": {"scale": {"y": "independent"}},
            "layer": [_prefill_layer(rows, named, x), {"layer": lines}],
        }
    )
