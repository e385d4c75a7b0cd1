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
type, a step lacking a field the views read, a field of the wrong type or out of its range (every
field of every record, checked one by one before any view sees it: a recording is a file anyone
may hand the teacher, and its strings end up in the page), steps going backwards, no steps at
all. Fields the record contract does not name are dropped. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core import schema
from engine.core.errors import FluxoError
from engine.core.metrics import summarize
from engine.core.records import StepRecord
from engine.core.sequence import Status

FORMAT, VERSION = "fluxo-recording", 1
MAX_BYTES = 64 << 20  # a 64 MB export is ~60,000 step records: more than any class shows
REQUEST_FIELDS = ("id", "arrival", "status")
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


# -- field by field ------------------------------------------------------------------------------
BIG = 10**12  # bound of every count and id
STATUSES = tuple(s.value for s in Status)
NAME = re.compile(r"[A-Za-z0-9_.:-]{0,64}")  # run names, request clients, config keys
MAX_TEXT = 300  # labels, titles, errors, event words


def _bad(n: int, where: str, want: str, got: object) -> BadRecording:
    shown = repr(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return BadRecording(f"line {n}: {where} must be {want}, got {shown}", n)


def _int(v: object, n: int, where: str, lo: int = 0, hi: int = BIG, none: bool = False):
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(n, where, f"an integer in [{lo}, {hi}]" + (" or null" if none else ""), v)
    return v


def _num(v: object, n: int, where: str, none: bool = False):
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(n, where, "a finite number" + (" or null" if none else ""), v)
    if abs(v) > 1e15:
        raise _bad(n, where, "a number of a sane size", v)
    return v


def _text(v: object, n: int, where: str, none: bool = False, limit: int = MAX_TEXT):
    if v is None and none:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise _bad(n, where, f"a string of at most {limit} characters", v)
    return v


def _one_of(v: object, n: int, where: str, options: tuple[str, ...]) -> str:
    if v not in options:
        raise _bad(n, where, "one of " + ", ".join(options), v)
    return v  # type: ignore[return-value]


def _scalar(v: object, n: int, where: str):
    """A config or summary value: a short string, a number, a boolean or null."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str):
        return _text(v, n, where, limit=64)
    return _num(v, n, where)


def _flat(v: object, n: int, where: str, none: bool = True) -> dict:
    if v is None and none:
        return {}
    if not isinstance(v, dict) or len(v) > 200:
        raise _bad(n, where, "an object of at most 200 fields", v)
    out = {}
    for k, x in v.items():
        if not NAME.fullmatch(k):
            raise _bad(n, f"a key of {where}", "a plain name", k)
        out[k] = _scalar(x, n, f"{where}.{k}")
    return out


def _check_step(rec: dict, n: int) -> dict:
    """A step record with every field checked against the contract (``engine/core/records.py``,
    read by ``engine/core/schema.py``), and only the fields it names."""
    try:
        return schema.check_record(rec, StepRecord, "a step record")
    except schema.Invalid as exc:
        raise BadRecording(f"line {n}: {exc.message}", n) from None


def _check_request(rec: dict, n: int) -> dict:
    if any(f not in rec for f in REQUEST_FIELDS):
        raise BadRecording(
            f"line {n}: a request record lacks one of {', '.join(REQUEST_FIELDS)}", n
        )
    client = rec.get("client", "")
    if client is not None and (not isinstance(client, str) or not NAME.fullmatch(client)):
        raise _bad(n, "a request's client", "a plain name of at most 64 characters", client)
    times = rec.get("token_times", [])
    if not isinstance(times, list) or len(times) > 1_000_000:
        raise _bad(n, "token_times", "a list of numbers", times)
    out: dict[str, Any] = {
        "id": _int(rec["id"], n, "a request's id"),
        "client": client,
        "arrival": _num(rec["arrival"], n, "arrival"),
        "status": _one_of(rec["status"], n, "a request's status", STATUSES),
        "token_times": [_num(t, n, "token_times") for t in times],
    }
    for k in (
        "prompt_tokens",
        "output_tokens",
        "preemptions",
        "cached_tokens",
        "computed_prompt_tokens",
    ):
        if k in rec:
            out[k] = _int(rec[k], n, k)
    for k in ("admitted", "first_token", "finished"):
        if k in rec:
            out[k] = _num(rec[k], n, k, none=True)
    if "error" in rec:
        out["error"] = _text(rec["error"], n, "a request's error", none=True)
    return out


def _run_of(runs: dict[str, Run], rec: dict, n: int = 0) -> Run:
    name = rec.pop("run", DEFAULT_RUN)
    if not isinstance(name, str) or not NAME.fullmatch(name) or not name:
        raise _bad(n, "run", "a plain name of at most 64 characters", name)
    if name not in runs and len(runs) >= 16:
        raise BadRecording(f"line {n}: more than 16 runs in one recording", n)
    return runs.setdefault(name, Run(name, label=name))


def _read_line(line: str, n: int, last: bool, ended: bool) -> dict:
    try:
        rec = json.loads(line)
    except RecursionError:
        raise BadRecording(f"line {n} nests deeper than any record does", n) from None
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
    meta: dict[str, Any] = {}
    for k, v in rec.items():
        if not NAME.fullmatch(k):
            raise _bad(n, "a recording field", "a plain name", k)
        if k == "ratios":
            meta[k] = _flat(v, n, "ratios")
        elif k in ("scale", "load"):  # the numbers the views format
            meta[k] = _num(v, n, k, none=True)
        elif k in ("number", "max_steps"):
            meta[k] = _int(v, n, k, none=True)
        elif k == "runs":
            if not isinstance(v, list) or len(v) > 16:
                raise _bad(n, "runs", "a list of run names", v)
            meta[k] = [_text(x, n, "a run name", limit=64) for x in v]
        elif isinstance(v, str):
            meta[k] = _text(v, n, k)
        else:
            meta[k] = _scalar(v, n, k)
    return meta


def _add_step(runs: dict[str, Run], rec: dict, n: int) -> None:
    run = _run_of(runs, rec, n)
    rec = _check_step(rec, n)
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
        run = _run_of(runs, rec, n)
        run.label = _text(rec.get("label"), n, "label", none=True) or run.name
        run.config = _flat(rec.get("config"), n, "config")
        run.summary = _flat(rec.get("summary"), n, "summary")
        run.steps_total = _int(rec.get("steps_total"), n, "steps_total", none=True)
    elif kind == "step":
        _add_step(runs, rec, n)
    elif kind == "request":
        run = _run_of(runs, rec, n)
        run.requests.append(_check_request(rec, n))
    else:
        raise BadRecording(
            f"line {n}: unknown record type {str(kind)[:40]!r} (step, request, run or recording)",
            n,
        )


def _finish(runs: dict[str, Run]) -> dict[str, Run]:
    """The runs that hold steps, each with a summary and a config (a plain export has neither)."""
    runs = {k: r for k, r in runs.items() if r.steps}
    if not runs:
        raise BadRecording("no step records: nothing to replay")
    for run in runs.values():
        if not run.summary:  # a plain export: the headline numbers of what it holds
            run.summary = summarize(run.steps, run.requests)
        run.config = run.config or config_of(run.steps)
    return runs


def config_of(steps: list[dict]) -> dict[str, Any]:
    """What the last step says of its engine's configuration, for records that came without one."""
    last = steps[-1]
    return {"policy": last["policy"], "runner": last["runner"], "max_slots": len(last["slots"])}


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
