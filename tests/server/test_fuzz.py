"""Hostile input: thousands of malformed messages, each answered by an ``error`` with a code; the
connection stays open and the server then serves a normal chat exactly as before."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_client import direct_greedy, open_client, url, wait_idle

KNOWN = {
    "chat",
    "cancel",
    "subscribe",
    "unsubscribe",
    "auth",
    "export",
    "control",
    "pause",
    "resume",
    "step",
    "traffic",
    "reset",
    "compare",
}
EXPECTED_CODES = {
    "bad_json",
    "bad_utf8",
    "unknown_type",
    "bad_field",
    "message_too_large",
    "forbidden",
    "bad_token",
    "empty_prompt",
    "invalid_token_ids",
    "prompt_too_long",
    "invalid_max_tokens",
    "invalid_sampling",
    "unknown_mode",
    "invalid_config",
    "unknown_request",
}
LIMIT = 4096  # the fuzzed server's max_message_bytes, small so "huge" is cheap

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
not_int = (
    st.none()
    | st.booleans()
    | st.floats()
    | st.text(max_size=10)
    | st.lists(st.integers(), max_size=3)
)
bad_int = not_int | st.integers(max_value=0) | st.integers(min_value=10**6, max_value=2**80)


def obj(kind: str, **fields) -> st.SearchStrategy[str]:
    return st.fixed_dictionaries({"type": st.just(kind), **fields}).map(json.dumps)


hostile = st.one_of(
    # not JSON at all
    st.text(max_size=50).filter(lambda s: not _is_json(s)),
    # JSON, but not an object
    (json_scalars | st.lists(json_values, max_size=3)).map(json.dumps),
    # objects without a known type
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "type"), json_values, max_size=4).map(
        json.dumps
    ),
    st.fixed_dictionaries(
        {"type": (json_values.filter(lambda v: not isinstance(v, str) or v not in KNOWN))}
    ).map(json.dumps),
    # chats with one thing wrong
    obj("chat"),
    obj("chat", prompt=st.just("hi"), messages=st.just([{"role": "user", "content": "hi"}])),
    obj("chat", prompt=not_int.filter(lambda v: not isinstance(v, str))),
    obj("chat", prompt=st.text(max_size=5).filter(lambda s: not s.strip())),
    obj("chat", messages=json_values.filter(lambda v: not (isinstance(v, list) and v))),
    obj(
        "chat",
        messages=st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.text(max_size=5).filter(
                        lambda r: r not in ("system", "user", "assistant")
                    ),
                    "content": st.text(max_size=5),
                }
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    obj("chat", prompt=st.just("hello"), max_tokens=bad_int),
    obj(
        "chat",
        prompt=st.just("hello"),
        temperature=st.floats(min_value=10.001) | st.floats(max_value=-0.001) | st.text(max_size=3),
    ),
    obj(
        "chat",
        prompt=st.just("hello"),
        top_p=st.floats(min_value=1.001) | st.just(0) | st.floats(max_value=-0.001),
    ),
    obj(
        "chat",
        prompt=st.just("hello"),
        seed=st.integers(max_value=-1) | st.floats() | st.text(max_size=3),
    ),
    obj("chat", prompt=st.just("word " * 700)),  # under the byte limit, over the context
    # other messages with bad fields
    obj("cancel", request=bad_int | st.integers(10**7, 10**9)),
    obj("subscribe", history=st.integers(max_value=-1) | st.text(max_size=3) | st.floats()),
    obj("export", format=st.text(max_size=6).filter(lambda f: f not in ("jsonl", "chrome"))),
    obj(
        "control",
        policy=st.text(max_size=8).filter(lambda p: p not in ("static", "continuous", "chunked")),
    ),
    obj("control", runner=json_values.filter(lambda p: p not in ("sync", "async"))),
    obj("control", max_slots=bad_int.filter(lambda v: not (isinstance(v, int) and 1 <= v <= 256))),
    obj("control", kv_blocks=st.integers(max_value=0) | st.text(max_size=3)),
    obj(
        "control",
        fill_timeout_s=st.floats(max_value=-0.1) | st.floats(min_value=3601) | st.text(max_size=3),
    ),
    obj("control", **{st_key: st.integers() for st_key in ("dtype", "model", "block_size")}),
    obj("traffic", action=json_values.filter(lambda a: a not in ("start", "stop"))),
    obj(
        "traffic",
        action=st.just("start"),
        rate=st.floats(max_value=0) | st.floats(min_value=500.5) | st.text(max_size=3),
    ),
    obj("auth", token=not_int.filter(lambda v: not isinstance(v, str))),
    obj(
        "compare",
        workload=st.text(max_size=6).filter(
            lambda w: w not in ("batching", "stall", "uniform", "memory", "overlap")
        ),
    ),
    # too big; non-UTF-8 bytes in a binary frame
    st.integers(LIMIT + 1, 3 * LIMIT).map(
        lambda n: json.dumps({"type": "chat", "prompt": "x" * n})
    ),
    st.binary(min_size=1, max_size=40).filter(lambda b: not _is_utf8(b)),
)


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
        return True
    except ValueError:
        return False


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.model  # SmolLM2
def test_hostile_messages_get_coded_errors_and_the_server_keeps_serving(serve, smollm2):
    from engine.server.connection import Limits

    # A short context, so a prompt under the byte limit can still be over it.
    server = serve(
        limits=Limits(max_message_bytes=LIMIT, max_requests_per_s=1e6), max_model_len=512
    )
    counts: dict[str, int] = {}

    async def volley(frames: list[str | bytes]) -> None:
        c = await open_client(url(server))
        for frame in frames:
            await c.send(frame)
        for frame in frames:  # one answer per frame, in order
            msg = await c.until(
                lambda m: m["type"] in ("error", "accepted", "state", "ok", "export", "history"),
                timeout=60,
            )
            assert msg["type"] == "error", (frame[:200], msg)
            assert msg["code"] in EXPECTED_CODES and msg["message"], msg
            counts[msg["code"]] = counts.get(msg["code"], 0) + 1
        await c.ws.close()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(hostile, min_size=20, max_size=60))
    def fuzz(frames):
        asyncio.run(volley(frames))

    fuzz()
    # every example ran and every frame was answered with a code: 60 lists of at least 20 frames
    # (1500 was the mean hypothesis happens to draw, and a quiet clean-clone run drew 1433)
    assert sum(counts.values()) >= 60 * 20, counts
    assert {"bad_json", "unknown_type", "bad_field", "message_too_large", "bad_utf8"} <= set(
        counts
    ), counts

    # Unharmed: a normal chat streams exactly the engine's greedy answer.
    ((ids, text),) = direct_greedy(smollm2, ["What is the capital of France?"], 12)

    async def normal():
        c = await open_client(url(server))
        return await c.chat("What is the capital of France?", 12)

    _, streamed, done, tokens = asyncio.run(normal())
    assert done["type"] == "done" and [t["token_id"] for t in tokens] == ids and streamed == text
    asyncio.run(wait_idle(server))
    assert server.engine.blocks.num_used == 0


def test_viewer_is_refused_control_without_the_token(serve):
    server = serve("tiny", token="tok")  # roles only: no forward runs

    async def main():
        c = await open_client(url(server))
        for kind in sorted({"control", "pause", "resume", "step", "traffic", "reset", "compare"}):
            await c.send({"type": kind})
            err = await c.until(lambda m: m["type"] == "error")
            assert err["code"] == "forbidden", (kind, err)

    asyncio.run(main())


def test_an_abusive_client_is_disconnected_and_others_are_not(serve):
    from engine.server.connection import Limits

    server = serve("tiny", limits=Limits(abuse_errors=50))

    async def main():
        bad, good = await open_client(url(server)), await open_client(url(server))
        for _ in range(80):
            await bad.send("nope")
        closed = False
        try:
            for _ in range(100):
                await bad.recv(10)
        except Exception as exc:  # noqa: BLE001 - the close arrives as an exception from recv
            closed = "1008" in str(exc) or "too many" in str(exc)
        assert closed
        _, _, done, _ = await good.chat("Say hi.", 3)
        assert done["type"] == "done"

    asyncio.run(main())
