"""``python -m engine.lesson N --live`` (engine/lab/live_steps.py) against a real server on the tiny
model: it sets the lesson up as the Lessons page does, visits each [[live]] setting in order and
keeps the server's own headline summary; the teacher's table is rendered from that."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.lab import live_steps, live_tables, preflight
from engine.lab.scenario import lesson_dir, load
from tests.servers import start_engine, stop

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    # calibrated, as `make lab` starts it: the lessons' traffic is a load in units of capacity
    proc, ws_url = start_engine(tmp_path_factory.mktemp("live"))
    yield ws_url
    stop(proc)


def test_every_setting_is_visited_in_order(url) -> None:
    scenario = load(lesson_dir(1) / "scenario.toml")  # 1, 2, 4, 8 slots under chat traffic
    rows = asyncio.run(live_steps.visit(url, scenario, seconds=4.0))
    assert [r["name"] for r in rows] == ["1 slot", "2 slots", "4 slots", "8 slots"]
    assert [r["settings"].get("max_slots") for r in rows] == [None, 2, 4, 8]
    for r in rows:
        s = r["summary"]
        assert set(s) == set(live_steps.HEADLINE)
        assert s["throughput"] >= 0 and 0 <= s["slot_utilization"] <= 1
    # twice one slot's capacity: answers stream at every setting after the first window (right
    # after a reset, a loaded machine may show none), and the load came to a rate here
    assert all(r["summary"]["throughput"] > 0 for r in rows[1:])
    offered = rows[-1]["offered"]
    assert offered["load"] == 2.0 and offered["rate"] == round(2.0 * offered["capacity"], 3)
    assert rows[0]["engine"]["weights"] == "fp32"  # the tiny model has no quantized file


def test_the_teachers_table(url) -> None:
    scenario = load(lesson_dir(7) / "scenario.toml")  # a traffic setting: the load changes
    scenario["live"] = scenario["live"][:2]
    rows = asyncio.run(live_steps.visit(url, scenario, seconds=2.5))
    assert rows[1]["settings"] == {"traffic": {"load": 0.9}}
    assert rows[1]["offered"]["load"] == 0.9
    doc = {"when": "now", "load": "1.5", "seconds": 2.5, "engine_cpus": [1], "engine_threads": 1}
    en = live_tables.live_markdown(doc | {"rows": rows}, 7, "en")
    pt = live_tables.live_markdown(doc | {"rows": rows}, 7, "pt-BR")
    # the header, the rule, then one row per setting
    assert en.count("\n| ") == 2 and "| 0.9x capacity |" in en and "core(s) 1" in en
    assert "| 0,9x a capacidade |" in pt and "carga média 1,5" in pt
    assert "not measured yet" in live_tables.live_markdown(None, 7, "en")


def test_alternating_rounds_visit_a_b_b_a_and_average_their_windows(url) -> None:
    """``live_rounds = 2``: 2 slots, 8 slots, 8 slots, 2 slots (a watcher reads the server's
    config change by change), each row the mean of its two windows, said in the table."""
    from websockets.asyncio.client import connect

    scenario = load(lesson_dir(1) / "scenario.toml")
    scenario["live"] = [{"name": "2 slots", "max_slots": 2}, {"name": "8 slots", "max_slots": 8}]
    scenario["live_rounds"] = 2
    slots: list[int] = []

    async def watch(stop: asyncio.Event) -> None:
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "subscribe", "history": 0}))
            while not stop.is_set():
                try:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except TimeoutError:
                    continue
                if msg["type"] == "state" and msg["config"]["max_slots"] not in slots[-1:]:
                    slots.append(msg["config"]["max_slots"])

    async def main():
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        rows = await live_steps.visit(url, scenario, seconds=4.0)
        stop.set()
        await watcher
        return rows

    rows = asyncio.run(main())
    assert slots[-3:] == [2, 8, 2], slots
    assert [r["name"] for r in rows] == ["2 slots", "8 slots"]
    for r in rows:
        assert len(r["windows"]) == 2
        got = [w["slot_utilization"] for w in r["windows"]]
        assert r["summary"]["slot_utilization"] == pytest.approx(sum(got) / 2)
    doc = {"when": "now", "load": "1.0", "seconds": 4.0, "rounds": 2, "engine_cpus": None}
    en = live_tables.live_markdown(doc | {"engine_threads": 2, "rows": rows}, 1, "en")
    assert "4 windows of 2 s (A B, B A, ...)" in en, en
    scenario["live"][0] = {"name": "as set up"}  # a switch back could not restore 2 slots
    with pytest.raises(ValueError, match="same fields"):
        live_steps.rounds(scenario)


def test_a_bad_setting_is_a_coded_error(url) -> None:
    scenario = load(lesson_dir(1) / "scenario.toml")
    scenario["live"] = [{"name": "no slots", "max_slots": 0}]
    with pytest.raises(RuntimeError, match=r"error \[invalid_config\]"):
        asyncio.run(live_steps.visit(url, scenario, seconds=2.0))


def _run(rows: dict[str, float]) -> dict:
    return {"rows": [{"name": n, "summary": {"throughput": v}} for n, v in rows.items()]}


def test_live_claims_hold_only_when_every_run_shows_them() -> None:
    scenario = {
        "live": [{"name": "4 slots"}, {"name": "8 slots"}],
        "live_check": [
            {
                "metric": "throughput",
                "a": "4 slots",
                "b": "8 slots",
                "op": ">",
                "size": 1.4,
                "claim_en": "x",
            }
        ],
    }
    held = live_steps.check(scenario, [_run({"4 slots": 10, "8 slots": 15})] * 3)
    assert held[0]["ok"] and held[0]["min"] == held[0]["max"] == 1.5
    one_off = [_run({"4 slots": 10, "8 slots": 15}), _run({"4 slots": 10, "8 slots": 9.5})]
    assert not live_steps.check(scenario, one_off)[0]["ok"]  # one run the other way: not carried
    assert not live_steps.check(scenario, [_run({"4 slots": 0, "8 slots": 9})])[0]["ok"]  # no data
    # the right direction is not enough: 1.08x is a drift the class cannot see, not the effect
    drift = live_steps.check(scenario, [_run({"4 slots": 10, "8 slots": 10.8})])[0]
    assert not drift["ok"] and preflight.verdict(drift, drift["min"]) == "none"
    assert preflight.verdict(drift, 1.2) == "weak"  # past half the bound's distance, in logs
    assert preflight.verdict(drift, 1.5) == "shows" and preflight.verdict(drift, 0.9) == "none"
    text = live_tables.checks_markdown(held, "pt-BR")
    assert "1,50-1,50x" in text and "manteve: sim" in text and "≥ 1,40x" in text
    assert "3 execuções" in text and "runs" not in text


def test_a_no_effect_claim_holds_within_its_band() -> None:
    """Lesson 5's claim on a CPU: async's tokens/s within 1.15x of sync's, either way."""
    claim = {"metric": "throughput", "a": "sync", "b": "async", "op": "~", "size": 1.15}
    scenario = {"live": [{"name": "sync"}, {"name": "async"}], "live_check": [claim]}
    for b, ok in ((104, True), (90, True), (120, False), (80, False)):
        assert live_steps.check(scenario, [_run({"sync": 100, "async": b})])[0]["ok"] is ok
    assert preflight.verdict(claim, 1.25) == "weak" and preflight.verdict(claim, 1.5) == "none"
    bad = {**scenario, "live_check": [{**claim, "size": 0.9}]}
    with pytest.raises(ValueError, match="size"):
        live_steps.live_claims(bad)
    with pytest.raises(ValueError, match="size"):  # every claim states its effect's size
        live_steps.live_claims({**scenario, "live_check": [{**claim, "op": ">", "size": None}]})


def test_a_no_gain_claim_caps_the_gain_not_the_loss() -> None:
    """Lesson 5's claim, saturated: async gains at most 1.15x over sync (it may lose: on two
    shared cores its host thread takes one from the forward)."""
    claim = {"metric": "throughput", "a": "sync", "b": "async", "op": "<=", "size": 1.15}
    scenario = {"live": [{"name": "sync"}, {"name": "async"}], "live_check": [claim]}
    for b, ok in ((104, True), (80, True), (114, True), (120, False)):
        assert live_steps.check(scenario, [_run({"sync": 100, "async": b})])[0]["ok"] is ok
    assert preflight.verdict(claim, 1.25) == "weak" and preflight.verdict(claim, 1.5) == "none"
    with pytest.raises(ValueError, match="size"):
        live_steps.live_claims({**scenario, "live_check": [{**claim, "size": 0.9}]})


def test_the_preflight_visits_what_the_claims_name() -> None:
    """Lesson 1's preflight visits 1 and 8 slots (2 and 4 carried into 8, not visited); lesson 7
    the loads below and past the knee; a verdict per lesson, its weakest claim's."""
    one = preflight.visits(load(lesson_dir(1) / "scenario.toml"))
    assert [s["name"] for s in one["live"]] == ["1 slot", "8 slots"]
    assert one["live"][1]["max_slots"] == 8
    seven = preflight.visits(load(lesson_dir(7) / "scenario.toml"))
    assert [s["traffic"] for s in seven["live"][1:]] == [{"load": 1.3}]
    run = {
        "rows": [
            {"name": "1 slot", "summary": {"throughput": 100.0}, "offered": {"load": 2.0}},
            {"name": "8 slots", "summary": {"throughput": 130.0}},
        ]
    }
    p = preflight.verdicts(one, run)
    assert p["verdict"] == "weak" and p["claims"][0]["min"] == 1.3 and "Replay" in p["advice_en"]
    assert p["offered"] == {"load": 2.0}
    run["rows"][1]["summary"]["throughput"] = 250.0
    assert preflight.verdicts(one, run)["verdict"] == "shows"
    eight = preflight.visits(load(lesson_dir(8) / "scenario.toml"))
    assert preflight.verdicts(eight, {"rows": []})["verdict"] == "no_claim"
    # a window that saw nothing, or an effect that did not show, is measured again, longer
    assert not preflight.again(preflight.verdicts(one, run))  # it shows (250 over 100)
    assert not preflight.unmeasured(p) and preflight.again(p)  # weak: 130 over 100
    del run["rows"][1]["summary"]["throughput"]
    nothing = preflight.verdicts(one, run)
    assert nothing["verdict"] == "none" and preflight.unmeasured(nothing)
    assert preflight.again(nothing)
    run["rows"][1]["summary"]["throughput"] = 100.0
    flat = preflight.verdicts(one, run)
    assert not preflight.unmeasured(flat) and flat["verdict"] == "none" and preflight.again(flat)
    p["offered"] = {"load": 0.4, "rate": 0.38, "capacity": 0.94}
    text = preflight.line(11, "Write your own scheduler", p | {"seconds": 30.0})
    assert "0.38 requests/s here (capacity 0.94), windows of 30 s" in text
    assert "windows of" not in preflight.line(1, "x", p)


def test_a_live_claim_must_name_the_lessons_settings() -> None:
    bad = {
        "live": [{"name": "a"}],
        "live_check": [{"metric": "throughput", "a": "a", "b": "zz", "op": ">"}],
    }
    with pytest.raises(ValueError, match="must name"):
        live_steps.live_claims(bad)
    for path in (lesson_dir(n) for n in range(12)):
        live_steps.live_claims(
            load(path / "scenario.toml")
        )  # every lesson's claims are well formed


def test_every_lesson_carries_a_claim_on_the_live_page_or_says_why_not() -> None:
    """Each lesson's Live steps hold at least one [[live_check]], or its [live_none] says why the
    page cannot show the claim, and the student texts say so too."""
    for path in (lesson_dir(n) for n in range(12)):
        sc = load(path / "scenario.toml")
        if live_steps.live_claims(sc):
            continue
        why = sc.get("live_none")
        assert why and why["en"] and why["pt"], f"{path.name}: no [[live_check]] and no [live_none]"
        assert "replay" in (path / "en.md").read_text(), path.name


def test_a_live_claim_may_set_two_figures_of_one_setting() -> None:
    scenario = {
        "live": [{"name": "one"}],
        "live_check": [
            {
                "metric": "ttft_p50",
                "over_metric": "itl_p50",
                "a": "one",
                "b": "one",
                "op": ">",
                "size": 5.0,
            }
        ],
    }
    run = {"rows": [{"name": "one", "summary": {"ttft_p50": 0.2, "itl_p50": 0.01}}]}
    (held,) = live_steps.check(scenario, [run])
    assert held["ok"] and abs(held["min"] - 20.0) < 1e-9
    run["rows"][0]["summary"]["ttft_p50"] = 0.005  # a first token cheaper than the next: fails
    assert not live_steps.check(scenario, [run])[0]["ok"]
    assert "one: ttft_p50 / one: itl_p50" in live_tables.checks_markdown([held], "en")


def test_prose_may_quote_the_stored_live_run() -> None:
    from engine.lab.prose import prose_number

    measured = {
        "live": {
            "rows": [{"summary": {"itl_p99": 0.0953}}, {"summary": {"itl_p99": 0.0584}}],
            "checks": [{"min": 0.61, "max": 0.83}],
        }
    }
    assert prose_number(measured, "live:0,itl_p99@0x1000", "en") == "95"
    assert prose_number(measured, "live:1,itl_p99/0,itl_p99@2", "pt-BR") == "0,61"
    assert prose_number(measured, "live:check0,max@2", "en") == "0.83"
