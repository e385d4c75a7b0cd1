"""A whole class on one server: every connection chats under its own limits, a waiting request is
told its place in the queue, and a comparison holds the live engine and its traffic."""

from __future__ import annotations

import asyncio
import time

import pytest
from server_client import open_client, url, wait_idle

from engine.server.connection import Limits


def test_ten_clients_chat_at_once_and_waiting_requests_learn_their_place(serve):
    # Positions, not text. Places are polled every 0.1 s: the queue must drain slower than that,
    # or the last in line sees only its admission (seen in CI, 2026-12-01: 6-token answers of the
    # tiny model, five waves of two, all done within one poll). With 12 forced tokens and 10 ms of
    # host work a step, the 10th waits 4 waves x 12 steps x >= 10 ms = >= 480 ms: >= 4 polls.
    server = serve("tiny", max_slots=2, host_work_ms=10.0, limits=Limits(queue_report_s=0.1))

    async def main():
        clients = [await open_client(url(server)) for _ in range(10)]
        await clients[0].send({"type": "pause"})
        await clients[0].until(lambda m: m["type"] == "state" and m["paused"])
        for i, c in enumerate(clients):
            await c.send(
                {
                    "type": "chat",
                    "prompt": f"Count to {i + 3}.",
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "ref": f"q{i}",
                }
            )
        accepted = [await c.until(lambda m: m["type"] in ("accepted", "error")) for c in clients]
        assert [a["type"] for a in accepted] == ["accepted"] * 10, accepted  # nobody refused
        assert sorted(a["queue_position"] for a in accepted) == list(range(1, 11))
        await clients[0].send({"type": "resume"})
        ends = await asyncio.gather(
            *(c.until(lambda m: m["type"] in ("done", "error")) for c in clients)
        )
        assert [e["type"] for e in ends] == ["done"] * 10
        return clients, accepted

    clients, accepted = asyncio.run(main())
    last = max(range(10), key=lambda i: accepted[i]["queue_position"])  # the 10th in line
    seen = [m["position"] for m in clients[last].seen if m["type"] == "queued"]
    assert seen and seen[-1] == 0, seen  # told when it was admitted
    waiting = [p for p in seen if p > 0]
    assert waiting == sorted(waiting, reverse=True) and waiting[0] < 10  # it moved up the queue
    for c in clients:
        assert not [
            m
            for m in c.seen
            if m["type"] == "queued" and m["ref"] not in {f"q{i}" for i in range(10)}
        ]


TRAFFIC = {
    "type": "traffic",
    "action": "start",
    **{"rate": 8, "prompts": "chat", "lengths": "uniform", "median": 8, "max_tokens": 8},
}


async def stepped_past(server, step: int, timeout: float) -> int:
    """The live engine's step count once it has gone past ``step`` (or at the timeout)."""
    end = time.monotonic() + timeout
    while server.engine.step_count <= step and time.monotonic() < end:
        await asyncio.sleep(0.1)
    return server.engine.step_count


async def while_comparing(server) -> tuple[int, int]:
    """The live engine's step count and the traffic's arrivals, last seen while the comparison
    still ran (the server resumes both the moment it ends, before its answer reaches us)."""
    last = (server.engine.step_count, server.traffic_stats["sent"])
    while server._compare_running:
        seen = (server.engine.step_count, server.traffic_stats["sent"])
        if server._compare_running:
            last = seen
        await asyncio.sleep(0.05)
    return last


@pytest.mark.model  # SmolLM2
def test_a_comparison_holds_live_stepping_and_traffic(serve):
    server = serve(max_slots=4)

    async def main():
        presenter = await open_client(url(server))
        await presenter.send(TRAFFIC)
        await presenter.until(lambda m: m["type"] == "state" and m["traffic"])
        await asyncio.sleep(1.0)
        await presenter.send(
            {
                "type": "compare",
                "workload": "uniform",
                "a": {"policy": "static"},
                "b": {"policy": "continuous"},
                "scale": 0.1,
                "ref": "cmp",
            }
        )
        await presenter.until(lambda m: m["type"] == "state" and m["comparing"])
        # said once the live step in progress has ended: from here nothing live steps
        held_step, held_sent = server.engine.step_count, server.traffic_stats["sent"]
        watching = asyncio.create_task(while_comparing(server))
        await presenter.send({"type": "resume", "ref": "r"})
        refused = await presenter.until(lambda m: m.get("ref") == "r")
        result = await presenter.until(lambda m: m["type"] == "compare", timeout=600)
        step, sent = await watching
        during = (step - held_step, sent - held_sent)
        state = await presenter.until(lambda m: m["type"] == "state" and not m["comparing"])
        await presenter.send({"type": "traffic", "action": "stop"})
        after = await stepped_past(server, held_step + during[0], 120)
        return refused, result, during, state, after, held_step

    refused, result, during, state, after, held_step = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "compare_running"
    assert during == (0, 0), during  # no live step and no traffic arrival while the replays ran
    assert result["held"] == {"live_engine_paused": True, "traffic_held": True}
    ratios = result["ratios"]
    assert ratios["tokens_per_step_b_over_a"] > 0 and ratios["slot_steps_per_token_b_over_a"] > 0
    assert not state["paused"] and after > held_step  # live serving went on afterwards
    asyncio.run(wait_idle(server, 120))
