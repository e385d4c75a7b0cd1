"""``python -m engine.lesson all --live --check --preflight``: will the class see it, here?

Before a class, each lesson's Live steps run briefly, as the room will see them: one engine server
started as ``make lab`` starts it, each lesson set up as the Lessons page does (a reset, its
[engine] and its traffic, whose load is in units of this engine's capacity), a 3 s warm-up, then
only the settings its ``[[live_check]]`` claims name, 10 s each (22 visits: about 4-5 minutes for
all twelve lessons); a lesson that did not show is visited again over 30 s windows, the page's
own (about a minute more for each). Per lesson: ``shows`` (every claim's effect at least its
size), ``weak`` (the right way, at least half the size in log terms) or ``none``; the measured
ratio against the bound;
the load and the requests/s it came to here; and what to do (run it live, or press "Replay this
lesson's recording"). The run is kept in the Fluxo cache (``preflight_file``), where the Lessons
page shows each lesson's line.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from engine.lab import live_steps
from engine.lab.live_steps import OPS, check, live_claims, settings
from engine.workloads.lessons import last_preflight, preflight_file

SECONDS = 10.0  # per visited setting: 22 visits and 12 resets in about 4-5 minutes
# A lesson that did not show in its short windows (or measured nothing: no answer, no token gap)
# is visited again, this many times as long: 30 s, the page's own headline window, what the class
# will watch. Lesson 11's long prompts at 0.4x capacity came to 0.38 requests/s on an AVX2-only
# EPYC (2026-12-03), and a 10 s window of its chunked setting held no token gap, while 20 s showed
# ITL p99 437 -> 86 ms. Lesson 2's static queue builds over its window: on an AVX-512 EPYC
# (2026-12-07) 10 s windows read TTFT continuous / static 0.91, 0.71, 0.66, 0.61 (bound <= 0.33),
# 20 s windows 0.05 and 0.14. A short window is not "does not show".
LONGER = 3
WARMUP_S = 3.0  # before a lesson's first window: the traffic past its empty start
ADVICE = {
    "shows": ("run it live", "rode ao vivo"),
    "weak": (
        "the effect is there, under its bound: run it live and point at it, or press Replay "
        "this lesson's recording",
        "o efeito existe, abaixo do limite: rode ao vivo e aponte para ele, ou aperte "
        "Reproduzir a gravação desta aula",
    ),
    "none": (
        "press Replay this lesson's recording",
        "aperte Reproduzir a gravação desta aula",
    ),
    "no_claim": (
        "the lesson says why: use its replay",
        "a aula diz por quê: use a reexecução",
    ),
}
RANK = {"shows": 0, "weak": 1, "none": 2}
WEAK = 0.5  # a ratio past half the size's distance from 1 (in log terms) "shows, weakly"


def visits(scenario: dict) -> dict:
    """The lesson with only the ``[[live]]`` settings its claims name, in order; what a skipped
    setting changes is carried into the next visited one (lesson 1 visits 1 and 8 slots)."""
    named = {c[k] for c in live_claims(scenario) for k in ("a", "b")}
    out: list[dict[str, Any]] = []
    carry: dict[str, Any] = {}
    for s in settings(scenario):
        merged = {**carry, **s}
        if s.get("traffic") or carry.get("traffic"):
            merged["traffic"] = {**carry.get("traffic", {}), **s.get("traffic", {})}
        if s["name"] in named:
            out.append(merged)
            carry = {}
        else:
            carry = {k: v for k, v in merged.items() if k not in ("name", "name_pt")}
    return {**scenario, "live": out}


def verdicts(scenario: dict, run: dict[str, Any]) -> dict[str, Any]:
    """One lesson's verdict from one short visit: per claim its ratio against its bound and
    ``shows`` / ``weak`` / ``none``; the lesson's is its weakest claim's; the traffic it offered."""
    claims = check(scenario, [run])
    for c in claims:
        c["verdict"] = verdict(c, c["min"])
    worst = max((c["verdict"] for c in claims), key=RANK.get, default="no_claim")
    offered = next((r["offered"] for r in run["rows"] if r.get("offered")), None)
    return {
        "verdict": worst,
        "claims": [
            {k: c[k] for k in ("metric", "a", "b", "op", "size", "min", "verdict", "claim_en")}
            | {"claim_pt": c.get("claim_pt", c["claim_en"])}
            for c in claims
        ],
        "offered": offered,
        "advice_en": ADVICE[worst][0],
        "advice_pt": ADVICE[worst][1],
    }


def line(number: int, title: str, p: dict[str, Any]) -> str:
    """One lesson's preflight, as the terminal prints it."""
    said = {"none": "does not show here", "no_claim": "no Live claim"}
    said = said.get(p["verdict"], p["verdict"])
    lines = [f"lesson {number:>2} {title}: {said}: {p['advice_en']}"]
    if p["offered"] and p["offered"].get("capacity"):
        o = p["offered"]
        load = f"{o['load']}x this engine's capacity = " if o.get("load") is not None else ""
        lines.append(
            f"    traffic: {load}{o['rate']:.2f} requests/s here (capacity {o['capacity']:.2f})"
            + (f", windows of {p['seconds']:.0f} s" if p.get("seconds", SECONDS) != SECONDS else "")
        )
    for c in p["claims"]:
        op = {">": ">=", "<": "<=", "~": "within", "<=": "<="}[c["op"]]
        lines.append(
            f"    {c['verdict']:>5}: {c['metric']} {c['b']} / {c['a']} = {c['min']:.2f}x "
            f"(bound {op} {c['size']}x)"
        )
    return "\n".join(lines)


def verdict(c: dict[str, Any], ratio: float) -> str:
    """``shows`` (the size holds), ``weak`` (the right direction, at least half the size in log
    terms) or ``none``."""
    if OPS[c["op"]](ratio, c["size"]):
        return "shows"
    if not (ratio == ratio and ratio > 0):  # NaN, or nothing measured
        return "none"
    if c["op"] in ("~", "<="):  # outside the band, but within its square
        return "weak" if OPS[c["op"]](ratio, c["size"] ** 2) else "none"
    return "weak" if math.log(ratio) / math.log(c["size"]) >= WEAK else "none"


def unmeasured(result: dict[str, Any]) -> bool:
    """Whether a lesson's visit measured nothing for some claim (its ratio NaN): no answer, or no
    gap between two tokens, in a window."""
    return any(not (c["min"] == c["min"]) for c in result["claims"])


def again(result: dict[str, Any]) -> bool:
    """Whether a lesson's short visit leaves it to a longer one: it did not show, or measured
    nothing for some claim."""
    return result["verdict"] != "shows" or unmeasured(result)


def _measure(visited: list[dict], seconds: float, device: str) -> dict[int, dict[str, Any]]:
    """Each claimed lesson's visit by number; those that did not show (or measured nothing), once
    more over ``LONGER`` times the window, on the same server (each visit asks for its own
    headline window; a second server's start cost ~25 s): that visit's verdict stands."""
    claimed = [s for s in visited if s["live"]]
    number = [int(s["lesson"]["number"]) for s in claimed]
    with live_steps.engine_server(device) as port:
        first = live_steps.measure(claimed, seconds, device, WARMUP_S, port=port)
        runs = dict(zip(number, first, strict=True))
        retry = [s for s, n in zip(claimed, number, strict=True) if again(verdicts(s, runs[n]))]
        if retry:
            print(
                f"did not show in {seconds:.0f} s windows: lesson(s) "
                + ", ".join(str(s["lesson"]["number"]) for s in retry)
                + f"; again over {seconds * LONGER:.0f} s",
                flush=True,
            )
            longer = live_steps.measure(retry, seconds * LONGER, device, WARMUP_S, port=port)
            for s, visit in zip(retry, longer, strict=True):
                runs[int(s["lesson"]["number"])] = visit
    return runs


def run(scenarios: list[dict], seconds: float = SECONDS, device: str = "cpu") -> int:
    """``--live --preflight``: each lesson's claimed settings once, briefly, on one server started
    as ``make lab`` starts it; a verdict per lesson, printed and kept (``preflight_file``)."""
    seconds = SECONDS if seconds == 30.0 else seconds  # the --live default means "the check's"
    t0 = time.perf_counter()
    visited = [visits(s) for s in scenarios]
    runs = _measure(visited, seconds, device)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kept = (last_preflight() or {}).get("lessons", {})  # one lesson re-checked: the rest stay
    doc = {"when": when, "load": f"{os.getloadavg()[0]:.1f}", "seconds": seconds, "lessons": kept}
    for scenario in visited:
        number, title = int(scenario["lesson"]["number"]), scenario["lesson"]["title_en"]
        visit = runs.get(number, {"rows": []})
        result = verdicts(scenario, visit) | {"seconds": visit.get("seconds", seconds)}
        doc["lessons"][str(number)] = result | {"when": when, "load": doc["load"]}
        print(line(number, title, result), flush=True)
    doc["took_s"] = round(time.perf_counter() - t0, 1)
    print(f"\n{doc['took_s']:.0f} s; kept in {preflight_file()} for the Lessons page")
    preflight_file().parent.mkdir(parents=True, exist_ok=True)
    preflight_file().write_text(json.dumps(doc, indent=1))
    return 0
