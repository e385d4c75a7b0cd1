"""Compare: the same workload replayed under two configurations, side by side, with measured ratios."""
import pandas as pd
import streamlit as st

from app import browser_view, ui

c, presenter = ui.page_setup("Compare", "One workload, two configurations, each on a fresh engine with the same "
                             "weights. The live engine is held while a comparison runs, so each run measures only "
                             "itself. The ratios are measured, not modelled.")
# Count-based ratios do not depend on how busy the machine was; wall-clock ones do.
COUNT_RATIOS = ("tokens_per_step_b_over_a", "slot_steps_per_token_b_over_a")
if c.snapshot(steps=0).state.get("comparing"):
    st.warning("A comparison is running: the live engine is held (no live steps, traffic waits) until it ends.",
               icon=":material/hourglass_top:")

PRESETS = {
    "static vs continuous": ("batching", {"policy": "static"}, {"policy": "continuous"}),
    "unchunked vs chunked": ("stall", {"policy": "continuous"}, {"policy": "chunked"}),
    "reserved vs paged": ("memory", {"kv_layout": "reserved"}, {"kv_layout": "paged"}),
    "sync vs async": ("overlap", {"runner": "sync"}, {"runner": "async"}),
}
p1, p2 = st.columns([2, 1])
preset = p1.radio("what to compare", list(PRESETS), horizontal=True, key="cmp_preset", disabled=not presenter)
scale = p2.slider("workload scale", 0.05, 1.0, 0.25, 0.05, key="cmp_scale", disabled=not presenter,
                  help="Fewer requests run faster on a CPU; 1.0 is the benchmark's full workload.")
workload, a_cfg, b_cfg = PRESETS[preset]
st.caption(f"workload **{workload}** · A = `{a_cfg}` · B = `{b_cfg}`")
if st.button("Run the comparison", key="cmp_run", type="primary", disabled=not presenter):
    with st.spinner("Replaying the workload twice on the real engine (the live engine is held meanwhile)…"):
        answer = ui.send(c, "compare", timeout=600, workload=workload, a=a_cfg, b=b_cfg, scale=scale)
    if answer is not None:
        st.session_state["cmp_result"] = answer
    st.rerun()

result = st.session_state.get("cmp_result")
if not result:
    st.info("Pick a comparison and run it.")
    st.stop()

def _fmt(name: str, value: object) -> str:
    """Ratios read as ×; fractions (KV waste, dead slots, busy) as percentages."""
    if not isinstance(value, (int, float)):
        return str(value)
    if "_over_" in name:
        return f"{value:.2f}×"
    if "fraction" in name or "waste" in name:
        return f"{100 * value:.0f}%"
    return f"{value:.3g}"


ratios = result.get("ratios", {})
counted = {k: ratios[k] for k in COUNT_RATIOS if k in ratios}
timed = {k: v for k, v in ratios.items() if k not in counted}
if counted:
    st.markdown("**Count-based** (steps and tokens: the same on a busy or a quiet machine)")
    cols = st.columns(4)
    for i, (name, value) in enumerate(counted.items()):
        cols[i % 4].metric(name.replace("_", " "), _fmt(name, value))
if timed:
    st.markdown("**Wall-clock** (seconds: they move with the machine's load)" if counted else "**Measured ratios**")
    cols = st.columns(min(4, len(timed)))
    for i, (name, value) in enumerate(timed.items()):
        cols[i % len(cols)].metric(name.replace("_", " "), _fmt(name, value))
keys = ("throughput", "ttft_p50", "itl_p50", "itl_p99", "itl_max", "slot_utilization", "dead_slot_fraction",
        "kv_waste", "busy_fraction", "peak_running", "steps", "wall_s")
table = pd.DataFrame({side: {k: result[side]["summary"].get(k) for k in keys} for side in ("a", "b")})
table.columns = [f"A: {result['a']['config']}", f"B: {result['b']['config']}"]
st.dataframe(table, width="stretch")
left, right = st.columns(2, gap="large")
for col, side in ((left, "a"), (right, "b")):
    run = result[side]
    steps = run["steps"]
    people: set[int] = set()  # a replay is synthetic: nobody's own chat is in it
    with col:
        st.subheader(f"{side.upper()}: {', '.join(f'{k}={v}' for k, v in run['config'].items()) if isinstance(run['config'], dict) else run['config']}")
        browser_view.recorded(steps, people, key=f"cmp_view_{side}", windows={"slots": 400, "stalls": 400},
                              min_column=320, kv_height=200, caption=f"run {side.upper()}: {len(steps)} steps",
                              height=1900)
