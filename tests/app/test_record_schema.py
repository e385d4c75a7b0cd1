"""One declaration of the step record (engine/core/records.py), three readers held to it: the
recording loader checks against it, the browser's copy (app/component/records.js) and the tables
of docs/protocol.md are generated from it, and rows.js reads no record field it does not name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app import recording
from engine.core import config, records, schema, schema_export
from engine.core.policy.base import Policy

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
BEGIN, END = "<!-- records: generated from engine/core/records.py -->\n", "<!-- records: end -->"


def _step(**over) -> dict:
    rec = {
        "type": "step",
        "step": 1,
        "t_start": 0.5,
        "t_end": 0.52,
        "policy": "continuous",
        "runner": "sync",
        "slots": [{"slot": 0, "request": 3, "phase": "prefill", "tokens": 9}],
        "admitted": [3],
        "finished": [],
        "preempted": [],
        "queue_len": 0,
        "kv": {"blocks_total": 64, "blocks_used": 1, "tokens_stored": 9, "tokens_allocated": 16},
        "tokens": {"prefill": 9, "decode": 0},
        "spans": [{"lane": "compute", "start": 0.5, "end": 0.51}],
        "events": [{"t": 0.4, "kind": "switch", "policy": "continuous"}],
    }
    rec.update(over)
    return rec


def _parse(*steps: dict):
    return recording.parse("\n".join(json.dumps(s) for s in steps) + "\n")


def test_the_docs_tables_are_the_declarations():
    text = PROTOCOL.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/protocol.md lost its generated records section"
    held = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert held == schema_export.doc_tables(), "run: python -m engine.core.schema_export docs"


def test_the_browsers_copy_is_the_declarations():
    held = (ROOT / "app" / "component" / "records.js").read_text(encoding="utf-8")
    assert held == schema_export.browser_module(), (
        "run: python -m engine.core.schema_export js > app/component/records.js"
    )


def test_rows_js_reads_only_fields_the_contract_names():
    """Every snake_case property rows.js reads is a record field or a row field rows.js itself
    writes (``name:`` in an object literal): a renamed or misspelt field fails here."""
    js = (ROOT / "app" / "component" / "rows.js").read_text(encoding="utf-8")
    named = set()
    for td in schema_export.TABLES + (records.RequestRecord,):
        named |= set(schema.fields(td))
    own = set(re.findall(r"\b([a-z]+_[a-z0-9_]+)\s*:", js))
    read = set(re.findall(r"\.([a-z]+_[a-z0-9_]+)\b", js))
    assert read, "found no field reads in rows.js: the pattern above is stale"
    assert read - named - own == set()


def test_the_value_lists_are_the_engines():
    assert records.HOOKS == tuple(h for h in vars(Policy) if h in records.HOOKS)
    hints = schema.fields(records.StepRecord)
    runner = schema_export.json_schema(hints["runner"][0])
    assert tuple(runner["enum"]) == config.RUNNERS


def test_a_record_is_kept_as_declared_and_its_strangers_dropped():
    step = _parse(_step(extra="dropped", rank=1)).run().steps[0]
    assert "extra" not in step and step["rank"] == 1
    assert step["tokens"] == {"prefill": 9, "decode": 0, "dead": 0}  # an older record's default
    assert step["events"] == [{"t": 0.4, "kind": "switch", "policy": "continuous"}]
    assert set(step) <= set(schema.fields(records.StepRecord))


@pytest.mark.parametrize(
    "over,says",
    [
        ({"queue_len": -1}, "queue_len must be an integer in [0, "),
        (
            {"slots": [{"slot": 5000, "request": 1, "phase": "decode", "tokens": 1}]},
            "slots[0].slot",
        ),
        ({"slots": [{"slot": 0, "request": 1, "phase": "baking", "tokens": 1}]}, "one of prefill"),
        ({"kv": {"blocks_total": 1, "tokens_stored": 0}}, "a step record's kv lacks tokens_alloc"),
        (
            {"spans": [{"lane": "gpu", "start": 0, "end": 1}] * 65},
            "spans must be a list of at most",
        ),
        ({"t_end": float("inf")}, "t_end must be a finite number"),
        ({"policy": "<script>"}, "policy must be a plain name"),
        ({"events": [{"kind": "x", "bad key": 1}]}, "events[0]'s key must be a plain name"),
        ({"admitted_cached": {"x": 1}}, "admitted_cached must be an object of request id"),
        ({"decided": ["admit", "rm -rf"]}, "decided[1] must be one of token_budget"),
        ({"rank": 5000}, "rank must be an integer in [0, 1024]"),
    ],
)
def test_a_field_out_of_its_declaration_is_refused_with_its_line(over, says):
    with pytest.raises(recording.BadRecording) as info:
        _parse(_step(), _step(step=2, **over))
    assert says in info.value.message and info.value.line == 2, info.value.message
