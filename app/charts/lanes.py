"""CPU / device lanes: the measured spans of the last steps per lane (host prepare, copies,
compute, host update); gaps in the compute lane are the device idle."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.common import LANE_COLORS, color_scale, dataset, spec, tooltip, window
from engine.core.records import LANES, Record, StepRecord


def lane_spans(steps: Sequence[StepRecord], last: int = 12) -> list[Record]:
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


def lane_rows(
    steps: Sequence[StepRecord], people: Iterable[int], last: int, with_overview: bool
) -> dict[str, list[Record]]:
    """The dataset the browser view feeds (``rows.js`` ``CHART_ROWS.lanes``, held equal)."""
    return {"lanes": lane_spans(steps, last)}


def lane_chart(
    steps: Sequence[StepRecord],
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
        "data": dataset(spans, "lanes", named),
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
                "scale": color_scale(LANE_COLORS, LANES),
                "legend": None,
            },
            "tooltip": tooltip("lane:N", "step:Q", "ms:Q"),
        },
    }
    if named:
        body["params"] = [{"name": "lane_title", "value": title}]
    return spec(body)
