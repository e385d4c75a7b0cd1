"""Traffic that repeats prompt prefixes, and the ``prefix`` benchmark (prefix cache off vs on).

Two kinds of repetition a real server sees every second:

- questions over one long shared document (a report pasted before each question, retrieval
  context, a long system prompt): hundreds of identical leading tokens per request;
- chats: every request starts with the chat template's system preamble (24 tokens for
  SmolLM2-135M-Instruct: one full block of 16 is shareable).

``python -m engine.bench prefix`` replays one seeded mix of both with the cache off and on,
interleaved (off, on, off, on), and reports TTFT, useful tokens/s, prefill tokens computed and the
hit rate; then the ``batching`` workload (no shared document) off and on, to price the bookkeeping.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from engine.core.metrics import median
from engine.workloads.canonical import CHAT_PROMPTS, WorkItem, batching_workload

# A document of its own (not the transport report of ``LONG_CONTEXT``, which other workloads
# repeat).
DOCUMENT = (
    "Annual report of the River Valley library network. The network runs nine branches, two mobile "
    "libraries and a digital lending service for about 140,000 residents. Visits grew by eleven "
    "percent this year, driven by the new evening hours at the central branch and by the reopening "
    "of the Northside branch after its roof was rebuilt. Loans of printed books were stable, while "
    "digital loans of e-books and audiobooks rose by a third; the waiting lists for popular titles "
    "now average five weeks. The children's reading club enrolled 3,200 members, its best year, "
    "and "
    "the summer program ran in every branch for the first time. Adult courses on computers and on "
    "filling in government forms were full from the first week, and the network added a second "
    "course on spotting online fraud. The mobile libraries visited fourteen villages every two "
    "weeks, "
    "but one of the two vans broke down for two months, which cut those visits by a quarter. Staff "
    "numbers fell from 88 to 83 because five positions stayed vacant; volunteers covered part of "
    "the "
    "shelving and the homework help. The budget was 6.1 million, of which 58 percent went to "
    "salaries, 17 percent to books and licences, 12 percent to buildings and the rest to "
    "transport, "
    "events and software. Energy costs rose sharply, and the board approved solar panels for three "
    "branches. Surveys gave the network a satisfaction score of 8.4 out of 10; the main complaints "
    "were the lack of study rooms during exams, slow wifi in two branches and the short opening "
    "hours on Saturdays. For next year the board asks for a plan that extends Saturday hours, "
    "replaces the broken van, adds study rooms and keeps the digital collection growing without "
    "cutting the budget for printed books."
)

QUESTIONS = (
    "Why did visits grow this year?",
    "What happened to digital loans?",
    "How many members joined the children's reading club?",
    "Which adult courses were offered?",
    "Why were mobile library visits cut?",
    "How many staff does the network have now?",
    "How was the budget split?",
    "What did the board decide about energy?",
    "What was the satisfaction score?",
    "What were the main complaints?",
    "What does the board ask for next year?",
    "How long are the waiting lists for popular titles?",
    "How many villages do the mobile libraries visit?",
    "Which branch reopened, and why was it closed?",
    "Who covered the work of the vacant positions?",
    "Summarize the report in one sentence.",
)


def document_prompt(index: int) -> str:
    """The shared document, then one of the questions (the same leading tokens every time)."""
    return f"{DOCUMENT}\n\nQuestion: {QUESTIONS[index % len(QUESTIONS)]}"


def prefix_workload(
    questions: int = 16, chats: int = 8, rate: float = 6.0, new_tokens: int = 24, seed: int = 0
) -> list[WorkItem]:
    """Questions over the document and chats, shuffled, arriving as a seeded Poisson stream."""
    rng = random.Random(seed)
    prompts = [document_prompt(i) for i in range(questions)] + [
        CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(chats)
    ]
    rng.shuffle(prompts)
    t, items = 0.0, []
    for p in prompts:
        items.append(WorkItem(p, new_tokens, t))
        t += rng.expovariate(rate)
    return items


def cache_counts(requests: list[dict]) -> dict[str, float]:
    """Count-based prefix-cache figures of a run, from its request records."""
    prompt = sum(r["prompt_tokens"] for r in requests)
    cached = sum(r["cached_tokens"] for r in requests)
    computed = sum(r["computed_prompt_tokens"] for r in requests)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": computed,
        "hit_rate": cached / prompt if prompt else 0.0,
    }


MERGED_KEYS = (
    "throughput", "ttft_p50", "ttft_p95", "itl_p50", "itl_p99", "wall_s", "useful_tokens", "steps",
    "prompt_tokens", "cached_tokens", "prefill_tokens", "hit_rate", "busy_fraction",
    "slot_utilization", "peak_running", "kv_waste",
)  # fmt: skip


def _off_on(model, tok, run: Callable, items: list, reps: int, slots: int) -> list[list[dict]]:
    """``reps`` x (cache off, cache on) on ``items``, interleaved; [off runs, on runs]."""
    out: list[list[dict]] = [[], []]
    for _ in range(reps):
        for on in (False, True):
            summary, engine = run(
                model, tok, items, policy="continuous", max_slots=slots, prefix_cache=on
            )
            summary.update(cache_counts(list(engine.telemetry.requests.values())))
            out[on].append(summary)
    return out


def _merge(results: list[dict]) -> dict[str, float]:
    """Medians over the repetitions, and the spread of the wall-clock figures."""
    merged = {k: median([r[k] for r in results]) for k in MERGED_KEYS}
    for k in ("throughput", "ttft_p50"):
        merged[f"{k}_min"] = min(r[k] for r in results)
        merged[f"{k}_max"] = max(r[k] for r in results)
    return merged


def bench_prefix(
    model, tok, run: Callable[..., tuple[dict, Any]], reps: int = 2, slots: int = 8
) -> dict[str, Any]:
    """Cache off vs on, interleaved ``reps`` times, on the prefix workload and on ``batching``."""
    runs: dict[str, list[dict]] = {}
    runs["off"], runs["on"] = _off_on(model, tok, run, prefix_workload(), reps, slots)
    batching = _off_on(model, tok, run, batching_workload(), reps, slots)
    runs["batching_off"], runs["batching_on"] = batching
    out: dict[str, Any] = {"runs": {k: _merge(v) for k, v in runs.items()}, "reps": reps}
    off, on = out["runs"]["off"], out["runs"]["on"]
    b_off, b_on = out["runs"]["batching_off"], out["runs"]["batching_on"]
    out["ratios"] = {
        "prefix_ttft_p50_on_over_off": on["ttft_p50"] / off["ttft_p50"],
        "prefix_throughput_on_over_off": on["throughput"] / off["throughput"],
        "prefix_hit_rate": on["hit_rate"],
        "prefix_prefill_tokens_on_over_off": on["prefill_tokens"] / off["prefill_tokens"],
        "prefix_batching_throughput_on_over_off": b_on["throughput"] / b_off["throughput"],
        "prefix_batching_hit_rate": b_on["hit_rate"],
    }
    return out
