"""Benchmarks: ``python -m engine.bench {batching,stall,memory,peer,dtype,overlap,prefix,all} [--json PATH]``.

Benchmarks measure; tests check behaviour. Every ratio comes from runs made in the same process,
on the same machine, one after the other, so machine noise mostly cancels out.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from engine.core import device
from engine.lab import replay
from engine.core.config import EngineConfig
from engine.core.cuda_exec import check_device
from engine.core.errors import DeviceUnavailable
from engine.core.engine import Engine
from engine.core.metrics import inter_token_latencies, median, percentile, summarize
from engine.core.model import load_model
from engine.core.requests import RequestHandle
from engine.workloads.canonical import CHAT_PROMPTS, WorkItem, batching_workload, long_prompt

Result = dict[str, Any]
DEVICE = "cpu"  # set by --device; every engine of a run uses it
GRAPHS = True  # --cuda-graphs on|off: decode steps replay CUDA graphs (engine/core/cuda_exec.py); CPU: no effect
WEIGHTS = "fp32"  # --weights fp32|q4|q8: CPU weight format of the engines run() builds (engine/core/quant.py)


def run(model, tok, items: list[WorkItem], **kwargs: Any) -> tuple[Result, Engine]:
    """``replay.run`` on this run's device (``--device``)."""
    kwargs.setdefault("device", DEVICE)
    kwargs.setdefault("cuda_graphs", GRAPHS)
    kwargs.setdefault("weights", WEIGHTS)
    return replay.run(model, tok, items, **kwargs)


def warm_up(model, tok) -> None:
    replay.warm_up(model, tok, DEVICE)


def _slot_steps(engine: Engine) -> int:
    return sum(s["phase"] != "idle" for r in engine.telemetry.steps for s in r["slots"])


# -- scenarios -------------------------------------------------------------------------------------
def batching(model, tok, slots: int = 8) -> Result:
    items = batching_workload()
    out: Result = {"runs": {}}
    for policy in ("static", "continuous", "chunked"):
        summary, engine = run(model, tok, items, policy=policy, max_slots=slots, fill_timeout_s=0.0, chunk_budget=128)
        summary["slot_steps"] = _slot_steps(engine)
        out["runs"][policy] = summary
    s, c = out["runs"]["static"], out["runs"]["continuous"]
    out["ratios"] = {
        "continuous_over_static": c["throughput"] / s["throughput"],
        # The static batch pays a slot-step for every dead slot; continuous needs one per useful token.
        "theoretical_continuous_over_static": s["slot_steps"] / s["useful_tokens"],
        "chunked_over_static": out["runs"]["chunked"]["throughput"] / s["throughput"],
        "overhead_fraction": c["overhead_fraction"],
    }
    return out


def stall(model, tok, chunk_budget: int = 24, steady: int = 6, arrivals: int = 4, period: int = 40) -> Result:
    """Steady long decodes; every ``period`` steps a ~384-token prompt arrives. ITL of the steady ones."""
    steady_items = [WorkItem(CHAT_PROMPTS[i], 40 + period * arrivals) for i in range(steady)]
    longs = [long_prompt(384, tok, i) for i in range(arrivals)]
    out: Result = {"runs": {}}
    for name, policy in (("unchunked", "continuous"), ("chunked", "chunked")):
        injected: list[int] = []

        def inject(engine: Engine, step: int) -> None:
            k = len(injected)
            if k < arrivals and step >= period * (k + 1):
                injected.append(engine.submit(prompt=longs[k], max_new_tokens=8, ignore_eos=True).id)

        summary, engine = run(model, tok, steady_items, on_step=inject, policy=policy, max_slots=steady + 2,
                              chunk_budget=chunk_budget)
        running = [r for r in engine.telemetry.requests.values() if r["id"] not in injected]
        itl = inter_token_latencies(running)
        summary.update(running_itl_p50=median(itl), running_itl_p99=percentile(itl, 99), running_itl_max=max(itl))
        out["runs"][name] = summary
    u, c = out["runs"]["unchunked"], out["runs"]["chunked"]
    out["ratios"] = {
        "unchunked_max_itl_over_median": u["running_itl_max"] / u["running_itl_p50"],
        "chunked_p99_itl_over_median": c["running_itl_p99"] / c["running_itl_p50"],
        "chunked_max_itl_over_median": c["running_itl_max"] / c["running_itl_p50"],
        "chunked_tput_over_unchunked": c["throughput"] / u["throughput"],
    }
    out["chunk_budget"] = chunk_budget
    return out


def memory(model, tok, kv_blocks: int = 128, n: int = 16) -> Result:
    """Same KV budget, natural (EOS-ended) answers capped at 256 tokens: reserved vs paged."""
    items = [WorkItem(long_prompt(160, tok, i) + " " + CHAT_PROMPTS[i], 256) for i in range(n)]
    out: Result = {"runs": {}}
    for layout in ("reserved", "paged"):
        summary, _ = run(model, tok, items, ignore_eos=False, policy="continuous", kv_layout=layout,
                         kv_blocks=kv_blocks, max_slots=n)
        out["runs"][layout] = summary
    r, p = out["runs"]["reserved"], out["runs"]["paged"]
    out["ratios"] = {
        "paged_waste": p["kv_waste"],
        "reserved_waste": r["kv_waste"],
        "paged_concurrency_over_reserved": p["peak_running"] / r["peak_running"],
        "paged_tput_over_reserved": p["throughput"] / r["throughput"],
    }
    out["kv_blocks"] = kv_blocks
    return out


def peer(model, tok, slots: int = 8, ours: Result | None = None) -> Result:
    """transformers' own serving paths on the ``batching`` workload, beside ours.

    They run in a fresh subprocess (``python -m engine.peer``), one after our runs, so each side
    gets a process of its own, as a real deployment would; the machine and the run are the same.
    """
    import subprocess
    import tempfile

    if DEVICE == "cuda":  # engine.peer loads and runs transformers on the CPU: no like-for-like pair
        return {"runs": {}, "ratios": {}, "note": "peer runs transformers on the CPU only; use --device cpu"}
    ours = ours or batching(model, tok, slots)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peer.json"
        subprocess.run([sys.executable, "-m", "engine.peer", "--slots", str(slots), "--json", str(path)],
                       check=True, cwd=Path(__file__).resolve().parents[2])
        hf = json.loads(path.read_text())
    hs, hc = hf["hf_static"], hf["hf_continuous"]
    out: Result = {"runs": {"hf_static": _peer_dict(hs), "hf_continuous": _peer_dict(hc),
                            "ours_static": ours["runs"]["static"], "ours_continuous": ours["runs"]["continuous"]}}
    out["ratios"] = {
        "ours_over_hf_cb": ours["runs"]["continuous"]["throughput"] / hc["tokens_per_s"],
        "ours_static_over_hf_static": ours["runs"]["static"]["throughput"] / hs["tokens_per_s"],
    }
    llama_cpp(model, tok, slots, ours, out)
    return out


def llama_cpp(model, tok, slots: int, ours: Result, out: Result) -> None:
    """llama.cpp's server (``-np slots``, 2 threads) on the same GGUF and workload, and
    ``llama-bench`` tg64 against our one-stream decode (1 / median ITL of a 64-token answer);
    skipped, and said so, where no llama.cpp build is present (scripts/build_llama_cpp.sh)."""
    from engine.lab import peer_llama_cpp

    lc = peer_llama_cpp.peer((model, tok), batching_workload(), slots)
    out["llama_cpp"] = lc
    if "skipped" in lc:
        print(f"llama.cpp skipped: {lc['skipped']}", flush=True)
        return
    srv = lc["server"]
    out["runs"]["llama_cpp_server"] = {"throughput": srv["tokens_per_s"], "useful_tokens": srv["useful_tokens"],
                                       "wall_s": srv["wall_s"]}
    one, _ = run(model, tok, [WorkItem(CHAT_PROMPTS[0], 64)], max_slots=1)
    out["runs"]["ours_one_stream"] = {"throughput": 1 / one["itl_p50"], "itl_p50": one["itl_p50"]}
    out["runs"]["llama_bench_tg64"] = {"throughput": lc["bench"].get("tg64_tokens_per_s")}
    out["ratios"]["ours_over_llama_cpp_server"] = ours["runs"]["continuous"]["throughput"] / srv["tokens_per_s"]
    if lc["bench"].get("tg64_tokens_per_s"):
        out["ratios"]["ours_one_stream_over_llama_bench_tg"] = (1 / one["itl_p50"]) / lc["bench"]["tg64_tokens_per_s"]


def _peer_dict(r: Result) -> Result:
    return {"throughput": r["tokens_per_s"], "useful_tokens": r["useful_tokens"], "wall_s": r["wall_s"],
            "slots": r["slots"], "note": r["note"]}


def dtype(model, tok) -> Result:
    """float32 against bfloat16 (AMX where the CPU has it): a decode-heavy run and a 384-token prefill."""
    items = batching_workload(16)
    prompt = [WorkItem(long_prompt(384, tok), 1)]
    out: Result = {"runs": {}}
    for dt in ("float32", "bfloat16"):
        m = device.run(model.to, getattr(torch, dt))
        summary, _ = run(m, tok, items, policy="continuous", max_slots=8, dtype=dt)
        times = [run(m, tok, prompt, dtype=dt)[0]["wall_s"] for _ in range(3)]
        summary["prefill_384_s"] = median(times)
        out["runs"][dt] = summary
    model.to(torch.float32)
    f, b = out["runs"]["float32"], out["runs"]["bfloat16"]
    out["ratios"] = {"bf16_decode_tput_over_fp32": b["throughput"] / f["throughput"],
                     "bf16_prefill_speedup": f["prefill_384_s"] / b["prefill_384_s"]}
    return out


def overlap(model, tok, slots: int = 8, new_tokens: int = 64, reps: int = 3) -> Result:
    """Decode-heavy steady state with sampling and streaming on: sync against async runner.

    Runs alternate (sync, async, sync, ...) so drift on a noisy machine hits both; medians of reps.
    """
    def one(runner: str) -> Result:
        engine = Engine(EngineConfig(policy="continuous", runner=runner, max_slots=slots, device=DEVICE,
                                     cuda_graphs=GRAPHS), model=model, tokenizer=tok)
        received: list[str] = []
        for i in range(slots):
            engine.submit(prompt=CHAT_PROMPTS[i], max_new_tokens=new_tokens, ignore_eos=True, temperature=0.8,
                          top_p=0.95, seed=i, sink=lambda e: received.append(e.text))
        engine.run_until_idle()
        records = list(engine.telemetry.steps)[2:]  # steady state: past the admission prefill
        summary = summarize(records, list(engine.telemetry.requests.values()))
        wall = records[-1]["t_end"] - records[0]["t_start"]
        summary["step_ms"] = 1000 * wall / len(records)
        summary["decode_tput"] = sum(r["tokens"]["decode"] for r in records) / wall
        return summary

    runs: dict[str, list[Result]] = {"sync": [], "async": []}
    for _ in range(reps):
        for runner in runs:
            runs[runner].append(one(runner))
    out: Result = {"runs": {}}
    for runner, results in runs.items():
        merged = {k: median([r[k] for r in results]) for k in ("step_ms", "decode_tput", "busy_fraction", "overhead_fraction", "throughput")}
        merged.update(reps=len(results), itl_p50=median([r["itl_p50"] for r in results]))
        out["runs"][runner] = merged
    s, a = out["runs"]["sync"], out["runs"]["async"]
    out["ratios"] = {
        "async_speedup": a["decode_tput"] / s["decode_tput"],
        # If async hid every idle moment of the sync loop, the device would never wait.
        "async_theoretical_speedup": 1 / s["busy_fraction"],
        "async_busy_fraction": a["busy_fraction"],
        "sync_busy_fraction": s["busy_fraction"],
        # The acceptance figures: speedup as a fraction of that maximum, and the gain (speedup - 1)
        # as a fraction of the maximum gain (the article's 22 % of a possible 24 %: 0.92).
        "async_speedup_over_max": (a["decode_tput"] / s["decode_tput"]) * s["busy_fraction"],
    }
    if s["busy_fraction"] < 0.999:
        out["ratios"]["async_gain_over_max_gain"] = ((a["decode_tput"] / s["decode_tput"] - 1)
                                                     / (1 / s["busy_fraction"] - 1))
    if DEVICE == "cuda":  # a greedy decode step at batch ``slots``: graphs replayed vs run eagerly
        steps: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(reps):
            for graphs in steps:
                steps[graphs].append(decode_step_ms(model, tok, graphs, slots))
        out["decode_step_ms"] = {"graphs": median(steps[True]), "eager": median(steps[False])}
        out["ratios"]["graph_decode_step_over_eager"] = median(steps[True]) / median(steps[False])
    return out


def decode_step_ms(model, tok, graphs: bool, slots: int = 8, new_tokens: int = 48) -> float:
    """Median compute lane (CUDA events: forward + greedy sampling) of the decode-only steps of
    ``slots`` requests decoding together, sync runner."""
    engine = Engine(EngineConfig(policy="continuous", max_slots=slots, device=DEVICE, cuda_graphs=graphs),
                    model=model, tokenizer=tok)
    for i in range(slots):
        engine.submit(prompt=CHAT_PROMPTS[i], max_new_tokens=new_tokens, ignore_eos=True)
    engine.run_until_idle()
    decode = [r for r in engine.telemetry.steps if not r["tokens"]["prefill"]][2:]
    return 1000 * median([s["end"] - s["start"] for r in decode for s in r["spans"] if s["lane"] == "compute"])


def server(model, tok) -> Result:
    from engine.lab.bench_server import server as run_server  # its own module: clients, a child process

    return run_server(model, tok)


def prefix(model, tok) -> Result:
    """Prefix caching off vs on, interleaved: questions over one shared document plus chats, then
    the ``batching`` workload (engine/workloads/prefix.py)."""
    from engine.workloads.prefix import bench_prefix

    return bench_prefix(model, tok, run)


def roofline(model, tok) -> Result:
    from engine.lab.roofline import roofline as run_roofline  # its own module: roofs, decode steps, model

    return run_roofline(model, tok)


def accuracy(model, tok) -> Result:
    from engine.lab.accuracy import accuracy as run_accuracy  # perplexity and greedy agreement per format

    return run_accuracy(model, tok)


SCENARIOS = {"batching": batching, "stall": stall, "memory": memory, "peer": peer, "dtype": dtype, "overlap": overlap,
             "server": server, "prefix": prefix, "roofline": roofline, "accuracy": accuracy}


# -- report ----------------------------------------------------------------------------------------
COLUMNS = (("throughput", "tok/s", 1), ("step_ms", "step ms", 1), ("busy_fraction", "busy", 3), ("wall_s", "wall s", 1), ("useful_tokens", "tokens", 0), ("ttft_p50", "TTFT p50", 2),
           ("itl_p50", "ITL p50", 3), ("itl_p99", "ITL p99", 3), ("itl_max", "ITL max", 3),
           ("slot_utilization", "slot use", 2), ("dead_slot_fraction", "dead", 2), ("kv_waste", "KV waste", 3),
           ("peak_running", "peak seqs", 0), ("lag_p50_ms", "lag p50 ms", 1), ("lag_p99_ms", "lag p99 ms", 1),
           ("requests_per_s", "req/s", 2))


def table(name: str, result: Result) -> str:
    lines = [f"== {name} =="]
    header = f"{'run':<16}" + "".join(f"{label:>11}" for _, label, _ in COLUMNS)
    lines.append(header)
    for run_name, r in result["runs"].items():
        cells = []
        for key, _, digits in COLUMNS:
            v = r.get(key)
            cells.append(f"{'-':>11}" if v is None else f"{v:>11.{digits}f}")
        lines.append(f"{run_name:<16}" + "".join(cells))
    for k, v in result.get("ratios", {}).items():
        lines.append(f"  {k:<40} {v:8.3f}")
    return "\n".join(lines)


def machine() -> Result:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else None
    return {"cpu": cpu or platform.processor(), "gpu": gpu, "cuda_graphs": GRAPHS if DEVICE == "cuda" else None, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__)
    ap.add_argument("scenario", choices=[*SCENARIOS, "page", "all"])
    ap.add_argument("--json", type=Path, help="write the results (with a top-level 'ratios') here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--cuda-graphs", choices=("on", "off"), default="on",
                    help="cuda: replay captured graphs for decode-only steps (off: every step eager)")
    ap.add_argument("--seconds", type=float, default=20.0, help="page: seconds per measured phase")
    ap.add_argument("--reps", type=int, default=2, help="page: A/B repetitions")
    ap.add_argument("--weights", choices=("fp32", "q4", "q8"), default="q4",
                    help="CPU weight format of the engines (roofline and accuracy measure all three)")
    args = ap.parse_args(argv)
    if args.scenario == "page":  # the lab runs in its own processes: no model in this one
        from engine.lab import bench_page

        result = bench_page.main(args)
        print(bench_page.table(result), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"machine": machine(), "ratios": result["ratios"],
                                             "scenarios": {"page": result}}, indent=1, default=str))
        return 0
    global DEVICE, GRAPHS
    DEVICE, GRAPHS = args.device, args.cuda_graphs == "on"
    global WEIGHTS
    WEIGHTS = args.weights
    try:
        check_device(DEVICE)
    except DeviceUnavailable as exc:
        raise SystemExit(f"error [{exc.code}]: {exc.message}") from None
    model, tok = device.run(load_model, "smollm2", "float32")
    model = model.to(DEVICE)
    warm_up(model, tok)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    results: Result = {}
    for name in names:
        t = time.perf_counter()
        if name == "peer" and "batching" in results:
            results[name] = peer(model, tok, ours=results["batching"])
        else:
            results[name] = SCENARIOS[name](model, tok)
        results[name]["bench_s"] = time.perf_counter() - t
        if name in ("roofline", "accuracy"):  # tables of their own (roofs and points; perplexities)
            import importlib

            own = importlib.import_module(f"engine.lab.{name}").table
            print(f"== {name} ==\n" + own(results[name]), flush=True)
        else:
            print(table(name, results[name]), flush=True)
    ratios = {k: v for r in results.values() for k, v in r.get("ratios", {}).items()}
    doc = {"machine": machine(), "ratios": ratios, "scenarios": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
