"""``python -m engine.bench page``: what the lab's own page costs the engine it measures.

The lab is started as ``make lab`` starts it (``engine/lab/launcher.py``: SmolLM2, the engine on
cores of its own with as many torch threads, the page on the rest), steady traffic runs (1.5
requests/s, 48-token answers, continuous, 8 slots), and the engine's step durations are read from
its step telemetry while, in turn (A B A B):

- ``closed`` / ``open``: nothing open vs the presenter's Live page open in Chromium (Debian's
  chromium through Playwright, pinned to the page's cores as the launcher's ``--open`` pins a
  local browser), with the Streamlit process's and Chromium's CPU use over the same window;
- ``none`` / ``viewers``: no extra subscriber vs 40 websocket viewers subscribed (in this process,
  which runs on the page's cores, as a class's browsers would run elsewhere);
- ``quiet`` / ``class``: no page session vs 40 students on the Lessons page answering lesson 1's
  prediction at once and following its fragment, in Streamlit's own protocol (``students.py``),
  as a class's sessions run in the teacher's page process;
- then 10 browser sessions send a chat at the same moment, and every answer is counted.

Ratios: ``page_step_p50_open_over_closed``, ``page_step_p90_open_over_closed``,
``page_streamlit_cores_per_session``, ``page_step_p50_viewers_over_none``,
``page_step_p50_class_over_quiet`` (with the students' waits: the page's open, the answer, a
fragment rerun, p50 and max), ``page_class_chats_answered``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

from engine.core import cpu
from engine.core.metrics import median, percentile
from engine.lab import launcher as lab
from engine.lab import students

Result = dict[str, Any]
TRAFFIC = {
    "type": "traffic",
    "action": "start",
    "rate": 1.5,
    "prompts": "chat",
    "lengths": "uniform",
    "median": 48,
    "max_tokens": 48,
    "seed": 1,
}
PHASES = ("closed", "open", "none", "viewers", "quiet", "class")  # in A/B pairs
CLASS = f"lang=pt-BR&lesson={students.LESSON}"  # the students' Lessons page
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def _say(what: str) -> None:
    """A progress line on stderr: a page phase can take minutes on a loaded 2-core machine."""
    print(f"[page {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


class StepTap:
    """One subscription (the bench's own, present in every phase alike) that keeps each step's
    duration with the wall time it arrived, on a thread with its own event loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.steps: list[
            tuple[float, float, int]
        ] = []  # (arrival wall time, step seconds, prefill tokens)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.ws = None
        threading.Thread(
            target=self.loop.run_until_complete, args=(self._main(),), daemon=True
        ).start()
        if not self._ready.wait(120):
            raise RuntimeError("could not subscribe to the engine")

    async def _main(self) -> None:
        from websockets.asyncio.client import connect

        async with connect(self.url, max_size=None) as ws:
            self.ws = ws
            await ws.send(json.dumps({"type": "subscribe", "history": 0}))
            self._ready.set()
            async for raw in ws:
                msg = json.loads(raw)
                if msg["type"] == "step":
                    r = msg["record"]
                    self.steps.append(
                        (time.time(), r["t_end"] - r["t_start"], r["tokens"]["prefill"])
                    )

    def send(self, msg: dict) -> None:
        asyncio.run_coroutine_threadsafe(self.ws.send(json.dumps(msg)), self.loop).result(10)

    def window(self, t0: float, t1: float) -> list[float]:
        return [d for t, d, _ in self.steps if t0 <= t < t1]

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


async def _viewers(url: str, n: int, seconds: float) -> int:
    """``n`` websocket viewers subscribed for ``seconds``; returns the step messages they got."""
    from websockets.asyncio.client import connect

    got = 0

    async def one() -> None:
        nonlocal got
        async with connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "subscribe", "history": 0}))
            end = time.time() + seconds
            while time.time() < end:
                try:
                    msg = await asyncio.wait_for(ws.recv(), max(0.01, end - time.time()))
                except TimeoutError:
                    break
                got += '"type":"step"' in msg

    await asyncio.gather(*(one() for _ in range(n)))
    return got


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _chromium_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["name"]) if "chrom" in (p.info["name"] or "")]


def _stats(xs: list[float]) -> Result:
    return {"steps": len(xs), "p50_ms": 1000 * median(xs), "p90_ms": 1000 * percentile(xs, 90)}


def _fill_frame(page, selector: str, timeout_s: float = 60):
    """The component's frame (the browser view lives in an iframe)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for frame in page.frames:
            try:
                if frame.query_selector(selector):
                    return frame
            except Exception:  # noqa: BLE001 - a frame navigating away
                pass
        time.sleep(0.25)
    raise RuntimeError(f"no frame with {selector} on the page")


def measure(page_url: str, ws_url: str, page_pid: int, seconds: float, reps: int) -> Result:
    from playwright.sync_api import sync_playwright

    tap = StepTap(ws_url)
    tap.send({"type": "control", "policy": "continuous", "max_slots": 8})
    tap.send(TRAFFIC)
    time.sleep(8)  # traffic reaches its steady state
    phases: dict[str, list[float]] = {k: [] for k in PHASES}
    classes: list[dict] = []
    cores: dict[str, list[float]] = {
        "streamlit_open": [],
        "streamlit_closed": [],
        "chromium_open": [],
    }
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        _say("browser started")
        for _ in range(reps):
            for phase in ("closed", "open"):
                _page_phase(browser, tap, page_url, page_pid, phase, seconds, phases, cores)
            for phase in ("none", "viewers", "quiet", "class"):
                t0 = time.time()
                _say(f"phase {phase}")
                if phase == "viewers":
                    # on the tap's loop: Playwright owns this thread's
                    tap.run(_viewers(ws_url, 40, seconds))
                elif phase == "class":
                    url, seed = page_url.rstrip("/"), 1000 * len(classes)
                    classes.append(tap.run(students.class_window(url, CLASS, 40, seconds, seed)))
                else:
                    time.sleep(seconds)
                phases[phase] += tap.window(t0, time.time())
        # The class phase counts answers, not step times: the generated traffic stops first, or
        # ten Live pages redrawing every step on the page's one core took 30-45 s each to open
        # (load ~20, 2026-11-30) and the phase ran past 7 minutes.
        tap.send({"type": "traffic", "action": "stop"})
        _say("10 browser sessions chat at once")
        answered, refused = class_chat(browser, page_url, 10)
        browser.close()
    runs = {name: _stats(xs) for name, xs in phases.items()}
    for k, xs in cores.items():
        runs.setdefault("cores", {})[k] = median(xs) if xs else None
    ratios = _ratios(runs) | _class_ratios(classes)
    ratios["page_class_chats_answered"] = answered
    ratios["page_class_chats_refused"] = refused
    return {"runs": runs, "ratios": ratios, "reps": reps, "seconds": seconds}


def _page_phase(
    browser,
    tap: StepTap,
    page_url: str,
    page_pid: int,
    phase: str,
    seconds: float,
    phases: dict[str, list[float]],
    cores: dict[str, list[float]],
) -> None:
    """``seconds`` of steps with the Live page ``"open"`` in a browser tab, or ``"closed"``;
    appends the window's step times to ``phases`` and the cores used to ``cores``."""
    ctx = page = None
    _say(f"phase {phase}")
    if phase == "open":
        ctx = browser.new_context(viewport={"width": 1600, "height": 1400})
        page = ctx.new_page()
        page.goto(page_url, timeout=180_000)
        _say("Live page loaded; waiting for its charts")
        _fill_frame(page, "#fluxo-charts canvas, #fluxo-charts svg", 300)
        time.sleep(5)  # the view is drawn and streaming
    s0, c0, t0 = _cpu_seconds([page_pid]), _cpu_seconds(_chromium_pids()), time.time()
    time.sleep(seconds)
    t1 = time.time()
    s1, c1 = _cpu_seconds([page_pid]), _cpu_seconds(_chromium_pids())
    phases[phase] += tap.window(t0, t1)
    cores[f"streamlit_{phase}"].append((s1 - s0) / (t1 - t0))
    if phase == "open":
        cores["chromium_open"].append((c1 - c0) / (t1 - t0))
        ctx.close()
        time.sleep(3)


def _ratios(runs: dict) -> dict:
    r = runs
    return {
        "page_step_p50_open_over_closed": r["open"]["p50_ms"] / r["closed"]["p50_ms"],
        "page_step_p90_open_over_closed": r["open"]["p90_ms"] / r["closed"]["p90_ms"],
        "page_streamlit_cores_per_session": runs["cores"]["streamlit_open"],
        "page_chromium_cores": runs["cores"]["chromium_open"],
        "page_step_p50_viewers_over_none": r["viewers"]["p50_ms"] / r["none"]["p50_ms"],
        "page_step_p50_class_over_quiet": r["class"]["p50_ms"] / r["quiet"]["p50_ms"],
    }


def _class_ratios(classes: list[dict]) -> dict:
    """The students' phases (``students.class_window``): medians over the reps, failures summed."""
    out = {
        f"page_class_{k}": median([c[k] for c in classes if k in c] or [float("nan")])
        for k in ("answers_shown", "open_p50_s", "open_max_s", "answer_p50_s", "fragment_p50_s")
    }
    return out | {"page_class_failed": sum(c["failed"] for c in classes)}


def class_chat(browser, page_url: str, n: int) -> tuple[int, int]:
    """``n`` browser sessions (contexts) open the Live page and send a chat at the same moment."""
    opened = []
    for _ in range(n):  # all navigations at once: opened one by one (each waiting for its chat
        # box) the tenth waited behind nine streaming pages on the page's one core, >5 minutes
        ctx = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = ctx.new_page()
        page.goto(page_url, timeout=180_000, wait_until="commit")
        opened.append((ctx, page))
    sessions = []
    for i, (ctx, page) in enumerate(opened):
        sessions.append((ctx, _fill_frame(page, "#fluxo-chat-input", 300)))
        _say(f"session {i + 1} of {n} ready")
    for i, (_, frame) in enumerate(sessions):
        frame.fill("#fluxo-chat-input", f"Student {i + 1}: name one ocean.")
    for _, frame in sessions:  # as close to the same moment as one driver gets
        frame.click("#fluxo-chat-send")
    answered = refused = 0
    deadline = time.time() + 180
    for _, frame in sessions:
        while time.time() < deadline:
            statuses = frame.eval_on_selector_all(
                "[data-status]", "els => els.map(e => e.dataset.status)"
            )
            if statuses and statuses[-1] in ("finished", "error", "refused", "cancelled"):
                answered += statuses[-1] == "finished"
                refused += statuses[-1] in ("refused", "error")
                break
            time.sleep(0.25)
    for ctx, _ in sessions:
        ctx.close()
    return answered, refused


def main(args: argparse.Namespace) -> Result:
    split = cpu.lab_split()
    eport, pport = lab.free_port(), lab.free_port()
    largs = lab.parse_args(
        [
            "--model",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--engine-port",
            str(eport),
            "--page-port",
            str(pport),
            "--device",
            args.device,
        ]
    )
    engine, page, _, split = lab.start(largs, split)
    # this driver and its Chromium run where a local browser would
    if split.pinned and split.page_cpus:
        cpu.pin_process(split.page_cpus)
    try:
        lab.wait_ready(engine, page, largs)
        result = measure(
            f"http://127.0.0.1:{pport}/",
            f"ws://127.0.0.1:{eport}",
            page.pid,
            seconds=args.seconds,
            reps=args.reps,
        )
    finally:
        lab.stop(page, engine)
    result["split"] = split.describe()
    result["machine_cores"] = os.cpu_count()
    return result


def table(result: Result) -> str:
    lines = [
        f"== page == ({result['split']}; {result['reps']} x {result['seconds']:.0f} s per phase, "
        f"A B A B)",
        f"{'phase':<10}{'steps':>8}{'p50 ms':>10}{'p90 ms':>10}",
    ]
    for name in PHASES:
        r = result["runs"][name]
        lines.append(f"{name:<10}{r['steps']:>8}{r['p50_ms']:>10.1f}{r['p90_ms']:>10.1f}")
    for k, v in result["ratios"].items():
        lines.append(f"  {k:<40} {v:8.3f}" if isinstance(v, float) else f"  {k:<40} {v!s:>8}")
    return "\n".join(lines)
