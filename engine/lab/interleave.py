"""Two settings of one engine compared inside one run, block by block.

A shared machine's speed drifts by several times within a minute (other processes come and go),
so two runs made one after the other can differ by more than the effect a lesson shows. An
interleaved run switches one live field (e.g. ``runner``: sync, async, sync, ...) every ``every``
steps of the same engine and workload; each block's steps are labelled by the setting they ran
under, and the two settings are compared on steps only seconds apart, so a slow moment of the
machine hits both alike.

Only steady decode steps count (no prefill), and the first ``SKIP`` steps of each block are
dropped: a switch takes effect between steps, so the step that carries it is labelled with the
new setting but ran under the old one (and an async step in flight is landed by the sync one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.errors import InvalidConfig
from engine.core.metrics import median

SKIP = 2  # steps dropped at the head of each block (the switch itself, then the step it lands)


def switcher(field: str, values: list[Any], every: int) -> Callable[[Any, int], None]:
    """An ``on_step`` callback for ``replay.run``: ``field`` takes the next value every ``every``
    steps."""
    if len(values) != 2 or every <= SKIP:
        raise InvalidConfig(
            f"alternate needs two values and every > {SKIP}, got {values!r} every {every}"
        )

    def on_step(engine, steps: int) -> None:
        if steps % every == 0:
            engine.reconfigure(**{field: values[(steps // every) % 2]})

    return on_step


def _steady(steps: list[dict], field: str) -> list[tuple[Any, float, float, int]]:
    """(label, interval, compute, tokens) of each steady decode step, block heads dropped."""
    out, run_len = [], 0
    for prev, rec in zip(steps, steps[1:], strict=False):
        run_len = run_len + 1 if rec[field] == prev[field] else 0
        interval = rec["t_end"] - prev["t_end"]  # what a step costs, under either runner
        compute = sum(s["end"] - s["start"] for s in rec["spans"] if s["lane"] == "compute")
        if (
            run_len >= SKIP
            and rec["tokens"]["prefill"] == 0
            and rec["tokens"]["decode"] > 0
            and interval > 0
        ):
            out.append((rec[field], interval, compute, rec["tokens"]["decode"]))
    return out


def compare_blocks(steps: list[dict], field: str, values: list[Any]) -> dict[str, float]:
    """Per setting: decode tokens/s (the median step's rate), device busy, device idle and forward
    time per step; then B over A (``b_over_a``), the ceiling ``b_over_a x busy(A)`` (<= 1 when B
    only hides A's idle device time) and the share of that possible gain B realised,
    ``(b_over_a - 1) / (1/busy(A) - 1)``.

    The ceiling assumes both settings' forwards take the same time. On this shared VM they do not:
    the median forward of one runner's blocks differed from the other's by 2-20 % within one run,
    either way (lesson 9, 1 thread, load < 1, 2026-11-30), which moves ``b_over_a`` by as much as
    the effect. So each figure also comes at equal forward (``*_eq``): B's rate rescaled by
    ``forward_b_over_a``, its median forward over A's."""
    a, b = values
    rows = _steady(steps, field)
    out: dict[str, float] = {}
    for v in values:
        mine = [r for r in rows if r[0] == v]
        out[f"{v}_steps"] = len(mine)
        out[f"{v}_rate"] = median([n / i for _, i, _, n in mine])  # decode tokens/s
        out[f"{v}_busy"] = median(
            [min(c / i, 1.0) for _, i, c, _ in mine]
        )  # compute share of a step
        out[f"{v}_idle_ms"] = 1000 * median(
            [max(i - c, 0.0) for _, i, c, _ in mine]
        )  # device idle per step
        out[f"{v}_compute_ms"] = 1000 * median([c for _, _, c, _ in mine])  # the forward itself
    out["forward_b_over_a"] = _ratio(out[f"{b}_compute_ms"], out[f"{a}_compute_ms"])
    for suffix, speedup in (
        ("", _ratio(out[f"{b}_rate"], out[f"{a}_rate"])),
        ("_eq", _ratio(out[f"{b}_rate"], out[f"{a}_rate"]) * out["forward_b_over_a"]),
    ):
        possible = 1 / out[f"{a}_busy"] - 1 if out[f"{a}_busy"] else float("nan")
        out[f"b_over_a{suffix}"] = speedup
        out[f"ceiling{suffix}"] = speedup * out[f"{a}_busy"]
        out[f"gain_share{suffix}"] = (speedup - 1) / possible if possible > 0 else float("nan")
    out["idle_b_over_a"] = _ratio(out[f"{b}_idle_ms"], out[f"{a}_idle_ms"])
    return out


def _ratio(x: float, y: float) -> float:
    return x / y if y else float("nan")
