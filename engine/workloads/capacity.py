"""Offered load in units of this engine's capacity: what a lesson's traffic means on any machine.

A rate in requests/s shows a queue on one laptop and nothing on a machine twice as fast (the q4
kernels made the same 2-core machine serve 2-2.5x more, and lessons 1, 4, 6 and 7 lost their
effect). So a lesson states its traffic as ``load``: a multiple of the requests/s at which this
engine, in its current configuration, would be 100 % busy for that traffic's shape. ``load = 1.5``
queues; ``load = 0.5`` leaves half the steps' time idle; on a GPU the same words give the same
picture.

Capacity comes from two measured things and one counted one:

- the **cost model** (``engine/core/cost_model.py``), calibrated on this machine's quiet steps: a
  step's compute from its rows, logit rows and attention pairs, plus the host work around it;
- the **traffic's shape**, counted, not guessed: the seeded ``TrafficSource`` draws its first
  ``SAMPLE`` arrivals, each prompt goes through the chat template and the tokenizer as a request
  would, and their mean prompt and answer lengths (and the prompt prefix they all share, which the
  prefix cache computes once) are what the engine will be asked for;
- the **configuration**: slots, and how many sequences the KV budget holds at once (a reserved
  layout holds ``prompt + max_new_tokens`` per sequence, a paged one what it stores).

With ``n`` sequences decoding each step (``n`` = slots, or fewer where memory binds), one request
takes ``answer`` rows of full decode steps (its ``1/n`` share of each) and the extra a step pays to
carry its prompt (the prefill's marginal cost)::

    seconds_per_request = answer * expected(decode step of n rows) / n
                          + compute(that step with the prompt) - compute(that step)
    capacity            = 1 / seconds_per_request          (requests/s at 100 % busy)

It is the continuous engine's ceiling for that many slots: a static batch's dead slots or a
stalled step serve less at the same offered load, which is what lessons 2 and 3 show. Answers of
``lengths = "natural"`` end at the model's end-of-sequence token: their length is unknown before
they run, so ``max_tokens`` stands for it (capacity at least what is said; the load at most).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.cost_model import CostModel, StepWork
from engine.core.numbers import ceil_div
from engine.workloads.traffic import TrafficParams, TrafficSource

SAMPLE = 128  # arrivals drawn to count a shape's lengths (the traffic's own seed: exact for it)


@dataclass(frozen=True, slots=True)
class Shape:
    """A traffic's mean lengths in tokens, counted on its own first ``SAMPLE`` arrivals."""

    prompt: float  # prompt tokens after the chat template
    shared: int  # leading prompt tokens every request shares (the template's preamble)
    answer: float  # answer tokens (natural lengths: max_tokens, their upper bound)
    reserve: float  # tokens a reserved KV layout holds per sequence (prompt + max_new_tokens)


def shape_of(params: TrafficParams, encode) -> Shape:
    """``params``' traffic counted: ``encode(prompt) -> token ids`` is the engine's own path
    (``engine.core.requests.encode`` with its tokenizer)."""
    source = TrafficSource(params)  # a fresh copy: the same seed, the same first arrivals
    prompts, answers, reserves, common = [], [], [], None
    for _ in range(SAMPLE):
        arrival = source.next()
        ids = encode(arrival.prompt)
        prompts.append(len(ids))
        answers.append(arrival.max_new_tokens)
        reserves.append(len(ids) + arrival.max_new_tokens)
        common = ids if common is None else _common_prefix(common, ids)
    n = len(prompts)
    return Shape(sum(prompts) / n, len(common or ()), sum(answers) / n, sum(reserves) / n)


def _common_prefix(a: list[int], b: list[int]) -> list[int]:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return a[:k]


def concurrency(
    shape: Shape, slots: int, kv_blocks: int, block_size: int, kv_layout: str, prefix_cache: bool
) -> int:
    """How many sequences decode together at full load: the slots, or fewer where the KV budget
    runs out first (a reserved layout holds each sequence's whole reservation; a paged one its
    stored tokens, about prompt plus half the answer on average)."""
    per_seq = shape.reserve if kv_layout == "reserved" else shape.prompt + shape.answer / 2
    blocks = ceil_div(max(1, round(per_seq)), block_size)
    if prefix_cache and kv_layout == "paged":  # the shared prefix's full blocks are held once
        blocks = max(1, blocks - shape.shared // block_size)
    return max(1, min(slots, kv_blocks // max(1, blocks)))


def seconds_per_request(model: CostModel, shape: Shape, n: int, cached: int) -> float | None:
    """Step time one request costs at full load with ``n`` sequences per step and ``cached``
    prompt tokens found in the prefix cache (module docstring); None before the model is fitted."""
    if not model.ready:
        return None
    ctx = round(shape.prompt + shape.answer / 2)  # a decode row's mean context
    new = max(1, round(shape.prompt - cached))
    decode = StepWork(n, n, n * ctx, n * ctx)  # a full decode-only step
    with_prompt = StepWork(n + new, n + 1, n * ctx + new * round(shape.prompt), n * ctx)
    step = model.expected(decode)  # the forward and the host work around it
    with_cost, decode_cost = model.predict_compute(with_prompt), model.predict_compute(decode)
    assert step is not None and with_cost is not None and decode_cost is not None  # ready above
    prefill = with_cost - decode_cost
    return shape.answer * step / n + prefill


def capacity(model: CostModel, shape: Shape, config) -> float | None:
    """Requests/s at which the engine in ``config`` (an ``EngineConfig``) would be 100 % busy
    serving ``shape``; None before the cost model is fitted."""
    n = concurrency(
        shape,
        config.max_slots,
        config.kv_blocks,
        config.block_size,
        config.kv_layout,
        config.prefix_cache,
    )
    bs = config.block_size
    cached = (shape.shared // bs) * bs if config.prefix_cache else 0  # the preamble's whole blocks
    s = seconds_per_request(model, shape, n, cached)
    return None if not s else 1.0 / s
