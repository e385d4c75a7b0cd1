"""``python -m engine.policy``: score a policy on a trace, write the shipped trace, convert an
export.

    python -m engine.policy score examples/policies/fair_share.py [more.py ...] [--json out.json]
        (quick: a counting stand-in for the weights, exact on the priced clock; --full: SmolLM2)
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
import time
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
    sc.add_argument(
        "--full",
        action="store_true",
        help="replay on the model's own weights (the default replays on a counting stand-in, "
        "exact on the priced clock; --clock wall is always full)",
    )
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


def _model(args: argparse.Namespace) -> tuple[Any, Any, str, str, bool]:
    """(model, tokenizer, weights, dtype, quick): the tiny model as it is; another on the priced
    clock as its tokenizer and ``score.counting_model`` (unless --full), else loaded whole."""
    import torch

    from engine.core.model import load_model, load_tokenizer

    if args.model == "tiny":  # the tiny model gains nothing from intra-op threads and loses much
        torch.set_num_threads(1)
        return *load_model("tiny", "float64"), "fp32", "float64", False
    if args.full or args.clock == "wall":
        lm, tok = load_model(args.model, "float32")
        return lm, tok, args.weights or lab_weights(args.model), "float32", False
    torch.set_num_threads(1)  # a width-16 forward: one thread, no barrier to wait at
    tok, config = load_tokenizer(args.model)
    lm = score.counting_model(config["vocab_size"], config["max_position_embeddings"])
    return lm, tok, "fp32", "float32", True


def run_score(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    policies = list(dict.fromkeys(_policy(p, args.name) for p in args.policy))
    items = trace.load(args.trace)
    model, tok, weights, dtype, quick = _model(args)
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
    result["weights"] = "counted" if quick else weights
    result["full_check"] = score.check_full(result) if quick else None
    result["seconds"] = round(time.perf_counter() - t0, 1)
    named = ", ".join(policies)
    title = f"{named} vs the built-ins: {len(items)} requests of {args.trace}, {args.clock} clock"
    for line in runs_table(title, result["runs"], COLUMNS):
        print(line)
    for policy, over in result["ratios"].items():
        for builtin, ratios in over.items():
            print(f"{policy} over {builtin}:")
            print("\n".join(ratio_lines(ratios)))
    print(_mode_line(result, quick))
    if args.json:
        Path(args.json).write_text(json.dumps(_plain(result), indent=1) + "\n")
    return result


def _mode_line(result: dict[str, Any], quick: bool) -> str:
    took = f"{result['seconds']} s"
    if not quick:
        return f"full replay on the model's own weights ({result['weights']}), {took}"
    line = f"quick ({took}): a counting stand-in picked the tokens, and no priced figure reads them"
    check = result["full_check"]
    if check is None:
        return line + "; no stored full replay of this trace to check against: --full replays one"
    held = "every one equal" if check["equal"] else f"off by up to {check['max_rel_diff']:.2%}"
    return (
        f"{line}.\nAgainst the stored full replay ({check['weights']}, {check['stored']}): "
        f"{', '.join(check['runs'])}, {check['metrics']} figures, {held}"
    )


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
