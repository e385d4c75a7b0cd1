"""``python -m engine.lesson N --live``: the numbers a lesson's Live-page steps will show.

A lesson's teacher notes expect numbers on the Live page, measured here as a teacher gets them:
the engine server started as ``make lab`` starts it (bundled model, default weights, its own
cores), this process connecting as the presenter's page does and sending what "Set up this
scenario" sends (``reset``, ``control`` with [engine], ``traffic`` with [traffic]); then each
``[[live]]`` setting in order, as the steps do (``control`` and ``traffic`` with its fields), one
headline window each, keeping the server's own ``metrics`` summary: the page's headline figures.

A ``[[live]]`` entry: ``name`` (the setting as the lesson's steps name it), optional live engine
fields (``policy``, ``max_slots``, ...) and optional ``traffic = {rate = ...}``. A lesson whose
settings the class compares at one steady load may set ``live_rounds = n``: the settings then
alternate in n shorter windows each (``visit``), as the replays interleave their runners.

A ``[[live_check]]`` entry is a claim the class should see on the page: ``metric`` (a headline
key) of settings ``a`` and ``b``, the ratio b / a held to ``size`` by ``op`` (``OPS``: ``>`` at
least size, ``<`` at most size < 1, ``~`` within size either way, ``<=`` a gain of at most size),
optional ``over_metric`` (a's figure: lesson 0's TTFT over its ITL), ``claim_en``/``claim_pt``.
``--live --check`` holds it in every one of ``runs`` visits; the notes show the min-max. A lesson
whose claim the page cannot show says why in ``[live_none]`` (``en``/``pt``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine.core import cpu
from engine.lab import launcher as lab
from engine.lab.scenario import CONFIG_FIELDS

HEADLINE = (  # the page's headline metrics, in its order (app/component/fluxo-live.js)
    "throughput",
    "ttft_p50",
    "itl_p50",
    "itl_p99",
    "slot_utilization",
    "dead_slot_fraction",
    "kv_waste",
    "busy_fraction",
)


_SPLIT: dict[bool, cpu.Split] = {}
# With ``live_rounds``, a window is read this long after its switch: the server's summary comes
# once a second, so the last one before a window's end may start up to a second before it.
SETTLE_S = 1.5


def machine_split(no_pin: bool = False) -> cpu.Split:
    """The lab's split of this machine (``python -m engine.lab --no-pin``'s: every core shared),
    as it was before this process pinned itself to the page's cores (a second ``measure`` in one
    process would otherwise see only those)."""
    if no_pin not in _SPLIT:
        _SPLIT[no_pin] = cpu.shared_split() if no_pin else cpu.lab_split()
    return _SPLIT[no_pin]


def start_engine(
    model: str = "smollm2", device: str = "cpu", no_pin: bool = False
) -> tuple[subprocess.Popen, int]:
    """The engine server alone, as ``make lab`` (or ``--no-pin``) starts it (its headline over
    the page's 30 s; a visit asks for its own window); returns it and its port."""
    port = lab.free_port()
    args = lab.parse_args(
        ["--model", model, "--engine-port", str(port), "--page-port", "0", "--device", device]
    )
    split = machine_split(no_pin)
    engine_cmd, _ = lab.commands(args, split, None)
    proc = subprocess.Popen(
        engine_cmd,
        cwd=lab.ROOT,
        preexec_fn=lab.pin_child(split.engine_cpus if split.pinned else ()),
    )
    if split.pinned and split.page_cpus:
        cpu.pin_process(split.page_cpus)  # this client runs where the page would
    deadline = time.monotonic() + 300  # a first start converts the bundled GGUF
    while not lab.engine_up(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            lab.stop(proc)
            raise SystemExit("the engine server did not come up")
        time.sleep(0.5)
    return proc, port


def settings(scenario: dict) -> list[dict[str, Any]]:
    """The scenario's ``[[live]]`` entries; a lesson without them is read once, as set up."""
    return list(scenario.get("live") or [{"name": "as set up"}])


async def _send(ws, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def _window(ws, seconds: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Every message for ``seconds``; the last ``metrics`` summary and the traffic the last
    ``state`` reports (its rate and the capacity it was sized on). A coded error stops the run."""
    last, traffic, end = None, None, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            msg = json.loads(await asyncio.wait_for(ws.recv(), left))
        except TimeoutError:
            break
        if msg["type"] == "error":
            raise RuntimeError(f"error [{msg['code']}]: {msg['message']}")
        if msg["type"] == "metrics":
            last = msg["summary"]
        if msg["type"] == "state" and msg.get("traffic"):
            traffic = msg["traffic"]
    return last, traffic


def rounds(scenario: dict) -> int:
    """``live_rounds``: how often the settings alternate (1: each once, in the steps' order)."""
    n = scenario.get("live_rounds", 1)
    if not isinstance(n, int) or not 1 <= n <= 8:
        raise ValueError(f"live_rounds must be an integer from 1 to 8, got {n!r}")
    fields = {
        frozenset(k for k in s if k in (*CONFIG_FIELDS, "traffic")) for s in settings(scenario)
    }
    if n > 1 and len(fields) > 1:  # a switch back must restore all that the other one changed
        raise ValueError(
            f"live_rounds: every [[live]] setting must state the same fields: {fields}"
        )
    return n


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


async def _apply(ws, s: dict, traffic: dict) -> tuple[dict, dict]:
    """One ``[[live]]`` setting sent as the lesson's step sends it: (its control, the traffic)."""
    control = {k: v for k, v in s.items() if k in CONFIG_FIELDS}
    if control:
        await _send(ws, "control", **control)
    if s.get("traffic"):
        traffic = {**traffic, **s["traffic"]}
        await _send(ws, "traffic", **traffic)
    return control, traffic


async def visit(
    url: str, scenario: dict, seconds: float = 30.0, warmup_s: float = 0.0
) -> list[dict[str, Any]]:
    """Set the lesson up as the Lessons page does, let the traffic run ``warmup_s`` (a window
    right after a reset starts empty: the preflight's short ones would read the ramp), then each
    ``[[live]]`` setting for one headline window of ``seconds``; per setting, the server's
    summary of that window.

    With ``live_rounds = n`` the settings alternate instead (A B, B A, A B, ...: n windows of
    ``seconds / n`` each, after a warm-up of at least one such window), each window read
    ``SETTLE_S`` after its switch so that none holds the other setting's steps, and a setting's
    figures are the mean of its windows. A neighbour whose pressure drifts over a minute, and the
    ramp from an empty engine, then land on both settings alike: lesson 5's two 30 s windows in
    turn read async / sync 1.05-1.21x at load 6.3, where its claim is "no gain past 1.15x"."""
    from websockets.asyncio.client import connect

    n = rounds(scenario)
    window = seconds / n
    order = [list(reversed(settings(scenario))) if r % 2 else settings(scenario) for r in range(n)]
    seen: dict[str, list[tuple[dict, dict | None]]] = {}
    rows: dict[str, dict] = {}
    async with connect(url, max_size=None) as ws:
        hello = json.loads(await ws.recv())["state"]
        engine = {k: hello.get(k) for k in ("device", "device_name", "weights")}
        await _send(ws, "subscribe", history=0, window_s=min(30.0, window))
        await _send(ws, "reset")
        await _send(ws, "control", **{"host_work_ms": 0.0, **scenario.get("engine", {})})
        traffic = {"action": "start", **scenario.get("traffic", {})}
        await _send(ws, "traffic", **traffic)
        if warmup_s or n > 1:
            await _window(ws, max(warmup_s, window if n > 1 else 0.0))
        for s in (s for each in order for s in each):
            control, traffic = await _apply(ws, s, traffic)
            summary, offered = await _window(ws, window + (SETTLE_S if n > 1 else 0.0))
            seen.setdefault(s["name"], []).append((summary or {}, offered))
            if s["name"] not in rows:  # a setting's row, at its first window
                settled = {**control, **({"traffic": s["traffic"]} if s.get("traffic") else {})}
                name = {"name": s["name"], "name_pt-BR": s.get("name_pt", s["name"])}
                rows[s["name"]] = name | {"settings": settled}
        await _send(ws, "traffic", action="stop")
    return _fold(rows, seen, engine, n)


def _fold(rows: dict[str, dict], seen: dict, engine: dict, n: int) -> list[dict[str, Any]]:
    """Per setting, in first-visit order: the mean of its windows' figures, its windows (when
    they alternated), the traffic last offered."""
    out = []
    for name, row in rows.items():
        windows = [w for w, _ in seen[name]]
        row["summary"] = {k: _mean([w.get(k) for w in windows]) for k in HEADLINE}
        if n > 1:  # each window's own figures, for the stored run
            row["windows"] = [{k: w.get(k) for k in HEADLINE} for w in windows]
        if offered := next((o for _, o in reversed(seen[name]) if o), None):
            # the requests/s the load came to here, and the capacity it was sized on
            row["offered"] = {k: offered.get(k) for k in ("rate", "load", "capacity")}
        out.append(row | {"engine": engine})
    return out


@contextmanager
def engine_server(device: str = "cpu", no_pin: bool = False) -> Iterator[int]:
    """An engine server started as ``make lab`` (or ``--no-pin``) starts it, for several
    ``measure`` passes (each visit asks for its own headline window); yields its port."""
    proc, port = start_engine(device=device, no_pin=no_pin)
    try:
        yield port
    finally:
        lab.stop(proc)


def measure(
    scenarios: list[dict],
    seconds: float = 30.0,
    device: str = "cpu",
    warmup_s: float = 0.0,
    no_pin: bool = False,
    port: int | None = None,
) -> list[dict[str, Any]]:
    """Each scenario's ``[[live]]`` settings, in turn, on one server started as ``make lab``
    (or ``--no-pin``) starts it, or on ``port``'s (``engine_server``); each lesson begins with
    a ``reset``, as the Lessons page's set-up does."""
    if port is None:
        with engine_server(device, no_pin) as port:
            return measure(scenarios, seconds, device, warmup_s, no_pin, port)
    split = machine_split(no_pin)
    out = []
    for scenario in scenarios:
        rows = asyncio.run(visit(f"ws://127.0.0.1:{port}", scenario, seconds, warmup_s))
        out.append(
            {
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load": f"{os.getloadavg()[0]:.1f}",
                "seconds": seconds,
                "rounds": rounds(scenario),
                "engine_cpus": list(split.engine_cpus) if split.pinned else None,
                "engine_threads": split.engine_threads,
                "rows": rows,
            }
        )
    return out


# -- claims the Live page must carry ---------------------------------------------------------------
# A claim holds when b / a is at least ``size`` (``>``, size above 1), at most it (``<``, size
# below 1), or within it either way (``~``, size above 1: "no effect", as lesson 5's tokens/s):
# an effect the class can see, not a direction a 1.08x drift also has.
OPS = {
    ">": lambda r, size: r >= size,
    "<": lambda r, size: r <= size,
    "~": lambda r, size: 1 / size <= r <= size,
    "<=": lambda r, size: r <= size,  # no gain: b gains at most size (> 1) over a; may lose
}


def live_claims(scenario: dict) -> list[dict[str, Any]]:
    """The scenario's ``[[live_check]]`` entries, checked against its ``[[live]]`` names."""
    names = {s["name"] for s in settings(scenario)}
    out = []
    for c in scenario.get("live_check") or []:
        if (
            c.get("metric") not in HEADLINE
            or c.get("over_metric", c.get("metric")) not in HEADLINE
            or c.get("op") not in OPS
        ):
            raise ValueError(f"live_check {c!r}: metric one of {HEADLINE}, op one of {tuple(OPS)}")
        if c.get("a") not in names or c.get("b") not in names:
            raise ValueError(f"live_check {c!r}: a and b must name [[live]] settings {names}")
        size = c.get("size")
        if not isinstance(size, int | float) or (size >= 1 if c["op"] == "<" else size <= 1):
            raise ValueError(f"live_check {c!r}: size, the effect's bound: < 1 for <, else > 1")
        out.append(c)
    return out


def check(scenario: dict, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim over ``runs`` (``measure`` results for this lesson): the ratio b / a of its
    metric in every run, and whether every run shows the claimed direction."""
    out = []
    for c in live_claims(scenario):
        ratios = []
        for run in runs:
            by = {r["name"]: r["summary"] for r in run["rows"]}
            a = by[c["a"]].get(c.get("over_metric", c["metric"]))
            b = by[c["b"]].get(c["metric"])
            ratios.append(b / a if a and b is not None else float("nan"))
        ok = bool(ratios) and all(OPS[c["op"]](r, c["size"]) for r in ratios)  # NaN fails
        out.append({**c, "ratios": ratios, "min": min(ratios), "max": max(ratios), "ok": ok})
    return out
