"""What every chart shares: the row budget, the colours of phases, KV states and lanes, the
classroom styling, and small helpers (inline or named data, tooltips, windows, step buckets).

Every builder returns a Vega-Lite spec as a plain dict (what Altair's ``to_dict`` would give;
:func:`as_altair` turns one back into an Altair chart, validating it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import altair as alt

from engine.core.records import Record, StepRecord

MAX_ROWS = 3000  # per chart, all datasets together
OVERVIEW_BINS = 300

# One colour per phase, the same in every chart (and in the legend of each).
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

FONT = 16  # readable from the back of a classroom


# Steps are whole numbers: integer ticks, never "1,0 2,0" (pt-BR) or "1.5".
# Step numbers grow to five digits in a lesson: at most ~6 ticks, and a label that would touch
# its neighbour is dropped (lesson 3's queue chart read "2086020880…" before).
STEP_AXIS = {"format": "d", "tickMinStep": 1, "tickCount": 6, "labelOverlap": "greedy"}
STEP_AXIS |= {"labelSeparation": 8}


def color_scale(colors: dict[str, str], domain: Sequence[str]) -> dict:
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


def dataset(rows: list[Record] | None, name: str = "", named: bool = False) -> dict:
    """Inline values (under the dataset's name too), or (``named``) a named dataset, no values,
    that the browser view fills."""
    return {"name": name} if named else {"name": name, "values": rows}


def tooltip(*fields: str) -> list[dict]:
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


def step_scale(domain: list[int] | None = None) -> dict:
    """A scale on step numbers, neither rounded out nor stretched to zero; ``domain`` pins it."""
    if domain is None:
        return {"nice": False, "zero": False}
    return {"domain": domain, "nice": False, "zero": False}


def step_x(scale: dict, field: str = "step") -> dict:
    """A quantitative x on step numbers, with integer ticks."""
    return {
        "field": field,
        "type": "quantitative",
        "title": "step",
        "axis": STEP_AXIS,
        "scale": scale,
    }


def window(steps: Sequence[StepRecord], last: int) -> list[Record]:
    steps = list(steps)
    return steps[-last:] if last and len(steps) > last else steps


def step_bins(steps: Sequence[StepRecord], bins: int) -> list[Sequence[Record]]:
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
