"""What every page shares: the cached engine client, roles, the sidebar, the mode toggles,
headline metrics and the export buttons."""
from __future__ import annotations

import json
import math
import os

import streamlit as st

from app.client import EngineClient, EngineError, Snapshot, local_exports
from engine.core.metrics import summarize

CSS = """
<style>
html, body, [class*="st-"] { font-size: 18px; }
/* Readable from the back of the room: headings keep their size over the 18px body rule above. */
h1, h1 * { font-size: 2.4rem !important; font-weight: 700 !important; }
h2, h2 * { font-size: 1.75rem !important; font-weight: 650 !important; }
h3, h3 * { font-size: 1.4rem !important; font-weight: 600 !important; }
[data-testid="stMetricValue"], [data-testid="stMetricValue"] * { font-size: 2.1rem !important; font-weight: 600; }
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * { font-size: 1.1rem !important; }
.fluxo-legend span { display: inline-block; padding: 2px 10px; margin-right: 6px; border-radius: 4px; color: white; font-weight: 600; }
</style>
"""
STATUS_ICON = {"connected": ":green[●]", "connecting": ":orange[●]", "disconnected": ":red[●]"}
LIVE = ("policy", "runner", "kv_layout", "max_slots", "chunk_budget", "kv_blocks", "prefix_cache")
CHOICES = {"policy": ("static", "continuous", "chunked"), "runner": ("sync", "async"), "kv_layout": ("reserved", "paged")}


@st.cache_resource(show_spinner=False)
def _client(url: str, token: str | None) -> EngineClient:
    return EngineClient(url, token)


def client() -> EngineClient:
    """The process's shared connection (a viewer's, unless the page itself holds FLUXO_TOKEN), or,
    for a browser session that typed a presenter token the page does not hold, a connection of
    its own made with that token (the engine decides whether it is right)."""
    url = os.environ.get("FLUXO_ENGINE_URL", "ws://127.0.0.1:8765")
    page_token = os.environ.get("FLUXO_TOKEN") or None
    typed = st.session_state.get("presenter_token") or None
    c = _client(url, typed if typed and not page_token else page_token)
    c.wait_connected(3.0)
    return c


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def exposed() -> bool:
    """The page listens beyond loopback (``server.address`` empty means every interface)."""
    return (st.get_option("server.address") or "") not in LOOPBACK


def is_presenter(c: EngineClient) -> bool:
    """The engine must grant the connection presenter rights, and when the page holds the token
    (FLUXO_TOKEN), this browser session must have typed it: students see the page, not the knobs.
    Fail safe: a page that listens beyond loopback without FLUXO_TOKEN has no presenter at all."""
    token = os.environ.get("FLUXO_TOKEN")
    if not token and exposed():
        return False
    if c.role != "presenter":
        return False
    return not token or st.session_state.get("presenter_token") == token


def page_setup(title: str, caption: str) -> tuple[EngineClient, bool]:
    st.markdown(CSS, unsafe_allow_html=True)
    c = client()
    presenter = is_presenter(c)
    with st.sidebar:
        icon = STATUS_ICON.get(c.status, "⚪")
        st.markdown(f"**Engine** {icon} `{c.status}`  \n`{c.url}`")
        if c.error and c.status != "connected":
            st.caption(c.error)
        if c.hello:
            st.caption(f"model {c.hello.get('model', '?')} · server {c.hello.get('version', '?')}")
            st.caption(f"device {c.hello.get('device', '?')} · {c.hello.get('device_name', '?')}")
        locked = exposed() and not os.environ.get("FLUXO_TOKEN")
        if locked:
            st.caption("This page listens beyond loopback and holds no FLUXO_TOKEN: the controls are off for "
                       "everyone. Start it with a presenter token (make lab does) to present.")
        elif os.environ.get("FLUXO_TOKEN") or c.token or c.role != "presenter":
            st.text_input("Presenter token", type="password", key="presenter_token",
                          help="Students watch and chat; the presenter's token unlocks the controls.")
        st.markdown("**Role:** " + (":blue[presenter] (controls on)" if presenter else ":gray[viewer] (chat and watch)"))
    st.title(title)
    st.caption(caption)
    # Always one slot for the error, so what follows keeps its place in the page (the browser view
    # below is not remounted, and its connection is not reopened, when an error shows).
    slot = st.empty()
    if "last_error" in st.session_state:
        slot.error(st.session_state.pop("last_error"), icon=":material/error:")
    return c, presenter


def send(c: EngineClient, type_: str, timeout: float = 10.0, **fields) -> dict | None:
    """Send a message; an error from the server is kept and shown at the top of the next run."""
    try:
        return c.request(type_, timeout=timeout, **fields)
    except EngineError as exc:
        st.session_state["last_error"] = f"The engine said **{exc.code}**: {exc.message}"
        return None


def _on_toggle(c: EngineClient, name: str) -> None:
    value = st.session_state[f"ctl_{name}"]
    answer = send(c, "control", **{name: value})
    if answer is not None:
        st.session_state.setdefault("_synced", {})[name] = answer.get("config", {}).get(name, value)


def mode_toggles(c: EngineClient, presenter: bool, keys: tuple[str, ...] = LIVE) -> None:
    """Policy / runner / KV layout / slots / chunk budget: each change sends one ``control``."""
    config = c.snapshot(steps=0).state.get("config", {})
    synced = st.session_state.setdefault("_synced", {})
    for name in keys:  # follow the server when someone else changed it
        if name in config and synced.get(name) != config[name]:
            synced[name] = config[name]
            st.session_state[f"ctl_{name}"] = config[name]
    choices = [k for k in keys if k in CHOICES]
    numbers = [k for k in keys if k not in CHOICES]
    cols = (st.columns(len(choices)) if choices else []) + (st.columns(len(numbers)) if numbers else [])
    for col, name in zip(cols, choices + numbers):
        with col:
            kw = dict(key=f"ctl_{name}", on_change=_on_toggle, args=(c, name), disabled=not presenter)
            if name in CHOICES:
                st.radio(name.replace("_", " "), CHOICES[name], horizontal=True, **kw)
            elif name == "max_slots":
                st.number_input("slots", 1, 64, **kw)
            elif name == "chunk_budget":
                st.number_input("chunk budget (tokens)", 8, 4096, step=8, **kw)
            elif name == "kv_blocks":
                st.number_input("KV blocks", 4, 1 << 16, step=16, **kw)
            elif name == "prefix_cache":
                st.toggle("prefix cache", help="reuse the KV blocks of prompt prefixes already computed", **kw)


def _fmt(v: float, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v * scale:.{digits}f}{unit}"


def headline(snap: Snapshot) -> None:
    """The server's ``metrics`` (engine.metrics.summarize over its window), or the same function
    over the page's buffer when none has arrived yet."""
    summary = snap.metrics.get("summary")
    window = snap.metrics.get("window_s")
    if not summary:
        summary = summarize(snap.steps[-300:], snap.requests[-300:]) if snap.steps else {}
        window = None
    row1 = st.columns(4)
    row2 = st.columns(4)
    items = [("useful tokens/s", _fmt(summary.get("throughput"))),
             ("TTFT p50", _fmt(summary.get("ttft_p50"), " ms", 1000, 0)),
             ("ITL p50", _fmt(summary.get("itl_p50"), " ms", 1000, 0)),
             ("ITL p99", _fmt(summary.get("itl_p99"), " ms", 1000, 0)),
             ("slot utilization", _fmt(summary.get("slot_utilization"), "%", 100, 0)),
             ("dead-slot fraction", _fmt(summary.get("dead_slot_fraction"), "%", 100, 0)),
             ("KV waste", _fmt(summary.get("kv_waste"), "%", 100, 0)),
             ("device busy", _fmt(summary.get("busy_fraction"), "%", 100, 0))]
    for col, (label, value) in zip(row1 + row2, items):
        col.metric(label, value)
    st.caption(f"over the last {window:.0f} s (server)" if window else "over the page's recent steps")


def exports(c: EngineClient, key: str) -> None:
    """Telemetry as JSON lines and as a Chrome trace (open it in ui.perfetto.dev). Charts: each
    chart's ⋯ menu saves it as PNG or SVG."""
    cols = st.columns([1, 1, 2])
    if cols[0].button("Prepare telemetry export", key=f"{key}_prep"):
        data = {}
        for fmt in ("jsonl", "chrome"):
            answer = send(c, "export", timeout=30, format=fmt)
            if answer is not None:
                data[fmt] = answer["data"] if isinstance(answer["data"], str) else json.dumps(answer["data"])
        if len(data) < 2:
            snap = c.snapshot()
            jsonl, trace = local_exports(snap.steps, snap.requests)
            data = {"jsonl": jsonl, "chrome": json.dumps(trace)}
        st.session_state[f"{key}_export"] = data
    data = st.session_state.get(f"{key}_export")
    if data:
        cols[1].download_button("JSON lines", data["jsonl"], "fluxo-telemetry.jsonl", "application/jsonl", key=f"{key}_jl", icon=":material/download:")
        cols[1].download_button("Chrome trace", data["chrome"], "fluxo-trace.json", "application/json", key=f"{key}_ct", icon=":material/download:")
    cols[2].caption("Each chart's ... menu saves it as PNG or SVG.")


def legend() -> None:
    from app.charts import PHASE_COLORS

    st.markdown('<div class="fluxo-legend">' + "".join(
        f'<span style="background:{c};{"color:#333" if p == "idle" else ""}">{p}</span>' for p, c in PHASE_COLORS.items())
        + '<span style="background:white;color:#212529;border:3px solid #212529">people\'s chats</span></div>',
        unsafe_allow_html=True)
