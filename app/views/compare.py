"""Compare: the same workload replayed under two configurations, side by side, with measured
ratios; or a lesson's recorded comparison, played side by side with no engine."""

import tomllib

import pandas as pd
import streamlit as st

from app import browser_view, evidence, evidence_page, i18n, predict_view, predictions, state, ui
from engine.workloads import trace
from engine.workloads.lessons import compares, lesson_dirs

ctx = ui.page_setup("cmp_title", "cmp_caption")
w, lang = ctx.w, ctx.lang
# Count-based ratios do not depend on how busy the machine was; wall-clock ones do.
COUNT_RATIOS = ("tokens_per_step_b_over_a", "slot_steps_per_token_b_over_a")
TABLE_KEYS = (
    "throughput",
    "ttft_p50",
    "itl_p50",
    "itl_p99",
    "itl_max",
    "slot_utilization",
    "dead_slot_fraction",
    "kv_waste",
    "busy_fraction",
    "peak_running",
    "steps",
    "wall_s",
)
PRESETS = {
    "static vs continuous": ("batching", {"policy": "static"}, {"policy": "continuous"}),
    "unchunked vs chunked": ("stall", {"policy": "continuous"}, {"policy": "chunked"}),
    "reserved vs paged": ("memory", {"kv_layout": "reserved"}, {"kv_layout": "paged"}),
    "sync vs async": ("overlap", {"runner": "sync"}, {"runner": "async"}),
}


SCALES = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 0,05 ... 1,00 (decimal comma in pt)


def lesson_scale(workload: str) -> float:
    """The scale the lessons run a preset's workload at (the walkthrough: 0.25 here while lesson
    2 says 0,5, so the page's numbers differed from the lesson's)."""
    for folder in lesson_dirs():
        scenario = tomllib.loads((folder / "scenario.toml").read_text())
        for cmp_ in compares(scenario):
            if cmp_.get("workload") == workload and cmp_.get("scale") in SCALES:
                return cmp_["scale"]
    return 0.5


SCORE_KEYS = (*trace.SCORE_RATIO_KEYS, "policy_errors", "steps")  # the scorer's, and two counts
TRACES = {"trace:class": "trace_class", "trace:live": "trace_live"}


def run_live() -> dict | None:
    """A preset or policies on a trace, run on the engine (a fresh engine per side, the live one
    held meanwhile)."""
    c, presenter = ctx.c, ctx.presenter
    if c.snapshot(steps=0).state.get("comparing"):
        st.warning(w["cmp_held"], icon=":material/hourglass_top:")
    mode = st.radio(
        w["cmp_mode"],
        ("presets", "trace"),
        horizontal=True,
        key="cmp_mode",
        format_func=lambda m: w["cmp_mode_" + m],
    )
    request, question = run_presets(presenter) if mode == "presets" else run_trace(c, presenter)
    if request is not None and presenter:
        predict_view.lock(question)  # the run starts: the class's answers are final
        with st.spinner(w["cmp_wait"]):
            answer = ui.send(c, "compare", timeout=600, **request)
        if answer is not None:
            st.session_state["cmp_result"] = answer
            predict_view.reveal(question, answer)  # the run's own ratio answers it
        st.rerun()
    return st.session_state.get("cmp_result")


Asked = tuple[dict | None, predictions.Question]  # the run to ask the engine for; its question


def run_trace(c, presenter: bool) -> Asked:
    """Two policies (the engine's: built-ins and loaded ones) scored on a request trace."""
    names, label = ui.policy_choices(c.snapshot(steps=0).state.get("policies"), None, w)
    t1, t2, t3, t4 = st.columns([2, 1, 1, 1])
    which = t1.radio(
        w["cmp_trace"], list(TRACES), key="cmp_trace", format_func=lambda t: w[TRACES[t]]
    )
    loaded = [n for n in names if n not in ui.CHOICES["policy"]]
    pa = t2.selectbox(
        w["cmp_policy_a"],
        names,
        names.index((loaded or ["continuous"])[0]),
        format_func=label,
        key="cmp_pa",
        disabled=not presenter,
    )
    pb = t3.selectbox(
        w["cmp_policy_b"],
        names,
        names.index("continuous"),
        format_func=label,
        key="cmp_pb",
        disabled=not presenter,
    )
    scale = t4.select_slider(
        w["cmp_scale"],
        SCALES,
        0.25,
        key="cmp_tscale",
        format_func=lambda x: i18n.num(x, 2, lang),
        disabled=not presenter,
        help=w["cmp_scale_help"],
    )
    st.caption(w["cmp_trace_line"].format(t=w[TRACES[which]], a=label(pa), b=label(pb)))
    question = predictions.COMPARE_QUESTIONS["trace"]
    predict_view.compare(question, presenter, lang)
    if not st.button(w["cmp_trace_run"], key="cmp_trun", type="primary", disabled=not presenter):
        return None, question
    return dict(workload=which, a={"policy": pa}, b={"policy": pb}, scale=scale), question


def run_presets(presenter: bool) -> Asked:
    """The lessons' workloads under two configurations."""
    p1, p2 = st.columns([2, 1])
    preset = p1.radio(
        w["cmp_what"], list(PRESETS), horizontal=True, key="cmp_preset", disabled=not presenter
    )
    workload, a_cfg, b_cfg = PRESETS[preset]
    if st.session_state.get("_cmp_scale_of") != preset:  # a preset opens at its lesson's scale
        st.session_state["_cmp_scale_of"] = preset
        st.session_state["cmp_scale"] = lesson_scale(workload)
    scale = p2.select_slider(
        w["cmp_scale"],
        SCALES,
        key="cmp_scale",
        format_func=lambda x: i18n.num(x, 2, lang),
        disabled=not presenter,
        help=w["cmp_scale_help"],
    )
    st.caption(
        w["cmp_line"].format(w=workload, a=i18n.settings(a_cfg, lang), b=i18n.settings(b_cfg, lang))
    )
    question = predictions.COMPARE_QUESTIONS[workload]
    predict_view.compare(question, presenter, lang)
    if not st.button(w["cmp_run"], key="cmp_run", type="primary", disabled=not presenter):
        return None, question
    return dict(workload=workload, a=a_cfg, b=b_cfg, scale=scale), question


def show_score(result: dict) -> None:
    """A comparison on a trace: the scorer's table (engine/lab/score.py), A and B, and B/A."""
    about = result.get("trace", {})
    targets = about.get("targets", {})
    st.markdown(f"**{w['score_title']}**")
    rows = {}
    for k in SCORE_KEYS:
        a, b = (result[s]["score"].get(k) for s in ("a", "b"))
        ratio = result.get("score_ratios", {}).get(f"{k}_b_over_a")
        rows[w.get("k_" + k, k)] = {
            "a": i18n.metric(k, a, lang),
            "b": i18n.metric(k, b, lang),
            "r": i18n.metric(f"{k}_b_over_a", ratio, lang),
        }
    df = pd.DataFrame(rows).T
    df.columns = [f"A: {differs(result, 'a')}", f"B: {differs(result, 'b')}", "B/A"]
    df.index.name = w["metric"]
    st.dataframe(df, width="stretch", height=38 + 35 * len(df))
    st.caption(
        w["score_caption"].format(
            n=i18n.num(about.get("requests"), 0, lang),
            ttft=i18n.num(targets.get("ttft_s"), 1, lang),
            itl=i18n.num(targets.get("itl_p99_s"), 2, lang),
        )
    )


def from_recording() -> dict | None:
    """The recording's two runs as a comparison: their summaries (of the whole runs) and steps."""
    rec = ctx.rec
    if rec is None:
        st.info(w["no_recordings"])
        return None
    if len(rec.runs) < 2:
        st.info(w["cmp_one_run"])
        return None
    a, b = list(rec.runs.values())[:2]
    ratios = dict(rec.meta.get("ratios") or {})  # the engine's, kept when it recorded
    st.caption(
        w["cmp_rec"].format(
            lesson=ui.plain(rec.meta.get("lesson", rec.source)),  # a file's words: text only
            w=ui.plain(rec.meta.get("workload", "?")),
            scale=i18n.num(rec.meta.get("scale"), 2, lang),
        )
    )
    side = lambda r: {"config": r.config, "summary": r.summary, "steps": r.steps, "label": r.label}  # noqa: E731
    return {"a": side(a), "b": side(b), "ratios": ratios, "replay": True}


def show_ratios(ratios: dict) -> None:
    counted = {k: ratios[k] for k in COUNT_RATIOS if k in ratios}
    timed = {k: v for k, v in ratios.items() if k not in counted and k.endswith("_b_over_a")}

    def label(name: str) -> str:
        key = name.removesuffix("_b_over_a")
        return f"{w.get('k_' + key, key.replace('_', ' '))} B/A"

    for title, group in (
        (w["count_based"], counted),
        (w["wall_clock"] if counted else w["measured_ratios"], timed),
    ):
        if not group:
            continue
        st.markdown(title)
        cols = st.columns(min(4, len(group)))
        for i, (name, value) in enumerate(group.items()):
            cols[i % len(cols)].metric(label(name), i18n.metric(name, value, lang))


def differs(result: dict, side: str) -> str:
    """The settings that set this side apart (a config's other fields are the same on both)."""
    mine, other = result[side]["config"], result["b" if side == "a" else "a"]["config"]
    return i18n.settings({k: v for k, v in mine.items() if other.get(k) != v} or mine, lang)


def table(result: dict) -> pd.DataFrame:
    """Metrics as rows, A and B as columns: every value with its unit, in the page's number
    format."""
    rows = {
        w.get("k_" + k, k): {
            side: i18n.metric(k, result[side]["summary"].get(k), lang) for side in ("a", "b")
        }
        for k in TABLE_KEYS
    }
    df = pd.DataFrame(rows).T
    df.columns = [f"A: {differs(result, 'a')}", f"B: {differs(result, 'b')}"]
    df.index.name = w["metric"]
    return df


result = from_recording() if ctx.src == "rec" else run_live()
if not result:
    if ctx.src != "rec":
        st.info(w["cmp_pick"])
    state.write_url()
    st.stop()
if "score" in result.get("a", {}):  # policies on a trace
    show_score(result)
else:
    show_ratios(result.get("ratios", {}))
    st.dataframe(table(result), width="stretch")
evidence_page.button(
    lambda: (
        evidence.from_recording(ctx.rec)
        if result.get("replay") and ctx.rec
        else evidence.from_compare(result, {"weights": result["a"]["config"].get("weights")})
    ),
    "cmp",
    lang,
)
same = {k: v for k, v in result["a"]["config"].items() if result["b"]["config"].get(k) == v}
st.caption(f"A, B: {ui.plain(i18n.settings(same, lang))}")  # a recording's config: text only
left, right = st.columns(2, gap="large")
for col, side in ((left, "a"), (right, "b")):
    run = result[side]
    steps = run["steps"]
    with col:
        st.subheader(f"{side.upper()}: {ui.plain(differs(result, side))}")
        caption = w["run_steps"].format(side=side.upper(), n=i18n.num(len(steps), 0, lang))
        kw = dict(
            lang=lang,
            projector=ctx.projector,
            names=ctx.charts,
            min_column=320,
            heights={"kv": 200},
            caption=caption,
            height=1900,
        )
        if result.get("replay"):  # both sides play together (one player moves the other)
            got = browser_view.replay(
                steps,
                (),
                key=f"cmp_view_{side}",
                at=state.get("at"),
                speed=state.get("speed"),
                sync="compare",
                **kw,
            )
            if got and got.get("at") is not None:
                state.put("at", got["at"])
        else:  # a replay is synthetic: nobody's own chat is in it
            browser_view.recorded(
                steps, (), key=f"cmp_view_{side}", windows={"slots": 400, "stalls": 400}, **kw
            )
state.write_url()
