"""The class predicts, the engine answers: each lesson's ``[[predict]]`` question, the answers of
every browser session on the page, and the engine's answer to reveal.

A question (``scenario.toml``): ``id``, ``en`` and ``pt`` (the question), ``unit``, the slider's
``min`` / ``max`` / ``step``, and ``answer``: where the engine's answer is stored, ``live:checkN``
(the Nth ``[[live_check]]`` of the lesson's stored Live runs, min-max over its runs) or
``full:checkN`` (the Nth claim of its stored full replay). This machine's own answer, when its
pre-class check measured the claim, is the preflight's (``last_preflight``).

The :class:`Board` lives once in the page process: every student's Streamlit session answers over
its own connection to the page, keyed by its session id, never shown. One answer per question
and session, editable until the presenter locks it; a session that answers faster than once a
second, or more than ``MAX_EDITS`` times, is refused with ``rate_limited``. What anyone sees is
the count, the median and the anonymous values (a histogram), their own answer, and the engine's
answer once revealed. A student may choose a nickname (``Board.name``): the presenter then sees
it beside that student's answer, and no other student ever does. Nothing here imports torch or
Streamlit.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import FluxoError
from engine.workloads.lessons import last_preflight

MAX_EDITS = 20  # one session's answers to one question: a first answer and its changes
MIN_GAP_S = 1.0  # between two of them
MAX_SESSIONS = 500  # answers to one question: a class of 60 with room; a flood of sessions stops
MAX_NAME = 24  # a nickname's characters


class Refused(FluxoError):
    code = "bad_field"


class Locked(Refused):
    code = "prediction_locked"


class RateLimited(Refused):
    code = "rate_limited"


@dataclass(frozen=True)
class Question:
    key: str  # "<lesson number>:<id>": unique on the page
    number: int
    text: dict[str, str]  # en, pt-BR
    unit: str
    lo: float
    hi: float
    step: float
    answer: str  # live:checkN or full:checkN; a Compare run's: ratios:<key> or score_ratios:<key>


def questions(scenario: dict[str, Any]) -> list[Question]:
    """A lesson's ``[[predict]]`` entries."""
    number = int(scenario["lesson"]["number"])
    out = []
    for q in scenario.get("predict") or []:
        text = {"en": q["en"], "pt-BR": q["pt"]}
        lo, hi, step = float(q["min"]), float(q["max"]), float(q.get("step", 0.1))
        if (
            not lo < hi
            or step <= 0
            or not str(q["answer"]).startswith(("live:check", "full:check"))
        ):
            raise ValueError(
                f"lesson {number} [[predict]] {q.get('id')!r}: min < max, step > 0, answer"
            )
        key = f"{number}:{q['id']}"
        out.append(Question(key, number, text, q.get("unit", "x"), lo, hi, step, q["answer"]))
    return out


def _cmp(name: str, en: str, pt: str, lo: float, hi: float, step: float, answer: str) -> Question:
    return Question(f"cmp:{name}", 0, {"en": en, "pt-BR": pt}, "x", lo, hi, step, answer)


# The Compare page's runs carry a question too: the ratio its run measures answers it, revealed
# as soon as the run ends (no typing: the run that the class watched is the answer).
COMPARE_QUESTIONS = {
    "batching": _cmp(
        "batching",
        "How many times static's tokens per second will continuous serve (B/A)?",
        "Quantas vezes os tokens por segundo do static o continuous vai servir (B/A)?",
        0.5,
        10.0,
        0.1,
        "ratios:throughput_b_over_a",
    ),
    "stall": _cmp(
        "stall",
        "Chunked prefill: its ITL p99 as a multiple of unchunked's (B/A)?",
        "Prefill em pedaços: seu ITL p99 como múltiplo do sem pedaços (B/A)?",
        0.0,
        2.0,
        0.05,
        "ratios:itl_p99_b_over_a",
    ),
    "memory": _cmp(
        "memory",
        "How many times as many requests run at once with paged KV (B/A, peak)?",
        "Quantas vezes mais requisições rodam ao mesmo tempo com KV paginado (B/A, pico)?",
        0.5,
        8.0,
        0.1,
        "ratios:peak_running_b_over_a",
    ),
    "overlap": _cmp(
        "overlap",
        "The async runner's tokens per second over the sync one's (B/A)?",
        "Os tokens por segundo do executor async sobre os do sync (B/A)?",
        0.5,
        2.0,
        0.05,
        "ratios:throughput_b_over_a",
    ),
    "trace": _cmp(
        "trace",
        "Policy B's goodput (requests/s within the targets) over policy A's (B/A)?",
        "O goodput da política B (requisições/s dentro das metas) sobre o da A (B/A)?",
        0.0,
        3.0,
        0.05,
        "score_ratios:goodput_rps_b_over_a",
    ),
}


def measured(q: Question, result: dict[str, Any]) -> float | None:
    """A Compare run's answer to its question: the ratio the run measured (None if it did not)."""
    part, _, key = q.answer.partition(":")
    value = (result.get(part) or {}).get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@functools.lru_cache(maxsize=32)
def _measured(path: str, mtime_ns: int) -> dict[str, Any]:
    """A lesson's measured.json, read once per version (every session's fragment asks every 2 s)."""
    return json.loads(Path(path).read_text())


def stored_answer(folder: Path, q: Question) -> dict[str, Any] | None:
    """The engine's answer in the lesson's stored runs (``measured.json``): ``lo``, ``hi``, how
    many runs and when; None if that run is not stored."""
    try:
        path = folder / "measured.json"
        measured = _measured(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError):
        return None
    part, _, index = q.answer.partition(":check")
    doc = measured.get(part) or {}
    checks = doc.get("checks") or []
    if not index.isdigit() or int(index) >= len(checks):
        return None
    c = checks[int(index)]
    values = c.get("ratios") or [c.get("measured")]
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None
    return {"lo": min(values), "hi": max(values), "runs": len(values), "when": doc.get("when")}


def machine_answer(q: Question) -> dict[str, Any] | None:
    """This machine's answer, from its last pre-class check (Live claims only)."""
    part, _, index = q.answer.partition(":check")
    lesson = ((last_preflight() or {}).get("lessons") or {}).get(str(q.number)) or {}
    claims = lesson.get("claims") or []
    if part != "live" or not index.isdigit() or int(index) >= len(claims):
        return None
    value = claims[int(index)].get("min")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return {"value": value, "when": lesson.get("when")}


@dataclass
class Tally:
    answers: dict[str, float] = field(default_factory=dict)  # session -> its answer
    times: dict[str, list[float]] = field(default_factory=dict)  # session -> when it answered
    locked: bool = False
    revealed: float | None = None


class Board:
    """Every question's answers, shared by the page's sessions (thread-safe); which question the
    presenter's Compare page asks now; and the answers revealed before (this page process)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}
        self._clock = clock
        self._asked: dict[str, str] = {}  # a page ("compare") -> the key of its question now
        self._revealed: dict[str, list[float]] = {}  # key -> every answer revealed, in order
        self._names: dict[str, str] = {}  # session -> the nickname it chose (the presenter's)

    def name(self, session: str, nickname: str) -> str:
        """A session's nickname, shown to the presenter only ("" or blanks: anonymous again);
        returns it as kept, or a coded refusal."""
        if not isinstance(nickname, str):
            raise Refused(f"a nickname is text, got {type(nickname).__name__}")
        kept = " ".join(nickname.split())
        if len(kept) > MAX_NAME or not all(c.isprintable() for c in kept):
            raise Refused(f"a nickname is at most {MAX_NAME} printable characters")
        with self._lock:
            if kept:
                self._names[session] = kept
            else:
                self._names.pop(session, None)
        return kept

    def ask(self, page: str, key: str) -> None:
        """The presenter's page asks ``key`` now: every session on that page shows it."""
        with self._lock:
            self._asked[page] = key

    def asked(self, page: str) -> str | None:
        with self._lock:
            return self._asked.get(page)

    def _tally(self, key: str) -> Tally:
        return self._tallies.setdefault(key, Tally())

    def answer(self, q: Question, session: str, value: object) -> None:
        """One session's answer (a new one replaces its last), or a coded refusal."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refused(f"an answer is a number, got {type(value).__name__}")
        if not (math.isfinite(value) and q.lo <= value <= q.hi):
            raise Refused(f"an answer is between {q.lo:g} and {q.hi:g}, got {value!r}")
        now = self._clock()
        with self._lock:
            t = self._tally(q.key)
            if t.locked:
                raise Locked("the presenter has locked this question: answers are final")
            times = t.times.setdefault(session, [])
            if session not in t.answers and len(t.answers) >= MAX_SESSIONS:
                raise RateLimited(f"this question has {MAX_SESSIONS} answers already")
            if len(times) >= MAX_EDITS or (times and now - times[-1] < MIN_GAP_S):
                raise RateLimited(
                    f"at most {MAX_EDITS} answers, one a second: your last one counts"
                )
            times.append(now)
            t.answers[session] = float(value)

    def lock(self, key: str, locked: bool = True) -> None:
        with self._lock:
            self._tally(key).locked = locked

    def reveal(self, key: str, value: float) -> None:
        """The engine's answer, shown to everyone; answers are locked from then on."""
        with self._lock:
            t = self._tally(key)
            t.locked, t.revealed = True, float(value)
            self._revealed.setdefault(key, []).append(float(value))

    def reset(self, key: str) -> None:
        with self._lock:
            self._tallies.pop(key, None)

    def view(self, key: str, session: str | None = None, presenter: bool = False) -> dict[str, Any]:
        """What a session sees: the class's answers without names, its own, and the state; the
        presenter also ``named``: (nickname, answer) of the students who chose one."""
        with self._lock:
            t = self._tallies.get(key) or Tally()
            values = sorted(t.answers.values())
            mine = t.answers.get(session) if session is not None else None
            named = sorted((self._names[s], v) for s, v in t.answers.items() if s in self._names)
            return {
                "named": named if presenter else [],
                "nickname": self._names.get(session, "") if session is not None else "",
                "earlier": list(self._revealed.get(key, []))[
                    : -1 if t.revealed is not None else None
                ],
                "count": len(values),
                "median": statistics.median(values) if values else None,
                "values": values,
                "mine": mine,
                "locked": t.locked,
                "revealed": t.revealed,
            }
