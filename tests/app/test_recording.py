"""Recorded runs (app/recording.py): every lesson ships one that validates and replays with no
engine and no model; the page's own export reads back; broken files get a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app import charts, recording
from app.engine_client import local_exports
from app.recording import BadRecording, parse

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p for p in (ROOT / "lessons").iterdir() if (p / "scenario.toml").exists())


def test_every_lesson_ships_a_small_recording():
    found = recording.lesson_recordings()
    assert sorted(found) == [p.name for p in LESSONS], (
        "python -m engine.lab.recordings all writes them"
    )
    sizes = {name: path.stat().st_size for name, path in found.items()}
    assert max(sizes.values()) < 450_000 and sum(sizes.values()) < 3_000_000, sizes


@pytest.mark.parametrize("lesson", [p.name for p in LESSONS])
def test_each_recording_validates_and_replays(lesson):
    rec = recording.load(ROOT / "lessons" / lesson / "recording.jsonl")
    assert rec.meta["lesson"] == lesson and rec.meta["model"] == "smollm2"
    assert list(rec.runs) == ["a", "b"]
    for run in rec.runs.values():
        assert run.steps and run.requests and run.summary["throughput"] > 0 and run.label
        numbers = [r["step"] for r in run.steps]
        assert numbers == sorted(set(numbers))
        # What the views draw, from the records alone: every chart's rows.
        spans = charts.slot_spans(run.steps, run.people)
        assert sum(sp["end"] - sp["start"] for sp in spans) == sum(
            len(r["slots"]) for r in run.steps
        )
        assert len(charts.itl_per_step(run.steps)) == len(run.steps)
        assert charts.kv_series(run.steps) and charts.lane_spans(run.steps)


def test_replay_needs_no_torch():
    """The page's process reads, validates and draws a recording without importing torch."""
    code = (
        "import sys; from app import recording, charts, browser_view, state, i18n\n"
        "for p in recording.lesson_recordings().values():\n"
        "    r = recording.load(p); [charts.slot_spans(x.steps) for x in r.runs.values()]\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_pages_own_export_reads_back(runs):
    """The JSON lines the page exports (engine.core.telemetry's format) replay as one run."""
    steps, requests = runs["static"]
    jsonl, _ = local_exports(steps, requests)
    rec = parse(jsonl)
    (run,) = rec.runs.values()
    assert run.name == "recorded" and run.steps == [json.loads(json.dumps(s)) for s in steps]
    assert len(run.requests) == len(requests)
    assert run.summary["steps"] == len(steps) and run.config["policy"] == "static"


def _lines(runs) -> list[str]:
    steps, requests = runs["continuous"]
    return local_exports(steps[:20], requests)[0].splitlines()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("truncated", "ends in the middle of line 20: it looks truncated"),
        ("garbage", "line 3 is not JSON"),
        ("unknown", "line 2: unknown record type 'frame'"),
        ("missing", "line 4: a step record lacks slots"),
        ("backwards", "line 6: step 1 comes after step 5"),
        ("empty", "the file is empty"),
        ("binary", "not a text file"),
        ("requests only", "no step records"),
        ("version", "line 1: format 'fluxo-recording' version 99"),
        ("deep", "line 3 nests deeper"),  # RecursionError before (security review 2, L6)
        ("kv", "line 4: a step record's kv lacks tokens_stored"),  # KeyError in the headline
    ],
)
def test_broken_files_get_a_clear_message(runs, case, expected):
    lines = _lines(runs)
    if case == "truncated":  # a download cut in the middle of a line
        text = "\n".join(lines[:19]) + "\n" + lines[19][: len(lines[19]) // 2]
    elif case == "garbage":
        text = "\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n"
    elif case == "unknown":
        text = "\n".join(lines[:1] + ['{"type": "frame"}'] + lines[1:]) + "\n"
    elif case == "missing":
        bad = json.loads(lines[3])
        del bad["slots"]
        text = "\n".join(lines[:3] + [json.dumps(bad)] + lines[4:]) + "\n"
    elif case == "deep":
        text = "\n".join(lines[:2] + ["[" * 50_000 + "]" * 50_000] + lines[2:]) + "\n"
    elif case == "kv":
        bad = json.loads(lines[3])
        del bad["kv"]["tokens_stored"]
        text = "\n".join(lines[:3] + [json.dumps(bad)] + lines[4:]) + "\n"
    elif case == "backwards":
        text = "\n".join(lines[:5] + [lines[0]] + lines[5:]) + "\n"
    elif case == "empty":
        text = "\n \n"
    elif case == "binary":
        text = b"\x89PNG\r\n\x1a\n\xff\xfe"
    elif case == "requests only":
        text = "\n".join(line for line in lines if '"type": "request"' in line) + "\n"
    else:
        text = (
            json.dumps({"type": "recording", "format": "fluxo-recording", "version": 99})
            + "\n"
            + "\n".join(lines)
        )
    with pytest.raises(BadRecording) as err:
        parse(text)
    assert expected in err.value.message and err.value.code == "bad_recording"


@pytest.mark.parametrize("lesson", [p.name for p in LESSONS])
def test_each_recording_shows_its_lesson(lesson):
    """The Replay a teacher shows is the lesson's claim: the recorded [compare]'s ratio B / A
    goes the way its ``expect`` says (lesson 4 at 0.35 of its scale showed 1.0x: no claim), and a
    comparison that cannot show a direction on a CPU says so (``expect = "none"`` and a text)."""
    import tomllib

    from engine.lab.recordings import recorded_compare

    with open(ROOT / "lessons" / lesson / "scenario.toml", "rb") as f:
        cmp_ = recorded_compare(tomllib.load(f))
    rec = recording.load(ROOT / "lessons" / lesson / "recording.jsonl")
    assert rec.meta["workload"] == cmp_["workload"], "re-record: python -m engine.lab.recordings"
    value = rec.meta["ratios"][cmp_["ratio"]]
    expect = cmp_["expect"]  # ">" or "<" than 1, "=": within 10 % of 1, "none": no direction
    holds = {">": value > 1, "<": value < 1, "=": abs(value - 1) <= 0.1, "none": True}
    assert holds[expect], f"{cmp_['ratio']} = {value:.3f}, expected {expect}"
