"""Benchmarks: ``python -m engine.bench {batching,stall,memory,peer,dtype,overlap,server,prefix,
roofline,phases,accuracy,page,kernels,all} [--json PATH]``.

Benchmarks measure; tests check behaviour. Every ratio comes from runs made in the same process,
on the same machine, one after the other, so machine noise mostly cancels out. The runs live in
``bench_runs`` (and ``bench_peers``, ``bench_server``, ``bench_page``...); this is the command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

import torch

from engine.core import device
from engine.core.cuda_exec import check_device
from engine.core.errors import DeviceUnavailable
from engine.core.model import load_model
from engine.lab import bench_runs
from engine.lab.bench_peers import peer
from engine.lab.bench_runs import Result, batching, dtype, memory, overlap, run, stall, warm_up
from engine.lab.tables import ratio_lines, runs_table


def server(model, tok) -> Result:
    # its own module: clients, a child process
    from engine.lab.bench_server import server as run_server

    return run_server(model, tok)


def prefix(model, tok) -> Result:
    """Prefix caching off vs on, interleaved: questions over one shared document plus chats, then
    the ``batching`` workload (engine/workloads/prefix.py)."""
    from engine.workloads.prefix import bench_prefix

    return bench_prefix(model, tok, run)


def roofline(model, tok) -> Result:
    # its own module: roofs, decode steps, model; then the quantized steps' phases against the
    # roofs, and llama.cpp's steps beside q4's, if built
    from engine.lab.peer_llama_cpp import roofline_peer
    from engine.lab.roofline import roofline as run_roofline
    from engine.lab.step_phases import roofline_phases

    out = run_roofline(model, tok)
    roofline_phases(model, out)
    roofline_peer(out)
    return out


def phases(model, tok) -> Result:
    # the q4/q8 steps' phases against their roofs, alone (roofline runs them too)
    from engine.lab.step_phases import phases as run_phases

    return run_phases(model, tok)


def accuracy(model, tok) -> Result:
    # perplexity and greedy agreement per format
    from engine.lab.accuracy import accuracy as run_accuracy

    return run_accuracy(model, tok)


SCENARIOS = {
    "batching": batching,
    "stall": stall,
    "memory": memory,
    "peer": peer,
    "dtype": dtype,
    "overlap": overlap,
    "server": server,
    "prefix": prefix,
    "roofline": roofline,
    "phases": phases,
    "accuracy": accuracy,
}


# -- report ----------------------------------------------------------------------------------------
COLUMNS = (
    ("throughput", "tok/s", 1),
    ("wall_per_step_ms", "step ms", 1),  # overlap: the mean step
    ("decode_window_ms", "dec step ms", 1),  # server: the median decode-only step window
    ("busy_fraction", "busy", 3),
    ("wall_s", "wall s", 1),
    ("useful_tokens", "tokens", 0),
    ("ttft_p50", "TTFT p50", 2),
    ("itl_p50", "ITL p50", 3),
    ("itl_p99", "ITL p99", 3),
    ("itl_max", "ITL max", 3),
    ("slot_utilization", "slot use", 2),
    ("dead_slot_fraction", "dead", 2),
    ("kv_waste", "KV waste", 3),
    ("peak_running", "peak seqs", 0),
    ("lag_p50_ms", "lag p50 ms", 1),
    ("lag_p99_ms", "lag p99 ms", 1),
    ("requests_per_s", "req/s", 2),
)


def table(name: str, result: Result) -> str:
    lines = runs_table(name, result["runs"], COLUMNS)
    return "\n".join(lines + ratio_lines(result.get("ratios", {})))


def machine() -> Result:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cuda = bench_runs.DEVICE == "cuda"
    return {
        "cpu": cpu or platform.processor(),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_graphs": bench_runs.GRAPHS if cuda else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__)
    ap.add_argument("scenario", choices=[*SCENARIOS, "page", "kernels", "all"])
    ap.add_argument("--json", type=Path, help="write the results (with a top-level 'ratios') here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--cuda-graphs",
        choices=("on", "off"),
        default="on",
        help="cuda: replay captured graphs for decode-only steps (off: every step eager)",
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="page: seconds per measured phase")
    ap.add_argument("--reps", type=int, default=2, help="page: A/B repetitions")
    ap.add_argument(
        "--weights",
        choices=("fp32", "q4", "q8"),
        default="q4",
        help="CPU weight format of the engines (roofline and accuracy measure all three)",
    )
    ap.add_argument(
        "--against",
        default="HEAD",
        help="kernels: the git revision whose CPU kernels are timed against the working tree's",
    )
    ap.add_argument(
        "--pairs", type=int, default=100, help="kernels: steps timed in turn, per build"
    )
    ap.add_argument(
        "--against-build",
        default="avx2",
        help="kernels: the instruction-set build of the revision's kernels (avx2, avxvnni, "
        "avx512vnni); the working tree's is the one this CPU serves with",
    )
    return ap.parse_args(argv)


def _write(path: Path | None, doc: Result) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, default=str))


def _page(args: argparse.Namespace) -> int:
    """The lab runs in its own processes: no model in this one."""
    from engine.lab import bench_page

    result = bench_page.main(args)
    print(bench_page.table(result), flush=True)
    doc = {"machine": machine(), "ratios": result["ratios"], "scenarios": {"page": result}}
    _write(args.json, doc)
    return 0


def _kernels(args: argparse.Namespace) -> int:
    """The working tree's CPU kernels against a revision's, in one process (kernel_ab)."""
    from engine.lab import kernel_ab

    model, _ = device.run(load_model, "smollm2", "float32")
    try:
        result = device.run(
            kernel_ab.compare, model, args.against, pairs=args.pairs, base_build=args.against_build
        )
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print("== kernels ==\n" + kernel_ab.table(result), flush=True)
    _write(
        args.json,
        {"machine": machine(), "ratios": result["ratios"], "scenarios": {"kernels": result}},
    )
    return 0


def _one(name: str, model, tok, results: Result) -> Result:
    if name == "peer" and "batching" in results:
        return peer(model, tok, ours=results["batching"])
    return SCENARIOS[name](model, tok)


# scenarios with tables of their own (roofs and points, phases, perplexities): their modules
OWN_TABLES = {
    "roofline": ("roofline", "step_phases"),
    "phases": ("step_phases",),
    "accuracy": ("accuracy",),
}


def _print(name: str, result: Result) -> None:
    if name in OWN_TABLES:
        own = [importlib.import_module(f"engine.lab.{m}").table for m in OWN_TABLES[name]]
        print(f"== {name} ==\n" + "\n".join(t(result) for t in own), flush=True)
    else:
        print(table(name, result), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.scenario == "page":
        return _page(args)
    if args.scenario == "kernels":
        return _kernels(args)
    try:  # first: a refused device must not become the runs' device (a module global)
        check_device(args.device)
    except DeviceUnavailable as exc:
        raise SystemExit(f"error [{exc.code}]: {exc.message}") from None
    bench_runs.configure(args.device, args.cuda_graphs == "on", args.weights)
    model, tok = device.run(load_model, "smollm2", "float32")
    model = model.to(args.device)
    warm_up(model, tok)
    # all: phases only once, inside roofline
    names = [n for n in SCENARIOS if n != "phases"] if args.scenario == "all" else [args.scenario]
    results: Result = {}
    for name in names:
        t = time.perf_counter()
        results[name] = _one(name, model, tok, results)
        results[name]["bench_s"] = time.perf_counter() - t
        _print(name, results[name])
    ratios = {k: v for r in results.values() for k, v in r.get("ratios", {}).items()}
    _write(args.json, {"machine": machine(), "ratios": ratios, "scenarios": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
