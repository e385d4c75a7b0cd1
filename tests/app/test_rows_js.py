"""The browser view's rows (app/component/rows.js, run in real Chromium) equal app/charts' rows.

The recorded telemetry of real tiny-model runs (every policy, and the async runner) goes into a
blank Chromium page holding rows.js; every data function's rows must equal the Python function's
on the same records, exactly (same floats: the same operations in the same order). A variant of
the records carries ``expected_s`` (spiky, so steps slowed by the machine and admission stalls
both occur) and prefix-cache counts, so the honest-stall and shared/cached paths are compared too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from app import charts

ROWS_JS = Path(__file__).resolve().parents[2] / "app" / "component" / "rows.js"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"
    ),
    pytest.mark.browser,
]

JS = """([steps, people]) => {
  const R = window.FluxoRows;
  const ppl = new Set(people);
  const itl = R.itlPerStep(steps);
  const prefixes = [1, Math.floor(steps.length / 3), Math.floor(steps.length / 2), steps.length];
  const [win, spans] = R.fitWindow(steps, 300, ppl, 1500);
  return {
    slot_spans: R.slotSpans(steps, ppl), queue_series: R.queueSeries(steps), \
overview: R.overview(steps),
    overview_20: R.overview(steps, 20), fit_window: [win.map(r => r.step), spans],
    itl_per_step: itl, admission_markers: R.admissionMarkers(itl), \
machine_markers: R.machineMarkers(itl),
    stall_lines: R.stallLines(itl), prefill_bars: R.prefillBars(itl),
    kv_series: R.kvSeries(steps), kv_series_fine: R.kvSeries(steps, steps.length, 16),
    request_kv_tokens: \
prefixes.map(n => Array.from(R.requestKvTokens(steps.slice(0, n)).entries())),
    block_map: prefixes.map(n => R.blockMap(steps.slice(0, n))), \
block_map_small: R.blockMap(steps, 50),
    lane_spans: R.laneSpans(steps, 12), lane_spans_all: R.laneSpans(steps, 0),
    device_busy: R.deviceBusy(R.laneSpans(steps, 12)),
  };
}"""


def python_rows(steps: list[dict], people: set[int]) -> dict:
    itl = charts.itl_per_step(steps)
    prefixes = [1, len(steps) // 3, len(steps) // 2, len(steps)]
    win, spans = charts.fit_window(steps, 300, people, 1500)
    return {
        "slot_spans": charts.slot_spans(steps, people),
        "queue_series": charts.queue_series(steps),
        "overview": charts.overview(steps),
        "overview_20": charts.overview(steps, 20),
        "fit_window": [[r["step"] for r in win], spans],
        "itl_per_step": itl,
        "admission_markers": charts.admission_markers(itl),
        "machine_markers": charts.machine_markers(itl),
        "stall_lines": charts.stall_lines(itl),
        "prefill_bars": charts.prefill_bars(itl),
        "kv_series": charts.kv_series(steps),
        "kv_series_fine": charts.kv_series(steps, bins=len(steps), block_size=16),
        "request_kv_tokens": [
            [[k, v] for k, v in charts.request_kv_tokens(steps[:n]).items()] for n in prefixes
        ],
        "block_map": [charts.block_map(steps[:n]) for n in prefixes],
        "block_map_small": charts.block_map(steps, 50),
        "lane_spans": charts.lane_spans(steps, 12),
        "lane_spans_all": charts.lane_spans(steps, 0),
        "device_busy": charts.device_busy(charts.lane_spans(steps, 12)),
    }


def with_expected_and_prefix(steps: list[dict]) -> list[dict]:
    """The same records with ``expected_s`` (None for the first steps, as before the cost model is
    calibrated; then the measured duration, scaled down 3x on every 7th step so the machine seems to
    have slowed it) and prefix-cache counts (shared and cached blocks, cached prompt tokens)."""
    out = copy.deepcopy(steps)
    for i, rec in enumerate(out):
        dur = rec["t_end"] - rec["t_start"]
        rec["expected_s"] = None if i < 5 else (dur / 3 if i % 7 == 0 else dur * 0.9)
        kv = rec["kv"]
        kv["blocks_shared"] = min(kv["blocks_used"], i % 3)
        kv["blocks_cached"] = min(kv["blocks_total"] - kv["blocks_used"], i % 5)
        rec["cached_tokens"] = 16 * (i % 2) if rec["admitted"] else 0
    return out


@pytest.fixture(scope="module")
def js_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page()
        page.set_content("<!doctype html><html><body></body></html>")
        page.add_script_tag(path=str(ROWS_JS.with_name("records.js")))
        page.add_script_tag(path=str(ROWS_JS))
        yield page
        browser.close()


def normalize(value):
    """JSON round trip: tuples become lists, as the JS side's arrays."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked", "async"])
@pytest.mark.parametrize("variant", ["recorded", "expected_and_prefix"])
def test_js_rows_equal_python_rows(js_page, runs, policy, variant):
    steps, requests = runs[policy]
    if variant == "expected_and_prefix":
        steps = with_expected_and_prefix(steps)
    people = {r["id"] for r in requests if r["client"] != "traffic"}
    got = js_page.evaluate(JS, [steps, sorted(people)])
    want = normalize(python_rows(steps, people))
    assert set(got) == set(want)
    for name in want:
        assert got[name] == want[name], f"{name} differs ({policy}, {variant})"
    if variant == "expected_and_prefix":  # the classification paths were exercised
        itl = want["itl_per_step"]
        assert any(r["slow"] for r in itl) and any(r["stall"] for r in itl)
        assert any(r["state"] == "shared" and r["tokens"] for r in want["kv_series_fine"])
        assert any(c["state"] == "cached" for m in want["block_map"] for c in m)


CHART_ROWS_JS = """([steps, people, meta]) => {
  const R = window.FluxoRows;
  const rows = {};
  for (const [name, m] of Object.entries(meta)) {
    rows[name] = [true, false].map(o => R.CHART_ROWS[name](steps, m.window, new Set(people), o));
  }
  return {rows, names: Object.keys(R.CHART_ROWS)};
}"""


@pytest.mark.parametrize("policy", ["static", "continuous", "async"])
def test_every_registered_chart_gets_its_datasets_from_rows_js(js_page, runs, policy):
    """rows.js feeds every chart of app/charts/registry.py, no more and no fewer, exactly the
    datasets the registry declares, equal to the registry's Python twins, and each row is the
    only one with its declared key (the view updates rows by key)."""
    steps, requests = runs[policy]
    people = {r["id"] for r in requests if r["client"] != "traffic"}
    meta = charts.view_meta(list(charts.BY_NAME))
    got = js_page.evaluate(CHART_ROWS_JS, [steps, sorted(people), meta])
    assert sorted(got["names"]) == sorted(charts.BY_NAME)
    for c in charts.CHARTS:
        for js, with_overview in zip(got["rows"][c.name], (True, False), strict=True):
            assert js == normalize(c.rows(steps, people, c.window, with_overview)), c.name
        assert set(got["rows"][c.name][0]) == set(charts.DATASETS[c.name]), c.name
        for data, fields in c.datasets:
            keys = [tuple(r[f] for f in fields) for r in got["rows"][c.name][0][data]]
            assert len(keys) == len(set(keys)), (c.name, data)
    if policy == "static":  # the tokens chart shows a closed batch's dead tokens
        assert any(
            r["phase"] == "dead" and r["tokens"] for r in got["rows"]["tokens"][0]["step_tokens"]
        )
