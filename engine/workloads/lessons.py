"""Where the lessons are and how one is read, for the lab (``engine/lab/scenario.py``) and the page
(``app/views/lessons.py``) alike: torch-free, so the page imports it without loading the engine."""

from __future__ import annotations

import json
import os
import re
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


def preflight_file() -> Path:
    """Where ``python -m engine.lesson all --live --check --preflight`` keeps its last run on this
    machine (the Fluxo cache), for the Lessons page to show beside each lesson."""
    cache = Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo"))
    return cache / "preflight.json"


def last_preflight() -> dict[str, Any] | None:
    """The last preflight of this machine (``{"when", "lessons": {number: ...}}``), or None."""
    try:
        return json.loads(preflight_file().read_text())
    except (OSError, ValueError):
        return None


def compares(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """A lesson's ``[compare]`` as a list: one table, or an array of tables (run in order)."""
    cmp_ = scenario.get("compare", [])
    return [cmp_] if isinstance(cmp_, dict) else list(cmp_)


# A lesson text's comments: its numbers' markers (``<!-- n EXPR -->VALUE<!-- /n -->``, rendered by
# ``engine/lab/prose.py``) and its section marks (``<!-- roofline -->``, ``<!-- live -->``).
COMMENT = re.compile(r"<!--.*?-->", re.S)


def as_shown(text: str) -> str:
    """A lesson text as the page shows it: every comment dropped, so a number's marker leaves its
    value (Streamlit's markdown would print a comment as text)."""
    return COMMENT.sub("", text)
