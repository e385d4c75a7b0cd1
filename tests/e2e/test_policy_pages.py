"""Student policies on the page, in Chromium, against a real engine (tiny model) started with
``--policy-file`` for an example policy and two broken ones written here: one that admits beyond
the free slots, one that raises. The Live page's switch lists the loaded policies (marked as
loaded) and switches to one live; the presenter, and only the presenter, sees one aggregated
notice of the refused decisions; Step by step says which hook decided; Compare scores a loaded
policy against a built-in on the shipped class trace. Screenshots in en and pt-BR under
tests/artifacts/ (policy-*.png)."""

from __future__ import annotations

import time

import pytest
from servers import start_engine, start_streamlit, stop

from app.engine_client import EngineClient

from .browsing import ARTIFACTS, VIEW, view, wait

TOKEN = "policy-e2e-token"
OVERADMIT = """from engine.core.policy import Policy


class OverAdmit(Policy):
    name = "overadmit"

    def admit(self, view):
        return [w.id for w in view.waiting]  # every waiting request, free slots or not
"""
RAISES = """from engine.core.policy import Policy


class Raises(Policy):
    name = "raises"

    def admit(self, view):
        return [w.id for w in view.waiting][0] / 0
"""


@pytest.fixture(scope="module")
def policy_lab(tmp_path_factory):
    """Engine (2 slots) with three loaded policies and a presenter token; the page holds the
    token, so a session is the presenter only once it typed it."""
    tmp = tmp_path_factory.mktemp("policy_lab")
    (tmp / "overadmit.py").write_text(OVERADMIT)
    (tmp / "raises.py").write_text(RAISES)
    files = ["examples/policies/shortest_prompt_first.py", tmp / "overadmit.py", tmp / "raises.py"]
    args = [a for f in files for a in ("--policy-file", str(f))]
    engine, ws_url = start_engine(tmp, "--slots", "2", "--token", TOKEN, *args)
    try:
        page, http_url = start_streamlit(tmp, ws_url, env_extra={"FLUXO_TOKEN": TOKEN})
    except Exception:
        stop(engine)
        raise
    probe = EngineClient(ws_url, TOKEN, history=50)
    assert probe.wait_connected(15)
    yield http_url, probe
    probe.close()
    stop(page)
    stop(engine)


def _open(browser, url: str, heading: str, presenter: bool = True):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1600, "height": 2200})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    page.goto(url)
    expect(page.get_by_role("heading", name=heading)).to_be_visible()
    if presenter:
        field = page.locator("input[type='password']")
        field.fill(TOKEN)
        field.press("Enter")
        pt = "pt-BR" in url
        role = "apresentador (controles ligados)" if pt else "presenter (controls on)"
        expect(page.get_by_text(role)).to_be_visible()
    return page


def _policy(probe) -> str:
    return probe.snapshot(steps=0).state.get("config", {}).get("policy")


def _switch(page, label: str, probe, name: str) -> None:
    page.get_by_text(label, exact=True).first.click()
    assert wait(lambda: _policy(probe) == name, 30), _policy(probe)


def test_live_lists_loaded_policies_and_tells_the_presenter_of_refusals(browser, policy_lab):
    from playwright.sync_api import expect

    http_url, probe = policy_lab
    page = _open(browser, http_url, "Live")
    viewer = _open(browser, http_url, "Live", presenter=False)
    for label in ("static", "continuous", "chunked", "shortest-first (loaded)"):
        expect(page.get_by_text(label, exact=True).first).to_be_visible()
    _switch(page, "shortest-first (loaded)", probe, "shortest-first")  # live, like a built-in
    _switch(page, "overadmit (loaded)", probe, "overadmit")
    probe.request("traffic", action="start", rate=8.0, prompts="chat", median=8, max_tokens=12)
    try:
        box = page.frame_locator(VIEW).locator("#fluxo-policy-errors")
        expect(box).to_contain_text("overadmit · admit · [policy_error] admit:", timeout=90_000)
        frame = view(page)
        # repeats are one line whose count grows: no flood
        wait(lambda: frame.evaluate("() => fluxo.policyErrors.total") >= 3, 60)
        assert box.locator("li").count() == 1 and "slots are free" in box.inner_text()
        page.screenshot(path=str(ARTIFACTS / "policy-live-en.png"))
        # a viewer's view received the same refusals and shows nothing of them
        vframe = view(viewer)
        wait(lambda: vframe.evaluate("() => fluxo.policyErrors.total") >= 1, 60)
        assert vframe.evaluate("() => document.getElementById('fluxo-policy-errors').hidden")
        _switch(page, "raises (loaded)", probe, "raises")
        expect(box).to_contain_text("raises · admit · [policy_error] ZeroDivisionError")
        pt = _open(browser, http_url + "/?lang=pt-BR", "Ao vivo")
        expect(pt.get_by_text("shortest-first (carregada)", exact=True).first).to_be_visible()
        ptbox = pt.frame_locator(VIEW).locator("#fluxo-policy-errors")
        expect(ptbox).to_contain_text("Política carregada recusada", timeout=60_000)
        expect(ptbox).to_contain_text("a última no passo")
        pt.screenshot(path=str(ARTIFACTS / "policy-live-pt-BR.png"))
        box.get_by_role("button", name="Dismiss").click()  # non-blocking: it goes away
        expect(box).to_be_hidden()
    finally:
        probe.request("reset", timeout=60)  # traffic off, the queue cancelled, continuous again
        for ctx in list(browser.contexts):  # every tab of this test: their views stop drawing
            ctx.close()


def _one_step(probe, policy: str, prompts: int = 3) -> dict:
    """A reset engine, paused, ``policy`` set, a few chats queued: one step, its record."""
    probe.request("reset", timeout=60)
    probe.request("pause")
    probe.request("control", policy=policy)
    for i in range(prompts):
        probe.chat("x" * (30 - 9 * i), max_tokens=4)
    time.sleep(0.5)
    before = [r["step"] for r in probe.snapshot().steps]
    probe.request("step")  # its answer may be an older state broadcast: look for the record

    def found():
        new = [r for r in probe.snapshot().steps if r["step"] > max(before, default=0)]
        return next((r for r in new if r["policy"] == policy and r["admitted"]), None)

    rec = wait(found, 30)
    assert rec and rec["policy"] == policy, rec
    return rec


@pytest.mark.parametrize("lang", ["en", "pt-BR"])
def test_step_by_step_says_which_hook_decided(browser, policy_lab, lang):
    from playwright.sync_api import expect

    http_url, probe = policy_lab
    try:
        rec = _one_step(probe, "shortest-first")
        assert rec["decided"] == ["admit"], rec
        en = lang == "en"
        heading = "Step by step" if en else "Passo a passo"
        page = _open(browser, f"{http_url}/step?lang={lang}", heading)
        expect(
            page.get_by_text(
                "admit of shortest-first decided" if en else "admit de shortest-first decidiu"
            )
        ).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / f"policy-step-{lang}.png"))
        _one_step(probe, "raises")
        page.close()  # a new session opens at the newest step (a reload keeps ?at=)
        page = _open(browser, f"{http_url}/step?lang={lang}", heading)
        expect(page.get_by_text("The engine refused" if en else "O motor recusou")).to_be_visible()
        expect(page.get_by_text("ZeroDivisionError").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / f"policy-step-refused-{lang}.png"))
        page.close()
    finally:
        probe.request("control", policy="continuous")
        probe.request("resume")


@pytest.mark.parametrize("lang", ["en", "pt-BR"])
def test_compare_scores_a_loaded_policy_on_the_class_trace(browser, policy_lab, lang):
    from playwright.sync_api import expect

    http_url, _ = policy_lab
    en = lang == "en"
    page = _open(browser, f"{http_url}/compare?lang={lang}", "Compare" if en else "Comparar")
    page.get_by_text("policies on a trace" if en else "políticas num trace").click()
    expect(
        page.get_by_text("shortest-first (loaded)" if en else "shortest-first (carregada)").first
    ).to_be_visible()
    page.get_by_role(
        "button", name="Score both on the trace" if en else "Pontuar as duas no trace"
    ).click()
    expect(page.get_by_text("Score on the trace" if en else "Pontuação no trace")).to_be_visible(
        timeout=180_000
    )
    table = page.locator("[data-testid='stDataFrame'] >> visible=true").first
    expect(table).to_be_visible()
    expect(page.get_by_text("28 requests" if en else "28 requisições")).to_be_visible()
    frame = view(page)  # side A's charts drawn from its replay's step records
    wait(lambda: frame.evaluate("() => fluxo.renders") > 0, 60)
    page.screenshot(path=str(ARTIFACTS / f"policy-compare-{lang}.png"), full_page=True)
    page.close()
