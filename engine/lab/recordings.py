"""``python -m engine.lab.recordings [N|all]``: record each lesson's scenario for the page's replay.

A lesson's ``[compare]`` marked ``record = true`` (else its first) runs both of its
configurations on SmolLM2 through the lesson machinery (``engine.lab.scenario.measure``: fresh
engines sharing the weights, the canonical seeded workload) at 0.35 of the comparison's scale (or
the ``[compare]``'s own ``record_scale``, where fewer requests cannot show the claim: lesson 4's
peak concurrency), and the records are written to
``lessons/NN-*/recording.jsonl``. The page (``app/recording.py``) opens it with no engine and no
model: a teacher can show the lesson on any laptop, and the Live page falls back to it when the
engine is unreachable.

The format is the page's own JSON lines export (one ``{"type": "step", ...}`` or
``{"type": "request", ...}`` object a line) with a header line (``"type": "recording"``) and one
``"type": "run"`` line per configuration (its config and the summary of the whole run); every
step and request line says its ``run``. To stay small (a few hundred KB a lesson) each run keeps
its first ``MAX_STEPS`` steps, and times are rounded to 10 microseconds.
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

from engine.lab.scenario import engine_config, lesson_dir, load, measure, ratios
from engine.lab.specs import SPECS
from engine.workloads.lessons import compares, lesson_dirs

FORMAT, VERSION = "fluxo-recording", 1
MAX_STEPS = 160  # per run: the start of a run holds its admissions, the part a lesson talks about
SCALE_FACTOR = 0.35  # of the [compare]'s own scale: a short recording, the same effect
DIGITS = 5  # seconds rounded to 10 us


def _round(x: Any) -> Any:
    """Floats rounded (NaN and infinities, which JSON cannot carry, become null)."""
    if isinstance(x, float):
        return None if not math.isfinite(x) else round(x, DIGITS)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def _label(config: dict[str, Any], other: dict[str, Any]) -> str:
    """What sets a run apart: the settings of its side of the [compare]."""
    return ", ".join(f"{k}={v}" for k, v in config.items()) or ", ".join(
        f"{k}=default" for k in other
    )


def _header(folder: Path, scenario: dict, cmp_: dict, scale: float) -> dict[str, Any]:
    """The recording's first line: which lesson, which [compare], when and how loaded."""
    meta = scenario["lesson"]
    return {
        "type": "recording",
        "format": FORMAT,
        "version": VERSION,
        "lesson": folder.name,
        "number": meta["number"],
        "title_en": meta["title_en"],
        "title_pt": meta["title_pt"],
        "workload": cmp_["workload"],
        "scale": scale,
        "ratio": cmp_.get("ratio", "throughput_b_over_a"),
        "model": "smollm2",
        "device": "cpu",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": round(os.getloadavg()[0], 1),
        "runs": ["a", "b"],
        "max_steps": MAX_STEPS,
    }


def _run_lines(side: str, cmp_: dict, res: dict) -> list[dict[str, Any]]:
    """One side's lines: its ``run`` line, its first ``MAX_STEPS`` steps and the requests that
    arrived by the last of them."""
    steps = res["steps"][:MAX_STEPS]
    t_last = steps[-1]["t_end"] if steps else 0.0
    requests = [r for r in res["requests"] if r["arrival"] <= t_last]
    other = cmp_.get("b" if side == "a" else "a", {})
    run = {
        "type": "run",
        "run": side,
        "label": _label(cmp_.get(side, {}), other),
        "config": res["config"],
        "summary": res["summary"],
        "steps_total": len(res["steps"]),
        "steps_kept": len(steps),
    }
    return [
        run,
        *({"type": "step", "run": side, **s} for s in steps),
        *({"type": "request", "run": side, **r} for r in requests),
    ]


def recorded_compare(scenario: dict) -> dict:
    """The ``[compare]`` a lesson's recording replays: the one marked ``record = true``, else the
    first (lesson 7's first rate is below the knee, where more slots change nothing)."""
    found = compares(scenario)
    return next((c for c in found if c.get("record")), found[0])


def record_lesson(model, tok, folder: Path) -> Path:
    """Run the lesson's recorded [compare] (both sides) and write ``folder/recording.jsonl``."""
    scenario = load(folder / "scenario.toml")
    cmp_ = recorded_compare(scenario)
    spec = SPECS[cmp_["workload"]]
    scale = cmp_.get("record_scale", max(0.05, float(cmp_.get("scale", 1.0)) * SCALE_FACTOR))
    lines, summary = [_header(folder, scenario, cmp_, scale)], {}
    for side in ("a", "b"):
        # One torch thread: on a shared 2-core machine (load ~12 here) a team of two spins.
        config = {**engine_config(spec["engine"], cmp_.get(side, {})), "threads": 1}
        res = measure(model, tok, spec, config, scale)
        summary[side] = res["summary"]
        lines += _run_lines(side, cmp_, res)
    lines[0]["ratios"] = ratios(summary["a"], summary["b"])  # as the live comparison answers
    lines[0] |= {"weights": res["config"].get("weights"), "threads": 1}  # the engine it ran on
    path = folder / "recording.jsonl"
    path.write_text(
        "".join(json.dumps(_round(line), separators=(",", ":")) + "\n" for line in lines)
    )
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m engine.lab.recordings", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("which", nargs="?", default="all", help="a lesson number, or all (default)")
    args = ap.parse_args(argv)
    from engine.core import device
    from engine.core.model import load_model
    from engine.lab.replay import warm_up

    folders = lesson_dirs() if args.which == "all" else [lesson_dir(int(args.which))]
    folders = [
        f for f in folders if (f / "scenario.toml").exists() and compares(load(f / "scenario.toml"))
    ]
    model, tok = device.run(load_model, "smollm2", "float32")
    warm_up(model, tok)
    for folder in folders:
        t = time.perf_counter()
        path = record_lesson(model, tok, folder)
        print(
            f"{folder.name}: {path.stat().st_size / 1024:.0f} KB in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
