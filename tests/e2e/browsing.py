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


def wait(fn, timeout: float = 30.0, every: float = 0.2):
    end = time.time() + timeout
    while time.time() < end:
        value = fn()
        if value:
            return value
        time.sleep(every)
    return fn()


def view(page, i: int = 0):
    """The i-th browser view's frame, once its script has its arguments."""
    el = page.locator(VIEW).nth(i)
    el.wait_for(state="attached", timeout=60_000)
    frame = el.element_handle().content_frame()
    # A comparison's two views carry both runs' records: on a loaded 2-core CI machine the
    # second one once took over 60 s to get its arguments (2026-12-02, a full clean-clone run;
    # 16 s alone).
    frame.wait_for_function("() => window.fluxo && window.fluxo.args", timeout=150_000)
    return frame
