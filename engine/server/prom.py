"""Prometheus metrics for ``GET /metrics``: vLLM's names and meanings where they exist, Fluxo's own
beside them (``docs/protocol.md``, section HTTP).

Counters and histograms are fed by a telemetry listener (``Telemetry.subscribe``), one call per
step record and per request record as the engine makes them, so they stay monotonic however the
telemetry buffers are trimmed, and a ``reset`` (which clears telemetry) does not move them back.
Gauges (running, waiting, KV use, config) are read from the engine when the page is rendered.

Where Fluxo's moment of counting differs from vLLM's, it is said here: prompt and generation tokens,
TTFT, inter-token latency and end-to-end latency are observed when a request ends (its record then
holds every token time); vLLM observes them per iteration. Over a scrape interval the totals agree.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.records import Record

# Bucket upper bounds in seconds (tokens for the per-step histogram). On this CPU a SmolLM2 decode
# step is ~45 ms and a 384-token prefill ~0.6 s, so the fine buckets sit around those.
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (
    0.1,
    0.3,
    0.5,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


# The vLLM histograms the page carries, in page order: (name, help, key of _snapshot's hists).
VLLM_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Arrival to first token, seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.", "itl"),
    ("vllm:e2e_request_latency_seconds", "Arrival to end of finished requests, seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Arrival to admission into a slot, seconds.", "queue"),
    ("vllm:iteration_tokens_total", "Token rows per engine step (dead slots included).", "step"),
)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        i = 0
        while i < len(self.bounds) and v > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.total += v
        self.n += 1


@dataclass(slots=True)
class Counters:
    prompt_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's name)
    prefix_hits: int = 0  # of those, the tokens found there (lesson 10's cache)
    generation_tokens: int = 0
    preemptions: int = 0
    dead_slot_steps: int = 0
    steps: int = 0
    step_tokens: dict[str, int] = field(
        default_factory=lambda: {"prefill": 0, "decode": 0, "dead": 0}
    )
    ended: dict[str, int] = field(
        default_factory=lambda: {"finished": 0, "cancelled": 0, "failed": 0}
    )
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    step_size: Histogram = field(default_factory=lambda: Histogram(STEP_TOKEN_BUCKETS))


class Metrics:
    """Subscribes to an engine's telemetry on creation; ``render()`` is the ``/metrics`` page."""

    def __init__(
        self, engine, model_name: str, extra: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.extra = extra  # server facts (HTTP requests in flight, subscribers) added as gauges
        self.c = Counters()
        self._lock = threading.Lock()
        self.unsubscribe = engine.telemetry.subscribe(self._on_record)

    # -- the engine thread ----------------------------------------------------------------------
    def _on_record(self, kind: str, rec: Record) -> None:
        with self._lock:
            c = self.c
            if kind == "step":
                c.steps += 1
                c.preemptions += len(rec["preempted"])
                tokens = rec["tokens"]
                for phase in c.step_tokens:
                    c.step_tokens[phase] += tokens.get(phase, 0)
                c.dead_slot_steps += tokens.get("dead", 0)  # one row per dead slot per step
                c.step_size.observe(
                    tokens.get("prefill", 0) + tokens.get("decode", 0) + tokens.get("dead", 0)
                )
                return
            if rec["finished"] is None:  # queued: counted when it ends
                return
            c.ended[rec["status"]] = c.ended.get(rec["status"], 0) + 1
            times = rec["token_times"]
            if rec["admitted"] is not None:
                c.prompt_tokens += rec["prompt_tokens"]
                c.prefix_queries += rec["prompt_tokens"]
                c.prefix_hits += rec.get("cached_tokens") or 0
                c.queue.observe(rec["admitted"] - rec["arrival"])
            c.generation_tokens += len(times)
            if rec["first_token"] is not None:
                c.ttft.observe(rec["first_token"] - rec["arrival"])
            for a, b in zip(times, times[1:], strict=False):
                c.itl.observe(b - a)
            if rec["status"] == "finished":
                c.e2e.observe(rec["finished"] - rec["arrival"])

    # -- the page -------------------------------------------------------------------------------
    def render(self) -> str:
        """The page: vLLM's metric names, then Fluxo's (and the server's extra gauges)."""
        snap, hists = self._snapshot()
        w = _Writer({"model_name": self.model_name})
        self._vllm(w, snap, hists)
        self._fluxo(w, snap)
        for name, (kind, help_, value) in (self.extra() if self.extra else {}).items():
            w.metric(name, kind, help_, [({}, value)])
        return w.text()

    def _snapshot(self) -> tuple[tuple, dict[str, tuple]]:
        """The counters and histograms, copied whole under the listener's lock."""
        with self._lock:
            c = self.c
            snap = (
                c.prompt_tokens,
                c.generation_tokens,
                c.preemptions,
                c.dead_slot_steps,
                c.steps,
                dict(c.step_tokens),
                dict(c.ended),
                (c.prefix_queries, c.prefix_hits),
            )
            hists = {
                name: (h.bounds, list(h.counts), h.total, h.n)
                for name, h in (
                    ("ttft", c.ttft),
                    ("itl", c.itl),
                    ("e2e", c.e2e),
                    ("queue", c.queue),
                    ("step", c.step_size),
                )
            }
        return snap, hists

    def _vllm(self, w: _Writer, snap: tuple, hists: dict[str, tuple]) -> None:
        self._vllm_gauges(w)
        prompt, gen, preempt = snap[:3]
        w.metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens of ended requests that were admitted (counted at the end).",
            [({}, prompt)],
        )
        w.metric(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated by ended requests (counted at the end).",
            [({}, gen)],
        )
        for name, help_, value in (
            (
                "queries",
                "Prompt tokens looked up in the prefix cache (ended requests).",
                snap[7][0],
            ),
            ("hits", "Of those, the tokens the prefix cache held (ended requests).", snap[7][1]),
        ):
            w.metric(f"vllm:prefix_cache_{name}_total", "counter", help_, [({}, value)])
        w.metric(
            "vllm:num_preemptions_total",
            "counter",
            "Preemptions by recompute (a running sequence's KV given back).",
            [({}, preempt)],
        )
        for name, help_, key in VLLM_HISTOGRAMS:
            w.histogram(name, help_, hists[key])

    def _vllm_gauges(self, w: _Writer) -> None:
        eng = self.engine
        w.metric(
            "vllm:num_requests_running",
            "gauge",
            "Requests in a batch slot now (live, not dead).",
            [({}, eng.running_count(include_dead=False))],
        )
        w.metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests submitted and not admitted yet.",
            [({}, eng.queue_len())],
        )
        kv = eng.kv_usage()
        usage = kv["blocks_used"] / kv["blocks_total"] if kv["blocks_total"] else 0.0
        w.metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV blocks in use / the KV budget (1 = full).",
            [({}, usage)],
        )

    def _fluxo(self, w: _Writer, snap: tuple) -> None:
        eng, cfg, kv = self.engine, self.engine.config, self.engine.kv_usage()
        dead, steps, step_tokens, ended = snap[3:7]
        w.metric(
            "fluxo:dead_slot_steps_total",
            "counter",
            "Slot-steps computed for requests that had already ended (static batches).",
            [({}, dead)],
        )
        w.metric("fluxo:steps_total", "counter", "Engine steps taken.", [({}, steps)])
        w.metric(
            "fluxo:step_tokens_total",
            "counter",
            "Token rows computed, by phase (prefill counts recompute after preemption).",
            [({"phase": k}, v) for k, v in step_tokens.items()],
        )
        w.metric(
            "fluxo:requests_ended_total",
            "counter",
            "Requests ended, by status.",
            [({"status": k}, v) for k, v in ended.items()],
        )
        w.metric(
            "fluxo:policy_info",
            "gauge",
            "The live scheduling configuration (value always 1).",
            [({"policy": cfg.policy, "runner": cfg.runner, "kv_layout": cfg.kv_layout}, 1)],
        )
        w.metric("fluxo:max_slots", "gauge", "Batch slots.", [({}, cfg.max_slots)])
        w.metric(
            "fluxo:kv_blocks_total", "gauge", "The KV budget in blocks.", [({}, kv["blocks_total"])]
        )
        w.metric("fluxo:kv_blocks_used", "gauge", "KV blocks in use.", [({}, kv["blocks_used"])])
        w.metric(
            "fluxo:engine_paused",
            "gauge",
            "1 while the presenter has paused the engine.",
            [({}, int(eng.paused))],
        )


class _Writer:
    """Prometheus text exposition format 0.0.4."""

    def __init__(self, common: dict[str, str]) -> None:
        self.common = common
        self.lines: list[str] = []

    def _labels(self, extra: dict[str, Any]) -> str:
        pairs = {**self.common, **extra}
        return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs.items()) + "}"

    def metric(self, name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{self._labels(labels)} {_num(value)}")

    def histogram(self, name: str, help_: str, h: tuple) -> None:
        bounds, counts, total, n = h
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} histogram")
        acc = 0
        for bound, k in zip(list(bounds) + [math.inf], counts, strict=False):
            acc += k
            le = "+Inf" if bound == math.inf else _num(float(bound))
            self.lines.append(f"{name}_bucket{self._labels({'le': le})} {acc}")
        self.lines.append(f"{name}_sum{self._labels({})} {_num(total)}")
        self.lines.append(f"{name}_count{self._labels({})} {n}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))
