"""Tokens per step: what each step computed, by phase, stacked. A batch that closes shows its
dead tokens (finished members still computed) grow until the batch ends; the batch that never
closes stays full of decode tokens; each admission's prompt is a prefill bar on its own axis."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.charts.common import (
    PHASE_COLORS,
    color_scale,
    dataset,
    spec,
    step_scale,
    step_x,
    tooltip,
    window,
)
from engine.core.records import Record, StepRecord

TOKEN_PHASES = ("prefill", "decode", "dead")  # bottom to top


def step_tokens(steps: Iterable[StepRecord]) -> list[Record]:
    """One row per step and phase (zeros too: the stacked areas need every step)."""
    return [
        {"step": r["step"], "phase": p, "order": i, "tokens": (r.get("tokens") or {}).get(p) or 0}
        for r in steps
        for i, p in enumerate(TOKEN_PHASES)
    ]


def token_rows(
    steps: Sequence[StepRecord], people: Iterable[int], last: int, with_overview: bool
) -> dict[str, list[Record]]:
    """The dataset the browser view feeds (``rows.js`` ``CHART_ROWS.tokens``, held equal)."""
    return {"step_tokens": step_tokens(window(steps, last))}


def _layers(color: dict) -> list[dict]:
    """The decode and dead area (left axis), then the prefill bars on top (right axis: in
    continuous they share steps with decode)."""
    x = step_x(step_scale())
    tip = tooltip("step:Q", "phase:N", "tokens:Q")
    area = {
        "transform": [{"filter": "datum.phase !== 'prefill'"}],
        "mark": {"type": "area", "interpolate": "step-after"},
        "encoding": {
            "x": x,
            "y": {
                "field": "tokens",
                "type": "quantitative",
                "stack": "zero",
                "title": "decode and dead tokens",
                "axis": {"format": "d", "tickMinStep": 1},
            },
            "color": color,
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": tip,
        },
    }
    bars = {
        "transform": [{"filter": "datum.phase === 'prefill' && datum.tokens > 0"}],
        "mark": {"type": "bar", "opacity": 0.6, "width": 4},
        "encoding": {
            "x": x,
            "y": {"field": "tokens", "type": "quantitative", "title": "prefill tokens"}
            | {"axis": {"orient": "right"}},
            "color": color,
            "tooltip": tip,
        },
    }
    return [area, bars]


def token_chart(
    steps: Sequence[StepRecord],
    last: int = 300,
    height: int = 260,
    title: str = "Tokens per step",
    named: bool = False,
) -> dict:
    """Decode and dead tokens per step, stacked (left axis: at most the slots), and each step's
    prefill tokens as bars on their own axis (right: a prompt is hundreds of tokens, and on one
    axis it flattened the decode area to a line). ``named``: dataset ``step_tokens``."""
    rows = None if named else step_tokens(window(steps, last))
    color = {
        "field": "phase",
        "type": "nominal",
        "scale": color_scale(PHASE_COLORS, TOKEN_PHASES),
        "title": "phase",
        "legend": {"symbolOpacity": 1},  # the bars' opacity is not the phase's colour
    }
    subtitle = "what each step computed · dead: a closed batch's finished members"
    return spec(
        {
            "data": dataset(rows, "step_tokens", named),
            "height": height,
            "width": "container",
            "title": {"text": title, "subtitle": subtitle},
            "layer": _layers(color),
            "resolve": {"scale": {"y": "independent"}},
        }
    )
