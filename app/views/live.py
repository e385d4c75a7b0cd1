"""Live: chat with the engine, drive traffic, flip the modes, and watch the four charts; or replay a
recorded run in the same charts (no engine needed: the page falls back to one when the engine
does not answer)."""

import streamlit as st

from app import browser_view, i18n, state, ui

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


def traffic_controls(c, presenter: bool, traffic: dict | None) -> None:
    t1, t2, t3 = st.columns(3)
    off = not presenter
    rate = t1.slider(w["rate"], 0.1, 10.0, 1.0, 0.1, key="tr_rate", disabled=off)
    prompts = t2.selectbox(w["prompts"], ("chat", "long", "mixed"), key="tr_prompts", disabled=off)
    lengths = t3.selectbox(
        w["lengths"], ("lognormal", "natural", "uniform"), key="tr_lengths", disabled=off
    )
    t4, t5, t6 = st.columns(3)
    median = t4.number_input(w["median"], 8, 256, 40, key="tr_median", disabled=off)
    sigma = t5.number_input(w["sigma"], 0.0, 2.0, 1.0, 0.1, key="tr_sigma", disabled=off)
    tmax = t6.number_input(w["max_tokens"], 8, 1024, 256, key="tr_max", disabled=off)
    b1, b2, b3 = st.columns([1, 1, 2])
    if (
        b1.button(
            w["start_traffic"],
            key="tr_start",
            icon=":material/play_arrow:",
            disabled=off,
            type="primary",
        )
        and presenter
    ):
        ui.send(
            c,
            "traffic",
            action="start",
            rate=rate,
            prompts=prompts,
            lengths=lengths,
            median=int(median),
            sigma=float(sigma),
            max_tokens=int(tmax),
        )
        st.rerun()
    if (
        b2.button(w["stop_traffic"], key="tr_stop", icon=":material/stop:", disabled=off)
        and presenter
    ):
        ui.send(c, "traffic", action="stop")
        st.rerun()
    b3.markdown(
        w["traffic_on"].format(rate=i18n.num(traffic.get("rate", 0), 1, lang))
        if traffic
        else w["traffic_off"]
    )


def live_view() -> None:
    c = ctx.c
    st_ = c.snapshot(steps=0).state
    if ctx.chart == "all":
        left, right = st.columns([2, 3], gap="large")
        with left:
            st.subheader(w["modes"])
            ui.mode_toggles(c, ctx.presenter)
        with right:
            st.subheader(w["traffic"])
            traffic_controls(c, ctx.presenter, st_.get("traffic"))
    # Chat, headline metrics and the charts live in the browser: its own connection to the engine,
    # incremental updates of views created once. This script runs again only when a widget changes.
    browser_view.live(
        slots=int(st_.get("config", {}).get("max_slots", 8)),
        held=bool(st_.get("comparing")),
        lang=lang,
        projector=ctx.projector,
        names=ctx.charts,
        presenter=ctx.presenter,
    )
    if ctx.chart == "all":
        st.divider()
        ui.exports(c, "live", ctx.presenter)


if ctx.src == "rec":
    replay_view()
else:
    live_view()
state.write_url()
