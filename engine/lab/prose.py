"""Numbers in a lesson's prose, rendered from its stored runs (``measured.json``), never typed.

``<!-- n short:batch-8,decode_tput/batch-1,decode_tput@2 -->3.77<!-- /n -->`` is the short run's
batch-8 ``decode_tput`` over batch-1's, 2 decimals; ``check3`` names the 4th claim's measured
value; ``x1000`` after the digits scales (seconds to ms). The Live page's stored run (``--live
--save``) is ``live:``: ``live:1,itl_p99`` is the lesson's 2nd Live setting's headline ITL p99,
``live:check0,min`` the least ratio its first ``[[live_check]]`` showed over the runs. Another
stored run of the lesson's folder is named by its file: ``phases.json:scenarios.phases.phases.
q4.rows=8.step_ms`` walks that JSON (``rows=8``: the list's element whose ``rows`` is 8; ``~``
stands for a space in a key), and a text value (a run's date) is written as it is.
``python -m engine.lesson N --save`` renders every marker of the lesson's four texts
(engine/lab/lesson.py ``write_notes``), and tests/lessons/test_lessons.py fails on a text whose
numbers are not its stored runs'.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NUMBER = re.compile(r"<!-- n (?P<expr>\S+) -->(?P<value>.*?)<!-- /n -->")


def prose_number(measured: dict, expr: str, lang: str) -> str:
    """The value of one ``<!-- n EXPR -->`` marker, formatted for ``lang``."""
    spec, _, fmt = expr.partition("@")
    digits, _, factor = fmt.partition("x")
    variant, _, path = spec.partition(":")
    doc = measured[variant]
    if variant.endswith(".json"):
        found = [walk(doc, t) for t in path.split("/")]
        if isinstance(found[0], str):
            return found[0]
        value = found[0] / found[1] if len(found) == 2 else found[0]
        text = f"{float(value) * float(factor or 1):.{int(digits or 2)}f}"
        return text.replace(".", ",") if lang == "pt-BR" else text

    def one(term: str) -> float:
        if variant == "live":  # ``live:1,itl_p99``: the 2nd Live setting; ``live:check0,min``
            row, metric = term.rsplit(",", 1)
            if row.startswith("check"):
                return float(doc["checks"][int(row[5:])][metric])
            return float(doc["rows"][int(row)]["summary"][metric])
        if term.startswith("check"):
            return float(doc["checks"][int(term[5:])]["measured"])
        run, metric = term.rsplit(",", 1)
        return float(doc["runs"][run]["summary"][metric])

    terms = [one(t) for t in path.split("/")]
    value = terms[0] / terms[1] if len(terms) == 2 else terms[0]
    text = f"{value * float(factor or 1):.{int(digits or 2)}f}"
    return text.replace(".", ",") if lang == "pt-BR" else text


def walk(doc, path: str):
    """The value at a dotted ``path`` of a stored JSON run (``key=value`` picks a list element)."""
    for part in path.replace("~", " ").split("."):
        if isinstance(doc, list):
            key, _, want = part.partition("=")
            doc = next(x for x in doc if str(x[key]) == want)
        else:
            doc = doc[part]
    return doc


def lesson_runs(folder: Path) -> dict:
    """What a lesson's markers read: its ``measured.json`` (short, full, live) and, by file name,
    every other stored run of the folder (``roofline.json``, ``phases.json``)."""
    stored = folder / "measured.json"
    out = json.loads(stored.read_text()) if stored.exists() else {}
    for f in sorted(folder.glob("*.json")):
        if f.name != "measured.json":
            out[f.name] = json.loads(f.read_text())
    return out


def render_numbers(text: str, measured: dict, lang: str) -> str:
    """``text`` with every ``<!-- n EXPR -->`` marker's value rendered from ``measured``."""

    def sub(m: re.Match) -> str:
        value = prose_number(measured, m["expr"], lang)
        return f"<!-- n {m['expr']} -->{value}<!-- /n -->"

    return NUMBER.sub(sub, text)
