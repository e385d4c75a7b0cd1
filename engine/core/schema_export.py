"""The record contract of ``engine/core/records.py`` written out for its other readers: the
browser's copy as JSON Schema (``python -m engine.core.schema_export js`` writes
``app/component/records.js``) and the Markdown tables of ``docs/protocol.md`` (``... docs``), each
field's meaning taken from the comments beside it. ``tests/app/test_record_schema.py`` holds both
files to what this module writes.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from engine.core import records
from engine.core.records import Default, Range, Text
from engine.core.schema import (
    MAX_NUMBER,
    MAX_TEXT,
    fields,
    is_typeddict,
    list_bound,
    marker,
    nullable,
    split_annotated,
)

TABLES = (
    records.StepRecord,
    records.SlotRecord,
    records.KVRecord,
    records.TokenCounts,
    records.SpanRecord,
)


# -- the browser's copy: JSON Schema -------------------------------------------------------------
def json_schema(tp: Any) -> dict:
    tp, none = nullable(tp)
    base, meta = split_annotated(tp)
    if none:
        return {"anyOf": [json_schema(tp), {"type": "null"}]}
    if is_typeddict(base):
        notes = comments(base)
        props = {}
        for name, (ftp, _) in fields(base).items():
            props[name] = json_schema(ftp)
            if notes.get(name):
                props[name]["description"] = notes[name]
            default = marker(split_annotated(ftp)[1], Default)
            if default is not None:
                props[name]["default"] = default.value
        required = [n for n, (t, req) in fields(base).items() if req and not _defaulted(t)]
        return {"type": "object", "title": base.__name__, "properties": props, "required": required}
    if get_origin(base) is Literal:
        return {"enum": list(get_args(base))}
    if get_origin(base) is list:
        most = list_bound(meta)
        return {"type": "array", "items": json_schema(get_args(base)[0]), "maxItems": most}
    if get_origin(base) is dict and "event" in meta:
        kind = {"type": "string", "maxLength": 64}
        return {"type": "object", "required": ["kind"], "properties": {"kind": kind}}
    if get_origin(base) is dict:
        item = json_schema(get_args(base)[1])
        return {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": item,
        }
    if base is int:
        r = marker(meta, Range) or Range()
        return {"type": "integer", "minimum": r.lo, "maximum": r.hi}
    if base is float:
        return {"type": "number", "minimum": -MAX_NUMBER, "maximum": MAX_NUMBER}
    text = marker(meta, Text)
    if text is not None:
        return {"type": "string", "pattern": f"^{text.pattern}$", "maxLength": text.most}
    return {"type": "string", "maxLength": MAX_TEXT}


def _defaulted(tp: Any) -> bool:
    return marker(split_annotated(tp)[1], Default) is not None


def browser_module() -> str:
    """``app/component/records.js``: the step record's JSON Schema and the contract's value lists,
    as ``window.FluxoRecords`` (rows.js reads the phases from it)."""
    data = {
        "PHASES": list(records.PHASES),
        "LANES": list(records.LANES),
        "HOOKS": list(records.HOOKS),
        "step": json_schema(records.StepRecord),
    }
    body = json.dumps(data, indent=1, ensure_ascii=False)
    return (
        "/* Generated from engine/core/records.py by `python -m engine.core.schema_export js`:\n"
        " * do not edit. The step record's contract as JSON Schema, and its value lists (rows.js\n"
        " * reads them). */\n"
        "(function (root) {\n"
        f"  root.FluxoRecords = {body};\n"
        '})(typeof window !== "undefined" ? window : this);\n'
    )


# -- the docs' tables ----------------------------------------------------------------------------
def comments(td: type) -> dict[str, str]:
    """The comments beside (and just above) each field of ``td`` in ``records.py``."""
    source = Path(records.__file__).read_text(encoding="utf-8")
    lines = source.splitlines()
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == td.__name__
    )
    out, above = {}, []
    for line in lines[node.lineno : node.end_lineno]:
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("# "))
            continue
        code, _, note = line.partition("  # ")
        name = code.strip().split(":")[0]
        if name.isidentifier() and ":" in code:
            out[name] = " ".join([*above, note.strip()]).strip()
        above = []
    return out


def type_text(tp: Any) -> str:
    """A type as the docs say it: ``integer 0-4096``, ``list of SlotRecord (at most 64)``."""
    tp, none = nullable(tp)
    base, meta = split_annotated(tp)
    text: str
    if is_typeddict(base):
        text = base.__name__
    elif get_origin(base) is Literal:
        text = "one of " + ", ".join(f"`{a}`" for a in get_args(base))
    elif get_origin(base) is list:
        most = list_bound(meta)
        text = f"list of {type_text(get_args(base)[0])} (at most {most:,})"
    elif get_origin(base) is dict and "event" in meta:
        text = "event: `kind` and plain-named scalars"
    elif get_origin(base) is dict:
        text = f"request id -> {type_text(get_args(base)[1])}"
    elif base is int:
        r = marker(meta, Range) or Range()
        text = f"integer {r.lo}-{r.hi:,}" if r.hi < 10**12 else "count"
    elif base is float:
        text = "seconds" if "seconds" in meta else "number"
    else:
        text = "name" if marker(meta, Text) else "text"
    default = marker(meta, Default)
    return text + (" or null" if none else "") + (f", default {default.value}" if default else "")


def doc_tables() -> str:
    """The Markdown tables of every record type, as ``docs/protocol.md`` holds them."""
    parts = []
    for td in TABLES:
        notes = comments(td)
        rows = [f"`{td.__name__}`\n", "| field | type | meaning |", "|---|---|---|"]
        for name, (tp, required) in fields(td).items():
            kind = type_text(tp) + ("" if required else "; optional")
            rows.append(f"| `{name}` | {kind} | {notes.get(name, '')} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("js", "docs"):
        raise SystemExit("usage: python -m engine.core.schema_export {js|docs}")
    sys.stdout.write(browser_module() if what == "js" else doc_tables())
