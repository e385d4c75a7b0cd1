"""Two data-parallel ranks: the translation on records captured from the real vLLM 0.32 here with
``--data-parallel-size 2`` (fixtures/vllm_0.32_dp2.jsonl: 16 chats x 24 tokens, the observer's
records as the sidecar's ``--capture`` wrote them; 8 chats landed on each rank)."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from pathlib import Path

import pytest

from engine.core.metrics import lane_time, summarize
from engine.observe.launch import omp_bind
from engine.observe.translate import Translator

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_0.32_dp2.jsonl"


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


def test_the_capture_has_both_ranks_each_counting_its_own_steps(wire):
    by_rank = defaultdict(list)
    for r in wire:
        by_rank[r["rank"]].append(r)
    assert sorted(by_rank) == [0, 1]
    for records in by_rank.values():
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        assert [r["step"] for r in records] == list(range(1, len(records) + 1))
        assert records[-1]["dropped"] == 0


def test_each_rank_has_its_own_lanes_and_a_request_stays_on_one(wire):
    tr, steps, ended = translate(wire)
    width = wire[0]["limits"]["max_num_seqs"]
    home: dict[int, int] = {}
    for step, r in zip(steps, wire, strict=True):
        assert step["rank"] == r["rank"] and step["vllm_step"] == r["step"]
        lanes = [s["slot"] for s in step["slots"]]
        assert lanes == list(range(r["rank"] * width, (r["rank"] + 1) * width))
        for s in step["slots"]:
            if s["request"] is not None:
                assert home.setdefault(s["request"], r["rank"]) == r["rank"]
    ranks = [home[q["id"]] for q in ended]
    assert ranks.count(0) > 0 and ranks.count(1) > 0
    assert tr.missed == 0


def test_every_request_ends_once_and_tokens_add_up(wire):
    tr, steps, ended = translate(wire)
    names = [n for r in wire for n in (*r["finished"], *r["aborted"])]
    assert len(names) == len(set(names)) == len(ended) == len(tr.ids)
    out = sum(sum(r["out"].values()) for r in wire)
    assert sum(q["output_tokens"] for q in ended) == out
    assert sum(s["tokens"]["decode"] for s in steps) == out - len(ended)
    assert tr.kv.keys() == {0, 1}  # each rank's own pool


def test_a_gap_on_one_rank_is_counted_once(wire):
    rank1 = [i for i, r in enumerate(wire) if r["rank"] == 1]
    records = [r for i, r in enumerate(wire) if i != rank1[2]]  # rank 1's third record lost
    tr, steps, _ = translate(records)
    assert tr.missed == 1
    said = [e for s in steps for e in s["events"] if e["kind"] == "observer_dropped"]
    assert len(said) == 1 and said[0]["missed"] == 1


def test_each_rank_gets_its_own_cores():
    assert omp_bind(2, [0, 1]) == "0|1"
    assert omp_bind(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    assert omp_bind(1, [0, 1]) is None and omp_bind(4, [0, 1]) is None


def test_busy_is_per_rank_not_summed(wire):
    """Two ranks each computing most of the window read as one busy engine, not as 190 %: the
    page showed 'device busy 194 %' on two ranks before ``summarize`` averaged per rank."""
    _, steps, _ = translate(wire)
    both = summarize(steps, [])
    one = summarize([s for s in steps if s["rank"] == 0], [])
    assert 0 < both["busy_fraction"] <= 1.0, both["busy_fraction"]
    summed = lane_time(steps, "compute") / (steps[-1]["t_end"] - steps[0]["t_start"])
    assert summed > both["busy_fraction"] and one["busy_fraction"] <= 1.0
