"""Plain-text tables of runs, the one printer the benchmark and lesson commands share: a row per
run, a column per metric (``-`` where a run lacks it), then the ratios."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Column = tuple[str, str, int]  # (key, label, digits)


def runs_table(
    title: str,
    runs: Mapping[str, Mapping[str, Any]],
    columns: Iterable[Column],
    name_width: int = 16,
) -> list[str]:
    """``== title ==``, a header, and one line per run (``runs``: name -> metric values)."""
    columns = list(columns)
    lines = [f"== {title} ==", f"{'run':<{name_width}}" + "".join(f"{c[1]:>11}" for c in columns)]
    for name, values in runs.items():
        cells = []
        for key, _, digits in columns:
            v = values.get(key)
            cells.append(f"{'-':>11}" if v is None else f"{v:>11.{digits}f}")
        lines.append(f"{name:<{name_width}}" + "".join(cells))
    return lines


def ratio_lines(ratios: Mapping[str, Any]) -> list[str]:
    """One line per ratio, numbers to three decimals (anything else as text)."""
    return [
        f"  {k:<40} {v:8.3f}" if isinstance(v, float | int) else f"  {k:<40} {v!s:>8}"
        for k, v in ratios.items()
    ]
