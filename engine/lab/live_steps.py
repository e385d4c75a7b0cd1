"""``python -m engine.lesson N --live``: the numbers a lesson's Live-page steps will show.

A lesson's teacher notes expect numbers on the Live page, measured here as a teacher gets them:
the engine server started as ``make lab`` starts it (bundled model, default weights, its own
cores), this process connecting as the presenter's page does and sending what "Set up this
scenario" sends (``reset``, ``control`` with [engine], ``traffic`` with [traffic]); then each
``[[live]]`` setting in order, as the steps do (``control`` and ``traffic`` with its fields), one
headline window each, keeping the server's own ``metrics`` summary: the page's headline figures.

A ``[[live]]`` entry: ``name`` (the setting as the lesson's steps name it), optional live engine
fields (``policy``, ``max_slots``, ...) and optional ``traffic = {rate = ...}``.

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


def machine_split(no_pin: bool = False) -> cpu.Split:
    """The lab's split of this machine (``python -m engine.lab --no-pin``'s: every core shared),
    as it was before this process pinned itself to the page's cores (a second ``measure`` in one
    process would otherwise see only those)."""
    if no_pin not in _SPLIT:
        _SPLIT[no_pin] = cpu.shared_split() if no_pin else cpu.lab_split()
    return _SPLIT[no_pin]


def start_engine(
    model: str = "smollm2", device: str = "cpu", window_s: float = 30.0, no_pin: bool = False
) -> tuple[subprocess.Popen, int]:
    """The engine server alone, as ``make lab`` (or ``--no-pin``) starts it, its headline
    summarizing the last ``window_s`` (the page's 30 s; the preflight's shorter visits, less);
    returns it and its port."""
    port = lab.free_port()
    args = lab.parse_args(
        ["--model", model, "--engine-port", str(port), "--page-port", "0", "--device", device]
    )
    split = machine_split(no_pin)
    engine_cmd, _ = lab.commands(args, split, None)
    engine_cmd += ["--metrics-window", str(window_s)]
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


async def visit(
    url: str, scenario: dict, seconds: float = 30.0, warmup_s: float = 0.0
) -> list[dict[str, Any]]:
    """Set the lesson up as the Lessons page does, let the traffic run ``warmup_s`` (a window
    right after a reset starts empty: the preflight's short ones would read the ramp), then each
    ``[[live]]`` setting for one headline window of ``seconds``; per setting, the server's
    summary of that window."""
    from websockets.asyncio.client import connect

    out = []
    async with connect(url, max_size=None) as ws:
        hello = json.loads(await ws.recv())["state"]
        engine = {k: hello.get(k) for k in ("device", "device_name", "weights")}
        await _send(ws, "subscribe", history=0)
        await _send(ws, "reset")
        await _send(ws, "control", **{"host_work_ms": 0.0, **scenario.get("engine", {})})
        traffic = {"action": "start", **scenario.get("traffic", {})}
        await _send(ws, "traffic", **traffic)
        if warmup_s:
            await _window(ws, warmup_s)
        for s in settings(scenario):
            control = {k: v for k, v in s.items() if k in CONFIG_FIELDS}
            if control:
                await _send(ws, "control", **control)
            if s.get("traffic"):
                traffic = {**traffic, **s["traffic"]}
                await _send(ws, "traffic", **traffic)
            summary, offered = await _window(ws, seconds)
            summary = summary or {}
            row = {"name": s["name"], "name_pt-BR": s.get("name_pt", s["name"])}
            row["settings"] = {**control, **({"traffic": s["traffic"]} if s.get("traffic") else {})}
            row["summary"] = {k: summary.get(k) for k in HEADLINE}
            if offered:  # the requests/s the load came to here, and the capacity it was sized on
                row["offered"] = {k: offered.get(k) for k in ("rate", "load", "capacity")}
            out.append(row | {"engine": engine})
        await _send(ws, "traffic", action="stop")
    return out


def measure(
    scenarios: list[dict],
    seconds: float = 30.0,
    device: str = "cpu",
    warmup_s: float = 0.0,
    no_pin: bool = False,
) -> list[dict[str, Any]]:
    """Each scenario's ``[[live]]`` settings, in turn, on one server started as ``make lab``
    (or ``--no-pin``) starts it (each lesson begins with a ``reset``, as the Lessons page's set-up
    does)."""
    split = machine_split(no_pin)
    proc, port = start_engine(device=device, window_s=min(30.0, seconds), no_pin=no_pin)
    out = []
    try:
        for scenario in scenarios:
            rows = asyncio.run(visit(f"ws://127.0.0.1:{port}", scenario, seconds, warmup_s))
            out.append(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "load": f"{os.getloadavg()[0]:.1f}",
                    "seconds": seconds,
                    "engine_cpus": list(split.engine_cpus) if split.pinned else None,
                    "engine_threads": split.engine_threads,
                    "rows": rows,
                }
            )
    finally:
        lab.stop(proc)
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


def checks_markdown(
    checks: list[dict[str, Any]], lang: str, names: dict[str, str] | None = None
) -> str:
    """One line per claim: its words, then b / a over the runs as min-max, and whether it held;
    ``names`` gives each setting's name in ``lang``."""
    names = names or {}
    lines = []
    for c in checks:
        text = c.get("claim_pt" if lang == "pt-BR" else "claim_en") or c["metric"]
        lo, hi = (_cell(v, 1, 2, "", lang) for v in (c["min"], c["max"]))
        bound = {">": "≥ ", "<": "≤ ", "~": "within ", "<=": "≤ "}[c["op"]] + _cell(
            c.get("size"), 1, 2, "x", lang
        )
        if lang == "pt-BR":
            bound = bound.replace("within", "dentro de")
        runs = len(c["ratios"])
        b, a = names.get(c["b"], c["b"]), names.get(c["a"], c["a"])
        if "over_metric" in c:  # two figures of the page's headline, maybe of one setting
            b, a = f"{b}: {_metric(c['metric'], lang)}", f"{a}: {_metric(c['over_metric'], lang)}"
        if lang == "pt-BR":
            held = f"{runs} execuções; limite {bound}; manteve: {'sim' if c['ok'] else 'não'}"
        else:
            held = f"{runs} runs; bound {bound}; held: {'yes' if c['ok'] else 'no'}"
        lines.append(f"- {text}: {b} / {a} = {lo}-{hi}x ({held})")
    return "\n".join(lines)


# -- the teacher's table ---------------------------------------------------------------------------
MARK_START, MARK_END = "<!-- live -->", "<!-- /live -->"
COLUMNS = (  # key, scale, decimals, unit
    ("throughput", 1, 1, ""),
    ("ttft_p50", 1000, 0, " ms"),
    ("itl_p50", 1000, 0, " ms"),
    ("itl_p99", 1000, 0, " ms"),
    ("slot_utilization", 100, 0, " %"),
    ("dead_slot_fraction", 100, 0, " %"),
    ("kv_waste", 100, 0, " %"),
    ("busy_fraction", 100, 0, " %"),
)
WORDS = {
    "en": {
        "head": (
            "setting|useful tokens/s|TTFT p50|ITL p50|ITL p99|"
            "slot utilization|dead-slot fraction|KV waste|device busy"
        ).split("|"),
        "how": "Each row: the page's headline over the {s:.0f} s after switching to that setting, "
        "in the order of the lesson's steps (so a backlog left by one setting shows in the next). "
        "Measured by `python -m engine.lesson {n} --live{flag}` on {when}, load average {load}: "
        "the engine started as {started} ({weights} weights, {threads} torch thread(s){on})."
        " A loaded machine shows longer times; the counts (slots, waste) move less.",
        "on": " on core(s) {c}",
        "pinned": "`make lab` starts it",
        "free": "`python -m engine.lab --no-pin` starts it, on every core",
        "none": "not measured yet: `python -m engine.lesson {n} --live --save`",
    },
    "pt-BR": {
        "head": (
            "ajuste|tokens úteis/s|TTFT p50|ITL p50|ITL p99|"
            "uso dos slots|slots mortos|desperdício de KV|dispositivo ocupado"
        ).split("|"),
        "how": "Cada linha: o topo da página nos {s:.0f} s depois de mudar para aquele ajuste, na "
        "ordem dos passos da aula (uma fila deixada por um ajuste aparece no seguinte). Medido por "
        "`python -m engine.lesson {n} --live{flag}` em {when}, carga média {load}: o motor "
        "iniciado como {started} (pesos {weights}, {threads} thread(s) do torch{on}). Uma "
        "máquina com carga mostra tempos maiores; as contagens (slots, desperdício) mudam menos.",
        "on": " no(s) núcleo(s) {c}",
        "pinned": "`make lab` o inicia",
        "free": "`python -m engine.lab --no-pin` o inicia, em todos os núcleos",
        "none": "ainda não medido: `python -m engine.lesson {n} --live --save`",
    },
}


def _metric(key: str, lang: str) -> str:
    """A headline metric as the claim names it (English) or as ``lang``'s table head names it."""
    names = dict(zip((k for k, *_ in COLUMNS), WORDS[lang]["head"][1:], strict=True))
    return key if lang == "en" else names.get(key, key)


def _cell(v: float | None, scale: float, decimals: int, unit: str, lang: str) -> str:
    if v is None:
        return "-"
    text = f"{v * scale:,.{decimals}f}"
    if lang == "pt-BR":  # 1,234.5 -> 1.234,5
        text = text.replace(",", "\0").replace(".", ",").replace("\0", ".")
    return text + unit


def live_markdown(live: dict | None, number: int, lang: str) -> str:
    """The teacher's table of what the Live page showed at each of the lesson's settings."""
    w = WORDS[lang]
    if not live:
        return w["none"].format(n=number)
    lines = ["| " + " | ".join(w["head"]) + " |", "|" + "---|" * len(w["head"])]
    for row in live["rows"]:
        name = row.get(f"name_{lang}") or row["name"]
        cells = (_cell(row["summary"].get(k), *spec, lang) for k, *spec in COLUMNS)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    engine = live["rows"][0]["engine"] if live["rows"] else {}
    cpus = live.get("engine_cpus")
    load_avg = live["load"].replace(".", ",") if lang == "pt-BR" else live["load"]
    lines += [
        "",
        w["how"].format(
            s=live["seconds"],
            n=number,
            when=live["when"],
            load=load_avg,
            weights=engine.get("weights", "?"),
            threads=live["engine_threads"],
            on=w["on"].format(c=",".join(map(str, cpus))) if cpus else "",
            started=w["pinned"] if cpus else w["free"],
            flag="" if cpus else " --no-pin",
        ),
    ]
    if live.get("checks"):
        named = {r["name"]: r.get(f"name_{lang}") or r["name"] for r in live["rows"]}
        lines += ["", checks_markdown(live["checks"], lang, named)]
    return "\n".join(lines)
