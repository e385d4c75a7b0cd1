"""Small number helpers every layer shares: ceiling division and the JSON-value type checks.

JSON ``true`` is a Python ``bool``, which is also an ``int``: every field that wants an integer
(or a number) must refuse it explicitly, so the check lives here once.
"""

from __future__ import annotations

import math
from typing import TypeGuard


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, exact for any size (no float rounding)."""
    return -(-a // b)


def is_int(v: object) -> TypeGuard[int]:
    """An integer that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: object) -> TypeGuard[int | float]:
    """An int or a float that is not a bool (NaN and infinities included)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: object) -> TypeGuard[int | float]:
    """A number (see :func:`is_number`) that is neither NaN nor infinite."""
    return is_number(v) and math.isfinite(v)
