"""The Lessons page against the real server (tiny model): every [compare] of every lesson runs from
the page in one action (Debian's chromium, playwright; at a quarter of each comparison's scale, on
the session's one lab), and a viewer's session never receives a lesson's teacher part (answer
keys, expected numbers) while the presenter's does (AppTest)."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import pytest
from servers import start_engine, stop  # tests/servers.py; pytest puts tests/ on sys.path
from streamlit.testing.v1 import AppTest

from engine.workloads.lessons import compares

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p for p in (ROOT / "lessons").iterdir() if (p / "scenario.toml").exists())
# Headings only the teacher's part has, in both languages.
TEACHER_ONLY = (
    "Answer key",
    "Gabarito",
    "Common misconceptions",
    "Concepções erradas comuns",
    "Expected numbers on the Live page",
    "Números esperados na página Ao vivo",
)


@pytest.fixture
def loopback_page():
    """AppTest runs the page in this process: say it listens on loopback, as ``make lab`` starts it
    (an unset address means every interface, where the page has no presenter at all)."""
    from streamlit import config as st_config

    before = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    yield
    st_config.set_option("server.address", before)


def _texts(at: AppTest) -> str:
    return "\n".join(str(m.value) for m in at.markdown) + "\n".join(
        e.label for e in at.main.expander
    )


def _lesson_page(url: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("FLUXO_ENGINE_URL", url)
    monkeypatch.delenv("FLUXO_TOKEN", raising=False)
    at = AppTest.from_file(str(ROOT / "app" / "views" / "lessons.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_viewer_never_gets_an_answer_key(tmp_path, monkeypatch, loopback_page):
    """The server holds a presenter token the page lacks: the page's session is a viewer's."""
    proc, url = start_engine(tmp_path, "--token", "s3cret")
    try:
        at = _lesson_page(url, monkeypatch)
        assert at.button(key="lesson_setup").disabled and at.button(key="lesson_compare").disabled
        for lang in ("pt-BR", "en"):
            at.radio(key="lang").set_value(lang).run()
            for i, name in enumerate(at.selectbox(key="lesson_name").options):
                at.selectbox(key="lesson_name").select_index(i).run()
                assert not at.exception and at.selectbox(key="lesson_name").value == LESSONS[i].name
                text = _texts(at)
                assert "<!--" not in text, (lang, name)  # a number's marker shows as its value
                assert len(at.main.expander) == 0, name
                # lesson 1's roofline figure is the students' too, where its text places it
                roofline = "roofline" in tomllib.loads((LESSONS[i] / "scenario.toml").read_text())
                drawn = [c for c in at.get("vega_lite_chart") if "roofline bound" in c.proto.spec]
                assert len(drawn) == int(roofline), name
                for heading in TEACHER_ONLY:
                    assert heading not in text, (lang, name, heading)
    finally:
        stop(proc)


def test_the_presenter_gets_the_teacher_part(tmp_path, monkeypatch, loopback_page):
    proc, url = start_engine(tmp_path)  # loopback, no token: this page is the presenter
    try:
        at = _lesson_page(url, monkeypatch)
        at.radio(key="lang").set_value("en").run()
        # The list reads as numbered, translated titles; the value is the lesson's folder.
        assert at.selectbox(key="lesson_name").options[0] == "0 · Anatomy of a request"
        for i, path in enumerate(LESSONS):
            at.selectbox(key="lesson_name").select_index(i).run()
            assert at.selectbox(key="lesson_name").value == path.name
            assert len(at.main.expander) == 1 and "Answer key" in _texts(at), path.name
            assert "<!--" not in _texts(at), path.name
        at.radio(key="lang").set_value("pt-BR").run()
        at.selectbox(key="lesson_name").select_index(0).run()
        assert at.selectbox(key="lesson_name").options[0] == "0 · Anatomia de uma requisição"
        assert (
            "Gabarito" in _texts(at)
            and at.button(key="lesson_compare").label == "Rodar a comparação desta aula"
        )
        # Lesson 0's comparison from the page: one `compare`, its measured ratio in the table.
        at.button(key="lesson_compare").click().run(timeout=600)
        assert not at.exception and not at.error, [e.value for e in at.exception] + [
            e.value for e in at.error
        ]
        done = at.session_state["lesson_compare_result"]
        assert done["lesson"] == LESSONS[0].name and len(done["results"]) == 1
        assert done["results"][0]["value"] is not None and len(at.main.dataframe) == 1
    finally:
        stop(proc)


def test_every_compare_of_every_lesson_runs_from_the_page(lab, browser):
    """One click per lesson ("Run this lesson's comparison") runs all of its [compare] tables."""
    from playwright.sync_api import expect

    _, http_url, probe = lab
    probe.request("traffic", action="stop")
    page = browser.new_page(viewport={"width": 1600, "height": 2000})
    page.set_default_timeout(120_000)
    expect.set_options(timeout=120_000)  # a shared 2-core machine reruns the page slowly
    page.goto(http_url + "/lessons?lang=en&src=live")
    expect(page.get_by_role("button", name="Run this lesson's comparison")).to_be_visible()
    for folder in LESSONS:
        scenario = tomllib.loads((folder / "scenario.toml").read_text())
        title = f"{scenario['lesson']['number']} · {scenario['lesson']['title_en']}"
        # The list right above the buttons: a click just after a comparison once focused it
        # without opening it (the button's tooltip leaving), so open it until the option shows.
        option = page.get_by_role("option", name=title, exact=True)
        for _ in range(5):
            page.mouse.move(1, 1)
            page.locator(".st-key-lesson_name [data-testid='stSelectbox']").click()
            try:
                option.wait_for(timeout=5_000)
                break
            except Exception:  # noqa: BLE001 - not open: Escape, then click again
                page.keyboard.press("Escape")
        option.click()
        expect(
            page.get_by_role("heading", name=scenario["lesson"]["title_en"]).first
        ).to_be_visible()
        t0 = time.time()
        page.get_by_role("button", name="Run this lesson's comparison").click()
        expect(page.get_by_text("Comparison done")).to_be_visible(timeout=600_000)
        table = page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]').first
        expect(table).to_be_visible()
        rows = table.locator('[role="row"]')  # header + one row per comparison
        expect(rows).to_have_count(len(compares(scenario)) + 1)
        print(f"{folder.name}: {len(compares(scenario))} comparison(s) in {time.time() - t0:.1f} s")
    page.close()
