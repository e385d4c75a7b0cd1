"""Recorded runs: the page's JSON lines export, read back for replay with no engine and no model.

A recording is JSON lines, one object a line, each with a ``type``:

- ``step`` and ``request``: the telemetry records (``engine/core/records.py``), exactly what the
  page's "JSON lines" export and the server's ``export`` write. A plain export is one run.
- ``recording`` (optional, first line): what was recorded (``format`` ``fluxo-recording``,
  ``version``, the lesson, the model, and the engine's B-over-A ``ratios`` of the two runs, as
  a live comparison answers them: the page shows those and computes none); ``run`` (optional):
  one configuration of a comparison (``run`` name, ``label``, ``config``, ``summary`` of the whole
  run). Then every step and request line names its ``run``. ``python -m engine.lab.recordings``
  writes these for the lessons.

:func:`parse` validates as it reads and raises :class:`BadRecording` (code ``bad_recording``)
with the line and the reason: not JSON, cut off at the end (a truncated download), an unknown
type, a step lacking a field the views read, steps going backwards, no steps at all. Nothing here
imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import FluxoError
from engine.core.metrics import summarize
from engine.core.records import SlotRecord, StepRecord

FORMAT, VERSION = "fluxo-recording", 1
MAX_BYTES = 64 << 20  # a 64 MB export is ~60,000 step records: more than any class shows
# What a step record must hold to be replayed: every field of the record contract
# (engine/core/records.py) but those the engine wrote later, which older recordings lack (the views
# read them with a default). A field added to StepRecord is required here unless listed.
LATER_STEP_FIELDS = ("admitted_cached", "cached_tokens", "expected_s")
STEP_FIELDS = tuple(f for f in StepRecord.__annotations__ if f not in LATER_STEP_FIELDS)
REQUEST_FIELDS = ("id", "arrival", "status")
SLOT_FIELDS = tuple(SlotRecord.__annotations__)  # every field of a slot
DEFAULT_RUN = "recorded"
LESSONS = Path(__file__).resolve().parents[1] / "lessons"


class BadRecording(FluxoError):
    code = "bad_recording"

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Run:
    name: str
    label: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    steps_total: int | None = None

    @property
    def people(self) -> set[int]:
        """Requests of people (a client other than traffic or a replay's own)."""
        return {r["id"] for r in self.requests if r.get("client") not in (None, "", "traffic")}


@dataclass
class Recording:
    runs: dict[str, Run]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def run(self, name: str | None = None) -> Run:
        return self.runs.get(name or "", next(iter(self.runs.values())))


def _check_step(rec: dict, n: int) -> None:
    missing = [f for f in STEP_FIELDS if f not in rec]
    if missing:
        raise BadRecording(f"line {n}: a step record lacks {', '.join(missing)}", n)
    if not isinstance(rec["step"], int) or not isinstance(rec["slots"], list):
        raise BadRecording(f"line {n}: a step record's step must be an integer and slots a list", n)
    if not all(isinstance(x, (int, float)) for x in (rec["t_start"], rec["t_end"])):
        raise BadRecording(f"line {n}: t_start and t_end must be numbers", n)
    for s in rec["slots"]:
        if not isinstance(s, dict) or any(f not in s for f in SLOT_FIELDS):
            raise BadRecording(f"line {n}: a slot lacks one of {', '.join(SLOT_FIELDS)}", n)
    if not isinstance(rec["kv"], dict) or "blocks_total" not in rec["kv"]:
        raise BadRecording(f"line {n}: a step record's kv lacks blocks_total", n)


def _run_of(runs: dict[str, Run], rec: dict) -> Run:
    name = str(rec.pop("run", DEFAULT_RUN))
    return runs.setdefault(name, Run(name, label=name))


def _read_line(line: str, n: int, last: bool, ended: bool) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        if last and not ended:
            raise BadRecording(
                f"the file ends in the middle of line {n}: it looks truncated (an "
                "interrupted download?); export it again",
                n,
            ) from None
        raise BadRecording(
            f"line {n} is not JSON: a recording is one JSON object per line", n
        ) from None
    if not isinstance(rec, dict) or "type" not in rec:
        raise BadRecording(
            f"line {n}: each line must be a JSON object with a type (step, request, ...)", n
        )
    return rec


def _decode(text: str | bytes) -> str:
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise BadRecording(
                f"the file has {len(text) >> 20} MB; a recording holds at most {MAX_BYTES >> 20} MB"
            )
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRecording(
                "this is not a text file: a recording is JSON lines (UTF-8)"
            ) from None
    if not text.strip():
        raise BadRecording("the file is empty")
    return text


def _check_meta(rec: dict, n: int) -> dict:
    if rec.get("format") != FORMAT or rec.get("version") != VERSION:
        raise BadRecording(
            f"line {n}: format {rec.get('format')!r} version {rec.get('version')!r}; "
            f"this page reads {FORMAT} version {VERSION}",
            n,
        )
    return rec


def _add_step(runs: dict[str, Run], rec: dict, n: int) -> None:
    run = _run_of(runs, rec)
    _check_step(rec, n)
    if run.steps and rec["step"] <= run.steps[-1]["step"]:
        raise BadRecording(
            f"line {n}: step {rec['step']} comes after step {run.steps[-1]['step']} in run "
            f"{run.name!r}: steps must go forward",
            n,
        )
    run.steps.append(rec)


def _add(runs: dict[str, Run], kind: str, rec: dict, n: int) -> None:
    """One run, step or request line into its run."""
    if kind == "run":
        run = _run_of(runs, rec)
        run.label, run.config = str(rec.get("label") or run.name), dict(rec.get("config") or {})
        run.summary, run.steps_total = dict(rec.get("summary") or {}), rec.get("steps_total")
    elif kind == "step":
        _add_step(runs, rec, n)
    elif kind == "request":
        run = _run_of(runs, rec)
        if any(f not in rec for f in REQUEST_FIELDS):
            raise BadRecording(
                f"line {n}: a request record lacks one of {', '.join(REQUEST_FIELDS)}", n
            )
        run.requests.append(rec)
    else:
        raise BadRecording(
            f"line {n}: unknown record type {kind!r} (step, request, run or recording)", n
        )


def _finish(runs: dict[str, Run]) -> dict[str, Run]:
    """The runs that hold steps, each with a summary and a config (a plain export has neither)."""
    runs = {k: r for k, r in runs.items() if r.steps}
    if not runs:
        raise BadRecording("no step records: nothing to replay")
    for run in runs.values():
        if not run.summary:  # a plain export: the headline numbers of what it holds
            run.summary = summarize(run.steps, run.requests)
        if not run.config:
            run.config = {
                "policy": run.steps[-1]["policy"],
                "runner": run.steps[-1]["runner"],
                "max_slots": len(run.steps[-1]["slots"]),
            }
    return runs


def parse(text: str | bytes, source: str = "") -> Recording:
    """Validate and read a recording; raises :class:`BadRecording` saying which line and why."""
    lines = _decode(text).split("\n")
    ended = lines[-1] == ""
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    runs: dict[str, Run] = {}
    meta: dict[str, Any] = {}
    for k, (n, line) in enumerate(numbered):
        rec = _read_line(line, n, k == len(numbered) - 1, ended)
        kind = rec.pop("type")
        if kind == "recording":
            meta = _check_meta(rec, n)
        else:
            _add(runs, kind, rec, n)
    return Recording(_finish(runs), meta, source)


def load(path: Path) -> Recording:
    return parse(path.read_bytes(), source=str(path))


def lesson_recordings() -> dict[str, Path]:
    """``lessons/NN-*/recording.jsonl`` by lesson folder name."""
    if not LESSONS.exists():
        return {}
    return {p.parent.name: p for p in sorted(LESSONS.glob("*/recording.jsonl"))}
