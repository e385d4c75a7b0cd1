"""The sidecar's translation (engine/observe/translate.py) and the observer's pure parts
(observer/fluxo_vllm_observer/record.py, publish.py) on records captured from the real vLLM 0.32
on this machine (fixtures/: 32 chats, half with a shared ~330-token system prompt; written by
FLUXO_OBSERVE_CAPTURE=... pytest tests/observe/test_vllm_live.py)."""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import pytest

from engine.observe.launch import ROOT, free_port
from engine.observe.translate import ObserverMismatch, Translator

sys.path.insert(0, str(ROOT / "observer"))  # the observer's pure modules import nothing of vLLM
from fluxo_vllm_observer.publish import Publisher  # noqa: E402
from fluxo_vllm_observer.record import phase_of, shared_blocks  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_0.32_rank0.jsonl"


@pytest.fixture(scope="module")
def wire() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def translate(records: list[dict]) -> tuple[Translator, list[dict], list[dict]]:
    tr = Translator(epoch=records[0]["t"][0])
    steps, ended = [], []
    for r in records:
        step, gone = tr.feed(copy.deepcopy(r))
        steps.append(step)
        ended += gone
    return tr, steps, ended


def test_phase_prefill_decode_and_recompute():
    assert phase_of(0, 41, 41, 41) == "prefill"  # a whole prompt
    assert phase_of(128, 200, 328, 328) == "prefill"  # the last chunk after a prefix hit
    assert phase_of(45, 1, 41, 46) == "decode"  # one new token
    assert phase_of(0, 46, 41, 46) == "prefill"  # recomputed after a preemption
    assert phase_of(41, 4, 41, 46) == "prefill"  # ... its output tokens too
    assert shared_blocks([1, 2, 3, 1]) == 2


def test_every_request_ends_once_and_holds_one_lane(wire):
    tr, steps, ended = translate(wire)
    assert len(ended) == len({r["id"] for r in ended}) == len(tr.ids)
    for step in steps:
        held = [s["request"] for s in step["slots"] if s["request"] is not None]
        assert len(held) == len(set(held)) <= wire[0]["limits"]["max_num_seqs"]
        assert [s["slot"] for s in step["slots"]] == list(range(len(step["slots"])))
    lane = {}  # a request keeps its lane from admission to its end
    for step in steps:
        for s in step["slots"]:
            if s["request"] is not None:
                assert lane.setdefault(s["request"], s["slot"]) == s["slot"]


def test_tokens_and_times_agree_with_the_records(wire):
    tr, steps, ended = translate(wire)
    out = sum(sum(r["out"].values()) for r in wire)
    assert sum(r["output_tokens"] for r in ended) == out
    assert sum(s["tokens"]["decode"] for s in steps) == out - len(ended)
    assert sum(s["tokens"]["prefill"] for s in steps) == sum(
        r["computed_prompt_tokens"] for r in ended
    )
    for r in ended:
        assert r["arrival"] <= r["admitted"] <= r["first_token"] <= r["finished"]
        assert len(r["token_times"]) == r["output_tokens"]
        assert r["prompt_tokens"] == r["cached_tokens"] + r["computed_prompt_tokens"]
    for s in steps:
        spans = s["spans"]
        assert s["t_start"] == spans[0]["start"] <= spans[-1]["end"] == s["t_end"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert sum(s["cached_tokens"] for s in steps) == sum(r["cached_tokens"] for r in ended) > 0


def test_kv_tokens_stored_follow_the_requests_that_hold_blocks(wire):
    _, steps, _ = translate(wire)
    block = wire[0]["limits"]["block_size"]
    for step in steps:
        kv = step["kv"]
        held = [s for s in step["slots"] if s["request"] is not None]
        assert kv["tokens_stored"] > 0 if held else kv["tokens_stored"] == 0
        if not kv["blocks_shared"]:  # each sequence's tokens in its own blocks
            assert kv["tokens_stored"] <= kv["tokens_allocated"] == kv["blocks_used"] * block


def test_a_gap_in_the_records_is_counted_and_said(wire):
    tr = Translator(epoch=wire[0]["t"][0])
    tr.feed(copy.deepcopy(wire[0]))
    step, _ = tr.feed(copy.deepcopy(wire[3]))  # records 2 and 3 never arrived
    assert tr.missed == 2
    assert step["events"][0]["kind"] == "observer_dropped" and step["events"][0]["missed"] == 2


def test_another_wire_version_is_refused_with_a_code(wire):
    bad = dict(wire[0], v=2)
    with pytest.raises(ObserverMismatch) as err:
        Translator(epoch=0.0).feed(bad)
    assert err.value.code == "observer_mismatch"


def test_the_publisher_drops_and_counts_instead_of_waiting():
    pub = Publisher(f"tcp://127.0.0.1:{free_port()}", hwm=4)  # nobody reads there
    t = time.perf_counter()
    sent = [pub.send({"seq": i}) for i in range(50)]
    took = time.perf_counter() - t
    pub.close()
    assert pub.sent + pub.dropped == 50 and pub.dropped >= 40 and sent[-1] is False
    assert took < 0.5  # 50 sends never wait for a reader: measured ~1 ms here
