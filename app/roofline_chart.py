"""The roofline figure: a pure function from ``python -m engine.bench roofline``'s result to a
Vega-Lite spec (a plain dict), for the lessons ("the weights are read once per step, whatever
the batch").

Two panels share the row axis (log2): decode step time per weight format against the roofline's
lower bound for that format (bytes / measured bandwidth, or its arithmetic at its measured roof:
the fp32 GEMM's for fp32, the int8 one for q4/q8's products; whichever is larger), and the
achieved fraction of the measured read bandwidth. Lesson 1 shows it from its stored run
(``lesson_figure``). Every mark is a
measured point or the model evaluated at a measured roof; nothing is interpolated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app import i18n

SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
COLORS = {"fp32": "#7f7f7f", "q8": "#1f77b4", "q4": "#d62728"}
# Vega's number format for pt-BR axes and tooltips: 1.000 and 0,5.
PT_BR = {"number": {"decimal": ",", "thousands": ".", "grouping": [3], "currency": ["R$", ""]}}


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


def _encodings(result: dict[str, Any], w: dict[str, str]) -> tuple[dict, dict, list[dict]]:
    """The colour (one per weight format, the known ones first), the x (rows, log2) and the
    tooltip the two panels share."""
    fmts = [f for f in COLORS if f in result["formats"]] + [
        f for f in result["formats"] if f not in COLORS
    ]
    color = {
        "field": "weights",
        "type": "nominal",
        "title": w["roof_weights"],
        "scale": {"domain": fmts, "range": [COLORS.get(f, "#2ca02c") for f in fmts]},
    }
    x = {
        "field": "rows",
        "type": "quantitative",
        "title": w["roof_rows"],
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


def _time_panel(color: dict, x: dict, tip: list[dict], width: int, height: int, title: str) -> dict:
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
        "title": title,
        "layer": [bound, _measured(whiskers), _measured(line)],
    }


def _fraction_panel(
    color: dict, x: dict, tip: list[dict], w: dict[str, str], bw: str, width: int, height: int
) -> dict:
    """The achieved fraction of the measured read bandwidth vs rows (0 to 1)."""
    fraction = {
        "field": "fraction",
        "type": "quantitative",
        "title": w["roof_fraction"],
        "scale": {"domain": [0, 1]},
    }
    return _measured(
        {
            "width": width,
            "height": height,
            "title": w["roof_share"].format(bw=bw),
            "mark": {"type": "line", "point": True},
            "encoding": {"x": x, "y": fraction, "color": color, "tooltip": tip},
        }
    )


def roofline_spec(
    result: dict[str, Any], width: int = 360, height: int = 220, lang: str = "en"
) -> dict[str, Any]:
    """Vega-Lite: step time vs rows (measured, with min-max whiskers, and the bound, dashed) and
    fraction of the measured bandwidth vs rows, colored by weight format; titles in ``lang``."""
    w = i18n.words(lang)
    color, x, tip = _encodings(result, w)
    bw = i18n.num(result["machine"]["bandwidth"]["read_gbs"], 1, lang)
    return {
        "$schema": SCHEMA,
        "data": {"values": roofline_rows(result)},
        "hconcat": [
            _time_panel(color, x, tip, width, height, w["roof_time"]),
            _fraction_panel(color, x, tip, w, bw, width, height),
        ],
        "resolve": {"scale": {"color": "shared"}},
        # Pinned light colours: the same figure in a dark-themed browser and on a projector.
        "background": "#ffffff",
        "config": {
            "axis": {"labelColor": "#111111", "titleColor": "#111111"},
            "legend": {"labelColor": "#111111", "titleColor": "#111111", "orient": "bottom"},
            "title": {"color": "#111111"},
            **({"locale": PT_BR} if lang == "pt-BR" else {}),
        },
    }


def lesson_figure(path: Path, lang: str) -> tuple[dict[str, Any], str]:
    """A stored ``python -m engine.bench roofline --json`` run -> (the figure, its caption naming
    the run: date, machine, the roofs measured in it, q4's step at 1 and 8 rows)."""
    doc = json.loads(Path(path).read_text())
    result, m = doc["scenarios"]["roofline"], doc["machine"]
    q4 = {p["rows"]: p["step_ms"] for p in result["formats"]["q4"]["points"]}
    roofs = result["machine"]
    caption = i18n.words(lang)["roof_caption"].format(
        date=m["date"],
        cpu=m["cpu"],
        threads=m["threads"],
        bw=i18n.num(roofs["bandwidth"]["read_gbs"], 1, lang),
        gf=i18n.num(roofs["matmul"]["gflops"], 0, lang),
        i8=i18n.num((roofs.get("int8") or {}).get("gops"), 0, lang),
        q1=i18n.num(q4[1], 1, lang),
        q8=i18n.num(q4[8], 1, lang),
    )
    return roofline_spec(result, width=210, height=210, lang=lang), caption
