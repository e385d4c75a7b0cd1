"""The server's ``compare`` on a request trace: two policies (a loaded one beside a built-in, say)
replayed and scored as ``python -m engine.policy score`` scores them (``engine/lab/score.py``:
fresh engines on the live engine's weights, the priced clock, goodput, fairness), for the Compare
page. A trace is data, never code: it is the shipped one (``trace:class``) or the live engine's
own request records since its last reset (``trace:live``, what the page's export converts to:
``engine/workloads/trace.py``'s ``from_export``); nothing of it comes over the wire.

Every other workload name is the lessons' and goes to ``scenario.compare`` unchanged, so this is
the one ``Comparison.run`` the server is given (``engine/serve.py``).
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import InvalidConfig
from engine.core.metrics import ratio, summarize
from engine.lab import scenario, score
from engine.lab.specs import ITL_TARGET_S
from engine.lab.specs import WORKLOADS as LESSON_WORKLOADS
from engine.workloads import trace

TRACES = ("trace:class", "trace:live")
WORKLOADS = (*LESSON_WORKLOADS, *TRACES)
MAX_STEPS = 2000  # step records sent back per side (the page draws the last ones)


def items_of(workload: str, engine, scale: float) -> list[trace.TraceItem]:
    """The trace's first ``scale`` of its requests, by arrival."""
    if workload == "trace:class":
        items = trace.load(trace.SHIPPED)
    else:
        if engine is None:
            raise InvalidConfig("trace:live needs the live engine's records")
        items = trace.parse(trace.dumps(trace.from_export(engine.telemetry.jsonl())))
    return items[: max(1, round(len(items) * scale))]


def side(model, tok, items, config: dict[str, Any], weights: str | None) -> dict[str, Any]:
    config = dict(config)
    policy = config.pop("policy", "continuous")
    if weights:
        config.setdefault("weights", weights)
    steps, reqs = score.replay(model, tok, items, policy, "priced", **config)
    return {
        "config": {"policy": policy, **score.CONFIG, **config},
        "summary": summarize(steps, reqs),
        "score": score.measure(steps, reqs, score.TTFT_TARGET_S, ITL_TARGET_S),
        "steps": steps[-MAX_STEPS:],
        "steps_total": len(steps),
    }


def compare(
    model,
    tok,
    workload: str,
    a: dict[str, Any],
    b: dict[str, Any],
    scale: float = 1.0,
    weights: str | None = None,
    engine=None,
) -> dict[str, Any]:
    """``scenario.compare`` for a lesson's workload; for a trace, both sides scored on it."""
    if workload not in TRACES:
        return scenario.compare(model, tok, workload, a, b, scale, weights=weights)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 1:
        raise InvalidConfig(f"scale must be in (0, 1], got {scale!r}")
    items = items_of(workload, engine, scale)
    out: dict[str, Any] = {"workload": workload}
    out["a"], out["b"] = (side(model, tok, items, cfg, weights) for cfg in (a, b))
    sa, sb = out["a"]["score"], out["b"]["score"]
    ua, ub = out["a"]["summary"], out["b"]["summary"]  # the headline summary's, where it has them
    keys = [k for k in scenario.RATIO_KEYS if k in ua and k in ub]
    out["ratios"] = {f"{k}_b_over_a": ratio(ub[k], ua[k]) for k in keys}
    out["score_ratios"] = {f"{k}_b_over_a": ratio(sb[k], sa[k]) for k in score.RATIO_KEYS}
    out["trace"] = {
        "requests": len(items),
        "clients": len({it.client for it in items}),
        "clock": "priced",
        "targets": {"ttft_s": score.TTFT_TARGET_S, "itl_p99_s": ITL_TARGET_S},
    }
    return out
