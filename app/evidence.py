"""Evidence a student can hand in: the tables a course grades, built from the records a run left.

From any run the page holds (Live's buffer, Step by step up to a step, a Compare answer, an opened
recording) :func:`build` makes one document:

- ``header``: what ran and where (engine, weights, device, threads, the machine's load, when, the
  lesson or workload, and each run's settings);
- ``tables``: ``requests`` (one row a request: arrival, TTFT, its own ITL p50/p99, tokens,
  preemptions), ``steps`` (one row a step: time, rows by phase, tokens, KV blocks, queue) and
  ``configs`` (one row a run: the headline numbers of ``engine.core.metrics.summarize`` over that
  run's own records), with ``ratios`` B over A when there are two runs;
- ``records``: the step and request records the tables came from.

:func:`to_zip` writes it as ``requests.csv``, ``steps.csv``, ``configs.csv`` and ``evidence.json``
(pandas reads each). No prompt or answer text is in a record, and a request's ``client`` (a
connection id or an address) becomes only its ``source``: person, traffic or replay, so a
student's export names no other student.

:func:`check` is what a teacher runs on a hand-in: it validates the records as a recording is
validated (``app/recording.py``), rebuilds every table from them and refuses a file whose tables
differ (a number edited by hand), whose CSV files differ from its JSON, or whose token times fall
outside every step. It cannot tell a run that never happened from one forged consistently in
every record; it makes a forged number cost a forged run. Nothing here imports torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import time
import zipfile
from dataclasses import dataclass
from typing import Any

from app import recording
from engine.core.metrics import percentile, slot_phase, summarize

FORMAT, VERSION = "fluxo-evidence", 1
REQUEST_COLUMNS = (
    "run", "id", "source", "arrival_s", "prompt_tokens", "cached_tokens", "output_tokens",
    "status", "ttft_s", "itl_p50_s", "itl_p99_s", "e2e_s", "preemptions",
)  # fmt: skip
STEP_COLUMNS = (
    "run", "step", "t_start_s", "t_end_s", "step_ms", "prefill_rows", "decode_rows", "dead_rows",
    "idle_slots", "prefill_tokens", "decode_tokens", "kv_blocks_used", "kv_blocks_total", "queue",
    "admitted", "finished", "preempted", "policy", "runner",
)  # fmt: skip
HEADLINE = (
    "requests", "steps", "useful_tokens", "wall_s", "throughput", "ttft_p50", "ttft_p95",
    "itl_p50", "itl_p99", "itl_max", "slot_utilization", "dead_slot_fraction", "kv_waste",
    "busy_fraction", "peak_running", "tokens_per_step", "slot_steps_per_token",
)  # fmt: skip
CONFIG_COLUMNS = ("run", "settings", *HEADLINE)
RATIOS = ("throughput", "ttft_p50", "itl_p50", "itl_p99", "tokens_per_step", "busy_fraction")
FILES = {"requests": "requests.csv", "steps": "steps.csv", "configs": "configs.csv"}
TOKEN_SLACK = 2e-5  # recordings keep 5 decimals of a second: a token may sit 10 us off its step


class BadEvidence(recording.BadRecording):
    code = "bad_evidence"


@dataclass
class Source:
    """One run's records and settings: what a table row comes from."""

    name: str
    config: dict[str, Any]
    steps: list[dict]
    requests: list[dict]


# -- the tables ----------------------------------------------------------------------------------
def _num(x: float | None) -> float | None:
    """A table's number, to the microsecond (the records keep 10 us): None where there is none
    (NaN is not JSON)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(x, 6) if isinstance(x, float) else x


def source_of(client: object) -> str:
    """Who sent a request, without saying who: a person's chat, the traffic generator, a replay."""
    if client == "traffic":
        return "traffic"
    return "person" if client else "replay"


def request_row(run: str, r: dict) -> dict[str, Any]:
    times = r.get("token_times") or []
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    first, finished = r.get("first_token"), r.get("finished")
    return {
        "run": run,
        "id": r["id"],
        "source": source_of(r.get("client")),
        "arrival_s": _num(r["arrival"]),
        "prompt_tokens": r.get("prompt_tokens"),
        "cached_tokens": r.get("cached_tokens", 0),
        "output_tokens": len(times),
        "status": r["status"],
        "ttft_s": None if first is None else _num(first - r["arrival"]),
        "itl_p50_s": _num(percentile(gaps, 50)) if gaps else None,
        "itl_p99_s": _num(percentile(gaps, 99)) if gaps else None,
        "e2e_s": None if finished is None else _num(finished - r["arrival"]),
        "preemptions": r.get("preemptions", 0),
    }


def step_row(run: str, s: dict) -> dict[str, Any]:
    phases = [slot_phase(x) for x in s["slots"]]
    tokens, kv = s.get("tokens") or {}, s["kv"]
    return {
        "run": run,
        "step": s["step"],
        "t_start_s": _num(s["t_start"]),
        "t_end_s": _num(s["t_end"]),
        "step_ms": _num(1000 * (s["t_end"] - s["t_start"])),
        "prefill_rows": phases.count("prefill"),
        "decode_rows": phases.count("decode"),
        "dead_rows": phases.count("dead"),
        "idle_slots": phases.count("idle"),
        "prefill_tokens": tokens.get("prefill", 0),
        "decode_tokens": tokens.get("decode", 0),
        "kv_blocks_used": kv.get("blocks_used"),
        "kv_blocks_total": kv.get("blocks_total"),
        "queue": s.get("queue_len", 0),
        "admitted": len(s.get("admitted") or ()),
        "finished": len(s.get("finished") or ()),
        "preempted": len(s.get("preempted") or ()),
        "policy": s.get("policy"),
        "runner": s.get("runner"),
    }


def settings(config: dict[str, Any]) -> str:
    return "; ".join(f"{k}={config[k]}" for k in sorted(config))


def config_row(src: Source) -> dict[str, Any]:
    summary = summarize(src.steps, src.requests) if src.steps else {}
    return {
        "run": src.name,
        "settings": settings(src.config),
        **{k: _num(summary.get(k)) for k in HEADLINE},
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """B over A of the headline figures, for a comparison (the first two runs)."""
    if len(rows) < 2:
        return {}
    a, b = rows[0], rows[1]
    out: dict[str, float | None] = {}
    for k in RATIOS:
        x, y = a.get(k), b.get(k)
        out[f"{k}_b_over_a"] = _num(y / x) if x and y is not None else None
    return out


def tables(sources: list[Source]) -> dict[str, Any]:
    configs = [config_row(s) for s in sources]
    return {
        "requests": [request_row(s.name, r) for s in sources for r in s.requests],
        "steps": [step_row(s.name, x) for s in sources for x in s.steps],
        "configs": configs,
        "ratios": ratios(configs),
    }


def header(what: str, meta: dict[str, Any], sources: list[Source]) -> dict[str, Any]:
    """What ran and where: the recording's own words (lesson, model, when, load) where it has
    them, and the machine that exported."""
    keep = ("lesson", "workload", "scale", "model", "device", "weights", "threads", "when", "load")
    return {
        "engine": "fluxo",
        "what": what,
        **{k: meta[k] for k in keep if meta.get(k) is not None},
        "runs": {s.name: s.config for s in sources},
        "exported": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "system": platform.system(),
            "cpu": platform.machine(),
            "cores": os.cpu_count(),
            "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        },
    }


def build(what: str, sources: list[Source], meta: dict[str, Any] | None = None) -> dict:
    """The evidence document of ``sources`` (``what``: live, step, compare or recording)."""
    kept = [
        Source(
            s.name,
            dict(s.config or (recording.config_of(s.steps) if s.steps else {})),
            list(s.steps),
            [_private(r) for r in s.requests],
        )
        for s in sources
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "header": header(what, meta or {}, kept),
        "tables": tables(kept),
        "records": {
            s.name: {"config": s.config, "steps": s.steps, "requests": s.requests} for s in kept
        },
    }


def _private(r: dict) -> dict:
    """A request record without its client's name (its source says enough)."""
    out = {k: v for k, v in r.items() if k != "client"}
    out["client"] = "traffic" if r.get("client") == "traffic" else ("c" if r.get("client") else "")
    return out


# -- where the records come from ----------------------------------------------------------------
def window(steps: list[dict], requests: list[dict]) -> list[dict]:
    """The requests as they stood over ``steps``' span (Live's buffer, Step by step's range):
    those alive in it, their tokens and finish clipped to it (a token before the first step is
    not this evidence's; one after the last step had not come yet)."""
    if not steps:
        return []
    start, end = steps[0]["t_start"] - TOKEN_SLACK, steps[-1]["t_end"] + TOKEN_SLACK
    out = []
    for r in requests:
        finished = r.get("finished")
        if r["arrival"] > end or (finished is not None and finished < start):
            continue
        times = [t for t in r.get("token_times") or [] if start <= t <= end]
        done = finished is not None and finished <= end
        first = r.get("first_token")
        first = first if first is not None and first <= end else None
        out.append(
            {
                **r,
                "token_times": times,
                "first_token": first,
                "finished": finished if done else None,
                "status": r["status"]
                if done
                else "running"
                if first and first <= end
                else "queued",
            }
        )
    return out


def from_recording(rec: recording.Recording) -> dict:
    sources = [Source(r.name, r.config, r.steps, r.requests) for r in rec.runs.values()]
    return build("recording", sources, rec.meta)


def from_compare(result: dict, meta: dict[str, Any] | None = None) -> dict:
    """A Compare answer (its ``a`` and ``b``: config, steps, requests)."""
    sources = []
    for side in ("a", "b"):
        steps = result[side].get("steps", [])  # a trace's last steps only: requests clipped
        requests = window(steps, result[side].get("requests", []))
        sources.append(Source(side, result[side].get("config", {}), steps, requests))
    return build("compare", sources, {"workload": result.get("workload"), **(meta or {})})


# -- files ---------------------------------------------------------------------------------------
def csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """One table as CSV: numbers as Python writes them back exactly (``repr``), empty for none."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow("" if row.get(c) is None else row[c] for c in columns)
    return out.getvalue()


COLUMNS = {"requests": REQUEST_COLUMNS, "steps": STEP_COLUMNS, "configs": CONFIG_COLUMNS}


def to_zip(doc: dict) -> bytes:
    """``requests.csv``, ``steps.csv``, ``configs.csv`` and ``evidence.json`` in one zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for table, name in FILES.items():
            z.writestr(name, csv_text(doc["tables"][table], COLUMNS[table]))
        z.writestr("evidence.json", json.dumps(doc, ensure_ascii=False, allow_nan=False))
    return buf.getvalue()
