"""The protocol end to end: a real server on a loopback port, real websocket clients, SmolLM2."""

from __future__ import annotations

import asyncio
import json

import pytest
from server_client import direct_greedy, open_client, url, wait_idle

pytestmark = [pytest.mark.slow, pytest.mark.model]  # SmolLM2 servers (3 tests: the tiny one)

PROMPTS = [
    "What is the capital of France?",
    "Écris une phrase sur la mer, avec des accents.",
    "Write a haiku about the sea. Use an emoji 🌊 too.",
]


def test_streamed_text_equals_the_engines_direct_greedy_output(serve, smollm2):
    server = serve()
    expected = direct_greedy(smollm2, PROMPTS, 24)

    async def main():
        clients = [await open_client(url(server)) for _ in PROMPTS]
        return await asyncio.gather(
            *(c.chat(p, 24) for c, p in zip(clients, PROMPTS, strict=False))
        )

    results = asyncio.run(main())
    for (_rid, text, done, tokens), (ids, ref_text) in zip(results, expected, strict=False):
        assert done["type"] == "done" and done["status"] == "finished"
        assert [t["token_id"] for t in tokens] == ids
        assert [t["index"] for t in tokens] == list(range(len(ids)))
        assert text == ref_text  # deltas are UTF-8 safe: accents and emoji come through whole
        stats = done["stats"]
        assert stats["output_tokens"] == len(ids) and stats["prompt_tokens"] > 10
        assert 0 < stats["ttft_s"] < stats["duration_s"]
    assert "Paris" in results[0][1]


def test_hello_state_and_exactly_one_terminal_message(serve):
    server = serve()

    async def main():
        c = await open_client(url(server))
        hello = c.seen[0]
        assert hello["role"] == "presenter" and hello["client"].startswith("c")
        assert (
            hello["limits"]["max_open_requests"] == 4
            and hello["state"]["config"]["policy"] == "continuous"
        )
        rid, _, done, _ = await c.chat("Say hi.", 6, ref="x")
        assert done["ref"] == "x" and done["request"] == rid
        await asyncio.sleep(0.3)  # nothing else may follow the terminal message
        for msg in await c.drain(0.2):
            assert msg.get("request") != rid, msg

    asyncio.run(main())


def test_cancel_frees_kv_at_once_and_ends_with_cancelled(serve):
    server = serve()

    async def main():
        c = await open_client(url(server))
        await c.send(
            {
                "type": "chat",
                "prompt": "Tell me a very long story about a dragon.",
                "max_tokens": 400,
                "ref": "long",
            }
        )
        acc = await c.until(lambda m: m["type"] == "accepted")
        await c.until(lambda m: m["type"] == "token" and m["index"] >= 2)
        await c.send({"type": "cancel", "request": acc["request"]})
        done = await c.until(lambda m: m["type"] == "done")
        assert done["status"] == "cancelled" and done["stats"]["output_tokens"] < 400
        await wait_idle(server)
        assert server.engine.blocks.num_used == 0
        await c.send({"type": "cancel", "request": acc["request"]})
        err = await c.until(lambda m: m["type"] == "error")
        assert err["code"] == "unknown_request"

    asyncio.run(main())


def test_control_broadcasts_state_and_bad_modes_get_codes(serve):
    server = serve()

    async def main():
        a, b = await open_client(url(server)), await open_client(url(server))
        await a.send({"type": "control", "policy": "static", "max_slots": 4, "runner": "async"})
        for c in (a, b):
            st = await c.until(lambda m: m["type"] == "state" and m["config"]["policy"] == "static")
            assert st["config"]["max_slots"] == 4 and st["config"]["runner"] == "async"
        for bad, code in (
            ({"policy": "oven"}, "unknown_mode"),
            ({"runner": "warp"}, "unknown_mode"),
            ({"max_slots": "eight"}, "invalid_config"),
            ({"max_slots": 0}, "invalid_config"),
            ({"block_size": 4}, "invalid_config"),
            ({}, "bad_field"),
        ):
            await a.send({"type": "control", **bad})
            err = await a.until(lambda m: m["type"] == "error")
            assert err["code"] == code, (bad, err)
        # The engine applies the switch between steps and keeps serving under it.
        _, text, done, _ = await a.chat("What is the capital of France?", 10)
        assert done["status"] == "finished" and "Paris" in text
        assert server.engine.config.policy == "static" and server.engine.config.runner == "async"

    asyncio.run(main())


def test_subscribe_history_steps_metrics_and_pause_step_resume(serve):
    server = serve()

    async def main():
        c = await open_client(url(server))
        await c.chat("Say hi.", 4)
        w = await open_client(url(server))
        await w.send({"type": "subscribe", "history": 50})
        hist = await w.until(lambda m: m["type"] == "history")
        assert hist["steps"] and hist["steps"][-1]["step"] == server.engine.step_count
        assert {"step", "slots", "kv", "spans", "admitted", "queue_len"} <= set(hist["steps"][0])
        await c.send({"type": "step"})
        assert (await c.until(lambda m: m["type"] == "error"))["code"] == "not_paused"
        await c.send({"type": "pause"})
        await c.until(lambda m: m["type"] == "state" and m["paused"])
        await c.send({"type": "chat", "prompt": "Count to five.", "max_tokens": 8, "ref": "p"})
        await c.until(lambda m: m["type"] == "accepted")
        await asyncio.sleep(0.3)
        assert server.engine.queue_len() == 1  # paused: nothing moves
        before = server.engine.step_count
        for _ in range(3):
            await c.send({"type": "step"})
            rec = (await w.until(lambda m: m["type"] == "step"))["record"]
            assert rec["step"] > before
        # One prefill step (the first token) and two decode steps: three tokens, then nothing.
        await c.until(
            lambda m: m["type"] == "token" and m["ref"] == "p" and m["index"] == 2, timeout=10
        )
        await asyncio.sleep(0.3)
        for msg in await c.drain(0.1):
            assert msg["type"] != "token", msg
        await c.send({"type": "resume"})
        done = await c.until(lambda m: m["type"] == "done")
        assert done["stats"]["output_tokens"] == 8
        metrics = await w.until(lambda m: m["type"] == "metrics", timeout=5)
        assert (
            metrics["summary"]["useful_tokens"] > 0
            and 0 <= metrics["summary"]["busy_fraction"] <= 1
        )

        # The request's record may have come before the metrics message (waiting for that one
        # read past it): look at what the watcher has seen first.
        def is_end(m: dict) -> bool:
            return m["type"] == "request" and m["record"]["id"] == done["request"]

        ended = next((m for m in w.seen if is_end(m)), None) or await w.until(is_end)
        assert ended["record"]["status"] == "finished"

    asyncio.run(main())


def test_traffic_generator_tags_its_requests_and_stops(serve):
    server = serve()

    async def main():
        c = await open_client(url(server))
        await c.send({"type": "subscribe", "history": 0})
        await c.send(
            {
                "type": "traffic",
                "action": "start",
                "rate": 8,
                "prompts": "mixed",
                "lengths": "lognormal",
                "median": 8,
                "sigma": 0.5,
                "max_tokens": 16,
                "seed": 3,
            }
        )
        st = await c.until(lambda m: m["type"] == "state" and m["traffic"])
        assert st["traffic"]["rate"] == 8
        ended = [await c.until(lambda m: m["type"] == "request") for _ in range(3)]
        assert all(r["record"]["client"] == "traffic" for r in ended)
        await c.send({"type": "traffic", "action": "stop"})
        await c.until(lambda m: m["type"] == "state" and m["traffic"] is None)
        for bad in (
            {"rate": 0},
            {"rate": 1000},
            {"lengths": "zipf"},
            {"prompts": 3},
            {"median": 500, "max_tokens": 16},
        ):
            await c.send({"type": "traffic", "action": "start", **bad})
            assert (await c.until(lambda m: m["type"] == "error"))["code"] == "invalid_config"
        await c.send({"type": "traffic", "action": "go"})
        assert (await c.until(lambda m: m["type"] == "error"))["code"] == "bad_field"
        assert server.traffic is None

    asyncio.run(main())


def test_presenter_token_roles(serve):
    server = serve(token="s3cret")

    async def main():
        viewer = await open_client(url(server))
        assert viewer.seen[0]["role"] == "viewer"
        for kind in ("control", "pause", "traffic", "reset", "step"):
            await viewer.send({"type": kind, "policy": "static", "action": "start"})
            assert (await viewer.until(lambda m: m["type"] == "error"))["code"] == "forbidden"
        _, _, done, _ = await viewer.chat("Say hi.", 4)  # viewers chat
        assert done["type"] == "done"
        await viewer.send({"type": "auth", "token": "wrong"})
        assert (await viewer.until(lambda m: m["type"] == "error"))["code"] == "bad_token"
        await viewer.send({"type": "auth", "token": "s3cret"})
        assert (await viewer.until(lambda m: m["type"] == "state"))["role"] == "presenter"
        await viewer.send({"type": "control", "policy": "chunked"})
        await viewer.until(lambda m: m["type"] == "state" and m["config"]["policy"] == "chunked")
        by_url = await open_client(url(server, "?token=s3cret"))
        assert by_url.seen[0]["role"] == "presenter"

    asyncio.run(main())


def test_bound_beyond_loopback_without_auth_everyone_is_a_viewer(serve):
    server = serve(host="0.0.0.0", token="t0k")

    async def main():
        c = await open_client(url(server))
        assert c.seen[0]["role"] == "viewer"
        await c.send({"type": "control", "policy": "static"})
        assert (await c.until(lambda m: m["type"] == "error"))["code"] == "forbidden"

    asyncio.run(main())


def test_export_and_reset(serve):
    server = serve()

    async def main():
        c = await open_client(url(server))
        await c.chat("Say hi.", 5)
        await c.send({"type": "export", "format": "jsonl"})
        exp = await c.until(lambda m: m["type"] == "export")
        lines = [json.loads(line) for line in exp["data"].splitlines()]
        assert {line["type"] for line in lines} == {"step", "request"}
        await c.send({"type": "export", "format": "chrome"})
        trace = (await c.until(lambda m: m["type"] == "export"))["data"]
        assert any(e.get("name", "").startswith("compute") for e in trace["traceEvents"])
        await c.send({"type": "control", "policy": "static", "max_slots": 2})
        await c.send(
            {
                "type": "traffic",
                "action": "start",
                "rate": 5,
                "lengths": "uniform",
                "median": 30,
                "max_tokens": 64,
            }
        )
        await c.until(lambda m: m["type"] == "state" and m["traffic"])
        await asyncio.sleep(1.0)
        await c.send({"type": "reset"})
        st = await c.until(
            lambda m: (
                m["type"] == "state"
                and m["traffic"] is None
                and m["config"]["policy"] == "continuous"
            )
        )
        assert st["config"]["max_slots"] == 8
        await wait_idle(server)
        assert server.engine.blocks.num_used == 0 and not server.engine.telemetry.steps

    asyncio.run(main())


def test_non_finite_numbers_go_out_as_null():
    from engine.server.protocol import dumps

    text = dumps(
        {"type": "compare", "ratios": {"a": float("nan"), "b": [1.5, float("inf")]}, "n": 3}
    )
    assert json.loads(text) == {"type": "compare", "ratios": {"a": None, "b": [1.5, None]}, "n": 3}


def test_traffic_in_units_of_capacity(serve):
    """``load`` is a multiple of the requests/s at which the engine would be 100 % busy with this
    traffic (engine/workloads/capacity.py): the server sets the rate from it once, against the
    configuration in force, and says both; later switches meet the same arrivals."""
    server = serve(model="tiny", calibrate=True, max_slots=2)
    traffic = {"type": "traffic", "action": "start", "prompts": "chat", "lengths": "uniform"}
    traffic |= {"median": 8, "max_tokens": 16}

    async def main():
        c = await open_client(url(server))
        await c.send({**traffic, "load": 0.5})
        st = await c.until(lambda m: m["type"] == "state" and m["traffic"])
        cap = st["traffic"]["capacity"]
        assert cap > 0 and st["traffic"]["load"] == 0.5
        assert st["traffic"]["rate"] == round(0.5 * cap, 3)
        await c.send({"type": "control", "max_slots": 8})  # the same arrivals meet more slots
        st = await c.until(lambda m: m["type"] == "state" and m["config"]["max_slots"] == 8)
        assert st["traffic"]["rate"] == round(0.5 * cap, 3)
        await c.send({**traffic, "load": 0.5})  # sized anew: 8 slots serve more than 2
        st = await c.until(
            lambda m: m["type"] == "state" and m["traffic"] and m["traffic"]["capacity"] != cap
        )
        assert st["traffic"]["capacity"] > cap
        await c.send({**traffic, "rate": 3.0})  # requests/s stays available, said in units too
        st = await c.until(lambda m: m["type"] == "state" and m["traffic"]["rate"] == 3.0)
        assert st["traffic"]["load"] is None and st["traffic"]["capacity"] > 0
        for bad in ({"load": 0}, {"load": 11}, {"load": "x"}):
            await c.send({**traffic, **bad})
            assert (await c.until(lambda m: m["type"] == "error"))["code"] == "invalid_config"
        await c.send({"type": "traffic", "action": "stop"})

    asyncio.run(main())


def test_a_load_needs_a_fitted_cost_model(serve):
    server = serve(model="tiny")  # not calibrated, no step run yet

    async def main():
        c = await open_client(url(server))
        await c.send({"type": "traffic", "action": "start", "load": 1.0})
        err = await c.until(lambda m: m["type"] == "error")
        assert err["code"] == "invalid_config" and "rate" in err["message"]

    asyncio.run(main())


def test_one_handler_for_every_kind_the_protocol_knows(serve):
    """The server's dispatch table answers each message type the protocol accepts, and no other
    (a type parsed but unhandled would be an internal error; one handled but never parsed, dead)."""
    from engine.server import protocol

    server = serve(model="tiny")
    assert set(server.handlers) == protocol.VIEWER_TYPES | protocol.PRESENTER_TYPES
