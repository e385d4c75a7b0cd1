"""End to end in a real browser: Debian's chromium driven by playwright, the real page, the real server."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))
from servers import start_engine, start_streamlit, stop  # noqa: E402

from app.client import EngineClient  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                "(.ci/run installs it with apt-get)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    engine, ws_url = start_engine(tmp, "--slots", "8", "--policy", "static")
    try:
        page, http_url = start_streamlit(tmp, ws_url)
    except Exception:
        stop(engine)
        raise
    yield ws_url, http_url
    stop(page)
    stop(engine)


def slot_phases(page) -> str:
    return page.locator("#fluxo-last-step").inner_text()


def test_the_lab_in_a_browser(lab):
    from playwright.sync_api import expect, sync_playwright

    ws_url, http_url = lab
    probe = EngineClient(ws_url, history=10)
    assert probe.wait_connected(15)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 2400})
        page.set_default_timeout(30_000)
        expect.set_options(timeout=30_000)
        page.goto(http_url)
        expect(page.get_by_role("heading", name="Live")).to_be_visible()

        # A chat streams back token by token.
        box = page.get_by_placeholder("Ask the model something…")
        box.fill("What is the capital of France?")
        box.press("Enter")
        expect(page.get_by_text("request #")).to_be_visible()
        expect(page.get_by_text("finished ·")).to_be_visible(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "01-chat.png"))

        # Traffic under the static policy: dead slots fill the slot chart.
        page.get_by_role("button", name="Start traffic").click()
        deadline = time.time() + 60
        while time.time() < deadline and not probe.state.get("traffic"):
            time.sleep(0.2)
        assert probe.state["traffic"]
        page.wait_for_selector(".vega-embed", timeout=30_000)
        page.wait_for_function("document.querySelectorAll('.vega-embed').length >= 4")
        expect(page.locator("#fluxo-last-step")).to_contain_text("static")
        time.sleep(4)
        page.screenshot(path=str(ARTIFACTS / "02-static-traffic.png"))
        static_text = slot_phases(page)

        # Step-end-to-browser latency: how old is each new step when its mark appears in the DOM.
        lags = page.evaluate("""async () => {
            const out = []; let last = null; const t0 = Date.now();
            while (Date.now() - t0 < 6000 && out.length < 8) {
                const el = document.querySelector('#fluxo-last-step');
                if (el && el.dataset.step !== last) {
                    if (last !== null) out.push(Date.now() / 1000 - parseFloat(el.dataset.tEnd));
                    last = el.dataset.step;
                }
                await new Promise(r => setTimeout(r, 20));
            }
            return out; }""")

        # Toggle static -> continuous: the next steps are continuous and the slot chart changes.
        page.get_by_text("continuous", exact=True).first.click()
        deadline = time.time() + 30
        while time.time() < deadline and probe.state.get("config", {}).get("policy") != "continuous":
            time.sleep(0.2)
        assert probe.state["config"]["policy"] == "continuous"
        expect(page.locator("#fluxo-last-step")).to_contain_text("continuous", timeout=30_000)
        time.sleep(4)
        page.screenshot(path=str(ARTIFACTS / "03-continuous-traffic.png"))
        assert slot_phases(page) != static_text

        # Each chart saves as PNG from its toolbar (Streamlit's "Download as PNG").
        page.locator(".vega-embed").first.hover()
        with page.expect_download() as download:
            page.get_by_role("button", name="Download as PNG").first.click()
        png = Path(download.value.path()).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000

        # Step by step: pause, step once (a long answer in flight, so the step has work whatever the traffic did).
        probe.request("chat", prompt="Tell me a long story.", max_tokens=200, ignore_eos=True)
        page.get_by_role("link", name="Step by step").click()
        expect(page.get_by_role("heading", name="Step by step")).to_be_visible()
        page.get_by_role("button", name="Pause").click()
        deadline = time.time() + 30
        while time.time() < deadline and not probe.state.get("paused"):
            time.sleep(0.2)
        assert probe.state["paused"]
        before = probe.state["step"]
        page.get_by_role("button", name="Step once").click()
        deadline = time.time() + 30
        while time.time() < deadline and probe.state["step"] != before + 1:
            time.sleep(0.2)
        assert probe.state["step"] == before + 1
        expect(page.get_by_role("heading", name=f"Step {before + 1} ·")).to_be_visible()
        time.sleep(1)
        page.screenshot(path=str(ARTIFACTS / "04-step-by-step.png"))
        page.get_by_role("button", name="Resume").click()
        browser.close()
    probe.request("traffic", action="stop")
    probe.close()
    report = {"step_end_to_browser_s": lags, "median_s": sorted(lags)[len(lags) // 2] if lags else None}
    (ARTIFACTS / "browser_latency.json").write_text(json.dumps(report, indent=2))
    print("\nstep end -> mark in the browser (s):", report)
    assert lags, "new steps must keep appearing in the page"
