"""``python -m engine.policy``: score a policy on a trace, write the shipped trace, convert an
export.

    python -m engine.policy score examples/policies/fair_share.py [more.py ...] [--json out.json]
    python -m engine.policy convert export.jsonl [--run NAME] [--out trace.jsonl]
    python -m engine.policy trace [--out engine/workloads/traces/class.jsonl]

A policy file is loaded the way ``engine.serve --policy-file`` loads it (this machine's own file,
``engine/core/policy/registry.py``); a built-in's name is scored the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from engine.core.config import lab_weights
from engine.core.errors import FluxoError
from engine.core.policy import registry
from engine.lab import score
from engine.lab.tables import ratio_lines, runs_table
from engine.workloads import trace

COLUMNS = (
    ("goodput_rps", "goodput/s", 3),
    ("slo_met_fraction", "met", 2),
    ("goodput_rps_without_heaviest", "others/s", 3),
    ("fairness", "Jain", 3),
    ("throughput", "tok/s", 1),
    ("ttft_p50", "TTFT p50", 3),
    ("ttft_p99", "TTFT p99", 3),
    ("itl_p50", "ITL p50", 3),
    ("itl_p99", "ITL p99", 3),
    ("preemptions", "preempt", 0),
    ("policy_errors", "refused", 0),
)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.policy", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("score", help="a policy against the built-ins on a trace")
    sc.add_argument("policy", nargs="+", help="policy files (.py) or registered policies' names")
    sc.add_argument("--name", help="which policy of a file (default: its first)")
    sc.add_argument("--trace", default=str(trace.SHIPPED), help="a trace (JSON lines)")
    sc.add_argument("--json", help="also write the result here")
    sc.add_argument("--model", default="smollm2", help="smollm2 (default) or tiny (tests)")
    sc.add_argument("--weights", default=None, help="fp32, q4 or q8 (default: the lab's)")
    sc.add_argument("--clock", choices=("priced", "wall"), default="priced")
    sc.add_argument("--ttft-target", type=float, default=score.TTFT_TARGET_S)
    sc.add_argument("--itl-target", type=float, default=score.ITL_TARGET_S)
    cv = sub.add_parser("convert", help="the page's JSON lines export as a trace")
    cv.add_argument("export")
    cv.add_argument("--run", default=None, help="one run of a comparison's export")
    cv.add_argument("--out", default="-")
    tr = sub.add_parser("trace", help="write the shipped trace")
    tr.add_argument("--out", default=str(trace.SHIPPED))
    return ap.parse_args(argv)


def _policy(arg: str, name: str | None) -> str:
    if not arg.endswith(".py"):
        if arg not in registry.names():
            raise FluxoError(
                f"no policy named {arg!r}; give a .py file or one of {registry.names()}"
            )
        return arg
    names = registry.load_file(arg)
    if name is not None and name not in names:
        raise FluxoError(f"{arg} defines {', '.join(names)}, not {name!r}")
    return name or names[0]


def _plain(value: Any) -> Any:
    """NaN as null: the JSON stays valid for any reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _model(name: str):
    import torch

    from engine.core.model import load_model

    if name == "tiny":  # the tiny model gains nothing from intra-op threads and loses much
        torch.set_num_threads(1)
    return load_model(name, "float64" if name == "tiny" else "float32")


def run_score(args: argparse.Namespace) -> dict[str, Any]:
    policies = list(dict.fromkeys(_policy(p, args.name) for p in args.policy))
    items = trace.load(args.trace)
    model, tok = _model(args.model)
    weights = args.weights or lab_weights(args.model)
    dtype = "float64" if args.model == "tiny" else "float32"
    result = score.score(
        model,
        tok,
        items,
        policies,
        args.clock,
        args.ttft_target,
        args.itl_target,
        model=args.model,
        dtype=dtype,
        weights=weights,
    )
    where = os.path.relpath(args.trace)  # the repo's own trace named as in the repo
    result["trace"] = args.trace if where.startswith("..") else where.replace(os.sep, "/")
    result["weights"] = weights
    named = ", ".join(policies)
    title = f"{named} vs the built-ins: {len(items)} requests of {args.trace}, {args.clock} clock"
    for line in runs_table(title, result["runs"], COLUMNS):
        print(line)
    for policy, over in result["ratios"].items():
        for builtin, ratios in over.items():
            print(f"{policy} over {builtin}:")
            print("\n".join(ratio_lines(ratios)))
    if args.json:
        Path(args.json).write_text(json.dumps(_plain(result), indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        if args.command == "score":
            run_score(args)
        elif args.command == "convert":
            text = Path(args.export).read_text(encoding="utf-8")
            out = trace.dumps(trace.from_export(text, args.run))
            sys.stdout.write(out) if args.out == "-" else Path(args.out).write_text(out)
        else:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(trace.dumps(trace.class_trace()))
    except FluxoError as exc:
        print(f"error [{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error [bad_trace]: {exc}", file=sys.stderr)
        return 2
    return 0
