"""A terminal demo of the engine (the lab's fallback when no page is running).

It replays the same burst of chat requests under the static and the continuous policy and draws
each step's slots as a row of letters, so the dead slots of the static batch are plain to see:
``P`` prefill, ``d`` decode, ``x`` dead (finished, still computed), ``.`` idle.
"""

from __future__ import annotations

import argparse
import sys

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.metrics import summarize
from engine.core.model import load_model
from engine.workloads.canonical import batching_workload

GLYPH = {"prefill": "P", "decode": "d", "dead": "x", "idle": "."}


def replay(model, tok, policy: str, n: int, slots: int, every: int) -> dict:
    engine = Engine(
        EngineConfig(policy=policy, max_slots=slots, fill_timeout_s=0.0), model=model, tokenizer=tok
    )
    first = None
    for item in batching_workload(n):
        h = engine.submit(prompt=item.prompt, max_new_tokens=item.max_new_tokens, ignore_eos=True)
        first = first or h
    print(f"\n--- {policy}: {n} requests, {slots} slots ---")
    while engine.has_work():
        rec = engine.step()
        if rec is None:
            continue
        if rec["step"] % every == 0 or rec["admitted"]:
            row = "".join(GLYPH[s["phase"]] for s in rec["slots"])
            ms = (rec["t_end"] - rec["t_start"]) * 1000
            print(
                f"step {rec['step']:4d} [{row}] queue {rec['queue_len']:3d}  {ms:6.0f} ms"
                f"  KV {rec['kv']['blocks_used']:3d}/{rec['kv']['blocks_total']} blocks"
            )
    s = summarize(list(engine.telemetry.steps), list(engine.telemetry.requests.values()))
    print(
        f"{policy}: {s['throughput']:.1f} useful tok/s, dead-slot fraction "
        f"{s['dead_slot_fraction']:.2f}, "
        f"TTFT p50 {s['ttft_p50']:.1f} s, wall {s['wall_s']:.1f} s"
    )
    # lengths are forced (EOS ignored) to replay the workload; show the answer itself
    ids = first.token_ids
    answer = ids[: next((i for i, t in enumerate(ids) if t in engine.eos_ids), len(ids))]
    print(f"first request said: {tok.decode(answer, skip_special_tokens=True)!r}")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.demo", description=__doc__)
    ap.add_argument(
        "--model",
        default="smollm2",
        help="'smollm2' (bundled) or a local Llama-family checkpoint dir",
    )
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument(
        "--every", type=int, default=5, help="print every Nth step (and every admission)"
    )
    args = ap.parse_args(argv)
    model, tok = load_model(args.model)
    static = replay(model, tok, "static", args.requests, args.slots, args.every)
    flowing = replay(model, tok, "continuous", args.requests, args.slots, args.every)
    print(f"\ncontinuous / static throughput: {flowing['throughput'] / static['throughput']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
