"""A hand-in, checked: is the evidence what Fluxo exported, and does it support the student's claim?

``python -m app.evidence_check ASSIGNMENT HAND_IN...`` reads each hand-in (a folder holding the
page's ``fluxo-evidence.zip`` and the student's ``claim.toml``, or the zip alone with the claim
inside it) and prints one line each: ``supported``, ``not supported`` (the evidence is sound, the
claim does not follow from it: which figure, claimed against measured) or ``rejected`` (the
evidence itself fails: edited tables, CSV files that differ from the JSON, records that do not
validate, or a run that is not the one the assignment asks for). Exit status: 0 if every hand-in
is supported, 1 otherwise. Sixty hand-ins take a few seconds: nothing is replayed, the tables are
rebuilt from the records each file carries (``app/evidence.py``).

An assignment is a folder of ``lessons/assignments/`` whose ``assignment.toml`` names the run it
wants (``[evidence]``: the workload and each side's settings), the figures a claim states and
how close to the evidence they must be, and the rule a verdict follows (``[rule]``).
"""

from __future__ import annotations

import bisect
import io
import json
import math
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from app import evidence, recording

MAX_ZIP = 64 << 20  # the page's biggest export is a few MB; a zip bomb stops here
OPS = {"<=": lambda x, y: x <= y, ">=": lambda x, y: x >= y, "<": lambda x, y: x < y}


def _same(x: Any, y: Any) -> bool:
    """Equal as a table holds it: numbers to 1e-9 relative (JSON keeps them exactly; a float
    summed in another order may differ in its last bit), everything else exactly."""
    num = (int, float)
    if isinstance(x, num) and isinstance(y, num) and not isinstance(x, bool):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    return x == y


def read(data: bytes) -> tuple[dict, dict[str, str], str | None]:
    """A hand-in's bytes (the zip, or ``evidence.json`` alone): the document, its CSV files and
    the ``claim.toml`` inside it, if any."""
    if data[:2] != b"PK":
        return json.loads(data), {}, None
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        if sum(i.file_size for i in z.infolist()) > MAX_ZIP:
            raise evidence.BadEvidence("the zip unpacks to more than 64 MB: not a Fluxo export")
        names = set(z.namelist())
        if "evidence.json" not in names:
            raise evidence.BadEvidence("the zip holds no evidence.json: export it from the page")
        doc = json.loads(z.read("evidence.json"))
        csvs = {n: z.read(n).decode() for n in evidence.FILES.values() if n in names}
        claim = z.read("claim.toml").decode() if "claim.toml" in names else None
    return doc, csvs, claim


def sources(doc: dict) -> list[evidence.Source]:
    """The records, validated line by line as the page validates a recording it opens."""
    lines = []
    for name, run in (doc.get("records") or {}).items():
        lines.append({"type": "run", "run": name, "config": run.get("config"), "summary": {}})
        lines += [{**s, "type": "step", "run": name} for s in run.get("steps") or []]
        lines += [{**r, "type": "request", "run": name} for r in run.get("requests") or []]
    rec = recording.parse("\n".join(json.dumps(x) for x in lines) + "\n", "evidence")
    return [evidence.Source(r.name, r.config, r.steps, r.requests) for r in rec.runs.values()]


def _differ(got: Any, want: Any, where: str) -> str | None:
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return f"{where}: columns {sorted(set(got) ^ set(want))} differ"
        return next((d for k in want if (d := _differ(got[k], want[k], f"{where}.{k}"))), None)
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{where}: {len(got)} rows where the records make {len(want)}"
        return next(
            (
                d
                for i, (g, w) in enumerate(zip(got, want, strict=True))
                if (d := _differ(g, w, f"{where}[{i}]"))
            ),
            None,
        )
    return None if _same(got, want) else f"{where}: {got!r} where the records make {want!r}"


def _spans(steps: list[dict]) -> list[tuple[float, float]]:
    """The times a token may carry: each step's window, and the gap between two steps whose
    numbers are not adjacent (a page that fell behind skipped the records between them)."""
    slack = evidence.TOKEN_SLACK
    out = [(s["t_start"] - slack, s["t_end"] + slack) for s in steps]
    pairs = zip(steps, steps[1:], strict=False)
    out += [(a["t_end"], b["t_start"]) for a, b in pairs if b["step"] != a["step"] + 1]
    return sorted(out)


def _tokens_outside(srcs: list[evidence.Source]) -> str | None:
    """A token time that no step of its run was running at: a request edited apart from its steps.
    (Under the async runner neighbouring windows overlap: the three before the token are tried.)"""
    for src in srcs:
        spans = _spans(src.steps)
        starts = [a for a, _ in spans]
        for r in src.requests:
            for t in r["token_times"]:
                i = bisect.bisect_right(starts, t) - 1
                if not any(spans[j][1] >= t for j in range(max(i - 3, 0), i + 1)):
                    return f"run {src.name}: request {r['id']} has a token at {t} s, in no step"
    return None


def problems(doc: dict, csvs: dict[str, str]) -> str | None:
    """Why this document is not a Fluxo export as exported, or None."""
    if doc.get("format") != evidence.FORMAT or doc.get("version") != evidence.VERSION:
        return f"format {doc.get('format')!r} version {doc.get('version')!r} is not Fluxo evidence"
    try:
        srcs = sources(doc)
    except recording.BadRecording as exc:
        return f"the records do not validate: {exc}"
    rebuilt = json.loads(json.dumps(evidence.tables(srcs)))
    if bad := _differ(doc.get("tables"), rebuilt, "tables"):
        return bad
    for table, name in evidence.FILES.items():
        want = evidence.csv_text(doc["tables"][table], evidence.COLUMNS[table])
        if name in csvs and csvs[name] != want:
            return f"{name} differs from the tables of evidence.json"
    return _tokens_outside(srcs)


# -- an assignment -------------------------------------------------------------------------------
def _wanted(doc: dict, spec: dict) -> str | None:
    """Why this evidence is not the run the assignment asks for, or None."""
    runs = list((doc.get("records") or {}).values())
    want = spec.get("evidence", {})
    if len(runs) < 2:
        return "the evidence holds one run; the assignment asks for a comparison (A and B)"
    workload = doc.get("header", {}).get("workload")
    if want.get("workload") and workload != want["workload"]:
        return f"workload {workload!r}; the assignment asks for {want['workload']!r}"
    for side, run in zip(("a", "b"), runs, strict=False):
        for k, v in want.get(side, {}).items():
            # the policy is also in every step record: a config edited apart from them shows
            said = {run["config"].get(k)}
            said |= {s.get("policy") for s in run["steps"]} if k == "policy" else set()
            if said != {v}:
                return f"{side.upper()} ran {k}={sorted(map(str, said))}; the assignment asks {v!r}"
    return None


def verdict(doc: dict, spec: dict) -> str:
    """The verdict the assignment's rule gives on this evidence (its first word if it holds)."""
    ratios = doc["tables"]["ratios"]
    rule = spec["rule"]
    holds = all(
        ratios.get(k) is not None and OPS[op](ratios[k], bound)
        for k, (op, bound) in rule["if"].items()
    )
    return rule["then"] if holds else rule["else"]


def grade(doc: dict, csvs: dict[str, str], claim: dict, spec: dict) -> tuple[str, str]:
    """(``supported`` / ``not supported`` / ``rejected``, why)."""
    if bad := problems(doc, csvs) or _wanted(doc, spec):
        return "rejected", bad
    ratios, rel = doc["tables"]["ratios"], spec["claim"]["within"]
    for k in spec["claim"]["figures"]:
        said, got = claim.get(k), ratios.get(k)
        if not isinstance(said, (int, float)) or got is None:
            return "not supported", f"the claim states no {k} (the evidence: {got})"
        if abs(said - got) > rel * abs(got) + 0.005:  # stated to 2 decimals
            return "not supported", f"{k}: claimed {said}, the evidence says {got:.3f}"
    due = verdict(doc, spec)
    if claim.get("verdict") != due:
        return (
            "not supported",
            f"verdict {claim.get('verdict')!r}; the rule on this evidence: {due!r}",
        )
    return "supported", f"verdict {due!r}, " + ", ".join(
        f"{k} {ratios[k]:.2f}" for k in spec["claim"]["figures"]
    )


def hand_in(path: Path) -> tuple[dict, dict[str, str], dict]:
    """A folder (the zip and ``claim.toml``) or a zip with ``claim.toml`` inside."""
    zips = sorted(path.glob("*.zip")) if path.is_dir() else [path]
    if not zips:
        raise evidence.BadEvidence("no .zip in the hand-in: download the evidence from the page")
    data = zips[0].read_bytes()
    if len(data) > MAX_ZIP:
        raise evidence.BadEvidence("the file is over 64 MB: not a Fluxo export")
    doc, csvs, inner = read(data)
    claim_file = path / "claim.toml" if path.is_dir() else None
    text = claim_file.read_text() if claim_file and claim_file.exists() else inner
    if text is None:
        raise evidence.BadEvidence("no claim.toml beside or inside the evidence")
    return doc, csvs, tomllib.loads(text)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(
            __doc__.split("\n\n")[0]
            + "\n\nusage: python -m app.evidence_check ASSIGNMENT HAND_IN..."
        )
        return 2
    spec = tomllib.loads((Path(args[0]) / "assignment.toml").read_text())
    worst = 0
    for arg in args[1:]:
        try:
            outcome, why = grade(*hand_in(Path(arg)), spec)
        except (evidence.BadEvidence, ValueError, KeyError, zipfile.BadZipFile) as exc:
            outcome, why = "rejected", str(exc) or type(exc).__name__
        print(f"{arg}: {outcome}: {why}")
        worst = max(worst, outcome != "supported")
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
