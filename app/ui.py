"""What every page shares: the cached engine client, roles, the sidebar (language, source of the
steps: live engine or recording, projector mode, one full-screen chart), the mode toggles,
headline metrics and the export buttons. Words come from app/i18n.py, shareable state from
app/state.py."""

from __future__ import annotations

import hmac
import json
import os
import re
import time
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from app import charts, i18n, presenter_session, recording, state
from app.browser_view import ORDER
from app.engine_client import EngineClient, local_exports
from app.engine_client_types import EngineError
from app.styles import CHART_ONLY_CSS, CSS, PRELOAD_CSS, PROJECTOR_CSS
from engine.core.config import KV_LAYOUTS, LIVE_FIELDS, POLICIES, RUNNERS

STATUS_ICON = {"connected": ":green[●]", "connecting": ":orange[●]", "disconnected": ":red[●]"}
# The engine's live fields the page toggles: all but those only a lesson's scenario sets.
SCENARIO_ONLY = ("fill_timeout_s", "host_work_ms")
LIVE = tuple(f for f in LIVE_FIELDS if f not in SCENARIO_ONLY)
CHOICES = {"policy": POLICIES, "runner": RUNNERS, "kv_layout": KV_LAYOUTS}  # the built-in policies


@st.cache_resource(show_spinner=False)
def _client(url: str, token: str | None) -> EngineClient:
    return EngineClient(url, token)


def client() -> EngineClient:
    """The process's shared connection (a viewer's, unless the page itself holds FLUXO_TOKEN), or,
    for a browser session that typed a presenter token the page does not hold, a connection of
    its own made with that token (the engine decides whether it is right)."""
    url = os.environ.get("FLUXO_ENGINE_URL", "ws://127.0.0.1:8765")
    page_token = os.environ.get("FLUXO_TOKEN") or None
    typed = presenter_session.token()
    token = typed if typed and not page_token else page_token
    c = _client(url, token)
    # The first run of a session with a connection waits for the engine (and its first
    # telemetry); later runs do not wait again for an engine that is down (the page falls back
    # to a recording).
    waited = st.session_state.setdefault("_waited", set())
    c.wait_connected(3.0 if token not in waited else 0.05)
    waited.add(token)
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
    typed = presenter_session.token() or ""
    return not token or hmac.compare_digest(typed.encode(), token.encode())


# Said where a viewer of a page beyond loopback would otherwise get the presenter's tools (the
# words of app/i18n.py are the page's; these two are this module's own).
SHARED_ONLY = {
    "en": "On a shared page, exports and uploads are the presenter's.",
    "pt-BR": "Numa página compartilhada, exportar e abrir arquivos é de quem apresenta.",
}


def may_share_files(presenter: bool) -> bool:
    """Exports and uploads cost the page process memory and the engine's loop time: on a page
    beyond loopback only the presenter's session may use them."""
    return presenter or not exposed()


_MD = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$])")


def plain(text: object) -> str:
    """Data (a recording's fields, an engine's message) shown in markdown as the text it is: no
    link, image, emphasis or HTML of its own."""
    return _MD.sub(r"\\\1", str(text))


CHARTS = ("all", *charts.BY_NAME)  # the picker: all of the grid, or any one chart alone


@dataclass
class Ctx:
    """What a page knows after :func:`page_setup`."""

    c: EngineClient | None
    presenter: bool
    lang: str
    w: dict[str, str]
    src: str  # "live" or "rec"
    rec: recording.Recording | None = None
    run: recording.Run | None = None
    projector: bool = False
    chart: str = "all"
    fallback: bool = False

    @property
    def charts(self) -> tuple[str, ...]:
        return ORDER if self.chart == "all" else (self.chart,)


def _sidebar_engine(c: EngineClient, w: dict[str, str]) -> None:
    icon = STATUS_ICON.get(c.status, "⚪")
    st.markdown(f"**{w['engine']}** {icon} `{w.get('status_' + c.status, c.status)}`  \n`{c.url}`")
    if c.error and c.status != "connected":
        st.caption(c.error)
    if c.hello:
        st.caption(
            w["model_line"].format(
                model=c.hello.get("model", "?"), version=c.hello.get("version", "?")
            )
        )
        st.caption(
            w["device_line"].format(
                device=c.hello.get("device", "?"), name=c.hello.get("device_name", "?")
            )
        )
        kernels = c.state.get("kernels") or "—"
        if c.state.get("kernels_reason"):  # why fp32 serves, or a note on the build that serves
            kernels += f" ({c.state['kernels_reason']})"
        st.caption(w["weights_line"].format(weights=c.state.get("weights", "?"), kernels=kernels))
    _sidebar_browser(w)


def _sign_in(c: EngineClient, w: dict[str, str], presenter: bool) -> None:
    """The token box, or, once this browser session presents with a token, a sign-out button:
    the role stays across page changes and reloads (``app/presenter_session.py``)."""
    page_token = os.environ.get("FLUXO_TOKEN")
    if exposed() and not page_token:
        st.caption(w["locked"])
        return
    held = presenter_session.token()
    # A token that does not unlock the controls: the page's own check, or the engine's answer
    # (an engine that is away for a moment takes nobody's role away)
    wrong = held and (
        not hmac.compare_digest(held.encode(), page_token.encode())
        if page_token
        else c.status == "connected" and c.role != "presenter"
    )
    if held and not wrong:
        if presenter:
            presenter_session.confirm()
        st.caption(w["signed_in"])
        st.button(w["sign_out"], key="sign_out", on_click=presenter_session.sign_out)
        return
    if wrong:
        presenter_session.reject()
        st.caption(w["token_wrong"])
    if page_token or c.token or c.role != "presenter":
        st.text_input(
            w["token"],
            type="password",
            key="presenter_token",
            help=w["token_help"],
            on_change=presenter_session.typed,
            args=("presenter_token",),
        )


def _sidebar_browser(w: dict[str, str]) -> None:
    """What the browser's own connection sees (the live view reports it), which can differ from
    the page process's: a browser that reaches the engine only through the page's relay, or not
    at all."""
    seen = (st.session_state.get("fluxo_live") or {}).get("browser")
    if not isinstance(seen, dict):
        return
    if seen.get("status") == "connected":
        st.caption(w["browser_relay" if seen.get("via") == "relay" else "browser_connected"])
    else:
        st.caption(w["browser_disconnected"].format(url=str(seen.get("url", "?"))[:80]))


def _source(w: dict[str, str], needs_engine: bool) -> tuple[str, EngineClient | None, bool]:
    """Live engine or recording. Unchosen, it is the engine when it answers, else a recording."""
    fallback = False
    if state.get("src") not in ("live", "rec"):
        c = client()
        state.put("src", "live" if c.status == "connected" else "rec")
        fallback = state.get("src") == "rec"
    src = state.widget(
        "src",
        "src",
        st.radio,
        w["source"],
        options=["live", "rec"],
        horizontal=True,
        format_func=lambda s: w["src_live" if s == "live" else "src_rec"],
    )
    c = client() if src == "live" or needs_engine else None
    return src, c, fallback


def _preload() -> None:
    """One hidden element of each kind the pages draw. Streamlit 1.67 loads an element's code on
    first use; after a switch between pages (no reload), elements of a kind the first page did not
    draw stayed grey placeholders here (buttons, sliders, tables: seen in Chromium, no network).
    Drawn once, hidden, on every page, each kind's code is there before any page needs it."""
    st.markdown(PRELOAD_CSS, unsafe_allow_html=True)
    with st.container(key="fluxo_preload"):
        st.button("·", key="_pre_button", disabled=True)
        st.select_slider("·", options=[0, 1], key="_pre_select_slider", disabled=True)
        st.slider("·", 0, 1, key="_pre_slider", disabled=True)
        st.number_input("·", 0, 1, key="_pre_number", disabled=True)
        st.dataframe(pd.DataFrame({"·": [0]}), hide_index=True)
        st.code("·", language="toml")
        st.download_button("·", "·", key="_pre_download", disabled=True)
        st.vega_lite_chart({"mark": "bar", "data": {"values": []}}, theme=None)
        with st.expander("·"):
            st.caption("·")


def _sidebar(needs_engine: bool) -> Ctx:
    """The sidebar: language, source (and recording), projector, one chart, engine, role."""
    with st.sidebar:
        lang = state.widget(
            "lang", "lang", st.radio, "idioma / language", options=list(i18n.LANGS), horizontal=True
        )
        w = i18n.words(lang)
        src, c, fallback = _source(w, needs_engine)
        uploads = src == "rec" and (not exposed() or is_presenter(client()))
        rec = state.choose_recording(w, uploads) if src == "rec" else None
        projector = state.widget(
            "projector", "projector", st.toggle, w["projector"], help=w["projector_help"]
        )
        chart = state.widget(
            "chart",
            "chart",
            st.selectbox,
            w["chart_only"],
            options=list(CHARTS),
            format_func=lambda n: w["all_charts"] if n == "all" else w[charts.BY_NAME[n].title],
        )
        st.caption(w["keys_hint"])
        if c is not None:
            _sidebar_engine(c, w)
        presenter = c is not None and is_presenter(c)
        if c is not None:
            _sign_in(c, w, presenter)
            st.markdown(
                f"**{w['role']}:** "
                + (f":blue[{w['presenter']}]" if presenter else f":gray[{w['viewer']}]")
            )
        _preload()
    return Ctx(c, presenter, lang, w, src, rec, None, projector, chart, fallback)


def page_setup(
    title: str, caption: str, caption_rec: str | None = None, needs_engine: bool = False
) -> Ctx:
    """CSS, the sidebar (language, source, recording, projector, engine, role), title and caption.
    ``title``/``caption`` are keys of app/i18n.py's words."""
    st.markdown(CSS, unsafe_allow_html=True)
    ctx = _sidebar(needs_engine)
    w = ctx.w
    if ctx.projector:
        st.markdown(PROJECTOR_CSS, unsafe_allow_html=True)
    if ctx.chart != "all":
        st.markdown(CHART_ONLY_CSS, unsafe_allow_html=True)
    state.put("_words", {k: v for k, v in w.items() if k.startswith("k_")})
    if ctx.chart == "all" or not ctx.projector:
        st.title(w[title])
        st.caption(w[caption_rec] if ctx.src == "rec" and caption_rec else w[caption])
    if ctx.fallback:
        st.warning(
            w["fallback"].format(url=os.environ.get("FLUXO_ENGINE_URL", "ws://127.0.0.1:8765")),
            icon=":material/cloud_off:",
        )
    # Always one slot for the error, so what follows keeps its place in the page (the browser view
    # below is not remounted, and its connection is not reopened, when an error shows).
    slot = st.empty()
    if "last_error" in st.session_state:
        slot.error(st.session_state.pop("last_error"), icon=":material/error:")
    return ctx


def words() -> dict[str, str]:
    return i18n.words(state.get("lang"))


def send(c: EngineClient, type_: str, timeout: float = 10.0, **fields) -> dict | None:
    """Send a message; an error from the server is kept and shown at the top of the next run."""
    try:
        return c.request(type_, timeout=timeout, **fields)
    except EngineError as exc:
        st.session_state["last_error"] = words()["error_said"].format(
            code=exc.code, message=exc.message
        )
        return None


def _on_toggle(c: EngineClient, name: str, presenter: bool) -> None:
    if not presenter:  # the page's own gate, whatever a widget message claims
        return
    value = st.session_state[f"ctl_{name}"]
    if send(c, "control", **{name: value}) is None:
        return  # refused: the run that follows shows the engine's value again, and why
    # The answer can be an older state broadcast that overtook this change's own: wait (briefly)
    # until the connection's state holds the change, so the run that follows never draws the
    # widget back at its old value.
    end = time.monotonic() + 2.0
    while c.snapshot(steps=0).state.get("config", {}).get(name) != value:
        if time.monotonic() > end:
            break
        time.sleep(0.02)


def policy_choices(reported, current, w: dict[str, str]):
    """The policies the engine reported (``state.policies``: built-ins first, then those loaded
    with ``--policy-file``), the one configured among them, and how each reads: a loaded one
    marked as such. An engine that reports none offers the built-ins."""
    names = [n for n in reported if isinstance(n, str)] if isinstance(reported, list) else []
    names = names or list(CHOICES["policy"])
    if isinstance(current, str) and current not in names:
        names.append(current)
    builtin = set(CHOICES["policy"])
    return names, lambda n: n if n in builtin else w["policy_loaded"].format(name=n)


def mode_toggles(c: EngineClient, presenter: bool, keys: tuple[str, ...] = LIVE) -> None:
    """Policy / runner / KV layout / slots / chunk budget: each change sends one ``control``."""
    w = words()
    engine_state = c.snapshot(steps=0).state
    config = engine_state.get("config", {})
    # Every widget shows the engine's configuration, whoever changed it (a lesson's set-up,
    # another presenter tab, a reset): seeded on every run, as Streamlit forgets a widget's value
    # when another page runs (the walkthrough: slots 1, reserved, chunk 8 shown after a lesson
    # set 8 slots, paged, chunk 64).
    for name in keys:
        if name in config:
            st.session_state[f"ctl_{name}"] = config[name]
    # At most two controls a row (the policy alone: its names are the longest), so no label
    # breaks mid-word from 1280 px up, even in projector mode (tests/e2e: screenshots at 1280 and
    # 1920 px).
    wide = ("policy", "prefix_cache")  # the longest labels: a row of their own
    rest = [k for k in keys if k in CHOICES and k not in wide]
    rest += [k for k in keys if k not in CHOICES and k not in wide]
    rows = [[k] for k in keys if k == "policy"] + [rest[i : i + 2] for i in range(0, len(rest), 2)]
    rows += [[k] for k in keys if k == "prefix_cache"]
    cols = [col for row in rows for col in st.columns(1 if row[0] in wide else 2)[: len(row)]]
    for col, name in zip(cols, [k for row in rows for k in row], strict=True):
        with col:
            kw = dict(
                key=f"ctl_{name}",
                on_change=_on_toggle,
                args=(c, name, presenter),
                disabled=not presenter,
            )
            if name == "policy":
                options, label = policy_choices(
                    engine_state.get("policies"), config.get("policy"), w
                )
                read = lambda n, f=label: plain(f(n))  # noqa: E731 - radio labels: markdown
                st.radio(w[name], options, horizontal=True, format_func=read, **kw)
            elif name in CHOICES:
                st.radio(w[name], CHOICES[name], horizontal=True, **kw)
            elif name == "max_slots":
                st.number_input(w["slots"], 1, 64, **kw)
            elif name == "chunk_budget":
                st.number_input(w["chunk_budget"], 8, 4096, step=8, **kw)
            elif name == "kv_blocks":
                st.number_input(w["kv_blocks"], 4, 1 << 16, step=16, **kw)
            elif name == "prefix_cache":
                st.toggle(w["prefix_cache"], help=w["prefix_help"], **kw)


HEADLINE = (
    ("m_throughput", "throughput"),
    ("m_ttft", "ttft_p50"),
    ("m_itl50", "itl_p50"),
    ("m_itl99", "itl_p99"),
    ("m_slot_util", "slot_utilization"),
    ("m_dead", "dead_slot_fraction"),
    ("m_kv_waste", "kv_waste"),
    ("m_busy", "busy_fraction"),
)


def headline(summary: dict, caption: str, lang: str) -> None:
    """The eight headline numbers of a summary (engine.core.metrics.summarize), in the language."""
    w = i18n.words(lang)
    cols = st.columns(4) + st.columns(4)
    for col, (label, key) in zip(cols, HEADLINE, strict=True):
        col.metric(w[label], i18n.metric(key, summary.get(key), lang))
    st.caption(caption)


def exports(c: EngineClient, key: str, presenter: bool) -> None:
    """Telemetry as JSON lines (which the page replays: Source → recording → open a file) and as a
    Chrome trace (open it in ui.perfetto.dev). Charts: each chart's ⋯ menu saves PNG or SVG. On a
    page beyond loopback, the presenter's alone (``may_share_files``)."""
    w = words()
    allowed = may_share_files(presenter)
    # one row, each button at its label's width ("Preparar exportação da telemetria" was cut in a
    # quarter of the page at 1366 px)
    with st.container(horizontal=True, key=f"{key}_exports"):
        if st.button(w["export_prep"], key=f"{key}_prep", disabled=not allowed) and allowed:
            st.session_state[f"{key}_export"] = _export_data(c)
        data = st.session_state.get(f"{key}_export") if allowed else None
        if data:
            st.download_button(
                w["export_jsonl"],
                data["jsonl"],
                "fluxo-telemetry.jsonl",
                "application/jsonl",
                key=f"{key}_jl",
                icon=":material/download:",
            )
            st.download_button(
                w["export_chrome"],
                data["chrome"],
                "fluxo-trace.json",
                "application/json",
                key=f"{key}_ct",
                icon=":material/download:",
            )
    if not allowed:
        st.caption(SHARED_ONLY.get(state.get("lang"), SHARED_ONLY["en"]))
    st.caption(w["export_note"])


def _export_data(c: EngineClient) -> dict[str, str]:
    """The engine's exports, or the page's own buffer's when the engine's are not available."""
    data = {}
    for fmt in ("jsonl", "chrome"):
        answer = send(c, "export", timeout=30, format=fmt)
        if answer is not None:
            got = answer["data"]
            data[fmt] = got if isinstance(got, str) else json.dumps(got)
    if len(data) < 2:
        snap = c.snapshot()
        jsonl, trace = local_exports(snap.steps, snap.requests)
        data = {"jsonl": jsonl, "chrome": json.dumps(trace)}
    return data
