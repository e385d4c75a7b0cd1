"""The README is a guide, and the docs' links go somewhere (issue 39, item 8): the README stays
within 200 lines (the two commands, the picture, the pages, the classroom, links; the recipes live
in docs/recipes.md), and every relative link of the README and docs/*.md names a file that exists
and, where it names a section, a heading of that file."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_LINES = 200


def anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    out = set()
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def broken(md: Path) -> list[str]:
    bad = []
    for url in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"(https?:|mailto:)", url):
            continue
        path, _, section = url.partition("#")
        target = (md.parent / path).resolve() if path else md
        if not target.exists():
            bad.append(f"{md.name}: {url} (no such file)")
        elif section and target.suffix == ".md" and section not in anchors(target):
            bad.append(f"{md.name}: {url} (no such section)")
    return bad


def test_the_readme_is_a_guide_of_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; move recipes to docs/recipes.md"


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = [b for f in files for b in broken(f)]
    assert not bad, "\n".join(bad)


def test_the_link_check_sees_a_missing_file_and_a_missing_section(tmp_path) -> None:
    (tmp_path / "a.md").write_text("# A title\n\n[x](b.md) [y](a.md#nothing) [z](#a-title)\n")
    assert broken(tmp_path / "a.md") == [
        "a.md: b.md (no such file)",
        "a.md: a.md#nothing (no such section)",
    ]


def _table_paths() -> list[str]:
    """Every path the "Files by package" tables of docs/architecture.md name in their first column
    (``{a,b}`` alternatives expanded)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("## Files by package") : text.index("## Data path")]
    cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]

    def expand(p: str) -> list[str]:
        m = re.search(r"\{([^}]+)\}", p)
        if not m:
            return [p]
        return [
            x for alt in m.group(1).split(",") for x in expand(p[: m.start()] + alt + p[m.end() :])
        ]

    return [x for c in cells for t in re.findall(r"`([^`]+)`", c) for x in expand(t)]


def test_the_architecture_table_names_every_file_and_only_files_that_exist() -> None:
    """Every source file of the packages has its row (its own, or its folder's), and every row
    names files that exist: the table cannot drift from the tree silently."""
    named = [n for n in _table_paths() if "/" in n]
    tree = [
        p.relative_to(ROOT).as_posix()
        for top in ("kernels", "engine", "app", "observer", "tests", "lessons", "examples")
        for p in sorted((ROOT / top).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and "vendor" not in p.parts
    ]

    def match(path: str, name: str) -> bool:
        return path.startswith(name) if name.endswith("/") else fnmatch.fnmatch(path, name)

    sources = [
        f
        for f in tree
        if f.split("/")[0] in ("kernels", "engine", "app", "observer")
        and f.endswith((".py", ".cpp", ".js", ".css", ".html"))
        and not f.endswith("__init__.py")
    ]
    unnamed = [f for f in sources if not any(match(f, n) for n in named)]
    assert not unnamed, f"files without a row in docs/architecture.md: {unnamed}"
    lessons = re.compile(r"lessons/<[^/]+>-<[^/]+>/")
    ghosts = [n for n in named if not lessons.fullmatch(n) and not any(match(f, n) for f in tree)]
    assert not ghosts, f"rows naming no file: {ghosts}"


def test_the_file_tables_are_the_files_own_first_paragraphs() -> None:
    """docs/architecture.md's per-file rows are what ``python -m engine.lab.file_table`` writes
    from each file's docstring or leading comment (issue 39, item 8): a row cannot drift from its
    file, and a file that says nothing of itself fails here."""
    from engine.lab import file_table

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert file_table.region(doc) == file_table.render(), (
        "docs/architecture.md's file tables differ from the files: "
        "run `python -m engine.lab.file_table --write`"
    )
    silent = [
        p.relative_to(ROOT).as_posix()
        for _, globs in file_table.SECTIONS
        for p in file_table.files(globs)
        if p.name != "__init__.py" and len(file_table.first_paragraph(p)) < 20
    ]
    assert not silent, f"files whose first paragraph does not say what they are: {silent}"


def test_the_file_table_reads_each_kind_of_file(tmp_path) -> None:
    from engine.lab.file_table import first_paragraph

    files = {
        "a.py": '"""A module.\n\nMore."""\n',
        "b.js": "/* A script,\n * on two lines.\n *\n * More. */\n",
        "c.cpp": "// A kernel | a bar.\n// Its second line.\n\nint x;\n",
        "d.html": "<!doctype html>\n<!-- A page. -->\n<!-- Not this. -->\n",
        "e.py": "x = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    said = {name: first_paragraph(tmp_path / name) for name in files}
    assert said == {
        "a.py": "A module.",
        "b.js": "A script, on two lines.",
        "c.cpp": "A kernel \\| a bar. Its second line.",
        "d.html": "A page.",
        "e.py": "",
    }
