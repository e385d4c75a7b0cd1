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
changesets. ``DATASETS`` lists the names per chart (from ``registry``).

One module per chart (``slots``, ``stalls``, ``kv``, ``lanes``, ``tokens``), what they share in
``common``; every chart declared once in ``registry`` (datasets, window, heights, builder, rows),
the charts together in ``sets``; every name is importable from ``app.charts`` itself.
"""

from app.charts.common import (
    CHAT_COLOR,
    CONFIG,
    FONT,
    KV_COLORS,
    KV_STATES,
    LANE_COLORS,
    MACHINE_COLOR,
    MAX_ROWS,
    OVERVIEW_BINS,
    PHASE_COLORS,
    SCHEMA,
    SLOW_FACTOR,
    STALL_FACTOR,
    STEP_AXIS,
    as_altair,
    color_scale,
    dataset,
    rows_sent,
    spec,
    step_bins,
    tooltip,
    window,
)
from app.charts.kv import (
    block_map,
    kv_chart,
    kv_rows,
    kv_series,
    kv_split,
    record_block_size,
    request_kv_tokens,
)
from app.charts.lanes import device_busy, lane_chart, lane_rows, lane_spans
from app.charts.registry import BY_NAME, CHARTS, DATASETS, ORDER, WINDOWS, Chart, view_meta
from app.charts.sets import all_charts, named_charts
from app.charts.slots import (
    fit_window,
    overview,
    queue_series,
    slot_chart,
    slot_rows,
    slot_spans,
)
from app.charts.stalls import (
    STALL_SERIES,
    admission_markers,
    itl_per_step,
    machine_markers,
    prefill_bars,
    stall_chart,
    stall_lines,
    stall_rows,
)
from app.charts.tokens import step_tokens, token_chart, token_rows
from engine.core.records import LANES, PHASES, Record

__all__ = [
    "BY_NAME",
    "CHARTS",
    "ORDER",
    "WINDOWS",
    "Chart",
    "view_meta",
    "kv_rows",
    "lane_rows",
    "slot_rows",
    "stall_rows",
    "step_tokens",
    "token_chart",
    "token_rows",
    "CHAT_COLOR",
    "CONFIG",
    "DATASETS",
    "FONT",
    "KV_COLORS",
    "KV_STATES",
    "LANES",
    "LANE_COLORS",
    "MACHINE_COLOR",
    "MAX_ROWS",
    "OVERVIEW_BINS",
    "PHASES",
    "PHASE_COLORS",
    "SCHEMA",
    "SLOW_FACTOR",
    "STALL_FACTOR",
    "STALL_SERIES",
    "STEP_AXIS",
    "Record",
    "admission_markers",
    "all_charts",
    "as_altair",
    "block_map",
    "color_scale",
    "dataset",
    "device_busy",
    "fit_window",
    "itl_per_step",
    "kv_chart",
    "kv_series",
    "kv_split",
    "lane_chart",
    "lane_spans",
    "machine_markers",
    "named_charts",
    "overview",
    "prefill_bars",
    "queue_series",
    "record_block_size",
    "request_kv_tokens",
    "rows_sent",
    "slot_chart",
    "slot_spans",
    "spec",
    "stall_chart",
    "stall_lines",
    "step_bins",
    "tooltip",
    "window",
]
