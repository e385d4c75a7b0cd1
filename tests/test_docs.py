"""The README is a guide, and the docs' links go somewhere (issue 39, item 8): the README stays
within 200 lines (the two commands, the picture, the pages, the classroom, links; the recipes live
in docs/recipes.md), and every relative link of the README and docs/*.md names a file that exists
and, where it names a section, a heading of that file."""

from __future__ import annotations

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
