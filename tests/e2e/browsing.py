"""What the browser tests share: where Chromium is, its flags, the view's frame, waiting."""

from __future__ import annotations

import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
VIEW = "iframe[src*='fluxo_view']"
# The lessons' [compare] tables run from the page at a quarter of their scale on the tiny model:
# every one of them still runs, in one action per lesson.
COMPARE_SCALE = "0.25"


def at_step(n: int) -> str:
    """A page function: the address's step is ``n`` exactly (``includes('at=8')`` also holds
    for at=83, which once let a loaded page's stale address pass for the new one)."""
    return f"() => new URLSearchParams(location.search).get('at') === '{n}'"


def wait(fn, timeout: float = 30.0, every: float = 0.2):
    end = time.time() + timeout
    while time.time() < end:
        value = fn()
        if value:
            return value
        time.sleep(every)
    return fn()


def view(page, i: int = 0, timeout_s: float = 150.0):
    """The i-th browser view's frame, once its script has its arguments. The frame is looked up
    again every 10 s: a rerun may replace the view's iframe, and a wait on the replaced one never
    ends (a clean-clone run, 2026-12-07: one of three sessions opened at once waited 150 s on
    its first frame; alone, and twice in its module, the test passed in 45-70 s)."""
    from playwright.sync_api import Error

    # A comparison's two views carry both runs' records: on a loaded 2-core CI machine the
    # second one once took over 60 s to get its arguments (2026-12-02, a full clean-clone run;
    # 16 s alone).
    end = time.monotonic() + timeout_s
    while True:
        el = page.locator(VIEW).nth(i)
        el.wait_for(state="attached", timeout=60_000)
        handle = el.element_handle()
        frame = handle.content_frame() if handle is not None else None
        left_ms = max(1_000, min(10_000, (end - time.monotonic()) * 1000))
        try:
            if frame is not None:
                frame.wait_for_function("() => window.fluxo && window.fluxo.args", timeout=left_ms)
                return frame
        except Error:  # not yet (a timeout), or that frame was detached: look it up again
            pass
        if time.monotonic() >= end:
            raise TimeoutError(f"view {i} got no arguments in {timeout_s:.0f} s")
