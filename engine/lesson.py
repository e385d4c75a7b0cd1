"""``python -m engine.lesson N [--short] [--json PATH]``: run lesson N's scenario headless, print its claims.

For a teacher preparing a class without the page: the same runs the lesson's check makes, on
SmolLM2, with each claim's threshold and the number this machine measured. ``--list`` lists them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine import device
from engine.bench import warm_up
from engine.model import load_model
from engine.scenario import Result, lesson_dir, lesson_dirs, load, run_lesson

# The columns a lesson's runs are shown with (the headline metrics, and the lessons' extras).
COLUMNS = (("throughput", "tok/s", 1), ("decode_tput", "dec tok/s", 1), ("step_ms", "step ms", 1),
           ("ttft_p50", "TTFT p50", 2), ("itl_p50", "ITL p50", 3), ("itl_p99", "ITL p99", 3),
           ("running_itl_max", "run ITLmax", 3), ("slot_utilization", "slot use", 2),
           ("dead_slot_fraction", "dead", 2), ("kv_waste", "KV waste", 3), ("peak_running", "peak", 0),
           ("preemptions", "preempt", 0), ("busy_fraction", "busy", 3), ("wall_s", "wall s", 1))


def report(title: str, result: Result) -> str:
    lines = [f"== {title} ==", f"{'run':<14}" + "".join(f"{label:>11}" for _, label, _ in COLUMNS)]
    for name, r in result["runs"].items():
        cells = (f"{r['summary'][k]:>11.{d}f}" if k in r["summary"] else f"{'-':>11}" for k, _, d in COLUMNS)
        lines.append(f"{name:<14}" + "".join(cells))
    lines += ["", f"{'claim':<72} {'threshold':>12} {'measured':>9}  result"]
    for c in result["checks"]:
        lines.append(f"{c['claim'][:72]:<72} {c['op']:>3} {c['threshold']:>8.3g} {c['measured']:>9.3f}  "
                     f"{'pass' if c['ok'] else 'FAIL'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.lesson", description=__doc__)
    ap.add_argument("number", nargs="?", type=int, help="lesson number (1, 2, ...)")
    ap.add_argument("--list", action="store_true", help="list the lessons and exit")
    ap.add_argument("--short", action="store_true", help="the shortened variant the tests run")
    ap.add_argument("--json", type=Path, help="also write the summaries and claims here")
    args = ap.parse_args(argv)
    if args.list or args.number is None:
        for p in lesson_dirs():
            sc = load(p / "scenario.toml")
            print(f"{int(p.name[:2]):>2}  {p.name:<28} {sc['lesson']['title_en']}  ({sc['lesson']['title_pt']})")
        return 0
    path = lesson_dir(args.number)
    scenario = load(path / "scenario.toml")
    model, tok = device.run(load_model, "smollm2", "float32")
    warm_up(model, tok)  # the first engine of a process pays one-off costs no lesson should measure
    t = time.perf_counter()
    result = run_lesson(model, tok, scenario, short=args.short)
    title = f"lesson {args.number}: {scenario['lesson']['title_en']}{' (short)' if args.short else ''}"
    print(report(title, result))
    print(f"\n{time.perf_counter() - t:.1f} s")
    if args.json:
        doc = {"lesson": path.name, "short": args.short, "checks": result["checks"],
               "runs": {k: {"config": v["config"], "summary": v["summary"]} for k, v in result["runs"].items()}}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0 if all(c["ok"] for c in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
