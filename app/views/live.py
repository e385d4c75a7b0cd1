"""Live: chat with the engine, drive traffic, flip the modes, and watch the four charts; or replay a
recorded run in the same charts (no engine needed: the page falls back to one when the engine
does not answer)."""

import streamlit as st

from app import browser_view, evidence_page, i18n, state, ui

ctx = ui.page_setup("live_title", "live_caption", "live_rec_caption")
w, lang = ctx.w, ctx.lang


def replay_view() -> None:
    """A recording's run in the live charts, played in the browser (play / pause / scrub /
    speed)."""
    if ctx.rec is None:
        st.info(w["no_recordings"])
        return
    run = state.choose_run(ctx.rec, w) if len(ctx.rec.runs) > 1 else ctx.rec.run()
    meta = ctx.rec.meta
    if ctx.chart == "all":
        ui.headline(run.summary, w["over_run"], lang)
        st.caption(
            w["rec_caption"].format(
                when=ui.plain(meta.get("when", "?")),
                model=ui.plain(meta.get("model", "?")),
                device=ui.plain(meta.get("device", "?")),
                steps=i18n.num(len(run.steps), 0, lang),
                total=i18n.num(run.steps_total or len(run.steps), 0, lang),
            )
        )
    at = state.get("at")
    got = browser_view.replay(
        run.steps,
        run.people,
        names=ctx.charts,
        key="live_replay",
        at=at,
        speed=state.get("speed"),
        caption=f"{ctx.rec.meta.get('lesson', ctx.rec.source)} · {run.label}",
        lang=lang,
        projector=ctx.projector,
    )
    if got and (got.get("at") != at or got.get("speed") != state.get("speed")):
        state.put("at", got.get("at"))
        state.put("speed", got.get("speed"))


# The traffic widgets, and how the engine's running traffic (``state.traffic``) sets each one.
TRAFFIC_KEYS = {
    "tr_load": "load",
    "tr_rate": "rate",
    "tr_prompts": "prompts",
    "tr_lengths": "lengths",
    "tr_median": "median",
    "tr_max": "max_tokens",
    "tr_sigma": "sigma",
}
TRAFFIC_FIELDS = (*TRAFFIC_KEYS.values(), "seed")  # a traffic's parameters, not its counters
TRAFFIC_DEFAULTS = {"tr_unit": "load", "tr_load": 0.8, "tr_rate": 1.0, "tr_prompts": "chat"}
TRAFFIC_DEFAULTS |= {"tr_lengths": "lognormal", "tr_median": 40, "tr_max": 256, "tr_sigma": 1.0}


def seed_traffic(traffic: dict | None) -> dict:
    """The traffic widgets show the engine's running traffic whenever it changed since this
    session last looked (a lesson's set-up, another presenter's tab), and this session's own
    choices otherwise; kept in a plain session dict, as Streamlit forgets a widget's value when
    another page runs (the walkthrough: 1.00 req/s and median 40 shown while a lesson ran
    0.45x capacity and median 16)."""
    kept = st.session_state.setdefault("_traffic_kept", dict(TRAFFIC_DEFAULTS))
    # its parameters, not its counters (sent, dropped), which move on every run
    params = {f: traffic.get(f) for f in TRAFFIC_FIELDS} if traffic else None
    if params and params != st.session_state.get("_traffic_seen"):
        st.session_state["_traffic_seen"] = params
        kept["tr_unit"] = "rate" if traffic.get("load") is None else "load"
        for key, field in TRAFFIC_KEYS.items():
            if traffic.get(field) is not None:
                kept[key] = traffic[field]
        kept["seed"] = traffic.get("seed", 0)
    for key in TRAFFIC_DEFAULTS:
        st.session_state[key] = kept[key]
    return kept


def _keep_traffic(key: str) -> None:
    st.session_state["_traffic_kept"][key] = st.session_state[key]


def traffic_controls(c, presenter: bool, traffic: dict | None) -> None:
    """The traffic generator. The offered load is a multiple of this engine's capacity (the
    requests/s at which it would be 100 % busy with this traffic and these settings: the engine
    computes it from its calibrated cost model, engine/workloads/capacity.py), so the same words
    show the same picture on any machine; requests/s stays one click away."""
    kept = seed_traffic(traffic)

    def kw(key: str) -> dict:
        return dict(key=key, disabled=not presenter, on_change=_keep_traffic, args=(key,))

    unit = st.radio(
        w["load_unit"],
        ("load", "rate"),
        format_func=lambda u: w[f"unit_{u}"],
        horizontal=True,
        **kw("tr_unit"),
    )
    if unit == "load":
        amount = st.slider(w["load"], 0.05, 3.0, step=0.05, **kw("tr_load"))
    else:
        amount = st.slider(w["rate"], 0.1, 50.0, step=0.1, **kw("tr_rate"))
    # radios, one row each: a selectbox cut "lognormal" to "lognorm…" on a 1280 px projector
    prompts = st.radio(w["prompts"], ("chat", "long", "mixed"), horizontal=True, **kw("tr_prompts"))
    lengths = st.radio(
        w["lengths"], ("lognormal", "natural", "uniform"), horizontal=True, **kw("tr_lengths")
    )
    t4, t5 = st.columns(2)  # three a row broke "comprimento" mid-word on a 1280 px projector
    median = t4.number_input(w["median"], 1, 1024, **kw("tr_median"))
    tmax = t5.number_input(w["max_tokens"], 1, 1024, **kw("tr_max"))
    sigma = t4.number_input(w["sigma"], 0.0, 3.0, step=0.1, **kw("tr_sigma"))
    shape = dict(prompts=prompts, lengths=lengths, median=int(median), sigma=float(sigma))
    params = {unit: float(amount), **shape, "max_tokens": int(tmax), "seed": kept.get("seed", 0)}
    traffic_buttons(c, presenter, params)
    st.markdown(traffic_line(traffic))


def traffic_buttons(c, presenter: bool, params: dict) -> None:
    """Start (with ``params``) and stop, one above the other, each as wide as the column: side
    by side they read "Start t…" on a 1280 px projector."""
    start = st.button(
        w["start_traffic"],
        key="tr_start",
        icon=":material/play_arrow:",
        disabled=not presenter,
        type="primary",
        width="stretch",
    )
    if start and presenter:
        ui.send(c, "traffic", action="start", **params)
        st.rerun()
    stop = st.button(
        w["stop_traffic"],
        key="tr_stop",
        icon=":material/stop:",
        disabled=not presenter,
        width="stretch",
    )
    if stop and presenter:
        ui.send(c, "traffic", action="stop")
        st.rerun()


def traffic_line(traffic: dict | None) -> str:
    """The traffic as the engine runs it: its load in units of capacity and what that is here."""
    if not traffic:
        return w["traffic_off"]
    rate = i18n.num(traffic.get("rate", 0), 1, lang)
    cap = traffic.get("capacity")
    if traffic.get("load") is not None and cap:
        load = i18n.num(traffic["load"], 1, lang)
        return w["traffic_on_load"].format(load=load, rate=rate, cap=i18n.num(cap, 1, lang))
    if cap:
        return w["traffic_on_rate"].format(rate=rate, load=i18n.num(traffic["rate"] / cap, 2, lang))
    return w["traffic_on"].format(rate=rate)


def controls(c, st_: dict) -> None:
    """Modes | Traffic in a fold: open for the presenter (who may close it to give the charts the
    first screen), closed for a viewer, whose first screen is the chat and the charts (the
    walkthrough: a student's first screen was greyed presenter controls, the chat below it)."""
    label = w["controls_fold"] if ctx.presenter else w["controls_fold_viewer"]
    with st.expander(label, expanded=ctx.presenter, icon=":material/tune:"):
        left, right = st.columns([1, 1], gap="large")
        with left:
            st.subheader(w["modes"])
            ui.mode_toggles(c, ctx.presenter)
        with right:
            st.subheader(w["traffic"])
            traffic_controls(c, ctx.presenter, st_.get("traffic"))


STALL_SCALES = (None, 100, 300, 1000, 3000, 10000)  # ms; None: the axis follows the data


def stall_scale() -> float | None:
    """The stall chart's time axis, a view option of each viewer's: following the data, or fixed,
    so that the drop chunked prefill makes (3,000 to 80 ms in lesson 3) looks like a drop
    rather than a rescaled axis."""

    def read(v: int | None) -> str:
        return w["stall_auto"] if v is None else i18n.metric("itl_max", v / 1000, lang)

    col = st.columns([2, 3])[0]
    return col.select_slider(
        w["stall_scale"], STALL_SCALES, key="stall_scale", format_func=read, help=w["stall_help"]
    )


def live_view() -> None:
    c = ctx.c
    st_ = c.snapshot(steps=0).state
    if ctx.chart == "all" and ctx.presenter:
        controls(c, st_)
    # Chat, headline metrics and the charts live in the browser: its own connection to the engine,
    # incremental updates of views created once. This script runs again only when a widget changes.
    config, traffic = st_.get("config", {}), st_.get("traffic")
    stall_max = stall_scale() if "stalls" in ctx.charts else None
    browser_view.live(
        slots=int(config.get("max_slots", 8)),
        held=bool(st_.get("comparing")),
        lang=lang,
        projector=ctx.projector,
        names=ctx.charts,
        presenter=ctx.presenter,
        stall_max_ms=stall_max,
        # what the widgets show: the view reruns the page when the engine's differs
        engine={
            "config": {k: config[k] for k in ui.LIVE if k in config},
            "traffic": None if not traffic else {f: traffic.get(f) for f in TRAFFIC_FIELDS},
        },
    )
    if ctx.chart == "all" and not ctx.presenter:
        controls(c, st_)
    if ctx.chart == "all":
        st.divider()
        ui.exports(c, "live", ctx.presenter)
        evidence_page.live(c, "live", lang)


if ctx.src == "rec":
    replay_view()
else:
    live_view()
state.write_url()
