"""Step by step: pause the engine, advance one step, walk back and forth through the record; or
walk through a recorded run the same way (Page Down / Page Up on a clicker)."""

import time

import pandas as pd
import streamlit as st

from app import browser_view, charts, evidence, evidence_page, i18n, policy_notes, state, ui
from engine.core.metrics import slot_phase

ctx = ui.page_setup("step_title", "step_caption")
w, lang = ctx.w, ctx.lang


def engine_controls(c, presenter: bool) -> None:
    """Pause / step once / resume on the live engine."""
    st_ = c.snapshot(steps=0).state
    paused = bool(st_.get("paused"))
    # one row, each button at its label's width (a quarter column cut them to "Pa…", "U…" in
    # projector mode at 1366 px); the engine's line under them
    b1 = b2 = b3 = st.container(horizontal=True, key="step_buttons")
    b4 = st.container()
    # ``and presenter``: the page's own gate, not only the widget's ``disabled``
    if (
        b1.button(
            w["pause"], key="pause", icon=":material/pause:", disabled=not presenter or paused
        )
        and presenter
    ):
        ui.send(c, "pause")
        st.rerun()
    if (
        b2.button(
            w["step_once"],
            key="step_once",
            icon=":material/skip_next:",
            disabled=not presenter,
            type="primary",
            help=w["step_once_help"],
        )
        and presenter
    ):
        before = c.snapshot(steps=1).steps
        answer = ui.send(c, "step")
        # The answer can overtake the step's own record on the wire (or be an older state
        # broadcast): wait until the buffer holds a step newer than the one we had.
        target = max((answer or {}).get("step", 0), (before[-1]["step"] + 1) if before else 1)
        for _ in range(100):
            newest = c.snapshot(steps=1).steps
            if answer is None or (newest and newest[-1]["step"] >= target):
                break
            time.sleep(0.05)
        state.put("at", None)  # follow the newest step
        st.rerun()
    if (
        b3.button(
            w["resume"],
            key="resume",
            icon=":material/play_arrow:",
            disabled=not presenter or not paused,
        )
        and presenter
    ):
        ui.send(c, "resume")
        st.rerun()
    b4.markdown(
        w["engine_line"].format(
            state=w["paused" if paused else "running"],
            step=st_.get("step", 0),
            queue=st_.get("queue_len", 0),
            running=st_.get("running", 0),
        )
    )


def pick_step(steps: list[dict]) -> int:
    """Back / Forward (Page Up / Page Down) and a slider over the recorded steps; the step shown
    is the shareable ``at`` (the slider is seeded from it on every run, on every page)."""
    numbers = [r["step"] for r in steps]
    at = state.get("at")
    i = numbers.index(at) if at in numbers else len(numbers) - 1
    n1, n2, n3 = st.columns([1, 4, 1])
    if n1.button(w["back"], key="back"):
        i = max(0, i - 1)
    if n3.button(w["forward"], key="fwd"):
        i = min(len(numbers) - 1, i + 1)
    st.session_state["step_at"] = numbers[i]
    at = n2.select_slider(
        w["recorded_step"],
        options=numbers,
        key="step_at",
        on_change=lambda: state.put("at", st.session_state["step_at"]),
    )
    state.put("at", at)
    return numbers.index(at)


def phase(name: str) -> str:
    """A slot's phase in the page's language ("idle" read "ocioso" on a pt-BR page)."""
    return browser_view.PHASE_PT.get(name, name) if lang == "pt-BR" else name


def batch_table(rec: dict, upto: list[dict], people: set[int]) -> pd.DataFrame:
    held = charts.request_kv_tokens(upto)
    bs = charts.record_block_size(rec)
    rows = []
    for s in rec["slots"]:
        rid = s["request"]
        tok = held.get(rid)
        rows.append(
            {
                w["col_slot"]: s["slot"],
                w["col_request"]: "" if rid is None else f"#{rid}",
                w["col_who"]: ""
                if rid is None
                else w["person" if rid in people else "traffic_who"],
                w["col_phase"]: phase(slot_phase(s)),
                w["col_tokens"]: s["tokens"],
                # "—" for a slot holding nothing, not the "None" the table drew before
                w["col_kv_tokens"]: "—" if tok is None else str(tok),
                w["col_kv_blocks"]: "—" if tok is None else str(-(-tok // bs)),
            }
        )
    return pd.DataFrame(rows)


def what_happened(rec: dict, requests: list[dict]) -> None:
    kv = rec["kv"]
    st.markdown(
        w["kv_line"].format(
            used=kv["blocks_used"],
            total=kv["blocks_total"],
            stored=kv["tokens_stored"],
            alloc=kv["tokens_allocated"],
        )
    )
    st.markdown(w["queue_line"].format(n=rec["queue_len"]))
    by_id = {r["id"]: r for r in requests}
    cached = {
        int(k): v for k, v in (rec.get("admitted_cached") or {}).items()
    }  # JSON keys are strings
    if policy_notes.loaded(rec):  # a policy of the class's: which hook decided what
        st.markdown(w["decided_head"].format(policy=ui.plain(rec["policy"])))
        for level, line in policy_notes.notes(rec, w):
            getattr(st, level)(line)
    why = policy_notes.admitted_why(rec, w)
    for rid in rec["admitted"]:
        cheap = w["cached_note"].format(n=cached[rid]) if cached.get(rid) else ""
        st.success(w["admitted"].format(rid=rid, why=why + cheap))
    for rid in rec["finished"]:
        r = by_id.get(rid, {})
        why = r.get("status", "ended")
        if why == "finished":
            why = w["finished_after"].format(n=r.get("output_tokens", "?"))
            if rec["policy"] == "static":
                why += w["dead_note"]
        elif r.get("error"):
            why = f"{why}: {ui.plain(r['error'])}"
        st.info(w["ended"].format(rid=rid, why=why))
    for rid in rec["preempted"]:
        st.warning(policy_notes.preempted_line(rec, rid, w))
    for ev in rec["events"]:
        if ev.get("kind") == "policy_error":
            continue  # said above, with its hook
        kind, changes = ui.plain(ev.get("kind")), ui.plain(ev.get("changes", ""))
        st.caption(w["event"].format(kind=kind, changes=changes))
    if not (rec["admitted"] or rec["finished"] or rec["preempted"]):
        st.caption(w["nothing"])


if ctx.src == "rec":
    if ctx.rec is None:
        st.info(w["no_recordings"])
        st.stop()
    run = state.choose_run(ctx.rec, w) if len(ctx.rec.runs) > 1 else ctx.rec.run()
    steps, requests, people = run.steps, run.requests, run.people
    name, config = run.name, run.config
else:
    engine_controls(ctx.c, ctx.presenter)
    snap = ctx.c.snapshot()
    steps, requests, people = snap.steps, snap.requests, snap.people
    name, config = "live", dict(snap.state.get("config") or {})
if not steps:
    st.info(w["no_steps"])
    state.write_url()
    st.stop()

i = pick_step(steps)
rec, upto = steps[i], steps[: i + 1]
ms = i18n.num(1000 * (rec["t_end"] - rec["t_start"]), 1, lang)
st.subheader(
    w["step_head"].format(step=rec["step"], policy=rec["policy"], runner=rec["runner"], ms=ms)
)
# The batch table across the page's width (beside "what happened", its last column was cut to
# "bloc…" at 1366 px), what happened under it.
st.markdown(f"**{w['batch']}**")
st.dataframe(
    batch_table(rec, upto, people),
    hide_index=True,
    width="stretch",
    height=min(40 + 36 * len(rec["slots"]), 600),
)
what_happened(rec, requests)
# the range walked so far, as the tables a course grades
evidence_page.button(
    lambda: evidence.build(
        "step",
        [evidence.Source(name, config, upto, evidence.window(upto, requests))],
        ctx.rec.meta if ctx.src == "rec" and ctx.rec else {"weights": config.get("weights")},
    ),
    "step",
    lang,
)

# Drawn in the browser from the records up to this step (sent again only when the step changes).
browser_view.recorded(
    upto[-600:],
    people,
    names=("slots", "kv"),
    key="step_view",
    windows={"slots": 60},
    overview=False,
    heights={"slots": 260, "kv": 220},
    title=w["slots_upto"],
    caption=w["steps_upto"].format(step=rec["step"]),
    height=900,
    lang=lang,
    projector=ctx.projector,
)
state.write_url()
