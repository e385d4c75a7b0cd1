"""The roofline figure: a pure function from ``python -m engine.bench roofline``'s result to a
Vega-Lite spec (a plain dict), for the lessons ("the weights are read once per step, whatever
the batch").

Two panels share the row axis (log2): decode step time per weight format against the roofline's
lower bound for that format (bytes / measured bandwidth, or flops / measured GEMM throughput,
whichever is larger), and the achieved fraction of the measured read bandwidth. Every mark is a
measured point or the model evaluated at a measured roof; nothing is interpolated.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
COLORS = {"fp32": "#7f7f7f", "q8": "#1f77b4", "q4": "#d62728"}


def roofline_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (format, rows, series): measured step ms (median, min, max) and the bound."""
    out = []
    for fmt, d in result["formats"].items():
        for p in d["points"]:
            base = {
                "weights": fmt,
                "rows": p["rows"],
                "mb_per_step": round(p["bytes_per_step"] / 1e6, 1),
                "fraction": p["fraction_of_bandwidth"],
                "gbs": p["achieved_gbs"],
            }
            out.append(
                {
                    **base,
                    "series": "measured",
                    "ms": p["step_ms"],
                    "lo": p["step_ms_min"],
                    "hi": p["step_ms_max"],
                }
            )
            out.append(
                {**base, "series": "roofline bound", "ms": p["roofline_ms"], "lo": None, "hi": None}
            )
    return out


def _encodings(result: dict[str, Any]) -> tuple[dict, dict, list[dict]]:
    """The colour (one per weight format, the known ones first), the x (rows, log2) and the
    tooltip the two panels share."""
    fmts = [f for f in COLORS if f in result["formats"]] + [
        f for f in result["formats"] if f not in COLORS
    ]
    color = {
        "field": "weights",
        "type": "nominal",
        "title": "weights",
        "scale": {"domain": fmts, "range": [COLORS.get(f, "#2ca02c") for f in fmts]},
    }
    x = {
        "field": "rows",
        "type": "quantitative",
        "title": "rows in the decode step",
        "scale": {"type": "log", "base": 2},
    }
    tip = [
        {"field": k, "type": t}
        for k, t in (
            ("weights", "nominal"),
            ("rows", "quantitative"),
            ("ms", "quantitative"),
            ("mb_per_step", "quantitative"),
            ("gbs", "quantitative"),
            ("fraction", "quantitative"),
        )
    ]
    return color, x, tip


def _measured(layer: dict) -> dict:
    return {"transform": [{"filter": "datum.series == 'measured'"}], **layer}


def _time_panel(color: dict, x: dict, tip: list[dict], width: int, height: int) -> dict:
    """Step time vs rows: the bound (dashed), the measured min-max whiskers and median line."""
    ms = {"field": "ms", "type": "quantitative", "title": "ms", "scale": {"type": "log"}}
    bound = {
        "transform": [{"filter": "datum.series == 'roofline bound'"}],
        "mark": {"type": "line", "strokeDash": [4, 3]},
        "encoding": {"x": x, "y": ms, "color": color},
    }
    whiskers = {
        "mark": {"type": "rule"},
        "encoding": {
            "x": x,
            "y": {"field": "lo", "type": "quantitative"},
            "y2": {"field": "hi"},
            "color": color,
        },
    }
    line = {
        "mark": {"type": "line", "point": True},
        "encoding": {
            "x": x,
            "y": {"field": "ms", "type": "quantitative"},
            "color": color,
            "tooltip": tip,
        },
    }
    return {
        "width": width,
        "height": height,
        "title": "decode step time (ms)",
        "layer": [bound, _measured(whiskers), _measured(line)],
    }


def _fraction_panel(
    color: dict, x: dict, tip: list[dict], bw: float, width: int, height: int
) -> dict:
    """The achieved fraction of the measured read bandwidth vs rows, with a rule at 0.7."""
    fraction = {
        "field": "fraction",
        "type": "quantitative",
        "title": "fraction",
        "scale": {"domain": [0, 1]},
    }
    return _measured(
        {
            "width": width,
            "height": height,
            "title": f"share of the measured read bandwidth ({bw:.1f} GB/s)",
            "layer": [
                {
                    "mark": {"type": "line", "point": True},
                    "encoding": {"x": x, "y": fraction, "color": color, "tooltip": tip},
                },
                {
                    "mark": {"type": "rule", "strokeDash": [2, 2], "color": "#555"},
                    "encoding": {"y": {"datum": 0.7}},
                },
            ],
        }
    )


def roofline_spec(result: dict[str, Any], width: int = 360, height: int = 220) -> dict[str, Any]:
    """Vega-Lite: step time vs rows (measured, with min-max whiskers, and the bound, dashed) and
    fraction of the measured bandwidth vs rows, colored by weight format."""
    color, x, tip = _encodings(result)
    bw = result["machine"]["bandwidth"]["read_gbs"]
    return {
        "$schema": SCHEMA,
        "data": {"values": roofline_rows(result)},
        "hconcat": [
            _time_panel(color, x, tip, width, height),
            _fraction_panel(color, x, tip, bw, width, height),
        ],
        "resolve": {"scale": {"color": "shared"}},
    }
