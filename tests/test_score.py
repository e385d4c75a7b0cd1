"""Scoring a policy on a trace: the trace format and its errors, an export converted, the shipped
trace as its generator writes it, the scorer's arithmetic on hand-built traces (the priced clock
to the millisecond, goodput, Jain's index) and the command end to end, on the tiny model."""

from __future__ import annotations

import json
import math

import pytest

from engine.core.metrics import goodput, jain_index
from engine.lab import score, score_cli
from engine.workloads import trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
C0, ROW = score.PRICES[:2]


def _line(**fields):
    return json.dumps({"arrival_s": 0.0, "client": "ana", "max_tokens": 4, **fields})


def test_a_trace_parses_in_arrival_order():
    text = "\n".join(
        [
            json.dumps({"format": "fluxo-trace", "version": 1}),
            _line(arrival_s=2.5, prompt="Hi"),
            "",
            _line(arrival_s=0.5, token_ids=[1, 2, 3]),
            _line(arrival_s=1, prompt_tokens=40, client="bot"),
            _line(messages=[{"role": "user", "content": "Hello"}]),
        ]
    )
    items = trace.parse(text)
    assert [it.arrival_s for it in items] == [0.0, 0.5, 1.0, 2.5]
    assert [it.kind for it in items] == ["messages", "token_ids", "prompt_tokens", "prompt"]
    filler = items[2].token_ids(None, 259, 7)
    assert len(filler) == 40 and filler == items[2].token_ids(None, 259, 7)
    assert filler != items[2].token_ids(None, 259, 8)


@pytest.mark.parametrize(
    "line,says",
    [
        ("{not json", "line 1: not JSON"),
        ("[1, 2]", "JSON object"),
        (_line(prompt="x", colour="red"), "unknown field(s) colour"),
        (_line(arrival_s=-1, prompt="x"), "arrival_s"),
        (_line(arrival_s="soon", prompt="x"), "arrival_s"),
        (_line(client="", prompt="x"), "client"),
        (_line(max_tokens=0, prompt="x"), "max_tokens"),
        (_line(max_tokens=True, prompt="x"), "max_tokens"),
        (_line(), "exactly one of"),
        (_line(prompt="x", prompt_tokens=3), "exactly one of"),
        (_line(prompt="  "), "prompt is not valid"),
        (_line(token_ids=[1, -2]), "token_ids is not valid"),
        (_line(messages=[{"role": "user"}]), "messages is not valid"),
        (_line(prompt_tokens=0), "prompt_tokens is not valid"),
        (json.dumps({"format": "other", "version": 1}), "header"),
        ("", "no requests"),
        ("[" * 50_000 + "]" * 50_000, "nests deeper"),  # RecursionError before (review L6)
    ],
)
def test_a_bad_trace_is_refused_with_the_line_and_the_reason(line, says):
    with pytest.raises(trace.BadTrace) as info:
        trace.parse(line)
    assert info.value.code == "bad_trace" and says in info.value.message, info.value.message


def test_an_export_converts_to_a_trace():
    export = [
        {"type": "step", "step": 1},
        {"type": "request", "id": 1, "client": "c3", "arrival": 10.0, "prompt_tokens": 30,
         "output_tokens": 12, "status": "finished"},
        {"type": "request", "id": 2, "client": "", "arrival": 10.5, "prompt_tokens": 8,
         "output_tokens": 0, "status": "cancelled"},
        {"type": "request", "id": 3, "client": "traffic", "arrival": 11.25, "prompt_tokens": 90,
         "output_tokens": 5, "status": "finished"},
    ]  # fmt: skip
    lines = trace.from_export("\n".join(map(json.dumps, export)))
    assert lines == [
        {"arrival_s": 0.0, "client": "c3", "prompt_tokens": 30, "max_tokens": 12},
        {"arrival_s": 1.25, "client": "traffic", "prompt_tokens": 90, "max_tokens": 5},
    ]
    assert [it.max_tokens for it in trace.parse(trace.dumps(lines))] == [12, 5]
    with pytest.raises(trace.BadTrace, match="no request"):
        trace.from_export(json.dumps(export[0]))
    # security review 2, L6: an arrival of 10**400 (OverflowError) and deep nesting, coded
    huge = [export[1], {**export[3], "arrival": 10**400}]
    assert len(trace.from_export("\n".join(map(json.dumps, huge)))) == 1
    with pytest.raises(trace.BadTrace, match="nests deeper"):
        trace.from_export("[" * 50_000 + "]" * 50_000)


def test_the_shipped_trace_is_what_its_generator_writes():
    assert trace.SHIPPED.read_text() == trace.dumps(trace.class_trace())
    items = trace.load(trace.SHIPPED)
    clients = {it.client for it in items}
    assert clients == {"ana", "bruno", "carla", "davi", "flood"}
    assert sum(it.client == "flood" for it in items) > len(items) / 2


def test_the_priced_clock_to_the_millisecond(tiny):
    """One request of 10 prompt tokens and 4 answer tokens, alone: a prefill step of 10 rows,
    then 3 decode steps of 1 row; TTFT is the first step's price, every gap a decode's."""
    lm, tok = tiny
    items = trace.parse(_line(arrival_s=1.0, prompt_tokens=10))
    steps, reqs = score.replay(
        lm, tok, items, "continuous", "priced", model="tiny", dtype="float64"
    )
    (r,) = reqs
    assert [s["tokens"]["prefill"] + s["tokens"]["decode"] for s in steps] == [10, 1, 1, 1]
    assert r["arrival"] == 1.0 and r["first_token"] == pytest.approx(1.0 + C0 + 10 * ROW)
    gaps = [b - a for a, b in zip(r["token_times"], r["token_times"][1:], strict=False)]
    assert gaps == pytest.approx([C0 + ROW] * 3)
    m = score.measure(steps, reqs, ttft_target=0.1, itl_target=0.1)
    assert m["goodput_rps"] == pytest.approx(1 / (C0 + 10 * ROW + 3 * (C0 + ROW)))
    assert m["fairness"] == 1.0 and m["preemptions"] == 0 and m["policy_errors"] == 0
    assert score.measure(steps, reqs, ttft_target=0.01, itl_target=0.1)["goodput_rps"] == 0


def test_goodput_and_fairness_arithmetic():
    def req(client, arrival, first, times, finished):
        return dict(client=client, arrival=arrival, first_token=first, token_times=times,
                    finished=finished)  # fmt: skip

    reqs = [
        req("a", 0.0, 0.5, [0.5, 0.6, 0.7], 0.7),  # meets TTFT 1 s and ITL p99 0.2 s
        req("a", 0.0, 1.5, [1.5, 1.6], 1.6),  # TTFT 1.5 s: misses
        req("b", 1.0, 1.2, [1.2, 1.9], 1.9),  # a 0.7 s gap: misses
        req("c", 1.0, 1.1, [1.1], 2.0),  # one token, no gap: meets
    ]
    g = goodput(reqs, 1.0, 0.2)
    assert g["goodput_rps"] == 2 / 2.0 and g["slo_met_fraction"] == 0.5
    assert g["goodput_by_client"] == {"a": 0.5, "b": 0.0, "c": 0.5}
    assert g["fairness"] == pytest.approx(1.0**2 / (3 * 0.5))  # (0.5+0+0.5)^2 / (3 (0.25+0.25))
    assert g["goodput_rps_without_heaviest"] == 0.5  # "a" sent most
    assert jain_index([1, 1, 1]) == 1.0 and jain_index([1, 0, 0, 0]) == 0.25
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0, 0]))


def test_the_command_scores_a_policy_file(tmp_path, capsys):
    small = tmp_path / "t.jsonl"
    lines = [
        {"arrival_s": i * 0.05, "client": "flood" if i % 3 else "ana",
         "prompt_tokens": 4 + 9 * (i % 4), "max_tokens": 3 + i % 5}
        for i in range(14)
    ]  # fmt: skip
    small.write_text(trace.dumps(lines))
    out = tmp_path / "s.json"
    files = ["examples/policies/shortest_prompt_first.py", "examples/policies/fair_share.py"]
    argv = ["score", *files, "--model", "tiny"]
    assert score_cli.main([*argv, "--trace", str(small), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "shortest-first over continuous:" in printed and "goodput/s" in printed
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {
        "shortest-first",
        "fair-share",
        "static",
        "continuous",
        "chunked",
    }
    assert (
        result["policies"] == ["shortest-first", "fair-share"] and "fair-share" in result["ratios"]
    )
    assert set(result["ratios"]["shortest-first"]) == {"static", "continuous", "chunked"}
    assert set(result["ratios"]["shortest-first"]["continuous"]) == set(score.RATIO_KEYS)
    assert all(r["policy_errors"] == 0 for r in result["runs"].values())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0}\n')
    assert score_cli.main(["score", "continuous", "--model", "tiny", "--trace", str(bad)]) == 2
    assert "error [bad_trace]: trace line 1" in capsys.readouterr().err


def _small_trace(tmp_path, n=14):
    small = tmp_path / "t.jsonl"
    lines = [
        {"arrival_s": i * 0.05, "client": "flood" if i % 3 else "ana",
         "prompt_tokens": 4 + 9 * (i % 4), "max_tokens": 3 + i % 5}
        for i in range(n)
    ]  # fmt: skip
    small.write_text(trace.dumps(lines))
    return small


def test_the_weights_cannot_move_a_priced_score(tiny, tmp_path):
    """The quick score's premise: on the priced clock two models with one tokenizer (the tiny
    float64 one and a counting stand-in of another width, seed and dtype) give the same figures,
    for the built-ins and a loaded policy file alike."""
    from engine.core.policy import registry

    registry.load_file("examples/policies/fair_share.py")
    items = trace.load(_small_trace(tmp_path))
    lm, tok = tiny
    stand_in = score.counting_model(lm.config.vocab_size, lm.config.max_position_embeddings, seed=3)
    names = ["fair-share"]
    full = score.score(lm, tok, items, names, model="tiny", dtype="float64")
    quick = score.score(stand_in, tok, items, names, model="tiny", dtype="float32")
    assert quick["runs"] == full["runs"] and set(full["runs"]) == {
        "fair-share",
        *registry.BUILTIN_NAMES,
    }
    assert all(r["steps"] > 5 for r in full["runs"].values())


def test_check_full_holds_quick_runs_to_a_stored_replay_and_can_fail(tmp_path):
    run = {"throughput": 10.0, "ttft_p50": 0.5, "goodput_by_client": {"ana": 1.0, "flood": 2.0}}
    result = {
        "trace": "t.jsonl", "clock": "priced", "targets": {"ttft_s": 2.0},
        "runs": {"continuous": run, "mine": {"throughput": 3.0}},
    }  # fmt: skip
    stored = tmp_path / "score.json"
    full = {**result, "config": dict(score.CONFIG), "when": "then", "weights": "q4"}
    stored.write_text(json.dumps(full))
    check = score.check_full(result, stored)
    assert check["equal"] and check["runs"] == ["continuous"] and check["metrics"] == 4
    full["runs"] = {"continuous": {**run, "goodput_by_client": {"ana": 1.1, "flood": 2.0}}}
    stored.write_text(json.dumps(full))
    check = score.check_full(result, stored)
    assert not check["equal"] and check["max_rel_diff"] == pytest.approx(0.1 / 1.1)
    stored.write_text(json.dumps({**full, "trace": "other.jsonl"}))
    assert score.check_full(result, stored) is None
    stored.write_text(json.dumps({**full, "config": {**score.CONFIG, "max_slots": 4}}))
    assert score.check_full(result, stored) is None
