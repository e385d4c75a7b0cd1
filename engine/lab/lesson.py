"""``python -m engine.lesson N [--short] [--json PATH]``: lesson N's scenario and its claims.

For a teacher preparing a class without the page: the same runs the lesson's check makes, on
SmolLM2, with each claim's threshold and the number this machine measured. ``--list`` lists them.
``--live``: instead, the numbers the lesson's Live-page steps show, on an engine server started as
``make lab`` starts it (engine/lab/live_steps.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from engine.core import device
from engine.core.cuda_exec import check_device, device_name
from engine.core.errors import DeviceUnavailable
from engine.core.model import load_model
from engine.lab import live_steps, live_tables, preflight
from engine.lab.prose import lesson_runs, render_numbers
from engine.lab.replay import warm_up
from engine.lab.scenario import Result, lesson_dir, load, run_lesson
from engine.workloads.lessons import lesson_dirs
from kernels.cpu_quant import build_name

# The columns a lesson's runs are shown with (the headline metrics, and the lessons' extras).
COLUMNS = (
    ("throughput", "tok/s", 1),
    ("decode_tput", "dec tok/s", 1),
    ("step_ms", "step ms", 1),
    ("ttft_p50", "TTFT p50", 2),
    ("itl_p50", "ITL p50", 3),
    ("itl_p99", "ITL p99", 3),
    ("running_itl_max", "run ITLmax", 3),
    ("slot_utilization", "slot use", 2),
    ("dead_slot_fraction", "dead", 2),
    ("kv_waste", "KV waste", 3),
    ("peak_running", "peak", 0),
    ("preemptions", "preempt", 0),
    ("busy_fraction", "busy", 3),
    ("wall_s", "wall s", 1),
)


def report(title: str, result: Result) -> str:
    lines = [f"== {title} ==", f"{'run':<14}" + "".join(f"{label:>11}" for _, label, _ in COLUMNS)]
    for name, r in result["runs"].items():
        cells = (
            f"{r['summary'][k]:>11.{d}f}" if k in r["summary"] else f"{'-':>11}"
            for k, _, d in COLUMNS
        )
        lines.append(f"{name:<14}" + "".join(cells))
    lines += ["", f"{'claim':<72} {'threshold':>12} {'measured':>9}  result"]
    for c in result["checks"]:
        lines.append(
            f"{c['claim'][:72]:<72} {c['op']:>3} {c['threshold']:>8.3g} {c['measured']:>9.3f}  "
            f"{'pass' if c['ok'] else 'FAIL'}"
        )
    return "\n".join(lines)


MARK_START, MARK_END = "<!-- measured -->", "<!-- /measured -->"
HEAD = {
    "en": (
        "claim",
        "threshold",
        "measured (short / full)",
        "Runs",
        "measured on",
        "not run",
        "load average",
        "torch thread(s)",
    ),
    "pt-BR": (
        "afirmação",
        "limite",
        "medido (curta / completa)",
        "Execuções",
        "medido em",
        "não rodou",
        "carga média",
        "thread(s) do torch",
    ),
}


VARIANT = {  # the words of a run's line: its variant, and its figures' labels in the language
    "en": {"short": "short", "full": "full"},
    "pt-BR": {"short": "curta", "full": "completa", "busy": "ocupado", "peak": "pico"},
}


def _num(x: float, lang: str) -> str:
    text = f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return text.replace(".", ",") if lang == "pt-BR" else text  # decimal commas in Portuguese prose


def measured_markdown(scenario: dict, measured: dict, lang: str) -> str:
    """The teacher's table of claims, each with the short and full value this machine measured."""
    h = HEAD[lang]
    lines = [f"| {h[0]} | {h[1]} | {h[2]} |", "|---|---|---|"]
    for check in scenario["check"]:
        claim = check.get("claim_pt", check["claim"]) if lang == "pt-BR" else check["claim"]
        cells = []
        for variant in ("short", "full"):  # matched by claim: a claim added later shows as not run
            done = {c["claim"]: c for c in (measured.get(variant) or {}).get("checks", [])}
            c = done.get(check["claim"])
            cells.append(f"{_num(c['measured'], lang)}{'' if c['ok'] else ' FAIL'}" if c else h[5])
        bound = _num(check["threshold"], lang)  # the short replay's own, where it has one
        if "short_threshold" in check:
            bound = f"{_num(check['short_threshold'], lang)} / {bound}"
        lines.append(f"| {claim} | {check['op']} {bound} | {' / '.join(cells)} |")
    for variant in ("short", "full"):
        doc = measured.get(variant)
        if not doc:
            continue
        runs = "; ".join(
            f"{name}: {_num(r['summary'].get('throughput', float('nan')), lang)} tok/s"
            + "".join(
                f", {VARIANT[lang].get(label, label)} {_num(r['summary'][k] * f, lang)}{unit}"
                for k, label, f, unit in (
                    ("ttft_p50", "TTFT p50", 1, " s"),
                    ("itl_p50", "ITL p50", 1000, " ms"),
                    ("itl_p99", "ITL p99", 1000, " ms"),
                    ("busy_fraction", "busy", 1, ""),
                    ("peak_running", "peak", 1, ""),
                )
                if k in r["summary"]
            )
            for name, r in doc["runs"].items()
        )
        load_avg = str(doc.get("load", "?")).replace(".", "," if lang == "pt-BR" else ".")
        threads = f", {doc['threads']} {h[7]}" if "threads" in doc else ""
        cpu = f", {doc['cpu']}" if "cpu" in doc else ""  # stored since 2026-12-03
        when = f"{h[4]} {doc.get('when', '?')}{cpu}, {h[6]} {load_avg}{threads}"
        lines += ["", f"{h[3]} ({VARIANT[lang][variant]}, {when}): {runs}."]
    return "\n".join(lines)


def write_notes(path: Path, scenario: dict) -> None:
    """Refresh the measured block of teacher.{lang}.md from measured.json, and every prose number
    (``<!-- n ... -->``) of the four texts (numbers never typed)."""
    measured = lesson_runs(path)  # measured.json, and the folder's other stored runs by name
    for lang in HEAD:
        student = path / f"{lang}.md"
        if student.exists():
            student.write_text(render_numbers(student.read_text(), measured, lang))
        notes = path / f"teacher.{lang}.md"
        if not notes.exists():
            continue
        text = notes.read_text()
        number = int(scenario["lesson"]["number"])
        for (start, end), block in (
            ((MARK_START, MARK_END), measured_markdown(scenario, measured, lang)),
            (
                (live_tables.MARK_START, live_tables.MARK_END),
                live_tables.live_markdown(measured.get("live"), number, lang),
            ),
        ):
            if start in text and end in text:
                head, rest = text.split(start, 1)
                text = f"{head}{start}\n{block}\n{end}{rest.split(end, 1)[1]}"
        notes.write_text(render_numbers(text, measured, lang))


def _live_args(ap: argparse.ArgumentParser) -> None:
    """The ``--live`` options: the Live-page steps measured on an engine server."""
    ap.add_argument(
        "--live",
        action="store_true",
        help="measure the lesson's Live-page steps ([[live]]) on an engine server started as "
        "`make lab` starts it, one headline window each (--save keeps them for the teacher notes)",
    )
    ap.add_argument(
        "--seconds", type=float, default=30.0, help="--live: seconds per setting (the window)"
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="--live: hold each [[live_check]] claim's direction in every run (exit 1 if not)",
    )
    ap.add_argument("--runs", type=int, default=3, help="--live --check: visits of the settings")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="--live: the engine on every core, as `python -m engine.lab --no-pin` starts it",
    )
    ap.add_argument(
        "--preflight",
        action="store_true",
        help="--live: the pre-class check: each lesson's claimed settings once, 10 s each (about "
        "5 minutes for all), and per lesson shows / weak / does not show with what to do; kept for "
        "the Lessons page",
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.lesson", description=__doc__)
    ap.add_argument("number", nargs="?", help="lesson number (1, 2, ...); with --live also: all")
    ap.add_argument("--list", action="store_true", help="list the lessons and exit")
    ap.add_argument("--short", action="store_true", help="the shortened variant the tests run")
    ap.add_argument("--json", type=Path, help="also write the summaries and claims here")
    ap.add_argument(
        "--save",
        action="store_true",
        help="keep this run in the lesson's measured.json (short and full apart) and refresh the "
        "measured tables of its teacher notes",
    )
    _live_args(ap)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the forward (default: torch's, one per core). On a shared machine "
        "1 is faster and steadier: a descheduled OpenMP thread stalls every step (tests use 1)",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=os.environ.get("FLUXO_DEVICE", "cpu"),
        help="cpu or cuda (or FLUXO_DEVICE); cuda without a GPU is an error, never a silent CPU "
        "run",
    )
    return ap.parse_args(argv)


def _list() -> int:
    for p in lesson_dirs():
        sc = load(p / "scenario.toml")
        print(
            f"{int(p.name[:2]):>2}  {p.name:<28} {sc['lesson']['title_en']}  "
            f"({sc['lesson']['title_pt']})"
        )
    return 0


def _model(args: argparse.Namespace) -> tuple:
    """SmolLM2 on ``args.device``, warmed up, with the torch threads ``args.threads`` asks for."""
    try:
        check_device(args.device)
    except DeviceUnavailable as exc:
        raise SystemExit(f"error [{exc.code}]: {exc.message}") from None
    if args.threads:  # the device thread (the engines) and this one (lesson 8's transformers peer)
        device.run(torch.set_num_threads, args.threads)
        torch.set_num_threads(args.threads)
    model, tok = device.run(load_model, "smollm2", "float32")
    model = model.to(args.device)  # the scenario's engines run where the model is
    # the first engine of a process pays one-off costs no lesson should measure
    warm_up(model, tok, args.device)
    return model, tok


def _record(path: Path, scenario: dict, args: argparse.Namespace, result: dict) -> None:
    """The run as JSON: written to ``--json``, and kept in measured.json with ``--save``."""
    doc = {
        "lesson": path.name,
        "short": args.short,
        "checks": result["checks"],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": f"{os.getloadavg()[0]:.1f}",
        # the engine the runs measured (one engine: the lab's default weights)
        "weights": _weights_of(result["runs"]),
        "device": args.device,
        "cpu": f"{device_name(args.device)}, {build_name() or 'no'} kernels",  # CPUs vary
        "threads": device.run(torch.get_num_threads),
        "runs": {
            k: {"config": v["config"], "summary": v["summary"]} for k, v in result["runs"].items()
        },
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    if args.save:
        file = path / "measured.json"
        measured = json.loads(file.read_text()) if file.exists() else {}
        measured["short" if args.short else "full"] = doc
        file.write_text(json.dumps(measured, indent=1))
        write_notes(path, scenario)


def _weights_of(runs: dict) -> str:
    """The weight format every engine run of a lesson read (peer runs have none), or "mixed"."""
    seen = {r["config"]["weights"] for r in runs.values() if "weights" in r.get("config", {})}
    return seen.pop() if len(seen) == 1 else ("mixed" if seen else "none")


def _live(args: argparse.Namespace) -> int:
    """``--live``: the [[live]] settings of lesson N (or of every lesson) on one server started as
    ``make lab`` starts it."""
    try:
        check_device(args.device)  # before a server is started on it
    except DeviceUnavailable as exc:
        raise SystemExit(f"error [{exc.code}]: {exc.message}") from None
    paths = lesson_dirs() if args.number == "all" else [lesson_dir(int(args.number))]
    scenarios = [load(p / "scenario.toml") for p in paths]
    if args.preflight:
        return preflight.run(scenarios, args.seconds, args.device)
    runs = [
        live_steps.measure(scenarios, args.seconds, args.device, no_pin=args.no_pin)
        for _ in range(args.runs if args.check else 1)
    ]
    results = runs[0]
    failed = 0
    for i, (path, scenario, result) in enumerate(zip(paths, scenarios, results, strict=True)):
        number = int(scenario["lesson"]["number"])
        if args.check:  # every claim of [[live_check]], over every run
            result["checks"] = live_steps.check(scenario, [r[i] for r in runs])
            failed += sum(not c["ok"] for c in result["checks"])
        print(f"== lesson {number} (live) ==\n{live_tables.live_markdown(result, number, 'en')}\n")
        if args.save:
            file = path / "measured.json"
            measured = json.loads(file.read_text()) if file.exists() else {}
            measured["live"] = result
            file.write_text(json.dumps(measured, indent=1))
            write_notes(path, scenario)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.list or args.number is None:
        return _list()
    if args.live:
        return _live(args)
    if args.number == "all":
        raise SystemExit("'all' is for --live; a lesson's claims run one lesson at a time")
    path = lesson_dir(int(args.number))
    scenario = load(path / "scenario.toml")
    model, tok = _model(args)
    t = time.perf_counter()
    result = run_lesson(model, tok, scenario, short=args.short)
    title = (
        f"lesson {args.number}: {scenario['lesson']['title_en']}{' (short)' if args.short else ''}"
    )
    print(report(title, result))
    print(f"\n{time.perf_counter() - t:.1f} s")
    _record(path, scenario, args, result)
    return 0 if all(c["ok"] for c in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
