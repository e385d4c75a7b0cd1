"""``python -m engine.lab.file_table``: docs/architecture.md's per-file tables, from the files.

Each source file of the packages says what it is in its first paragraph: a Python module's
docstring, a C++ or JavaScript file's leading comment, an HTML file's first ``<!-- -->`` comment, a
stylesheet's first ``/* */``. This writes those paragraphs as the "Files by package" tables between
the ``<!-- files -->`` markers (``--write``), or prints them; ``tests/test_docs.py`` holds the
document to them, so a row cannot drift from its file: change the file's first paragraph and run
this again. The lessons' and the tests' tables below the markers are written by hand.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
START = "<!-- files: written by `python -m engine.lab.file_table --write` from each file's first "
START += "paragraph; do not edit by hand -->"
END = "<!-- /files -->"
SECTIONS = (  # heading, the folder's files (globs), in the order a reader meets the layers
    ("kernels/", ("kernels/*.py", "kernels/*.cpp")),
    ("engine/core/", ("engine/core/*.py",)),
    ("engine/core/policy/", ("engine/core/policy/*.py",)),
    ("engine/workloads/", ("engine/workloads/*.py",)),
    ("engine/server/", ("engine/server/*.py",)),
    ("engine/lab/", ("engine/lab/*.py",)),
    ("engine/*.py", ("engine/*.py",)),
    ("engine/observe/", ("engine/observe/*.py",)),
    ("observer/fluxo_vllm_observer/", ("observer/fluxo_vllm_observer/*.py",)),
    ("app/", ("app/*.py",)),
    ("app/views/", ("app/views/*.py",)),
    ("app/charts/", ("app/charts/*.py",)),
    ("app/component/", ("app/component/*.*", "app/component/keys/*.*")),
)


def _comment(text: str, suffix: str) -> str:
    """The leading comment of a C++, JavaScript, CSS or HTML file, its markers stripped."""
    if suffix == ".html":
        m = re.search(r"<!--(.*?)-->", text, re.S)
        return m.group(1) if m else ""
    text = text.lstrip()
    if text.startswith("/*"):
        body = text[2 : text.index("*/")]
        return "\n".join(re.sub(r"^\s*\* ?", "", line) for line in body.splitlines())
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return "\n".join(lines)


def first_paragraph(path: Path) -> str:
    """What ``path`` says it is: its docstring's (or leading comment's) first paragraph, on one
    line; empty when it says nothing."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(text)) or ""
    else:
        doc = _comment(text, path.suffix)
    para = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(para.split()).replace("|", "\\|")


def files(globs: tuple[str, ...]) -> list[Path]:
    """The section's source files; a package's ``__init__`` only where its docstring says more
    than nothing."""
    out = sorted({p for g in globs for p in ROOT.glob(g) if p.is_file()})
    return [p for p in out if p.name != "__init__.py" or first_paragraph(p)]


def render() -> str:
    """The tables, between the markers."""
    parts = [START]
    for heading, globs in SECTIONS:
        parts += ["", f"### `{heading}`", "", "| file | what it is |", "|---|---|"]
        for p in files(globs):
            parts.append(f"| `{p.relative_to(ROOT).as_posix()}` | {first_paragraph(p)} |")
    return "\n".join([*parts, "", END])


def region(doc: str) -> str:
    """The generated part of ``doc``, markers included."""
    return doc[doc.index(START) : doc.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.lab.file_table", description=__doc__)
    ap.add_argument("--write", action="store_true", help="rewrite docs/architecture.md's tables")
    args = ap.parse_args(argv)
    if not args.write:
        print(render())
        return 0
    doc = DOC.read_text(encoding="utf-8")
    DOC.write_text(doc.replace(region(doc), render()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
