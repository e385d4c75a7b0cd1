"""One lab for every browser test of this package: a real engine (tiny model) and the real page,
plus a page with no engine at all (replay), and one Chromium. Starting a lab costs ~15-30 s on a
shared 2-core machine; each e2e file used to start its own. ``browsing`` is this package's own
module; ``servers`` (tests/servers.py) imports as a top-level module, as pytest puts tests/, the
folder above this package, on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import free_port, start_engine, start_streamlit, stop

from app.engine_client import EngineClient

from .browsing import ARGS, ARTIFACTS, CHROMIUM, COMPARE_SCALE


def pytest_collection_modifyitems(items):
    if not CHROMIUM.exists():
        skip = pytest.mark.skip(
            reason="Debian chromium is not installed at /usr/bin/chromium "
            "(.ci/run installs it with apt-get)"
        )
        for item in items:
            if "browser" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


LOGS: list[Path] = []  # the lab's folders: engine-*.log and streamlit-*.log


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test reports what a CI log cannot otherwise show: each open tab's text (and
    a screenshot under tests/artifacts/) and the tail of the engine's and the page's logs."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    b = item.funcargs.get("browser")
    for i, page in enumerate(p for c in (b.contexts if b else []) for p in c.pages):
        try:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"failed-{item.name}-{i}.png"), timeout=10_000)
            text = page.inner_text("body", timeout=10_000)
        except Exception as exc:  # noqa: BLE001 - a report must not hide the failure itself
            text = f"(unreadable: {exc})"
        report.sections.append((f"tab {i}: {page.url}", text[-4000:]))
    for folder in LOGS:
        for log in sorted(folder.glob("*.log")):
            report.sections.append((f"log {log.name}", log.read_text(errors="replace")[-4000:]))


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    """The engine (tiny model, 8 slots) and the page; a probe client checks what the page did."""
    tmp = tmp_path_factory.mktemp("lab")
    LOGS.append(tmp)
    engine, ws_url = start_engine(tmp, "--slots", "8")
    try:
        page, http_url = start_streamlit(
            tmp, ws_url, env_extra={"FLUXO_COMPARE_SCALE": COMPARE_SCALE}
        )
    except Exception:
        stop(engine)
        raise
    probe = EngineClient(ws_url, history=10)
    assert probe.wait_connected(15)
    yield ws_url, http_url, probe
    probe.close()
    stop(page)
    stop(engine)


@pytest.fixture(scope="package")
def offline(tmp_path_factory):
    """The page alone: its engine URL answers nothing (a closed port), as on a laptop at home."""
    tmp = tmp_path_factory.mktemp("offline")
    page, http_url = start_streamlit(tmp, f"ws://127.0.0.1:{free_port()}")
    yield http_url
    stop(page)
