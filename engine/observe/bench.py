"""``python -m engine.bench vllm`` (``engine/bench.py`` sends it here): Fluxo's default engine
and vLLM on the same machine, the same workload over the same OpenAI API, A B A B.

The workload is ``batching`` (32 chats at once, output lengths lognormal: median 40, [8, 256];
EOS ignored, so both engines produce exactly the tokens asked for). Per run, from the client's
clock: useful tokens/s (the tokens asked for over the run's wall time), TTFT (request sent to the
first chunk with text) and ITL (between chunks with text) percentiles; beside them each engine's
own counters from its ``/metrics`` (generation tokens and engine steps: the same names on both).
vLLM starts from ``.venv-vllm`` (``make vllm``) without the observer; Fluxo's engine is
``engine.serve`` with its defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.core.metrics import percentile
from engine.observe import launch
from engine.workloads.canonical import WorkItem, batching_workload

Result = dict[str, Any]
COUNTERS = ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")


def sse_texts(lines) -> list[tuple[float, str]]:
    """(arrival time, text) of each streamed chunk that carries text; ``lines`` yields bytes."""
    out = []
    for raw in lines:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        choices = json.loads(line[5:]).get("choices") or [{}]
        text = (choices[0].get("delta") or {}).get("content") or choices[0].get("text")
        if text:
            out.append((time.perf_counter(), text))
    return out


def stream(url: str, model: str, item: WorkItem) -> Result:
    """One chat, streamed: its TTFT and inter-chunk gaps on the client's clock."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": item.prompt}],
        "max_tokens": item.max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:  # noqa: S310 - a local engine
        chunks = sse_texts(r)
    times = [t for t, _ in chunks]
    return {"ttft": times[0] - t0, "itl": [times[i + 1] - times[i] for i in range(len(times) - 1)]}


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:  # noqa: S310
        text = r.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def run_once(url: str, model: str, items: list[WorkItem]) -> Result:
    """Every item sent at once; the client's numbers and the engine's counters for this run."""
    before = counters(url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(items)) as pool:
        done = list(pool.map(lambda it: stream(url, model, it), items))
    wall = time.perf_counter() - t0
    after = counters(url)
    ttft = [d["ttft"] for d in done]
    itl = [g for d in done for g in d["itl"]]
    useful = sum(it.max_new_tokens for it in items)
    return {
        "wall_s": wall,
        "useful_tokens": useful,
        "tokens_per_s": useful / wall,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "itl_p50": percentile(itl, 50),
        "itl_p95": percentile(itl, 95),
        "itl_p99": percentile(itl, 99),
        "engine_tokens": after[COUNTERS[0]] - before[COUNTERS[0]],
        "engine_steps": after[COUNTERS[1]] - before[COUNTERS[1]],
    }


def ready(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    launch.wait_ready(url, proc, timeout_s)


def start_fluxo(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "engine.serve", "--port", str(port)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def vllm(rounds: int = 2, n: int = 32) -> Result:
    """A B A B: Fluxo's engine, then vLLM, ``rounds`` times, both up all along (the idle one
    waits on its socket)."""
    items = batching_workload(n)
    fx_port, vl_port = launch.free_port(), launch.free_port()
    fluxo = start_fluxo(fx_port)
    log = Path(tempfile.gettempdir()) / "fluxo-bench-vllm.log"
    vl = launch.start_vllm(vl_port, "", log_path=log)  # the observer's class, publishing off
    engines = {"fluxo": f"http://127.0.0.1:{fx_port + 1}", "vllm": f"http://127.0.0.1:{vl_port}"}
    runs: list[Result] = []
    try:
        ready(engines["fluxo"], fluxo)
        ready(engines["vllm"], vl)
        models = {k: launch.get_json(u + "/v1/models")["data"][0]["id"] for k, u in engines.items()}
        for k, u in engines.items():  # warm-up: compiled paths, caches, first-request costs
            run_once(u, models[k], items[:4])
        for r in range(rounds):
            for k, u in engines.items():
                runs.append({"engine": k, "round": r + 1, **run_once(u, models[k], items)})
    finally:
        launch.stop(vl)
        fluxo.terminate()
        fluxo.wait(30)
    return {"workload": f"batching, {n} chats at once", "runs": runs}


def table(result: Result) -> str:
    ms = ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "itl_p99")
    heads = ("TTFT p50", "TTFT p95", "ITL p50", "ITL p95", "ITL p99")
    rows = [
        f"{'engine':<7} {'round':>5} {'tokens/s':>9} "
        + " ".join(f"{h:>10}" for h in heads)
        + f" {'tokens':>7} {'steps':>6}"
    ]
    for r in result["runs"]:
        rows.append(
            f"{r['engine']:<7} {r['round']:>5} {r['tokens_per_s']:>9.1f} "
            + " ".join(f"{r[k] * 1000:>7.0f} ms" for k in ms)
            + f" {r['engine_tokens']:>7.0f} {r['engine_steps']:>6.0f}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    what = "Fluxo's engine and vLLM over the same OpenAI API, A B A B"
    ap = argparse.ArgumentParser(prog="python -m engine.bench vllm", description=what)
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds (default 2)")
    ap.add_argument("--json", type=Path, help="write the runs here")
    args = ap.parse_args(argv)
    if not (launch.VENV / "bin" / "python").exists():
        print(f"no {launch.VENV}: install it with {launch.INSTALL}", file=sys.stderr)
        return 2
    result = vllm(rounds=args.rounds)
    print("== vllm ==\n" + table(result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0
