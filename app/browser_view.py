"""The browser view: the lab's charts drawn in the browser (``app/component/``), from Python.

One Streamlit component, served from ``app/component/`` with the chart libraries vendored in
``app/component/vendor/`` (vega, vega-lite, vega-embed from npm; no CDN: a classroom may be
offline). The specs come from ``app/charts.py`` (``charts.named_charts``: named datasets, no
rows); the rows are derived in the browser by ``app/component/rows.js``, a port of the data
functions of ``app/charts.py``.

- :func:`live`: the browser opens its own websocket to the engine (every browser session is its
  own client with its own limits), subscribes, draws incrementally and chats. The Streamlit
  script only renders the component when it reruns for a widget; no rerun per step.
- :func:`recorded`: the records come as arguments (Step by step, Compare); drawn once per change.

The browser reaches the engine at ``ws(s)://<the page's host>:<port of FLUXO_ENGINE_URL>``, or at
``FLUXO_ENGINE_PUBLIC_URL`` when set (the engine behind another host name or a proxy).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

import streamlit.components.v1 as components

from app import charts

COMPONENT_DIR = Path(__file__).resolve().parent / "component"
_component = components.declare_component("fluxo_view", path=str(COMPONENT_DIR))
ORDER = ("slots", "stalls", "kv", "lanes")
DEFAULT_ENGINE_URL = "ws://127.0.0.1:8765"


def engine_endpoint() -> dict[str, Any]:
    """Where the browser finds the engine: the port of ``FLUXO_ENGINE_URL`` on the page's own host
    name, or ``FLUXO_ENGINE_PUBLIC_URL`` as given."""
    url = os.environ.get("FLUXO_ENGINE_URL", DEFAULT_ENGINE_URL)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return {"engine_port": port, "engine_public_url": os.environ.get("FLUXO_ENGINE_PUBLIC_URL") or None}


def live(slots: int = 8, held: bool = False, key: str = "fluxo_live", buffer: int = 1000) -> None:
    """Chat, headline metrics and the four live charts, fed by the browser's own connection."""
    specs = charts.named_charts(slots=slots)
    _component(mode="live", specs=specs, order=list(ORDER), chat=True, metrics=True, min_column=720, buffer=buffer,
               held=held, **engine_endpoint(), key=key, default=None, height=1500)


def recorded(steps: Sequence[dict], people: Iterable[int] = (), names: Sequence[str] = ORDER, key: str = "fluxo_rec",
             windows: dict[str, int] | None = None, min_column: int = 720, caption: str = "recorded steps",
             height: int = 900, overview: bool = True, **spec_kw: Any) -> None:
    """Charts of recorded steps (no connection). ``names``: which charts, in order; ``windows``:
    steps per chart (slots 300, stalls 300, kv 2000, lanes 12 by default); charts sit side by side
    when each gets ``min_column`` pixels."""
    steps = list(steps)
    specs = charts.named_charts(with_overview=overview, **spec_kw)
    specs = {n: specs[n] for n in names}
    people = sorted(people)
    # The browser redraws only when the records change: a digest of what it is given.
    digest = hashlib.sha1(json.dumps([len(steps), steps[0]["step"] if steps else None,
                                      steps[-1]["step"] if steps else None, steps[-1]["t_end"] if steps else None,
                                      people]).encode()).hexdigest()[:16]
    _component(mode="static", specs=specs, order=list(names), steps=steps, people=people, data_key=digest,
               windows=windows or {}, min_column=min_column, chat=False, metrics=False, caption=caption, overview=overview,
               key=key, default=None, height=height)
