"""Recorded sessions in a real browser, with NO engine server: the page (its engine URL answers
nothing) falls back to a shipped lesson recording and every view replays it; the URL holds the
view, language, recording and step, so a copied link reopens the same picture; the presenter's
keys (Page Down / Page Up, space, ?) work; projector mode shows one large chart. Screenshots in
pt-BR and in projector mode go to tests/artifacts/ (08-replay-pt-BR.png, 09-projector.png,
10-step-pt-BR.png, 11-compare-replay.png); Compare's evidence downloads and checks."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .browsing import ARTIFACTS, VIEW, at_step, view

REC = "02-oven-vs-flow"  # static vs continuous: dead slots on one side, none on the other


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def step_shown(frame) -> int:
    return int(frame.locator("#rp-pos").get_attribute("data-step"))


def _live_falls_back_to_the_recording(page, offline: str):
    """Live: the engine does not answer, so the page says so and replays the lesson's recording.
    Returns the view's frame."""
    from playwright.sync_api import expect

    page.goto(f"{offline}/?lang=pt-BR&rec={REC}")
    expect(page.get_by_role("heading", name="Ao vivo")).to_be_visible()
    expect(page.get_by_text("não responde: mostrando uma gravação")).to_be_visible()
    frame = view(page)
    frame.wait_for_function(
        "() => fluxo.mode === 'replay' && fluxo.all.length > 50 && fluxo.renders > 0"
    )
    assert frame.evaluate("() => fluxo.ws") is None and sorted(
        frame.evaluate("() => Object.keys(fluxo.views)")
    ) == ["kv", "lanes", "slots", "stalls"]
    return frame


def _play_then_pause_with_space(page, frame) -> int:
    """Play at 0.5x from the start, pause with the page's space key: the step paused at goes into
    the URL. Returns that step. (The q4 recording's 83 steps take 1.5 s: at 8x the run ended
    before the key arrived, 2 runs in 6.)"""
    from playwright.sync_api import expect

    total = frame.evaluate("() => fluxo.all.length")
    frame.locator("#rp-speed").select_option("0.5")
    frame.locator("#rp-play").click()  # from the end, play starts again at the first step
    frame.wait_for_function("() => fluxo.player.playing && fluxo.player.cursor >= 5")
    page.locator("h1").click()  # focus on the page, not in the view: the page's own key handler
    page.keyboard.press(" ")
    frame.wait_for_function("() => !fluxo.player.playing")
    at = step_shown(frame)
    assert 5 <= frame.evaluate("() => fluxo.player.cursor") < total - 1
    assert (
        frame.evaluate("() => fluxo.buffer.length")
        == frame.evaluate("() => fluxo.player.cursor") + 1
    )
    page.wait_for_function(at_step(at))  # paused: the step is in the URL
    assert (
        params(page.url) | {"at": str(at)} == params(page.url)
        and params(page.url)["lang"] == "pt-BR"
    )
    expect(frame.locator("#rp-pos")).to_contain_text(f"passo {at} ·")
    return at


def _step_keys_walk_the_steps(page, at: int) -> str:
    """Step by step opens at the same step; Page Down / Page Up walk the recorded steps; ? shows
    the keys' help. Returns the page's link."""
    from playwright.sync_api import expect

    page.get_by_role("link", name="Passo a passo").click()
    expect(page.get_by_role("heading", name=re.compile(rf"^Passo {at} ·"))).to_be_visible()
    page.wait_for_function(
        "() => document.querySelector('.st-key-fwd button') && window.__fluxoKeysReady"
    )
    page.wait_for_timeout(1000)  # the page's keys frame settles (Streamlit may replace it)

    def shows(n: int) -> None:
        """Step ``n`` drawn and the page's run finished (its address says so), as a presenter
        waits to see the step before pressing the next key."""
        expect(page.get_by_role("heading", name=re.compile(rf"^Passo {n} ·"))).to_be_visible()
        page.wait_for_function(at_step(n))

    for key, n in (("PageDown", at + 1), ("PageDown", at + 2), ("PageUp", at + 1)):
        page.keyboard.press(key)
        shows(n)
    page.wait_for_function(f"() => ({at_step(at + 1)})() && location.pathname.endsWith('/step')")
    expect(page.get_by_text("Composição do lote")).to_be_visible()
    page.keyboard.press("?")  # the keys' help, over the page
    expect(page.locator("#fluxo-keys-help")).to_contain_text("Teclas de apresentação")
    page.screenshot(path=str(ARTIFACTS / "10-step-pt-BR.png"))
    page.keyboard.press("Escape")
    expect(page.locator("#fluxo-keys-help")).to_have_count(0)
    return page.url


def _compare_plays_both_runs(page) -> None:
    """Compare: both runs side by side, playing together (one player moves the other)."""
    from playwright.sync_api import expect

    page.get_by_role("link", name="Comparar").click()
    expect(page.get_by_role("heading", name=re.compile("^A: política static"))).to_be_visible()
    # the engine's own ratios, kept in the recording's first line (the page computes none)
    expect(page.get_by_text("Por contagem", exact=False)).to_be_visible()
    a, b = view(page, 0), view(page, 1)
    for f in (a, b):
        f.wait_for_function(
            "() => fluxo.mode === 'replay' && Object.keys(fluxo.views).length === 4"
        )
    a.locator("#rp-start").click()
    a.locator("#rp-speed").select_option("8")
    a.locator("#rp-play").click()
    # B moved with A (at 8x a short run can end, and stop playing, before a loaded machine's
    # next poll: a full run once waited 60 s on "playing" after B had followed to the end)
    b.wait_for_function("() => fluxo.player.cursor >= 3")
    page.keyboard.press(" ")  # space pauses both
    a.wait_for_function("() => !fluxo.player.playing")
    b.wait_for_function("() => !fluxo.player.playing")
    page.screenshot(path=str(ARTIFACTS / "11-compare-replay.png"), full_page=True)
    _evidence_downloads_and_checks(page)


def _evidence_downloads_and_checks(page) -> None:
    """The evidence button: a real download (built on click), which the hand-in checker takes."""
    from app import evidence_check

    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile("Evidências")).click()
    assert download.value.suggested_filename == "fluxo-evidence.zip"
    doc, csvs, _ = evidence_check.read(Path(download.value.path()).read_bytes())
    assert evidence_check.problems(doc, csvs) is None
    assert set(doc["records"]) == {"a", "b"} and set(csvs) == {
        "requests.csv",
        "steps.csv",
        "configs.csv",
    }


def test_every_view_replays_a_recording_without_an_engine(offline, browser):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    frame = _live_falls_back_to_the_recording(page, offline)
    at = _play_then_pause_with_space(page, frame)
    page.screenshot(path=str(ARTIFACTS / "08-replay-pt-BR.png"))
    link = _step_keys_walk_the_steps(page, at)
    _compare_plays_both_runs(page)
    page.close()

    # A copied link reopens the same view and step, in a fresh browser session.
    ctx = browser.new_context(viewport={"width": 1500, "height": 1400})
    fresh = ctx.new_page()
    fresh.goto(link)
    expect(fresh.get_by_role("heading", name=re.compile(rf"^Passo {at + 1} ·"))).to_be_visible(
        timeout=60_000
    )
    assert params(fresh.url)["rec"] == REC and params(fresh.url)["lang"] == "pt-BR"
    ctx.close()


def test_projector_mode_shows_one_large_chart(offline, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(f"{offline}/?src=rec&rec={REC}&run=a&projector=1&chart=slots&at=60")
    frame = view(page)
    # the records arrive with the render that follows the first one on a loaded machine: wait
    # for both (a full run once read an empty buffer right after the first render)
    frame.wait_for_function(
        "() => fluxo.renders > 0 && Object.keys(fluxo.views).length === 1 && fluxo.buffer.length"
    )
    assert frame.evaluate("() => Object.keys(fluxo.views)") == ["slots"]
    assert frame.evaluate("() => document.body.classList.contains('projector')")
    assert frame.evaluate("() => fluxo.buffer[fluxo.buffer.length - 1].step") == 60
    expect(page.locator(VIEW)).to_be_visible()
    # Large type: the chart's axis labels are drawn at 1.35 x the classroom size.
    assert frame.evaluate("() => fluxo.args.specs.slots.config.axis.labelFontSize") >= 21
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "09-projector.png"))
    page.close()
