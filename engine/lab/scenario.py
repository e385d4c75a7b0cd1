"""Lesson scenarios: ``scenario.toml`` -> a seeded workload -> runs on fresh engines -> claims.

The same canonical workloads (``engine/lab/specs.py``) serve the lessons (``python -m
engine.lesson N``, tests/lessons) and the server's ``compare`` message, so the page replays exactly
what a lesson measured.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.config import LIVE_FIELDS, EngineConfig, lab_weights
from engine.core.cost_model import CostModel, FrozenCostModel
from engine.core.engine import Engine
from engine.core.errors import InvalidConfig, UnknownMode
from engine.core.metrics import detail
from engine.core.metrics import ratio as _ratio
from engine.core.requests import RequestHandle
from engine.lab import interleave, stepclock
from engine.lab.replay import run
from engine.lab.specs import (  # the canonical workloads (engine/lab/specs.py)
    ITL_TARGET_S,
    SPECS,
    Spec,
    build_workload,
    natural,
    step_clock,
)
from engine.workloads.canonical import WorkItem
from engine.workloads.lessons import lesson_dirs

Result = dict[str, Any]
# What a scenario may set; the rest stays at EngineConfig's defaults.
CONFIG_FIELDS = (*LIVE_FIELDS, "dtype", "weights")


# -- one run -------------------------------------------------------------------------------------
def measure_peer(
    model, tok, spec: Spec, config: dict[str, Any], scale: float = 1.0, peer: str = "hf_static"
) -> Result:
    """The same workload through transformers' padded ``generate``, static batches of ``max_slots``.

    Its padding is counted from the same tokenized prompts ``generate`` receives: every batch is
    left-padded to its longest prompt, so it computes ``len(batch) x width`` prompt rows.
    """
    from engine.lab import (
        peer as peers,
    )  # transformers' serving paths; imported only when a lesson asks

    if peer != "hf_static":
        raise UnknownMode(f"unknown peer {peer!r}; choose hf_static")
    items = build_workload(spec, tok, scale)
    slots = int(config.get("max_slots", 8))
    res = peers.hf_static(model, tok, items, slots)
    ids = peers.prompt_ids(tok, sorted(items, key=lambda it: it.arrival_s))
    batches = [ids[b : b + slots] for b in range(0, len(ids), slots)]
    padded = sum(len(b) * max(map(len, b)) for b in batches)
    real = sum(map(len, ids))
    summary = {
        "throughput": res.tokens_per_s,
        "wall_s": res.wall_s,
        "useful_tokens": res.useful_tokens,
        "prefill_tokens": padded,
        "prompt_tokens": real,
        "padding_fraction": 1 - real / padded,
    }
    return {
        "config": {"peer": peer, "max_slots": slots},
        "summary": summary,
        "steps": [],
        "requests": [],
        "tokens": [],
    }


def measure(
    model,
    tok,
    spec: Spec,
    config: dict[str, Any],
    scale: float = 1.0,
    alternate: Spec | None = None,
    cost: CostModel | None = None,
) -> Result:
    """Run ``spec`` on a fresh engine sharing ``model``'s weights; summary plus the lessons' extras.

    ``alternate`` (``{field, values, every}``) switches one live field between two values every
    ``every`` steps and adds the two settings' block-by-block comparison (engine/lab/interleave.py).
    ``cost`` (a frozen, calibrated model) prices every step's ``expected_s`` instead of the fresh
    engine's own, still unfitted, model.
    """
    items = build_workload(spec, tok, scale)
    config = {"weights": lab_weights(), **config}  # the engine the class watches (one engine)
    handles: dict[int, RequestHandle] = {}
    device = next(model.parameters()).device.type  # the server's model may live on CUDA
    on_step = None
    if alternate:
        on_step = interleave.switcher(
            alternate["field"], alternate["values"], int(alternate["every"])
        )
    if cost is not None:
        on_step = _priced_by(cost, on_step)
    driver = stepclock.run if step_clock(spec) else run
    summary, engine = driver(
        model,
        tok,
        items,
        ignore_eos=not natural(spec),
        on_step=on_step,
        on_submit=lambda i, h: handles.__setitem__(i, h),
        **{"device": device, **config},
    )
    steps, requests = list(engine.telemetry.steps), list(engine.telemetry.requests.values())
    summary.update(_extras(steps, requests, items, handles))
    if alternate:
        summary.update(interleave.compare_blocks(steps, alternate["field"], alternate["values"]))
    tokens = [handles[i].token_ids for i in range(len(items))]
    return {
        "config": summary.pop("config"),
        "summary": summary,
        "steps": steps,
        "requests": requests,
        "tokens": tokens,
    }


def _priced_by(cost: CostModel, then):
    """An ``on_step`` that gives the engine ``cost`` before its first step, then calls ``then``."""

    def on_step(engine, step: int) -> None:
        if step == 0:
            engine.cost_model = engine.scheduler.cost_model = cost
        if then is not None:
            then(engine, step)

    return on_step


def calibrated(model, tok) -> FrozenCostModel:
    """This machine's quiet step costs, calibrated once on a fresh engine of the lab's weights
    (``Engine.calibrate``) and frozen: the yardstick a lesson's claims are stated against, so
    they hold on a slow laptop and a fast desktop alike."""
    device = next(model.parameters()).device.type
    engine = Engine(
        EngineConfig(weights=lab_weights(), device=device, max_slots=8), model=model, tokenizer=tok
    )
    engine.calibrate()
    return FrozenCostModel(engine.cost_model)


def _extras(
    steps: list[dict],
    requests: list[dict],
    items: list[WorkItem],
    handles: dict[int, RequestHandle],
) -> Result:
    # "Running" requests: those present from t=0 when others arrive later (a stall hurts their ITL).
    later = any(it.arrival_s > 0 for it in items)
    ids = {handles[i].id for i, it in enumerate(items) if not later or it.arrival_s == 0}
    out = detail(steps, requests, ids, ITL_TARGET_S)  # every formula: engine/core/metrics.py
    return {
        **out,
        **stepclock.rows_target(steps, requests),
        # The most prompt tokens one step computed (a whole long prompt, or one chunk of it).
        "max_step_prefill": max((r["tokens"]["prefill"] for r in steps), default=0),
    }


def engine_config(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Merge a base config and overrides, allowing only live fields and dtype; validated now."""
    merged = {**base, **overrides}
    unknown = set(merged) - set(CONFIG_FIELDS)
    if unknown:
        raise InvalidConfig(
            f"not a scenario config field: {', '.join(sorted(unknown))}; "
            f"use {', '.join(CONFIG_FIELDS)}"
        )
    EngineConfig(**merged)  # raises a coded FluxoError on a bad value
    return merged


# -- compare: the server's `compare` message -----------------------------------------------------
RATIO_KEYS = (
    "throughput",
    "ttft_p50",
    "itl_p50",
    "itl_p99",
    "itl_max",
    "running_itl_max",
    "running_itl_p99",
    "peak_running",
    "decode_tput",
    "tokens_per_step",
    "slot_steps_per_token",
)


def compare(
    model,
    tok,
    workload: str,
    a: dict[str, Any],
    b: dict[str, Any],
    scale: float = 1.0,
    weights: str | None = None,
) -> Result:
    """Replay one canonical workload under configs ``a`` and ``b`` (fresh engines, same weights;
    ``weights``: the live engine's format, by default the lab's)."""
    if workload not in SPECS:
        raise UnknownMode(f"unknown workload {workload!r}; choose one of {', '.join(SPECS)}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 1:
        raise InvalidConfig(f"scale must be in (0, 1], got {scale!r}")
    spec = SPECS[workload]
    base = {**spec["engine"], "weights": weights or lab_weights()}
    configs = {
        k: engine_config(base, v) for k, v in (("a", a), ("b", b))
    }  # both valid before either runs
    out: Result = {"workload": workload}
    for key, config in configs.items():
        res = measure(model, tok, spec, config, scale)
        res.pop("tokens")
        out[key] = res
    out["ratios"] = ratios(out["a"]["summary"], out["b"]["summary"])
    return out


def ratios(sa: dict[str, Any], sb: dict[str, Any]) -> dict[str, float]:
    """B over A for every ``RATIO_KEYS`` figure of two runs' summaries, and each side's waste and
    busy figures: what a comparison answers (and what a recording keeps, engine/lab/recordings.py).
    """
    out = {f"{k}_b_over_a": _ratio(sb[k], sa[k]) for k in RATIO_KEYS}
    out.update(
        kv_waste_a=sa["kv_waste"],
        kv_waste_b=sb["kv_waste"],
        dead_slot_fraction_a=sa["dead_slot_fraction"],
        dead_slot_fraction_b=sb["dead_slot_fraction"],
        busy_fraction_a=sa["busy_fraction"],
        busy_fraction_b=sb["busy_fraction"],
    )
    return out


# -- lessons -------------------------------------------------------------------------------------
def lesson_dir(number: int) -> Path:
    for p in lesson_dirs():
        if int(p.name[:2]) == number:
            return p
    raise InvalidConfig(f"no lesson {number}; lessons: {', '.join(p.name for p in lesson_dirs())}")


def load(path: Path) -> Spec:
    with open(path, "rb") as f:
        return tomllib.load(f)


def run_lesson(model, tok, scenario: Spec, short: bool = False) -> Result:
    """Every [[run]] of a scenario, one after the other in this process, then its [[check]]s."""
    wl = scenario["workload"]
    base_scale = wl.get("short_scale", 0.5) if short else 1.0
    # [short]: config for the shortened replay (e.g. a KV budget scaled with the answers' cap).
    base = {**scenario["engine"], **(scenario.get("short", {}) if short else {})}
    runs: dict[str, Result] = {}
    against = any(c.get("against") for c in scenario["check"])
    cost = calibrated(model, tok) if against else None
    for r in scenario["run"]:
        spec = SPECS[r.get("workload", wl["name"])]
        overrides = {k: v for k, v in r.items() if k in CONFIG_FIELDS}
        config = engine_config(base, overrides)
        scale = base_scale * r.get("scale", 1.0)
        if "peer" in r:
            runs[r["name"]] = measure_peer(
                model, tok, spec, {**spec["engine"], **config}, scale, r["peer"]
            )
        else:
            runs[r["name"]] = measure(model, tok, spec, config, scale, r.get("alternate"), cost)
    # A claim may hold for one replay only (``variants = ["full"]``): e.g. a median over the full
    # run's 16 requests, which the short run's 4 cannot give.
    variant = "short" if short else "full"
    checks = [
        evaluate(c, runs, short)
        for c in scenario["check"]
        if variant in c.get("variants", ("short", "full"))
    ]
    return {"runs": runs, "checks": checks}


OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda x, t: x >= t,
    "<=": lambda x, t: x <= t,
    "==": lambda x, t: x == t,
}


def evaluate(check: Spec, runs: dict[str, Result], short: bool = False) -> Result:
    """One claim: a run's metric, or its ratio (or difference) to another's, against a threshold."""
    run_ = runs[check["run"]]
    if (
        check["metric"] == "same_tokens"
    ):  # token-for-token agreement of two runs of the same workload
        value = float(run_["tokens"] == runs[check["over"]]["tokens"])
    elif check["metric"] == "same_prefix":
        # the same prompts with answers cut at different lengths (a run at another ``scale``):
        # each pair of answers agrees token for token as far as the shorter one goes
        pairs = zip(run_["tokens"], runs[check["over"]]["tokens"], strict=True)
        value = float(bool(run_["tokens"]) and all(a[: len(b)] == b[: len(a)] for a, b in pairs))
    else:
        value = run_["summary"][check["metric"]]
        if (
            "over" in check or "over_metric" in check
        ):  # another run's metric, or another metric of this run
            other = runs[check.get("over", check["run"])]["summary"][
                check.get("over_metric", check["metric"])
            ]
            value = value - other if check.get("mode") == "diff" else _ratio(value, other)
        if check.get("against") == "expected":
            # Measured over what this machine's calibrated step costs promise for the same steps
            # (``<metric>_expected``): a claim that holds on any CPU or GPU, stated as a count.
            key = check["metric"] + "_expected"
            promised = run_["summary"][key]
            if "over" in check:
                promised = _ratio(promised, runs[check["over"]]["summary"][key])
            value = _ratio(value, promised)
        if check.get("mode") == "ceiling":
            # A speedup over the most overlap can give, 1 / busy of the run it is measured against:
            # (b / a) x busy(a) <= 1 (plus noise) whenever b only hides a's idle device time.
            value *= runs[check["over"]]["summary"]["busy_fraction"]
    threshold = check.get("short_threshold", check["threshold"]) if short else check["threshold"]
    ok = not math.isnan(value) and OPS[check["op"]](value, threshold)
    return {
        "claim": check["claim"],
        "op": check["op"],
        "threshold": threshold,
        "measured": value,
        "ok": ok,
    }
