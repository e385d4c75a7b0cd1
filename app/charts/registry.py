"""Every chart of the page, declared once: what the page lists, sizes, draws and feeds.

A :class:`Chart` names its datasets (and the fields that identify a row in each: the browser view
updates a row in place when a row with the same key comes again), the steps it shows by default,
its title's words key, its heights, the builder of its spec and the Python twin of its rows.
Everything else reads this table: the chart picker (``app/ui.py``), the views' order and heights
(``app/browser_view.py``), the dataset names and windows the browser view gets as arguments, and
the tests (``tests/app/test_chart_registry.py``; ``tests/app/test_rows_js.py`` holds the browser's
rows, ``app/component/rows.js`` ``CHART_ROWS``, equal to the twins here).

Adding a chart: ``app/README.md``, "Add a chart".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from app.charts.kv import kv_chart, kv_rows
from app.charts.lanes import lane_chart, lane_rows
from app.charts.slots import slot_chart, slot_rows
from app.charts.stalls import stall_chart, stall_rows
from app.charts.tokens import token_chart, token_rows
from engine.core.records import Record, StepRecord

Rows = Callable[[Sequence[StepRecord], Iterable[int], int, bool], dict[str, list[Record]]]


@dataclass(frozen=True)
class Chart:
    name: str  # the chart's id: in URLs (?chart=), the view's div, rows.js CHART_ROWS
    datasets: tuple[tuple[str, tuple[str, ...]], ...]  # (dataset, the fields keying its rows)
    window: int  # steps drawn by default (a page may ask for another number)
    heights: tuple[int, int, int]  # px: among the others, among them on a projector, alone
    spec: Callable[..., dict]  # builder: (steps, named=..., height=..., **options) -> Vega-Lite
    rows: Rows  # (steps, people, window, with_overview) -> {dataset: rows}: rows.js's twin
    options: tuple[str, ...] = ()  # the builder's own keywords a page may pass
    grid: bool = True  # drawn when the page shows "all charts" (else only picked alone)

    @property
    def title(self) -> str:
        """Its words key (``app/i18n_sidebar.py``, en and pt-BR): the picker's label."""
        return f"chart_{self.name}"

    def named(self, height: int, **options: object) -> dict:
        """The spec with named datasets and no rows, what the browser view creates once."""
        own = {k: v for k, v in options.items() if k in self.options}
        return self.spec([], named=True, height=height, **own)


CHARTS: tuple[Chart, ...] = (
    Chart(
        "slots",
        (("spans", ("slot", "start")), ("queue", ("step",)), ("overview", ("step", "phase"))),
        300,
        (320, 380, 560),
        slot_chart,
        slot_rows,
        ("slots", "with_overview", "title"),
    ),
    Chart(
        "stalls",
        (
            ("prefill", ("step",)),
            ("admissions", ("step",)),
            ("machine", ("step",)),
            ("itl_lines", ("step", "series")),
        ),
        300,
        (300, 340, 560),
        stall_chart,
        stall_rows,
        ("y_max_ms",),
    ),
    Chart(
        "kv",
        (("kv_series", ("step", "state")), ("blocks", ("cell",))),
        2000,
        (260, 300, 520),
        kv_chart,
        kv_rows,
    ),
    Chart("lanes", (("lanes", ("step", "lane")),), 12, (230, 260, 480), lane_chart, lane_rows),
    Chart(
        "tokens",
        (("step_tokens", ("step", "phase")),),
        300,
        (260, 300, 520),
        token_chart,
        token_rows,
        grid=False,
    ),
)
BY_NAME = {c.name: c for c in CHARTS}
ORDER = tuple(c.name for c in CHARTS if c.grid)  # "all charts", in the order drawn
DATASETS = {c.name: tuple(d for d, _ in c.datasets) for c in CHARTS}
WINDOWS = {c.name: c.window for c in CHARTS}


def view_meta(names: Sequence[str], windows: dict[str, int] | None = None) -> dict[str, dict]:
    """What the browser view needs per chart besides its spec: each dataset's key fields and the
    steps to draw (``windows`` overrides the defaults)."""
    windows = windows or {}
    return {
        n: {
            "datasets": {d: list(key) for d, key in BY_NAME[n].datasets},
            "window": windows.get(n, BY_NAME[n].window),
        }
        for n in names
    }
