"""The tokens-per-step chart, picked alone, on lesson 2's recording in pt-BR (no engine): the
closed batch (run a, static) shows dead tokens, the batch that never closes (run b) none; the
view's frame keeps the height of its one chart. The screenshot is
tests/artifacts/14-tokens-pt-BR.png."""

from __future__ import annotations

from .browsing import ARTIFACTS, VIEW, view

REC = "02-oven-vs-flow"
FED = """() => {
  const rows = Array.from((fluxo.rows["tokens/step_tokens"] || new Map()).values());
  const sum = p => rows.filter(r => r.phase === p).reduce((a, r) => a + r.tokens, 0);
  return {n: rows.length, dead: sum("dead"), decode: sum("decode"), prefill: sum("prefill")};
}"""


def _tokens(page, offline: str, run: str) -> dict:
    page.goto(f"{offline}/?lang=pt-BR&src=rec&rec={REC}&run={run}&chart=tokens")
    frame = view(page)
    frame.wait_for_function(
        "() => fluxo.renders > 0 && fluxo.buffer.length && fluxo.rows['tokens/step_tokens']"
    )
    assert frame.evaluate("() => Object.keys(fluxo.views)") == ["tokens"]
    return frame.evaluate(FED) | {"title": frame.locator("#chart-tokens").inner_text()}


def test_the_tokens_chart_shows_the_closed_batch_s_dead_tokens(offline, browser):
    page = browser.new_page(viewport={"width": 1366, "height": 1000})
    static = _tokens(page, offline, "a")
    # The frame is as tall as the one chart and stays so (it grew ~1,000 px a second before: the
    # document's scrollHeight, never below the frame's own height, plus a margin, on each message).
    heights = []
    for _ in range(3):
        page.wait_for_timeout(1000)
        heights.append(page.locator(VIEW).bounding_box()["height"])
    assert heights[0] == heights[-1] < 1500, heights
    page.locator(VIEW).screenshot(path=str(ARTIFACTS / "14-tokens-pt-BR.png"))
    flow = _tokens(page, offline, "b")
    page.close()
    assert static["n"] and static["n"] % 3 == 0  # one row per step and phase
    assert static["dead"] > 0 and static["decode"] > 0 and static["prefill"] > 0
    assert flow["dead"] == 0 and flow["decode"] > 0
