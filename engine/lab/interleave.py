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
    time per step; then B over A (``b_over_a``), the raw ceiling ``b_over_a x busy(A)`` (<= 1 when
    B only hides A's idle device time), the share of that possible gain B realised,
    ``(b_over_a - 1) / (1/busy(A) - 1)``, and the forward drift ``forward_b_over_a`` (B's median
    forward over A's) as its own number.

    The raw ceiling is not an identity: it is about ``busy(B) / forward_b_over_a``, so it goes
    over 1 when B's forwards run faster than A's (drift of the machine, or a B that skips work),
    and a claim on it needs a noise band sized from the drift measured in repeated runs. Its
    rescaled twin, B's rate times ``forward_b_over_a`` times busy(A), is about busy(B) and so
    never over 1 by construction; it is no longer reported. ``gain_share_eq`` (B's rate rescaled
    by the forward drift) is kept: about ``(busy(B) - busy(A)) / (1 - busy(A))``, the share of
    A's idle time B turned into compute."""
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
    possible = 1 / out[f"{a}_busy"] - 1 if out[f"{a}_busy"] else float("nan")
    speedup = _ratio(out[f"{b}_rate"], out[f"{a}_rate"])
    out["b_over_a"] = speedup
    out["ceiling"] = speedup * out[f"{a}_busy"]
    out["gain_share"] = (speedup - 1) / possible if possible > 0 else float("nan")
    out["b_over_a_eq"] = speedup * out["forward_b_over_a"]
    out["gain_share_eq"] = (out["b_over_a_eq"] - 1) / possible if possible > 0 else float("nan")
    out["idle_b_over_a"] = _ratio(out[f"{b}_idle_ms"], out[f"{a}_idle_ms"])
    return out


def _ratio(x: float, y: float) -> float:
    return x / y if y else float("nan")
