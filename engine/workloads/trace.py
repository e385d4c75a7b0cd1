"""Request traces: the traffic a policy is scored on (``python -m engine.policy score``).

A trace is JSON lines, one request a line (``docs/protocol.md``, "Request traces")::

    {"arrival_s": 0.0, "client": "ana", "prompt": "Why is the sky blue?", "max_tokens": 24}
    {"arrival_s": 0.4, "client": "bot", "prompt_tokens": 120, "max_tokens": 16}

- ``arrival_s`` (seconds from the trace's start, >= 0), ``client`` (1-64 characters), ``max_tokens``
  (the answer's length, 1-1024: every answer is generated to it, EOS ignored), and exactly one of
  ``prompt`` (text, through the chat template), ``messages`` (chat messages), ``token_ids``
  (integers) or ``prompt_tokens`` (only a length: seeded filler tokens, what an export keeps).
- An optional first line ``{"format": "fluxo-trace", "version": 1}``; blank lines are skipped.

``parse`` refuses anything else with a ``BadTrace`` (code ``bad_trace``) naming the line.
``from_export`` turns the page's JSON lines export (its ``request`` records) into a trace; the
shipped trace (``traces/class.jsonl``) is ``class_trace()``: four students and one who floods.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import FluxoError
from engine.core.numbers import is_int, is_number
from engine.workloads.canonical import CHAT_PROMPTS, LONG_CONTEXT, lognormal_lengths

FORMAT, VERSION = "fluxo-trace", 1
SHIPPED = Path(__file__).with_name("traces") / "class.jsonl"
PROMPT_FIELDS = ("prompt", "messages", "token_ids", "prompt_tokens")
FIELDS = {"arrival_s", "client", "max_tokens", *PROMPT_FIELDS}
MAX_TOKENS, MAX_PROMPT = 1024, 1 << 15
# The figures of a policy's score on a trace that two scores are compared by, B over A
# (engine/lab/score.py computes them; the Compare page shows them with its own counts beside)
SCORE_RATIO_KEYS = (
    "goodput_rps",
    "goodput_rps_without_heaviest",
    "fairness",
    "throughput",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "preemptions",
)


class BadTrace(FluxoError):
    code = "bad_trace"


@dataclass(frozen=True, slots=True)
class TraceItem:
    arrival_s: float
    client: str
    max_tokens: int
    prompt: Any  # the value of the one prompt field
    kind: str  # which: prompt, messages, token_ids or prompt_tokens

    def token_ids(self, encode, vocab: int, index: int) -> list[int]:
        """The prompt as token ids: ``encode(messages=..., prompt=...)`` for text; filler drawn
        from a generator seeded by the line ``index`` for a bare length (no two lines share a
        prefix by accident)."""
        if self.kind == "token_ids":
            return list(self.prompt)
        if self.kind == "prompt_tokens":
            rng = random.Random(index)
            return [rng.randrange(min(vocab, 256)) for _ in range(self.prompt)]
        if self.kind == "messages":
            return encode(messages=self.prompt)
        return encode(prompt=self.prompt)


def _item(obj: Any, line: int) -> TraceItem:
    def bad(why: str) -> BadTrace:
        return BadTrace(f"trace line {line}: {why}")

    if not isinstance(obj, dict):
        raise bad("each line must be a JSON object")
    unknown = set(obj) - FIELDS
    if unknown:
        raise bad(
            f"unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(FIELDS))}"
        )
    arrival = obj.get("arrival_s")
    if not is_number(arrival) or not 0 <= arrival < 1e6 or not math.isfinite(arrival):
        raise bad(f"arrival_s must be a number of seconds >= 0, got {arrival!r}")
    client = obj.get("client")
    if not isinstance(client, str) or not 1 <= len(client) <= 64:
        raise bad(f"client must be a string of 1-64 characters, got {client!r}")
    max_tokens = obj.get("max_tokens")
    if not is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS:
        raise bad(f"max_tokens must be an integer in [1, {MAX_TOKENS}], got {max_tokens!r}")
    given = [k for k in PROMPT_FIELDS if k in obj]
    if len(given) != 1:
        raise bad(f"give exactly one of {', '.join(PROMPT_FIELDS)} (got {len(given)})")
    kind, value = given[0], obj[given[0]]
    ok = {
        "prompt": isinstance(value, str) and value.strip() != "",
        "messages": isinstance(value, list)
        and value != []
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value),
        "token_ids": isinstance(value, list)
        and 0 < len(value) <= MAX_PROMPT
        and all(is_int(t) and t >= 0 for t in value),
        "prompt_tokens": is_int(value) and 1 <= value <= MAX_PROMPT,
    }[kind]
    if not ok:
        raise bad(f"{kind} is not valid: {json.dumps(value)[:80]}")
    return TraceItem(float(arrival), client, max_tokens, value, kind)


def parse(text: str) -> list[TraceItem]:
    """Every request of a trace, in arrival order (ties keep the file's order)."""
    items: list[TraceItem] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadTrace(f"trace line {n}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise BadTrace(f"trace line {n}: nests deeper than any trace line does") from None
        if isinstance(obj, dict) and "format" in obj and not items:
            if obj.get("format") != FORMAT or obj.get("version") != VERSION:
                raise BadTrace(f"trace line {n}: not a {FORMAT} version {VERSION} header")
            continue
        items.append(_item(obj, n))
    if not items:
        raise BadTrace("the trace holds no requests")
    return sorted(items, key=lambda it: it.arrival_s)


def load(path: str | Path) -> list[TraceItem]:
    try:
        return parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadTrace(f"cannot read the trace {path}: {exc}") from None


def from_export(text: str, run: str | None = None) -> list[dict[str, Any]]:
    """The page's JSON lines export (or a recording) as trace lines: one per ``request`` record
    (of ``run``, when given) that streamed at least one token, by its arrival, client, prompt
    length and answer length; the prompts themselves are not in an export."""
    records = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadTrace(f"export line {n}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise BadTrace(f"export line {n}: nests deeper than any record does") from None
        if isinstance(obj, dict) and obj.get("type") == "request":
            if run is None or obj.get("run") == run:
                records.append(obj)
    kept = [
        r
        for r in records
        if is_int(r.get("output_tokens"))
        and r["output_tokens"] > 0
        and is_number(r.get("arrival"))
        and abs(r["arrival"]) < 1e12  # a clock in seconds; 10**400 is no float at all
    ]
    if not kept:
        raise BadTrace("the export holds no request that streamed a token")
    t0 = min(r["arrival"] for r in kept)
    return [
        {
            "arrival_s": round(r["arrival"] - t0, 4),
            "client": str(r.get("client") or "anonymous")[:64],
            "prompt_tokens": max(1, min(MAX_PROMPT, int(r.get("prompt_tokens") or 1))),
            "max_tokens": min(MAX_TOKENS, r["output_tokens"]),
        }
        for r in sorted(kept, key=lambda r: r["arrival"])
    ]


def class_trace(seed: int = 0) -> list[dict[str, Any]]:
    """The shipped trace: four students (two ask short questions, two paste the transport report
    first) at ~0.2 requests/s each for ~40 s, and one student whose script floods the engine with
    80 short questions at 8 per second from t = 3 s: more than 8 slots can serve, so a queue forms
    and the scheduling order decides who waits."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    for k, client in enumerate(("ana", "bruno", "carla", "davi")):
        t = rng.uniform(0, 3)
        for i, n in enumerate(lognormal_lengths(8, median=24, hi=64, seed=seed + k)):
            question = CHAT_PROMPTS[(5 * k + i) % len(CHAT_PROMPTS)]
            prompt = question if k < 2 else f"{LONG_CONTEXT}\n{question}"
            lines.append(
                {"arrival_s": round(t, 3), "client": client, "prompt": prompt, "max_tokens": n}
            )
            t += rng.expovariate(0.2)
    for i, n in enumerate(lognormal_lengths(80, median=32, hi=64, seed=seed + 9)):
        question = CHAT_PROMPTS[(7 * i) % len(CHAT_PROMPTS)]
        line = {"arrival_s": round(3 + i / 8, 3), "client": "flood", "prompt": question}
        lines.append({**line, "max_tokens": n})
    return sorted(lines, key=lambda d: d["arrival_s"])


def dumps(lines: list[dict[str, Any]]) -> str:
    header = json.dumps({"format": FORMAT, "version": VERSION})
    return "\n".join([header, *(json.dumps(d, ensure_ascii=False) for d in lines)]) + "\n"
