"""The browser view: the lab's charts drawn in the browser (``app/component/``), from Python.

One Streamlit component, served from ``app/component/`` with the chart libraries vendored in
``app/component/vendor/`` (vega, vega-lite, vega-embed from npm; no CDN: a classroom may be
offline). The specs come from ``app/charts/`` (``charts.named_charts``: named datasets, no
rows); the rows are derived in the browser by ``app/component/rows.js``, a port of the data
functions of ``app/charts/``.

- :func:`live`: the browser opens its own websocket to the engine (every browser session is its
  own client with its own limits), subscribes, draws incrementally and chats. The Streamlit
  script only renders the component when it reruns for a widget; no rerun per step.
- :func:`recorded`: the records come as arguments (Step by step, Compare); drawn once per change.

The browser reaches the engine at ``ws(s)://<the page's host>:<port of FLUXO_ENGINE_URL>``, or
through the page's own origin (``app/relay.py``, when the page runs as ``app/asgi.py``: first when
the page is not on loopback or on HTTPS, and whenever the direct port does not answer), or at
``FLUXO_ENGINE_PUBLIC_URL`` when set (the engine behind another host name or a proxy).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import streamlit.components.v1 as components

from app import charts

COMPONENT_DIR = Path(__file__).resolve().parent / "component"
_component = components.declare_component("fluxo_view", path=str(COMPONENT_DIR))
_keys = components.declare_component("fluxo_keys", path=str(COMPONENT_DIR / "keys"))
ORDER = charts.ORDER  # "all charts" (app/charts/registry.py)
DEFAULT_ENGINE_URL = "ws://127.0.0.1:8765"


def engine_endpoint() -> dict[str, Any]:
    """Where the browser finds the engine: the port of ``FLUXO_ENGINE_URL`` on the page's own host
    name, or ``FLUXO_ENGINE_PUBLIC_URL`` as given."""
    url = os.environ.get("FLUXO_ENGINE_URL", DEFAULT_ENGINE_URL)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return {
        "engine_port": port,
        "engine_public_url": os.environ.get("FLUXO_ENGINE_PUBLIC_URL") or None,
        # set by app/asgi.py when this page's server relays the engine on its own origin
        "relay_path": os.environ.get("FLUXO_RELAY_PATH") or None,
    }


# Chart words in Portuguese (titles, axes, legends); the English is app/charts/'s own.
CHART_PT = {
    "Slot occupancy": "Ocupação dos slots",
    "Slots up to this step": "Slots até este passo",
    "one bar per (slot, request, phase) span · black outline: people's chats": (
        "uma barra por trecho (slot, requisição, fase) · contorno preto: conversas de pessoas"
    ),
    "step": "passo",
    "slot": "slot",
    "phase": "fase",
    "queue": "fila",
    "KV": "KV",
    "whole buffer (binned): slots per phase": "todo o buffer (agrupado): slots por fase",
    "Admission stalls": "Engasgos de admissão",
    "prefill tokens in the step": "tokens de prefill no passo",
    "ms (ITL, step time)": "ms (ITL, tempo do passo)",
    "KV memory": "Memória KV",
    "Tokens per step": "Tokens por passo",
    "prefill tokens": "tokens de prefill",
    "decode and dead tokens": "tokens de decode e mortos",
    "what each step computed · dead: a closed batch's finished members": (
        "o que cada passo calculou · morto: membros já terminados de um lote fechado"
    ),
    "KV tokens": "tokens de KV",
    "tokens stored · shared · allocated but unused · cached · free": (
        "tokens guardados · compartilhados · alocados sem uso · em cache · livres"
    ),
    "block pool now": "blocos agora",
    "one cell per block, grouped by owner": "uma célula por bloco, por dono",
    "time (ms)": "tempo (ms)",
    "start": "início",
    "last 12 steps · gaps in compute: the device idle": (
        "últimos 12 passos · lacunas no cálculo: o dispositivo ocioso"
    ),
    "purple band: slowed by the machine (over 1.5x its expected time, nothing admitted)": (
        "faixa roxa: passo desacelerado pela máquina (mais de 1,5x o tempo esperado, nada admitido)"
    ),
    "▼ (prefill colour): a step that admitted (bars: its prefill tokens, right axis)": (
        "▼ (cor do prefill): um passo que admitiu (barras: seus tokens de prefill, eixo direito)"
    ),
}
PHASE_PT = {"prefill": "prefill", "decode": "decode", "dead": "morto", "idle": "ocioso"}
KV_PT = {
    "stored": "guardados",
    "shared": "compartilhados",
    "allocated, unused": "alocados sem uso",
    "cached": "em cache",
    "free": "livres",
}
LEGEND_PT = {"phase": PHASE_PT, "state": KV_PT}  # a colour field -> its values' words
PT_LOCALE = {"decimal": ",", "thousands": ".", "grouping": [3], "currency": ["R$", ""]}


def localize(node: Any, lang: str, scale: float = 1.0, words: bool = False) -> Any:
    """A spec with its words (titles, subtitles) in ``lang`` and its fonts ``scale`` times larger
    (projector); field names and data are left alone."""
    if isinstance(node, list):
        return [localize(v, lang, scale, words) for v in node]
    if not isinstance(node, dict):
        return (
            CHART_PT.get(node, node)
            if words and lang == "pt-BR" and isinstance(node, str)
            else node
        )
    out = {}
    for k, v in node.items():
        if k in ("data", "scale", "field", "expr"):
            out[k] = v
        elif k.endswith("FontSize") and isinstance(v, (int, float)):
            out[k] = round(v * scale)
        else:
            out[k] = localize(v, lang, scale, words or k in ("title", "text", "subtitle"))
    legend = LEGEND_PT.get(out.get("field")) if lang == "pt-BR" and "scale" in out else None
    if legend:  # legend labels: the data keep their English values
        expr = " : ".join(f"datum.label == '{en}' ? '{pt}'" for en, pt in legend.items())
        out["legend"] = {**(out.get("legend") or {}), "labelExpr": f"{expr} : datum.label"}
    return out


def _view_args(lang: str, projector: bool, words: dict[str, str] | None) -> dict[str, Any]:
    from app import i18n

    w = words or i18n.words(lang)
    return {
        "lang": lang,
        "projector": projector,
        "words": {k: w[k] for k in i18n.VIEW_KEYS},
        "locale": PT_LOCALE if lang == "pt-BR" else None,
    }


def _specs(
    names: Sequence[str],
    lang: str,
    projector: bool,
    heights: dict[str, int] | None = None,
    windows: dict[str, int] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """The component's chart arguments: each chart's localized named spec, the order, and what
    the view feeds (datasets, their keys, the steps drawn: ``charts.view_meta``)."""
    heights = {**_heights(names, projector), **(heights or {})}
    specs = charts.named_charts(names, heights, **kw)
    return {
        "specs": {n: localize(specs[n], lang, 1.35 if projector else 1.0) for n in names},
        "order": list(names),
        "charts": charts.view_meta(names, windows),
    }


def live(
    slots: int = 8,
    held: bool = False,
    key: str = "fluxo_live",
    buffer: int = 1000,
    lang: str = "en",
    projector: bool = False,
    names: Sequence[str] = ORDER,
    presenter: bool = False,
    engine: dict | None = None,
    stall_max_ms: float | None = None,
) -> None:
    """Chat, headline metrics and the four live charts, fed by the browser's own connection;
    ``presenter``: this session presents, so the view shows the loaded policies' refused
    decisions (``fluxo-policy.js``) and reruns the page when the engine's configuration or traffic
    differs from ``engine`` (what the page's widgets show: ``{"config": ..., "traffic": ...}``);
    ``stall_max_ms``: the stall chart's fixed time axis (none: it follows the data)."""
    _component(
        mode="live",
        **_specs(names, lang, projector, slots=slots, y_max_ms=stall_max_ms),
        chat=True,
        metrics=True,
        min_column=_min_column(names, projector),
        buffer=buffer,
        held=held,
        presenter=presenter,
        engine=engine,
        **engine_endpoint(),
        **_view_args(lang, projector, None),
        key=key,
        default=None,
        height=1500,
    )


def _heights(names: Sequence[str], projector: bool) -> dict[str, int]:
    """One chart alone fills a projected slide; otherwise the charts' usual heights."""
    which = 2 if len(names) == 1 else (1 if projector else 0)
    return {n: charts.BY_NAME[n].heights[which] for n in names}


def _min_column(names: Sequence[str], projector: bool) -> int:
    return 4000 if len(names) == 1 else (900 if projector else 720)


def _digest(steps: list[dict], people: list[int], *extra: Any) -> str:
    """The browser redraws only when the records change: a digest of what it is given."""
    ends = [
        len(steps),
        steps[0]["step"] if steps else None,
        steps[-1]["step"] if steps else None,
        steps[-1]["t_end"] if steps else None,
        people,
        *extra,
    ]
    return hashlib.sha1(json.dumps(ends).encode()).hexdigest()[:16]


def recorded(
    steps: Sequence[dict],
    people: Iterable[int] = (),
    names: Sequence[str] = ORDER,
    key: str = "fluxo_rec",
    windows: dict[str, int] | None = None,
    min_column: int = 720,
    caption: str = "recorded steps",
    height: int = 900,
    overview: bool = True,
    lang: str = "en",
    projector: bool = False,
    **spec_kw: Any,
) -> None:
    """Charts of recorded steps (no connection). ``names``: which charts, in order; ``windows``:
    steps per chart (else each chart's own, ``charts.WINDOWS``); ``heights``, in ``spec_kw``: px
    per chart; charts sit side by side when each gets ``min_column`` pixels."""
    steps, people = list(steps), sorted(people)
    _component(
        mode="static",
        **_specs(names, lang, projector, windows=windows, with_overview=overview, **spec_kw),
        steps=steps,
        people=people,
        data_key=_digest(steps, people),
        min_column=min_column,
        chat=False,
        metrics=False,
        caption=caption,
        overview=overview,
        **_view_args(lang, projector, None),
        key=key,
        default=None,
        height=height,
    )


def replay(
    steps: Sequence[dict],
    people: Iterable[int] = (),
    names: Sequence[str] = ORDER,
    key: str = "fluxo_replay",
    at: int | None = None,
    speed: float = 1.0,
    caption: str = "",
    lang: str = "en",
    projector: bool = False,
    sync: str = "",
    min_column: int | None = None,
    height: int = 1500,
    **spec_kw: Any,
) -> dict | None:
    """A recorded run played in the browser: play / pause, scrub, step, speed (space plays and
    pauses). ``at``: the step to open at; ``sync``: views with the same name play together
    (Compare). Returns what the view last reported: ``{"at": step, "speed": x}`` when paused."""
    steps, people = list(steps), sorted(people)
    return _component(
        mode="replay",
        **_specs(names, lang, projector, **spec_kw),
        steps=steps,
        people=people,
        data_key=_digest(steps, people),
        at=at,
        speed=speed,
        sync=sync,
        chat=False,
        metrics=False,
        min_column=min_column or _min_column(names, projector),
        caption=caption,
        **_view_args(lang, projector, None),
        key=key,
        default=None,
        height=height,
    )


def keys(words: dict[str, str], query: str, cookie: dict | None = None) -> None:
    """The presenter's keys on this page (Page Down / Page Up, space, ? for help); it also writes
    the page's state into the address bar (``query``), so a copied link reopens the same picture,
    and the presenter's session secret into its cookie (``cookie``: ``{"name", "value"}``, a value
    "" clears it; None leaves it; ``app/presenter_session.py``)."""
    _keys(
        words={k: v for k, v in words.items() if k.startswith("k_")},
        query=query,
        cookie=cookie,
        key="fluxo_keys",
        default=None,
        height=0,
    )
