"""Lessons: classroom walkthroughs (pt-BR / en), a one-click scenario setup, the lesson's own
comparison in one click, and the teacher's notes (answer keys, expected numbers, the lesson's
figure) shown to the presenter only."""

import json
import os
import tomllib
from pathlib import Path

import streamlit as st

from app import i18n, predict_view, preflight, recording, roofline_chart, state, ui
from app.i18n_lessons import WORDS
from engine.workloads.lessons import LESSONS_DIR, as_shown, compares, lesson_dirs

LANGS = i18n.LANGS
# A test-only knob: FLUXO_COMPARE_SCALE shrinks every [compare] (the e2e suite runs all of them on
# the tiny model at 0.25 of their scale, in one action per lesson as a teacher would).
SCALE = float(os.environ.get("FLUXO_COMPARE_SCALE", "1"))


def setup_scenario(c, scenario: dict) -> bool:
    """``reset``, then ``control`` with the lesson's [engine], then ``traffic`` with its
    [traffic]."""
    if ui.send(c, "reset") is None:
        return False
    engine = {
        "host_work_ms": 0.0,
        **scenario.get("engine", {}),
    }  # no simulated host work unless the lesson sets it
    if ui.send(c, "control", **engine) is None:
        return False
    traffic = dict(scenario.get("traffic", {}))
    if traffic:
        traffic.setdefault("action", "start")
        if ui.send(c, "traffic", **traffic) is None:
            return False
    return True


def run_compares(c, scenario: dict, words: dict) -> list[dict] | None:
    """Every [compare] of the lesson, in order (a sweep is several); the server holds live
    traffic."""
    out = []
    todo = compares(scenario)
    note = st.empty()  # under the button, at once (a spinner shows only after half a second)
    for i, cmp_ in enumerate(todo, 1):
        note.info(words["compare_wait"].format(i=i, n=len(todo)), icon=":material/hourglass_top:")
        answer = ui.send(
            c,
            "compare",
            timeout=600,
            workload=cmp_["workload"],
            a=cmp_.get("a", {}),
            b=cmp_.get("b", {}),
            scale=cmp_.get("scale", 1.0) * SCALE,
        )
        if answer is None:
            return None
        ratio = cmp_.get("ratio", "throughput_b_over_a")
        metric = ratio.removesuffix("_b_over_a")
        out.append(
            {
                "workload": cmp_["workload"],
                "a": cmp_.get("a", {}),
                "b": cmp_.get("b", {}),
                "ratio": ratio,
                "value": answer.get("ratios", {}).get(ratio),
                "scale": cmp_.get("scale", 1.0),
                "metric": metric,
                "a_value": answer.get("a", {}).get("summary", {}).get(metric),
                "b_value": answer.get("b", {}).get("summary", {}).get(metric),
            }
        )
    return out


def figure(folder: Path, scenario: dict, lang: str, words: dict) -> None:
    """The lesson's slide figure: [figure]'s metric for its runs, from lessons/NN/measured.json."""
    spec, path = scenario.get("figure"), folder / "measured.json"
    if not spec:
        return
    if not path.exists():
        st.caption(words["no_figure"].format(n=scenario["lesson"]["number"]))
        return
    measured = json.loads(path.read_text())
    src = "full" if "full" in measured else "short"
    runs = measured[src]["runs"]
    rows = [
        {"run": name, "value": runs[name]["summary"].get(spec["metric"])}
        for name in spec["runs"]
        if name in runs
    ]
    title = spec.get(f"title_{'pt' if lang == 'pt-BR' else 'en'}", spec["metric"])
    # Pinned light colours: the same figure in a dark-themed browser and on a projector.
    chart = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": title,
        "data": {"values": rows},
        "background": "#ffffff",
        "config": {
            "axis": {"labelColor": "#111111", "titleColor": "#111111"},
            "title": {"color": "#111111"},
        },
        "mark": {"type": "bar", "tooltip": True},
        "height": 260,
        "encoding": {
            "x": {"field": "run", "type": "nominal", "sort": spec["runs"], "title": None},
            "y": {
                "field": "value",
                "type": "quantitative",
                "title": spec.get("axis", spec["metric"]),
            },
        },
    }
    st.caption(
        words["figure"].format(
            src=f"`python -m engine.lesson {scenario['lesson']['number']}"
            f"{' --short' if src == 'short' else ''}`"
        )
    )
    st.vega_lite_chart(chart, width="stretch", theme=None)


def roofline_figure(folder: Path, scenario: dict, lang: str) -> None:
    """[roofline]'s stored ``bench roofline`` run as a figure in the lesson text, for every viewer
    (the text cites its numbers), with a caption naming the run and its roofs."""
    name = scenario.get("roofline", {}).get("file")
    if not name or not (folder / name).exists():
        return
    spec, caption = roofline_chart.lesson_figure(folder / name, lang)
    st.vega_lite_chart(spec, theme=None)
    st.caption(caption)


ctx = ui.page_setup("lessons_title", "lessons_caption", needs_engine=True)
c, presenter, lang = ctx.c, ctx.presenter, ctx.lang
words = WORDS[lang if lang in WORDS else "en"]
dirs = lesson_dirs()
if not dirs:
    st.info(words["none"].format(path=LESSONS_DIR))
    st.stop()
scenarios = {d.name: tomllib.loads((d / "scenario.toml").read_text()) for d in dirs}


def _title(name: str) -> str:
    meta = scenarios[name]["lesson"]
    return f"{meta['number']} · {meta['title_pt'] if lang == 'pt-BR' else meta['title_en']}"


def _replay(name: str) -> None:
    """Before the next run draws the sidebar: the source becomes this lesson's recording."""
    for key, value in (("src", "rec"), ("rec", name)):
        st.session_state[key] = value
        state.put(key, value)
    state.put("at", None)


def actions(name: str, scenario: dict) -> None:
    """The lesson's buttons in one row above the text, each at its label's width (the row wraps
    on a narrow screen, no label is cut: "Rodar a comparaç…" in a third of 1366 px before), and
    right under them what they did: the set-up's confirmation, the comparison's progress and its
    table across the page's whole width (it used to land at the top of the text column, out of
    sight of the button, its B / A column cut at 1366 px)."""
    help_ = None if presenter else words["presenter_only"]
    with st.container(horizontal=True, key="lesson_actions"):
        setup = st.button(
            words["setup"],
            key="lesson_setup",
            icon=":material/play_arrow:",
            type="primary",
            disabled=not presenter,
            help=help_,
        )
        run = compares(scenario) and st.button(
            words["compare"],
            key="lesson_compare",
            icon=":material/compare_arrows:",
            disabled=not presenter,
            help=help_ or words["compare_help"],
        )
        if name in recording.lesson_recordings() and st.button(
            words["replay"],
            key="lesson_replay",
            icon=":material/replay:",
            help=words["replay_help"],
            on_click=_replay,
            args=(name,),
        ):
            st.switch_page("views/live.py")
    if setup and presenter:
        if setup_scenario(c, scenario):
            st.session_state["lesson_ok"] = name
        st.rerun()
    if st.session_state.get("lesson_ok") == name:
        st.success(words["setup_ok"])
    if run and presenter:
        results = run_compares(c, scenario, words)  # its spinner shows here, under the button
        if results is not None:
            st.session_state["lesson_compare_result"] = {"lesson": name, "results": results}
        st.rerun()
    done = st.session_state.get("lesson_compare_result")
    if done and done["lesson"] == name:
        compare_table(done["results"])


def compare_table(results: list[dict]) -> None:
    st.success(words["compare_ok"])
    st.markdown(f"**{words['results']}**")
    cols, w = words["cols"], ctx.w
    st.dataframe(
        [
            {
                cols[0]: r["workload"],
                cols[1]: i18n.settings(r["a"], lang),
                cols[2]: i18n.settings(r["b"], lang),
                cols[3]: w.get("k_" + r["metric"], r["metric"]),
                cols[4]: i18n.metric(r["metric"], r["a_value"], lang),
                cols[5]: i18n.metric(r["metric"], r["b_value"], lang),
                cols[6]: i18n.num(r["value"], 2, lang, "×"),
                cols[7]: i18n.num(r["scale"], 2, lang),
            }
            for r in results
        ],
        width="stretch",
    )


name = state.widget(
    "lesson",
    "lesson_name",
    st.selectbox,
    words["lesson"],
    options=list(scenarios),
    format_func=_title,
)
folder, scenario = LESSONS_DIR / name, scenarios[name]
actions(name, scenario)
left, right = st.columns([2, 1], gap="large")
with right:
    st.markdown(f"**{words['scenario']}**")
    # One line per setting: legible in a narrow column, and the same words as scenario.toml.
    for table in ("engine", "traffic"):
        if scenario.get(table):
            lines = "\n".join(f"{k} = {v!r}" for k, v in scenario[table].items())
            st.code(f"[{table}]\n{lines}", language="toml")
    if scenario.get("engine", {}).get("host_work_ms"):
        st.warning(
            words["simulated"].format(ms=scenario["engine"]["host_work_ms"]),
            icon=":material/science:",
        )
    preflight.view(int(scenario["lesson"]["number"]), presenter, lang)
    watch = scenario.get("watch")
    if watch:
        st.markdown(f"**{words['watch']}**")
        st.write(
            watch if isinstance(watch, str) else watch.get(lang if lang in watch else "en", "")
        )
with left:
    predict_view.view(folder, scenario, presenter, lang)  # every browser answers, before the run
    text_path = folder / f"{lang}.md"
    text = text_path.read_text() if text_path.exists() else words["no_text"].format(lang=lang)
    # The roofline figure goes where the text places it (a `<!-- roofline -->` line).
    before, marker, after = text.partition("<!-- roofline -->")
    st.markdown(as_shown(before))
    if marker:
        roofline_figure(folder, scenario, lang)
        st.markdown(as_shown(after))
    # The teacher's part (answer keys, expected numbers, misconceptions, timing, figure) is sent
    # to the presenter's browser only: a viewer's session never renders it.
    if presenter:
        teacher_path = folder / f"teacher.{lang}.md"
        if teacher_path.exists():
            with st.expander(words["teacher"], expanded=False, icon=":material/school:"):
                st.markdown(as_shown(teacher_path.read_text()))
                figure(folder, scenario, lang, words)
state.write_url()
