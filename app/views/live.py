"""Live: chat with the engine, drive traffic, flip the modes, and watch the four charts."""
import streamlit as st

from app import browser_view, ui

c, presenter = ui.page_setup("Live", "A real continuous-batching engine (SmolLM2-135M on this machine's CPU). "
                             "Every bar below is a measured step of it.")


left, right = st.columns([2, 3], gap="large")
state = c.snapshot(steps=0).state
with left:
    st.subheader("Modes")
    ui.mode_toggles(c, presenter)
with right:
    st.subheader("Traffic")
    traffic = state.get("traffic")
    t1, t2, t3 = st.columns(3)
    rate = t1.slider("rate (requests/s)", 0.1, 10.0, 1.0, 0.1, key="tr_rate", disabled=not presenter)
    prompts = t2.selectbox("prompts", ("chat", "long", "mixed"), key="tr_prompts", disabled=not presenter)
    lengths = t3.selectbox("lengths", ("lognormal", "natural", "uniform"), key="tr_lengths", disabled=not presenter)
    t4, t5, t6 = st.columns(3)
    median = t4.number_input("median length", 8, 256, 40, key="tr_median", disabled=not presenter)
    sigma = t5.number_input("sigma", 0.0, 2.0, 1.0, 0.1, key="tr_sigma", disabled=not presenter)
    tmax = t6.number_input("max tokens", 8, 1024, 256, key="tr_max", disabled=not presenter)
    b1, b2, b3 = st.columns([1, 1, 2])
    if b1.button("Start traffic", key="tr_start", icon=":material/play_arrow:", disabled=not presenter, type="primary"):
        ui.send(c, "traffic", action="start", rate=rate, prompts=prompts, lengths=lengths, median=int(median),
                sigma=float(sigma), max_tokens=int(tmax))
        st.rerun()
    if b2.button("Stop traffic", key="tr_stop", icon=":material/stop:", disabled=not presenter):
        ui.send(c, "traffic", action="stop")
        st.rerun()
    b3.markdown(f"**traffic:** {'on, ' + format(traffic.get('rate', 0), '.1f') + ' req/s' if traffic else 'off'}")

# Chat, headline metrics and the four charts live in the browser: its own connection to the engine,
# incremental updates of views created once. This script runs again only when a widget changes.
browser_view.live(slots=int(state.get("config", {}).get("max_slots", 8)), held=bool(state.get("comparing")))
st.divider()
ui.exports(c, "live")
