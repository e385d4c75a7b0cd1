"""llama.cpp as a peer: its server on the same GGUF and the same ``batching`` workload,
``llama-bench`` for one-stream decode (tg) and prompt processing (pp), and ``llama-batched-bench``
for its decode step at 1 and 8 rows beside the roofline's.

llama.cpp is not a Python dependency: ``scripts/build_llama_cpp.sh`` builds ``llama-server``,
``llama-bench`` and ``llama-batched-bench`` from the source vendored in the ``llama-cpp-python``
sdist into ``.peers/llama.cpp`` (git-ignored; or point ``FLUXO_LLAMA_CPP`` at an install).
``find()`` returns None when they are not there, and the benchmark then says it skipped llama.cpp.

Like Fluxo's ``batching`` run: every request is sent at once, greedy, EOS ignored so each produces
exactly its ``max_new_tokens``; the server gets ``slots`` parallel slots (``-np``) and 2 threads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.workloads.canonical import WorkItem

ROOT = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class LlamaCpp:
    server: Path
    bench: Path
    version: str
    batched: Path | None = None  # llama-batched-bench (builds before it had none)


def find() -> LlamaCpp | None:
    base = Path(os.environ.get("FLUXO_LLAMA_CPP", ROOT / ".peers" / "llama.cpp"))
    server, bench = base / "bin" / "llama-server", base / "bin" / "llama-bench"
    if not (server.exists() and bench.exists()):
        return None
    version = (base / "VERSION").read_text().strip() if (base / "VERSION").exists() else "?"
    batched = base / "bin" / "llama-batched-bench"
    return LlamaCpp(
        server,
        bench,
        f"llama-cpp-python {version} (vendored llama.cpp)",
        batched if batched.exists() else None,
    )


def run_bench(
    lc: LlamaCpp, gguf: str, threads: int = 2, prompt: int = 128, gen: int = 64, reps: int = 3
) -> dict[str, float]:
    """``llama-bench`` tokens/s: ``pp{prompt}`` and ``tg{gen}`` (mean and stddev over ``reps``)."""
    out = subprocess.run(
        [
            str(lc.bench),
            "-m",
            gguf,
            "-t",
            str(threads),
            "-p",
            str(prompt),
            "-n",
            str(gen),
            "-r",
            str(reps),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(out.stdout)
    res: dict[str, float] = {}
    for r in rows:
        key = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        res[f"{key}_tokens_per_s"] = float(r["avg_ts"])
        res[f"{key}_stddev"] = float(r.get("stddev_ts", 0.0))
    return res


def parse_batched(jsonl: str) -> dict[int, dict[str, float]]:
    """``llama-batched-bench --output-format jsonl``: per parallel sequence count (``pl``), the
    decode step's ms (``t_tg`` over ``tg`` steps) and its context (prompt + half the decode)."""
    out: dict[int, dict[str, float]] = {}
    for line in jsonl.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[int(r["pl"])] = {
                "step_ms": 1000 * float(r["t_tg"]) / int(r["tg"]),
                "ctx": int(r["pp"]) + int(r["tg"]) / 2,
            }
    return out


def run_batched(
    lc: LlamaCpp,
    gguf: str,
    threads: int = 2,
    ctx: int = 128,
    rows: tuple[int, ...] = (1, 8),
    gen: int = 32,
) -> dict[int, dict[str, float]]:
    """llama.cpp's decode step: ``rows`` sequences, each with a ``ctx``-token prompt, ``gen`` steps
    (its default KV cache, f16)."""
    cmd = [str(lc.batched), "-m", gguf, "-t", str(threads), "-c", str(max(rows) * (ctx + gen) + 64)]
    cmd += ["-npp", str(ctx), "-ntg", str(gen), "-npl", ",".join(map(str, rows))]
    cmd += ["--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return parse_batched(out.stdout)


def roofline_peer(result: dict[str, Any], threads: int = 2) -> None:
    """Beside a ``roofline`` result: llama.cpp's decode step on the same GGUF at 1 and 8 rows, its
    share of the same read roof (the same weight bytes, its K and V in f16), and q4's step speed-up
    over it; ``{"skipped": why}`` without a build or without q4."""
    from engine.core.model import GGUF_FILE, gguf_dir
    from engine.lab.roofline_model import Shape, step_bytes

    lc, q4 = find(), result["formats"].get("q4")
    if lc is None or lc.batched is None or q4 is None:
        why = "no q4 in this run" if q4 is None else "no llama-batched-bench in .peers/llama.cpp"
        result["llama_cpp"] = {"skipped": why + " (scripts/build_llama_cpp.sh builds it)"}
        print(f"llama.cpp skipped: {result['llama_cpp']['skipped']}", flush=True)
        return
    shape = Shape(**{**q4["shape"], "kv_itemsize": 2})
    bw = result["machine"]["bandwidth"]["read_gbs"]
    steps = run_batched(lc, os.path.join(gguf_dir(), GGUF_FILE), threads, result["ctx"])
    points = []
    for rows, p in steps.items():
        nbytes = step_bytes(shape, rows, round(p["ctx"]))
        points.append(
            {
                "rows": rows,
                **p,
                "bytes_per_step": nbytes,
                "fraction_of_bandwidth": nbytes / (bw * 1e6) / p["step_ms"],
            }
        )
    result["llama_cpp"] = {"points": points, "kv": "f16", "version": lc.version}
    ours = {p["rows"]: p["step_ms"] for p in q4["points"]}
    for p in points:  # run_batched's rows: 1 and 8
        n = "1_row" if p["rows"] == 1 else f"{p['rows']}_rows"
        result["ratios"][f"llama_cpp_fraction_of_bandwidth_{n}"] = p["fraction_of_bandwidth"]
        if p["rows"] in ours:
            result["ratios"][f"q4_step_speedup_over_llama_cpp_{n}"] = p["step_ms"] / ours[p["rows"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass(slots=True)
class ServerResult:
    name: str
    useful_tokens: int  # tokens the server reports it generated (asked: sum of max_new_tokens)
    wall_s: float
    tokens_per_s: float
    slots: int
    note: str


def _start_server(
    lc: LlamaCpp, gguf: str, slots: int, threads: int, ctx: int
) -> tuple[subprocess.Popen, str]:
    """``llama-server`` on a free local port, up and healthy: ``(process, base url)``."""
    port = _free_port()
    cmd = [str(lc.server), "-m", gguf, "-t", str(threads), "-tb", str(threads)]
    cmd += ["-np", str(slots), "-c", str(ctx), "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, base, timeout_s=120)
    except BaseException:
        _stop(proc)
        raise
    return proc, base


def _wait_healthy(proc: subprocess.Popen, base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("llama-server did not come up")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_server(
    lc: LlamaCpp,
    gguf: str,
    prompts: list[str],
    items: list[WorkItem],
    slots: int = 8,
    threads: int = 2,
    ctx_per_slot: int = 1024,
) -> ServerResult:
    """All ``items`` sent at once to ``llama-server -np slots``; ``prompts`` are the chat-templated
    texts (the same template Fluxo applies). Wall time from the first send to the last answer."""
    proc, base = _start_server(lc, gguf, slots, threads, slots * ctx_per_slot)
    try:

        def one(i: int, n: int = 0) -> int:
            body = {
                "prompt": prompts[i],
                "n_predict": n or items[i].max_new_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
                "top_k": 1,
                "cache_prompt": False,
            }
            return int(_post(base + "/completion", body)["tokens_predicted"])

        one(0, 4)  # warm-up, as the other peers get
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            got = list(pool.map(one, range(len(items))))
        wall = time.perf_counter() - start
    finally:
        _stop(proc)
    useful = sum(got)
    return ServerResult(
        "llama_cpp_server",
        useful,
        wall,
        useful / wall,
        slots,
        f"llama-server -np {slots} -t {threads}, /completion, ignore_eos, {lc.version}",
    )


def peer(
    model_tok: tuple[Any, Any], items: list[WorkItem], slots: int = 8, threads: int = 2
) -> dict[str, Any]:
    """Both measurements, or ``{"skipped": reason}`` where no build is present."""
    from engine.core.model import GGUF_FILE, chat_ids, gguf_dir

    lc = find()
    if lc is None:
        return {
            "skipped": "no llama.cpp build in .peers/llama.cpp "
            "(scripts/build_llama_cpp.sh builds one)"
        }
    gguf = os.path.join(gguf_dir(), GGUF_FILE)
    _, tok = model_tok
    prompts = [tok.decode(chat_ids(tok, [{"role": "user", "content": it.prompt}])) for it in items]
    out: dict[str, Any] = {"bench": run_bench(lc, gguf, threads)}
    out["server"] = asdict(run_server(lc, gguf, prompts, items, slots, threads))
    return out
