"""The four charts together: built from records (Step by step, Compare, the tests), or with named
datasets and no rows (what the browser view creates once and feeds itself)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.kv import kv_chart
from app.charts.lanes import lane_chart
from app.charts.slots import slot_chart
from app.charts.stalls import stall_chart
from engine.core.records import Record


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
    stall_max_ms: float | None = None,
) -> dict[str, dict]:
    """The four charts with named datasets and no rows: what the browser view creates once
    (``stall_max_ms``: the stall chart's fixed time axis, none: it follows the data)."""
    return {
        "slots": slot_chart(
            [],
            named=True,
            slots=slots,
            height=slot_height,
            with_overview=with_overview,
            title=slot_title,
        ),
        "stalls": stall_chart([], named=True, height=stall_height, y_max_ms=stall_max_ms),
        "kv": kv_chart([], named=True, height=kv_height),
        "lanes": lane_chart([], named=True, height=lane_height),
    }
