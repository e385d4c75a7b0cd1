"""Every lesson's claim, replayed on SmolLM2 (shortened), so no lesson can teach what the engine no longer shows.

The claims are measured, never hard-coded: each test runs the lesson's scenario (the same runs
``python -m engine.lesson N --short`` makes, one after the other in this process) and asserts the
claim in direction and rough size, with margin for a shared, noisy 2-core machine.
"""
from __future__ import annotations

import math
from typing import Any

import pytest

from engine.bench import warm_up
from engine.config import LIVE_FIELDS, EngineConfig
from engine.errors import FluxoError
from engine.scenario import CONFIG_FIELDS, OPS, SPECS, WORKLOADS, build_workload, engine_config, lesson_dirs, load, run_lesson

LESSONS = lesson_dirs()
REQUIRED = {"01-why-batches", "02-oven-vs-flow", "03-admission-stalls", "04-memory-is-the-stage", "05-cpu-and-accelerator"}
# The `traffic` message's vocabulary (docs/protocol.md), `action` aside.
TRAFFIC_FIELDS = {"rate", "prompts", "lengths", "median", "sigma", "max_tokens", "seed"}
CHARTS = {"Slot occupancy", "Admission stalls", "KV memory", "CPU/device timeline"}


# -- fast: files and scenario structure -------------------------------------------------------------
def test_every_lesson_is_there() -> None:
    assert REQUIRED <= {p.name for p in LESSONS}


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_files_and_scenario(path, tiny) -> None:
    for lang in ("pt-BR", "en"):
        text = (path / f"{lang}.md").read_text()
        assert len(text) > 1500 and "MEASURED_" not in text, f"{path.name}/{lang}.md is missing or unfinished"
    sc = load(path / "scenario.toml")
    assert sc["lesson"]["number"] == int(path.name[:2])
    # [engine] is sent as-is in a `control` message: live fields only, and valid.
    assert set(sc["engine"]) <= set(LIVE_FIELDS)
    EngineConfig(**sc["engine"])
    # [workload] restates the canonical workload the page's `compare` replays: they must not drift.
    wl = sc["workload"]
    assert {k: v for k, v in wl.items() if k not in ("name", "short_scale")} == {"groups": SPECS[wl["name"]]["groups"]}
    assert 0 < wl["short_scale"] <= 1
    _, tok = tiny
    assert build_workload(SPECS[wl["name"]], tok, wl["short_scale"])
    names = set()
    for r in sc["run"]:
        assert r.get("workload", wl["name"]) in WORKLOADS
        engine_config(sc["engine"], {k: v for k, v in r.items() if k in CONFIG_FIELDS})
        assert set(r) <= {"name", "workload", "scale", *CONFIG_FIELDS}
        names.add(r["name"])
    for c in sc["check"]:
        assert c["run"] in names and c.get("over", c["run"]) in names and c["op"] in OPS
    cmp_ = sc["compare"]
    assert cmp_["workload"] in WORKLOADS
    for side in ("a", "b"):
        engine_config(SPECS[cmp_["workload"]]["engine"], cmp_[side])
    assert sc["watch"]["chart"] in CHARTS and sc["watch"]["en"] and sc["watch"]["pt-BR"]
    assert set(sc["traffic"]) <= TRAFFIC_FIELDS


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_traffic_is_what_the_server_accepts(path) -> None:
    """The page starts a lesson's [traffic] with one `traffic` message: the server must accept it."""
    from engine.traffic import TrafficParams

    traffic = load(path / "scenario.toml")["traffic"]
    params = TrafficParams.from_message({"type": "traffic", "action": "start", **traffic})
    assert {k: getattr(params, k) for k in traffic} == traffic


def test_bad_scenario_config_is_refused() -> None:
    with pytest.raises(FluxoError):
        engine_config({"policy": "oven"}, {})
    with pytest.raises(FluxoError):
        engine_config({}, {"block_size": 8})  # not live: a lesson cannot set it


# -- slow: each lesson's claim on the real model ----------------------------------------------------
@pytest.fixture(scope="module")
def model(smollm2):
    warm_up(*smollm2)  # one-off costs of the first engine of a process are no lesson's business
    return smollm2


def lesson(number: int, model) -> dict[str, Any]:
    """Run lesson ``number`` shortened; on a shared CPU a timing claim that fails is measured once more."""
    path = next(p for p in LESSONS if int(p.name[:2]) == number)
    sc = load(path / "scenario.toml")
    result = run_lesson(*model, sc, short=True)
    if not all(c["ok"] for c in result["checks"]):
        result = run_lesson(*model, sc, short=True)
    return {name: r["summary"] | {"tokens": r["tokens"]} for name, r in result["runs"].items()} | {"_checks": result["checks"]}


def _failed(runs: dict[str, Any]) -> list[dict]:
    return [c for c in runs["_checks"] if not c["ok"]]


def test_lesson1_tokens_per_second_grow_with_batch(model) -> None:
    r = lesson(1, model)
    assert r["batch-8"]["decode_tput"] >= 3 * r["batch-1"]["decode_tput"], r
    assert r["batch-8"]["step_ms"] <= 2 * r["batch-1"]["step_ms"]
    assert not _failed(r), _failed(r)


def test_lesson2_flow_beats_oven_on_long_tails_only(model) -> None:
    r = lesson(2, model)
    assert r["continuous"]["throughput"] >= 2 * r["static"]["throughput"], _failed(r)
    assert r["cont-uniform"]["throughput"] < 1.5 * r["static-uniform"]["throughput"], _failed(r)
    assert r["static"]["dead_slot_fraction"] > 0.4 and r["continuous"]["dead_slot_fraction"] == 0
    assert not _failed(r), _failed(r)


def test_lesson3_admission_stalls_and_chunked_prefill(model) -> None:
    r = lesson(3, model)
    u, c = r["unchunked"], r["chunked"]
    assert u["running_itl_max"] >= 4 * u["running_itl_p50"], _failed(r)
    assert c["running_itl_p99"] <= 2 * c["running_itl_p50"], _failed(r)
    assert not _failed(r), _failed(r)


def test_lesson4_paged_memory_wastes_less_and_admits_more(model) -> None:
    r = lesson(4, model)
    res, pag = r["reserved"], r["paged"]
    assert pag["kv_waste"] < 0.5 * res["kv_waste"] and pag["kv_waste"] <= 0.15
    assert pag["peak_running"] > res["peak_running"]
    assert not _failed(r), _failed(r)


def test_lesson5_async_same_tokens_and_at_least_as_busy(model) -> None:
    r = lesson(5, model)
    assert r["async"]["tokens"] == r["sync"]["tokens"] == r["async-2"]["tokens"] == r["sync-2"]["tokens"]
    busy_sync = (r["sync"]["busy_fraction"] + r["sync-2"]["busy_fraction"]) / 2
    busy_async = (r["async"]["busy_fraction"] + r["async-2"]["busy_fraction"]) / 2
    assert not math.isnan(busy_async) and busy_async >= busy_sync - 0.02, (busy_async, busy_sync)
    assert not _failed(r), _failed(r)


def test_compare_replays_a_workload_under_two_configs(tiny) -> None:
    """What the server's `compare` message calls: both runs, their records, and the ratios."""
    from engine.scenario import compare

    out = compare(*tiny, "uniform", {"policy": "static", "dtype": "float64"},
                  {"policy": "continuous", "dtype": "float64"}, scale=0.2)
    assert out["workload"] == "uniform" and out["a"]["config"]["policy"] == "static"
    for side in ("a", "b"):
        assert out[side]["summary"]["useful_tokens"] == 5 * 32 and out[side]["steps"] and out[side]["requests"]
    assert math.isfinite(out["ratios"]["throughput_b_over_a"])
    with pytest.raises(FluxoError):
        compare(*tiny, "nope", {}, {}, 1.0)
    with pytest.raises(FluxoError):
        compare(*tiny, "uniform", {"policy": "oven"}, {}, 1.0)
