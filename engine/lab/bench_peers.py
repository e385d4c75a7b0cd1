"""The ``peer`` benchmark: transformers' own serving paths (``python -m engine.peer``, a child
process) and llama.cpp (``engine/lab/peer_llama_cpp.py``) on the ``batching`` workload, beside ours.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.lab import bench_runs
from engine.lab.bench_runs import Result, batching, run
from engine.workloads.canonical import CHAT_PROMPTS, WorkItem, batching_workload


def peer(model, tok, slots: int = 8, ours: Result | None = None) -> Result:
    """transformers' own serving paths on the ``batching`` workload, beside ours.

    They run in a fresh subprocess (``python -m engine.peer``), one after our runs, so each side
    gets a process of its own, as a real deployment would; the machine and the run are the same.
    """
    if bench_runs.DEVICE == "cuda":  # engine.peer runs transformers on the CPU: no like pair
        return {
            "runs": {},
            "ratios": {},
            "note": "peer runs transformers on the CPU only; use --device cpu",
        }
    ours = ours or batching(model, tok, slots)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peer.json"
        cmd = [sys.executable, "-m", "engine.peer", "--slots", str(slots), "--json", str(path)]
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[2])
        hf = json.loads(path.read_text())
    hs, hc = hf["hf_static"], hf["hf_continuous"]
    mine = ours["runs"]
    out: Result = {
        "runs": {
            "hf_static": _peer_dict(hs),
            "hf_continuous": _peer_dict(hc),
            "ours_static": mine["static"],
            "ours_continuous": mine["continuous"],
        }
    }
    out["ratios"] = {
        "ours_over_hf_cb": mine["continuous"]["throughput"] / hc["tokens_per_s"],
        "ours_static_over_hf_static": mine["static"]["throughput"] / hs["tokens_per_s"],
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
    out["runs"]["llama_cpp_server"] = {
        "throughput": srv["tokens_per_s"],
        "useful_tokens": srv["useful_tokens"],
        "wall_s": srv["wall_s"],
    }
    one, _ = run(model, tok, [WorkItem(CHAT_PROMPTS[0], 64)], max_slots=1)
    one_stream = 1 / one["itl_p50"]
    out["runs"]["ours_one_stream"] = {"throughput": one_stream, "itl_p50": one["itl_p50"]}
    tg64 = lc["bench"].get("tg64_tokens_per_s")
    out["runs"]["llama_bench_tg64"] = {"throughput": tg64}
    ours_tput = ours["runs"]["continuous"]["throughput"]
    out["ratios"]["ours_over_llama_cpp_server"] = ours_tput / srv["tokens_per_s"]
    if tg64:
        out["ratios"]["ours_one_stream_over_llama_bench_tg"] = one_stream / tg64


def _peer_dict(r: Result) -> Result:
    keys = ("useful_tokens", "wall_s", "slots", "note")
    return {"throughput": r["tokens_per_s"], **{k: r[k] for k in keys}}
