"""Lessons: classroom walkthroughs (pt-BR / en) with a one-click scenario setup."""
import tomllib
from pathlib import Path

import streamlit as st

from app import ui

LESSONS = Path(__file__).resolve().parents[2] / "lessons"

c, presenter = ui.page_setup("Lessons", "Each lesson sets up a scenario on the live engine and says what to watch.")


def lesson_dirs() -> list[Path]:
    return sorted(p for p in LESSONS.iterdir() if p.is_dir() and (p / "scenario.toml").exists()) if LESSONS.exists() else []


def setup_scenario(scenario: dict) -> bool:
    """``reset``, then ``control`` with the lesson's [engine], then ``traffic`` with its [traffic]."""
    if ui.send(c, "reset") is None:
        return False
    engine = scenario.get("engine", {})
    if engine and ui.send(c, "control", **engine) is None:
        return False
    traffic = dict(scenario.get("traffic", {}))
    if traffic:
        traffic.setdefault("action", "start")
        if ui.send(c, "traffic", **traffic) is None:
            return False
    return True


dirs = lesson_dirs()
if not dirs:
    st.info(f"No lessons found in `{LESSONS}` yet.")
    st.stop()
lang = st.radio("language", ("pt-BR", "en"), horizontal=True, key="lesson_lang")
names = [d.name for d in dirs]
name = st.selectbox("lesson", names, key="lesson_name")
folder = LESSONS / name
text_path = folder / f"{lang}.md"
scenario = tomllib.loads((folder / "scenario.toml").read_text())
left, right = st.columns([5, 2], gap="large")
with right:
    st.markdown("**Scenario**")
    # One line per setting: legible in a narrow column, and the same words as scenario.toml.
    for table in ("engine", "traffic"):
        if scenario.get(table):
            lines = "\n".join(f"{k} = {v!r}" for k, v in scenario[table].items())
            st.code(f"[{table}]\n{lines}", language="toml")
    if st.button("Set up this scenario", key="lesson_setup", icon=":material/play_arrow:", type="primary", disabled=not presenter,
                 help=None if presenter else "Only the presenter sets up scenarios."):
        if setup_scenario(scenario):
            st.session_state["lesson_ok"] = name
        st.rerun()
    if st.session_state.get("lesson_ok") == name:
        st.success("Scenario running: open the Live page.")
    watch = scenario.get("watch")
    if watch:
        st.markdown("**What to watch**")
        st.write(watch if isinstance(watch, str) else watch.get(lang if lang in watch else "en", watch))
with left:
    st.markdown(text_path.read_text() if text_path.exists() else f"(no {lang} text for this lesson)")
