"""Issue 36 in Streamlit's AppTest against a real engine server: the presenter's role survives a
page change (a reload is the browser's: tests/e2e/test_presenter_session.py), and after every
lesson's set-up each Live widget reads back the engine's own configuration and traffic."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
TOKEN = "a-long-random-classroom-token"


@pytest.fixture(autouse=True)
def loopback_page():
    before = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    yield
    st_config.set_option("server.address", before)


def entry(engine_server, monkeypatch, token: str | None = None) -> AppTest:
    monkeypatch.setenv("FLUXO_ENGINE_URL", engine_server)
    monkeypatch.delenv("FLUXO_ENGINE_PUBLIC_URL", raising=False)
    if token:
        monkeypatch.setenv("FLUXO_TOKEN", token)
    else:
        monkeypatch.delenv("FLUXO_TOKEN", raising=False)
    at = AppTest.from_file(str(APP / "streamlit_app.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def go(at: AppTest, view: str) -> AppTest:
    at.switch_page(str(APP / "views" / f"{view}.py")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_presenter_stays_presenter_across_page_changes(engine_server, monkeypatch, probe):
    """The walkthrough's lesson 2 route, Aulas -> Ao vivo -> Aulas, with the page's token: before,
    each page change made the presenter a viewer again, with an empty token box."""
    at = entry(engine_server, monkeypatch, TOKEN)
    assert at.radio(key="ctl_policy").disabled
    at.text_input(key="presenter_token").input("not-the-token").run()
    assert at.radio(key="ctl_policy").disabled
    assert any("does not unlock" in c.value for c in at.sidebar.caption)
    at.text_input(key="presenter_token").input(TOKEN).run()
    assert not at.radio(key="ctl_policy").disabled
    for view in ("lessons", "live", "lessons", "step", "compare", "live"):
        go(at, view)
        # no token to type again (the Lessons page's one text box is a student's nickname)
        assert not [t for t in at.text_input if t.key == "presenter_token"], view
        assert at.button(key="sign_out"), view
        enabled = {
            "lessons": lambda: not at.button(key="lesson_setup").disabled,
            "live": lambda: not at.radio(key="ctl_policy").disabled,
            "step": lambda: not at.button(key="step_once").disabled,
            "compare": lambda: not at.button(key="cmp_run").disabled,
        }[view]
        assert enabled(), view
    at.button(key="sign_out").click().run()
    assert at.radio(key="ctl_policy").disabled and at.text_input(key="presenter_token")
    go(at, "lessons")
    assert at.button(key="lesson_setup").disabled


def live_widgets(at: AppTest) -> dict:
    """What the Live page's Modes and Traffic widgets show."""
    out = {k: at.radio(key=f"ctl_{k}").value for k in ("policy", "runner", "kv_layout")}
    for k in ("max_slots", "kv_blocks", "chunk_budget"):
        out[k] = at.number_input(key=f"ctl_{k}").value
    out["prefix_cache"] = at.toggle(key="ctl_prefix_cache").value
    unit = at.radio(key="tr_unit").value
    out["traffic"] = {
        "unit": unit,
        "amount": at.slider(key=f"tr_{unit}").value,
        "prompts": at.radio(key="tr_prompts").value,
        "lengths": at.radio(key="tr_lengths").value,
        "median": at.number_input(key="tr_median").value,
        "max_tokens": at.number_input(key="tr_max").value,
        "sigma": at.number_input(key="tr_sigma").value,
    }
    return out


def test_every_lesson_setup_shows_in_the_live_widgets(engine_server, monkeypatch, probe):
    """Prepare each lesson on the Lessons page, open Live, and read every widget back against the
    engine's configuration (a second client's view of it) and the lesson's own scenario."""
    at = entry(engine_server, monkeypatch)
    lessons = sorted(p.parent for p in (ROOT / "lessons").glob("*/scenario.toml"))
    assert lessons
    for folder in lessons:
        scenario = tomllib.loads((folder / "scenario.toml").read_text())
        go(at, "lessons")
        at.selectbox(key="lesson_name").set_value(folder.name).run()
        at.button(key="lesson_setup").click().run()
        assert not at.error, (folder.name, [e.value for e in at.error])
        go(at, "live")
        shown = live_widgets(at)
        config = probe.snapshot(steps=0).state["config"]
        for k, v in shown.items():
            if k != "traffic":
                assert v == config[k], (folder.name, k, v, config[k])
        for k, v in scenario.get("engine", {}).items():
            assert shown.get(k, v) == v, (folder.name, k, shown.get(k), v)
        traffic = scenario.get("traffic")
        if traffic:
            running = probe.snapshot(steps=0).state["traffic"]
            unit = "load" if "load" in traffic else "rate"
            want = {"unit": unit, "amount": traffic[unit]}
            want |= {k: running[k] for k in ("prompts", "lengths", "median", "max_tokens")}
            want["sigma"] = running["sigma"]
            assert shown["traffic"] == want, (folder.name, shown["traffic"], want)
            assert running["median"] == traffic.get("median", running["median"])
