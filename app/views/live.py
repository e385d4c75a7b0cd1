"""Live: chat with the engine, drive traffic, flip the modes, and watch the four charts."""
import time

import streamlit as st

from app import charts, ui

REFRESH_S = 0.75
c, presenter = ui.page_setup("Live", "A real continuous-batching engine (SmolLM2-135M on this machine's CPU). "
                             "Every bar below is a measured step of it.")


left, right = st.columns([2, 3], gap="large")
with left:
    st.subheader("Chat")
    max_tokens = st.slider("max tokens", 8, 256, 64, 8, key="chat_max_tokens")
    prompt = st.chat_input("Ask the model something…")
    if prompt:
        st.session_state.setdefault("chats", []).append(c.chat(prompt=prompt, max_tokens=max_tokens))

    @st.fragment(run_every=0.4)
    def chat_log() -> None:
        for stream in st.session_state.get("chats", [])[-6:]:
            view = c.chat_view(stream)
            with st.chat_message("user"):
                st.write(view.prompt)
            with st.chat_message("assistant"):
                if view.error:
                    st.error(view.error)
                else:
                    st.write(view.text + ("" if view.ended else " ..."))
                    req = f"request #{view.request} · " if view.request is not None else ""
                    ttft = view.stats.get("ttft_s")
                    st.caption(f"{req}{view.status} · {view.tokens} tokens" + (f" · TTFT {1000 * ttft:.0f} ms" if ttft else ""))

    chat_log()

with right:
    st.subheader("Modes")
    ui.mode_toggles(c, presenter)
    st.subheader("Traffic")
    state = c.snapshot(steps=0).state
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


@st.fragment(run_every=REFRESH_S)
def live_charts() -> None:
    snap = c.snapshot()
    ui.headline(snap)
    last = snap.steps[-1] if snap.steps else None
    if last is None:
        st.info("No steps yet: send a chat or start traffic.")
        return
    offset = snap.state.get("wall_offset", 0.0)
    age = time.time() - (last["t_end"] + offset)
    st.markdown(f"<div id='fluxo-last-step' data-step='{last['step']}' data-t-end='{last['t_end'] + offset:.4f}'>"
                f"step <b>{last['step']}</b> · {last['policy']} · {last['runner']} · queue {last['queue_len']} · "
                f"{age * 1000:.0f} ms old at render</div>", unsafe_allow_html=True)
    t0 = time.perf_counter()
    built = charts.all_charts(snap.steps, snap.people, last=300)
    a, b = st.columns(2)
    a.vega_lite_chart(built["slots"], width="stretch", theme=None)
    b.vega_lite_chart(built["stalls"], width="stretch", theme=None)
    a.vega_lite_chart(built["kv"], width="stretch", theme=None)
    b.vega_lite_chart(built["lanes"], width="stretch", theme=None)
    st.caption(f"charts built in {1000 * (time.perf_counter() - t0):.0f} ms from {len(snap.steps)} buffered steps · "
               f"{snap.received_steps} received, {snap.skipped_steps} skipped by the server")


live_charts()
st.divider()
ui.exports(c, "live")
