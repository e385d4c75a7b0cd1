"""The charts together, as the registry lists them: built from records (the tests), or with named
datasets and no rows (what the browser view creates once and feeds itself)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.registry import BY_NAME, CHARTS, ORDER
from engine.core.records import StepRecord


def all_charts(
    steps: Sequence[StepRecord], people: Iterable[int] = (), windows: dict[str, int] | None = None
) -> dict[str, dict]:
    """Every chart with its rows inline (``windows``: steps per chart, else each one's own)."""
    steps, people, windows = list(steps), list(people), windows or {}
    out = {}
    for c in CHARTS:
        kw: dict = {"people": people} if c.name == "slots" else {}
        out[c.name] = c.spec(steps, last=windows.get(c.name, c.window), **kw)
    return out


def named_charts(
    names: Sequence[str] = ORDER, heights: dict[str, int] | None = None, **options: object
) -> dict[str, dict]:
    """The charts ``names`` with named datasets and no rows: what the browser view creates once.
    ``heights``: px per chart (else each chart's usual); ``options``: builder keywords, each
    given to the charts that take it (``slots``, ``with_overview``, ``title`` for the slot chart;
    ``y_max_ms``: the stall chart's fixed time axis, none: it follows the data)."""
    unknown = set(options) - {o for c in CHARTS for o in c.options}
    if unknown:  # a misspelt option would otherwise be dropped without a word
        raise TypeError(f"no chart takes {sorted(unknown)}")
    heights = heights or {}
    return {n: BY_NAME[n].named(heights.get(n, BY_NAME[n].heights[0]), **options) for n in names}
