"""Every page, run by Streamlit's AppTest against a real engine server (tiny model) over real
websockets."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from servers import settled_step, start_engine, stop
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from app import charts, evidence, evidence_check, predict_view, predictions

APP = Path(__file__).resolve().parents[2] / "app"


@pytest.fixture(autouse=True)
def loopback_page():
    """AppTest runs the scripts in this process: say the page listens on loopback, as ``make lab``
    starts it on one laptop (an unset address means every interface: no presenter then)."""
    before = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    yield
    st_config.set_option("server.address", before)


def query(at: AppTest) -> dict[str, str]:
    """The query string the page writes into the address bar (through its keys component)."""
    from urllib.parse import parse_qsl

    (keys,) = [
        json.loads(el.proto.json_args)
        for el in at.get("component_instance")
        if el.proto.component_name.endswith("fluxo_keys")
    ]
    return dict(parse_qsl(keys["query"]))


def views(at: AppTest) -> list[dict]:
    """The arguments of every browser view (``app/browser_view.py``) on the page."""
    return [
        json.loads(el.proto.json_args)
        for el in at.get("component_instance")
        if el.proto.component_name.endswith("fluxo_view")
    ]


@pytest.fixture
def page(engine_server, monkeypatch):
    monkeypatch.setenv("FLUXO_ENGINE_URL", engine_server)
    monkeypatch.delenv("FLUXO_TOKEN", raising=False)
    monkeypatch.delenv("FLUXO_ENGINE_PUBLIC_URL", raising=False)

    def run(name: str) -> AppTest:
        at = AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=60).run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return run


def wait_for(fn, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    return fn()


def test_entry_routes_to_the_live_page(engine_server, monkeypatch):
    monkeypatch.setenv("FLUXO_ENGINE_URL", engine_server)
    at = AppTest.from_file(str(APP / "streamlit_app.py"), default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "Live"
    at.switch_page(str(APP / "views" / "step.py")).run()
    assert at.title[0].value == "Step by step"


def test_live_page_widgets_and_mode_toggle(page, probe):
    at = page("live")
    assert at.radio(key="ctl_policy").options == ["static", "continuous", "chunked"]
    assert at.radio(key="ctl_runner").options == ["sync", "async"]
    assert at.radio(key="ctl_kv_layout").options == ["reserved", "paged"]
    for key in ("ctl_max_slots", "ctl_chunk_budget", "ctl_kv_blocks", "tr_median", "tr_max"):
        assert not at.number_input(key=key).disabled
    assert len(views(at)) == 1 and at.slider(key="tr_load").value == 0.8  # x capacity
    assert at.radio(key="tr_unit").options == ["x this engine's capacity", "requests/s"]
    assert {b.label for b in at.button} >= {
        "Start traffic",
        "Stop traffic",
        "Prepare telemetry export",
    }
    assert at.radio(key="ctl_policy").value == "continuous"

    at.radio(key="ctl_policy").set_value("static").run()
    assert not at.error, [e.value for e in at.error]
    assert wait_for(lambda: probe.state.get("config", {}).get("policy") == "static")
    at.number_input(key="ctl_max_slots").set_value(4).run()
    assert wait_for(lambda: probe.state.get("config", {}).get("max_slots") == 4)
    # Someone else switches back: the page follows the server on its next run.
    probe.request("control", policy="chunked")
    at.run()
    assert at.radio(key="ctl_policy").value == "chunked"


def test_live_page_traffic_and_browser_view(page, probe, engine_server):
    """The live charts and the chat are the browser view's (tests/e2e drives them in Chromium):
    the page hands it the four named-data specs of app/charts/ and where the engine is."""
    at = page("live")
    at.button(key="tr_start").click().run()
    assert wait_for(lambda: probe.state.get("traffic"))
    assert wait_for(lambda: len(probe.snapshot().steps) > 20)
    before = views(at)
    at.run()
    (args,) = views(at)
    assert args == before[0], (
        "the view's arguments do not change with the steps: no resend, no rebuild"
    )
    assert args["mode"] == "live" and args["chat"] and args["metrics"]
    assert (
        args["engine_port"] == int(engine_server.rsplit(":", 1)[1])
        and args["engine_public_url"] is None
    )
    assert args["specs"] == json.loads(json.dumps(charts.named_charts(slots=8)))
    # Nothing drawn or chatted through Streamlit (one empty chart: ui._preload's hidden one).
    assert len(at.get("vega_lite_chart")) == 1 and not at.chat_input
    at.button(key="tr_stop").click().run()
    assert wait_for(lambda: probe.state.get("traffic") is None)


def test_server_error_is_shown(page, probe):
    """``step`` while the engine runs: the server answers ``not_paused`` and the page shows it."""
    at = page("step")
    assert not probe.state.get("paused")
    at.button(key="step_once").click().run()
    assert any("not_paused" in e.value for e in at.error), [e.value for e in at.error]


def test_step_page_pause_and_single_step(page, probe):
    probe.request(
        "traffic",
        action="start",
        rate=5.0,
        prompts="chat",
        lengths="uniform",
        median=200,
        max_tokens=256,
    )
    assert wait_for(lambda: len(probe.snapshot().steps) > 5)
    at = page("step")
    at.button(key="pause").click().run()
    assert wait_for(lambda: probe.state.get("paused"))
    at.run()
    assert not at.button(key="step_once").disabled
    before = settled_step(probe)  # a step in flight when Pause came still lands
    at.button(key="step_once").click().run()
    assert wait_for(lambda: probe.state["step"] == before + 1)
    at.run()
    slider = at.select_slider(key="step_at")
    assert (
        str(slider.value) == slider.options[-1] == str(before + 1)
    )  # the page follows the new step
    table = at.dataframe[0].value
    assert list(table.columns[:4]) == ["slot", "request", "who", "phase"]
    assert len(table) >= 8
    (view,) = views(at)  # the browser view draws the records up to the shown step
    assert view["mode"] == "static" and view["order"] == ["slots", "kv"]
    assert view["steps"][-1]["step"] == before + 1
    at.button(key="back").click().run()
    assert at.subheader[0].value.startswith("Step ")
    assert views(at)[0]["steps"][-1]["step"] == before
    at.button(key="resume").click().run()
    assert wait_for(lambda: not probe.state.get("paused"))


def test_compare_page(page, probe):
    at = page("compare")
    assert at.radio(key="cmp_preset").options[0] == "static vs continuous"
    assert at.select_slider(key="cmp_scale").value == 0.5  # lesson 2's scale for this workload
    at.select_slider(key="cmp_scale").set_value(0.1)
    # the run carries its question (issue 41): answered before, locked by the run, answered by it
    q = predictions.COMPARE_QUESTIONS["batching"]
    predict_view.board().reset(q.key)
    at.number_input(key=f"pred_{q.key}").set_value(3.0)
    at.button(key=f"pred_{q.key}_send").click().run()
    assert predict_view.board().view(q.key)["count"] == 1
    at.button(key="cmp_run").click().run(timeout=300)
    assert not at.error, [e.value for e in at.error]
    result = at.session_state["cmp_result"]
    seen = predict_view.board().view(q.key)
    assert seen["locked"] and seen["revealed"] == result["ratios"]["throughput_b_over_a"]
    assert (
        result["a"]["config"]["policy"] == "static"
        and result["b"]["config"]["policy"] == "continuous"
    )
    assert result["ratios"]
    a, b = views(
        at
    )  # the same four charts, side by side, drawn in the browser from the replays' records
    assert a["mode"] == b["mode"] == "static" and a["order"] == b["order"] == [
        "slots",
        "stalls",
        "kv",
        "lanes",
    ]
    assert [r["step"] for r in a["steps"]] == [r["step"] for r in result["a"]["steps"]]
    assert len(at.main.dataframe) == 1
    # the evidence button's document, from the engine's own answer: the checker takes it
    doc = evidence.from_compare(result)
    assert evidence_check.problems(doc, {}) is None and doc["header"]["workload"] == "batching"


def test_lessons_page_sets_up_a_scenario(page, probe):
    at = page("lessons")
    names = at.selectbox(key="lesson_name").options
    if not names:
        pytest.skip("no lessons in lessons/ yet")
    assert at.radio(key="lang").options == ["en", "pt-BR"]
    import tomllib

    lesson = at.selectbox(key="lesson_name").value  # the folder (the options show titles)
    scenario = tomllib.loads((APP.parent / "lessons" / lesson / "scenario.toml").read_text())
    at.button(key="lesson_setup").click().run()
    assert not at.error, [e.value for e in at.error]
    config = probe.state.get("config", {})
    for k, v in scenario.get("engine", {}).items():
        assert config.get(k) == v, (k, config.get(k), v)
    if scenario.get("traffic"):
        assert wait_for(lambda: probe.state.get("traffic"))
    at.radio(key="lang").set_value("pt-BR").run()
    assert at.markdown


def test_viewers_cannot_control(tmp_path, monkeypatch):
    proc, url = start_engine(tmp_path, "--token", "s3cret")
    try:
        monkeypatch.setenv("FLUXO_ENGINE_URL", url)
        monkeypatch.delenv("FLUXO_TOKEN", raising=False)
        at = AppTest.from_file(str(APP / "views" / "live.py"), default_timeout=60).run()
        assert not at.exception
        assert at.radio(key="ctl_policy").disabled and at.button(key="tr_start").disabled
        assert views(at)[0]["chat"]  # viewers chat (in the browser view) and watch
        at.text_input(key="presenter_token").input("wrong").run()
        assert at.radio(key="ctl_policy").disabled
        at.text_input(key="presenter_token").input("s3cret").run()
        assert not at.radio(key="ctl_policy").disabled
        at.radio(key="ctl_policy").set_value("static").run()
        assert not at.error, [e.value for e in at.error]
    finally:
        stop(proc)


def test_exposed_page_without_token_has_no_presenter(page, probe):
    """Listening beyond loopback (empty address = every interface) without FLUXO_TOKEN: fail safe,
    even though this loopback engine with no token would take any connection as presenter."""
    assert probe.role == "presenter"
    for address in ("0.0.0.0", ""):
        st_config.set_option("server.address", address)
        at = page("live")
        assert at.radio(key="ctl_policy").disabled and at.button(key="tr_start").disabled
        assert not at.text_input  # no token to type: the page holds none to check it against
        assert any("beyond loopback" in c.value for c in at.sidebar.caption)


# -- replay: no engine at all ------------------------------------------------------------------
REC = "02-oven-vs-flow"


@pytest.fixture
def offline(monkeypatch):
    """The page with an engine URL that answers nothing (a closed port)."""
    from servers import free_port

    monkeypatch.setenv("FLUXO_ENGINE_URL", f"ws://127.0.0.1:{free_port()}")
    monkeypatch.delenv("FLUXO_TOKEN", raising=False)

    def run(name: str, **query: str) -> AppTest:
        at = AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=60)
        at.query_params.update(query)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return run


def test_live_falls_back_to_a_recording(offline):
    from app.recording import load

    at = offline("live", rec=REC)
    assert any("not reachable" in w.value for w in at.warning)
    assert at.radio(key="src").value == "rec" and at.selectbox(key="rec").value == REC
    (view,) = views(at)
    run = load(APP.parent / "lessons" / REC / "recording.jsonl").runs["a"]
    assert view["mode"] == "replay" and [r["step"] for r in view["steps"]] == [
        r["step"] for r in run.steps
    ]
    assert [m.label for m in at.metric][:2] == ["useful tokens/s", "TTFT p50"]
    assert query(at)["src"] == "rec" and query(at)["rec"] == REC
    at.selectbox(key="run").set_value("b").run()
    assert views(at)[0]["steps"][0]["policy"] == "continuous" and query(at)["run"] == "b"


def test_step_by_step_on_a_recording_follows_the_url(offline):
    at = offline("step", src="rec", rec=REC, at="40", lang="pt-BR")
    assert at.title[0].value == "Passo a passo"
    assert at.subheader[0].value.startswith("Passo 40 ·")
    at.button(key="fwd").click().run()
    assert at.subheader[0].value.startswith("Passo 41 ·") and query(at)["at"] == "41"
    assert list(at.dataframe[0].value.columns[:4]) == ["slot", "requisição", "quem", "fase"]
    (view,) = views(at)
    assert view["mode"] == "static" and view["steps"][-1]["step"] == 41 and view["lang"] == "pt-BR"
    assert "step_once" not in [b.key for b in at.button]  # no engine controls on a recording


def test_compare_on_a_recording_is_formatted(offline):
    at = offline("compare", src="rec", rec=REC, lang="pt-BR")
    a, b = views(at)
    assert a["mode"] == b["mode"] == "replay" and a["sync"] == b["sync"] == "compare"
    table = at.dataframe[0].value
    assert list(table.columns) == ["A: política static", "B: política continuous"]
    cells = [str(v) for v in table.to_numpy().ravel()]
    # Every value with its unit in Portuguese number format: no raw floats such as 16.5884.
    assert all(re.fullmatch(r"—|-?[\d.]+(,\d+)?( ms| s|%)?", c) for c in cells), cells
    assert any("," in c for c in cells)
    assert [m.label for m in at.metric][0].endswith("B/A")
    assert all("×" in m.value for m in at.metric)
