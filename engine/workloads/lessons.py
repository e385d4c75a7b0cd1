"""Where the lessons are and how one is read, for the lab (``engine/lab/scenario.py``) and the page
(``app/views/lessons.py``) alike: torch-free, so the page imports it without loading the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"


def lesson_dirs() -> list[Path]:
    """The lesson folders, in order: ``NN-slug`` with a ``scenario.toml`` (none where the lessons
    are not installed, as in a wheel)."""
    if not LESSONS_DIR.is_dir():
        return []
    return sorted(
        p
        for p in LESSONS_DIR.iterdir()
        if p.is_dir() and p.name[:2].isdigit() and (p / "scenario.toml").exists()
    )


def compares(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """A lesson's ``[compare]`` as a list: one table, or an array of tables (run in order)."""
    cmp_ = scenario.get("compare", [])
    return [cmp_] if isinstance(cmp_, dict) else list(cmp_)
