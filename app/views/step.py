"""Step by step: pause the engine, advance one step, walk back and forth through the record."""
import time

import pandas as pd
import streamlit as st

from app import browser_view, charts, ui

c, presenter = ui.page_setup("Step by step", "Pause the engine and look at one step at a time: who is in each slot, "
                             "what it computed, what entered and what left.")

state = c.snapshot(steps=0).state
paused = bool(state.get("paused"))
b1, b2, b3, b4 = st.columns([1, 1, 1, 3])
if b1.button("Pause", key="pause", icon=":material/pause:", disabled=not presenter or paused):
    ui.send(c, "pause")
    st.rerun()
if b2.button("Step once", key="step_once", icon=":material/skip_next:", disabled=not presenter, type="primary",
             help="One engine step; the engine must be paused first."):
    before = c.snapshot(steps=1).steps
    answer = ui.send(c, "step")
    # The answer can overtake the step's own record on the wire (or be an older state broadcast):
    # wait until the buffer holds a step newer than the one we had.
    target = max((answer or {}).get("step", 0), (before[-1]["step"] + 1) if before else 1)
    for _ in range(100):
        newest = c.snapshot(steps=1).steps
        if answer is None or (newest and newest[-1]["step"] >= target):
            break
        time.sleep(0.05)
    st.session_state.pop("step_at", None)  # follow the newest step
    st.rerun()
if b3.button("Resume", key="resume", icon=":material/play_arrow:", disabled=not presenter or not paused):
    ui.send(c, "resume")
    st.rerun()
b4.markdown(f"**engine:** {'paused' if paused else 'running'} · step {state.get('step', 0)} · "
            f"queue {state.get('queue_len', 0)} · running {state.get('running', 0)}")

snap = c.snapshot()
steps = snap.steps
if not steps:
    st.info("No steps recorded yet: send a chat or start traffic on the Live page, then pause here.")
    st.stop()

numbers = [r["step"] for r in steps]
if st.session_state.get("step_at") not in numbers:
    st.session_state["step_at"] = numbers[-1]
n1, n2, n3 = st.columns([1, 4, 1])
if n1.button("Back", key="back", icon=":material/arrow_back:"):
    i = numbers.index(st.session_state["step_at"])
    st.session_state["step_at"] = numbers[max(0, i - 1)]
if n3.button("Forward", key="fwd", icon=":material/arrow_forward:"):
    i = numbers.index(st.session_state["step_at"])
    st.session_state["step_at"] = numbers[min(len(numbers) - 1, i + 1)]
at = n2.select_slider("recorded step", options=numbers, key="step_at")
i = numbers.index(at)
rec = steps[i]
upto = steps[: i + 1]

st.subheader(f"Step {rec['step']} · {rec['policy']} · {rec['runner']} · "
             f"{1000 * (rec['t_end'] - rec['t_start']):.1f} ms")
held = charts.request_kv_tokens(upto)
bs = charts._block_size(rec)
people = snap.people
rows = []
for s in rec["slots"]:
    rid = s["request"]
    tok = held.get(rid)
    rows.append({"slot": s["slot"], "request": "" if rid is None else f"#{rid}",
                 "who": "" if rid is None else ("person" if rid in people else "traffic"),
                 "phase": charts._phase(s), "tokens this step": s["tokens"],
                 "KV tokens": tok, "KV blocks": None if tok is None else -(-tok // bs)})
left, right = st.columns([3, 2], gap="large")
with left:
    st.markdown("**Batch composition**")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", height=min(40 + 36 * len(rows), 600))
with right:
    kv = rec["kv"]
    st.markdown(f"**KV**: {kv['blocks_used']}/{kv['blocks_total']} blocks · {kv['tokens_stored']} tokens stored of "
                f"{kv['tokens_allocated']} allocated")
    st.markdown(f"**queue**: {rec['queue_len']} waiting")
    by_id = {r["id"]: r for r in snap.requests}
    why_admit = {"static": "a new static batch formed (slots filled or the fill timeout passed)",
                 "continuous": "a slot and its prompt's KV were free, so it entered and its whole prompt was prefilled",
                 "chunked": "a slot was free; its prompt is prefilled in chunks within the step's token budget"}
    cached = {int(k): v for k, v in (rec.get("admitted_cached") or {}).items()}  # JSON keys are strings
    for rid in rec["admitted"]:
        cheap = (f"; {cached[rid]} of its prompt tokens came from the prefix cache (blocks another request "
                 "already computed), so this step prefilled only the rest") if cached.get(rid) else ""
        st.success(f"admitted #{rid}: {why_admit.get(rec['policy'], '')}{cheap}")
    for rid in rec["finished"]:
        r = by_id.get(rid, {})
        why = r.get("status", "ended")
        if why == "finished":
            why = f"finished after {r.get('output_tokens', '?')} tokens (EOS or max tokens)"
        elif r.get("error"):
            why = f"{why}: {r['error']}"
        if rec["policy"] == "static" and why.startswith("finished"):
            why += "; its slot stays dead until the whole batch ends"
        st.info(f"ended #{rid}: {why}")
    for rid in rec["preempted"]:
        st.warning(f"preempted #{rid}: the KV pool ran out of blocks, so the newest running request gave its blocks "
                   "back; it waits at the head of the queue and will be recomputed")
    for ev in rec["events"]:
        st.caption(f"event: {ev.get('kind')} {ev.get('changes', '')}")
    if not (rec["admitted"] or rec["finished"] or rec["preempted"]):
        st.caption("nothing entered or left in this step")

# Drawn in the browser from the records up to this step (sent again only when the step changes).
browser_view.recorded(upto[-600:], people, names=("slots", "kv"), key="step_view", windows={"slots": 60},
                      overview=False, slot_height=260, kv_height=220, slot_title="Slots up to this step",
                      caption=f"recorded steps up to step {rec['step']}", height=900)
