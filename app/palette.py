"""Colour-vision checks for the lab's phase colours (dead / prefill / decode / idle).

A projector washes colours out and about one man in twelve sees red and green poorly, so the
four phases must stay apart for every viewer. :func:`simulate` applies the Machado, Oliveira and
Fernandes (2009) matrices at full severity (protanopia, deuteranopia, tritanopia) in linear RGB;
:func:`min_distance` is the smallest CIELAB distance (CIE76 Delta E) between any two colours of a
palette as that viewer sees them. ``tests/app/test_palette.py`` holds the phases to a minimum.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations

# Machado et al. 2009, severity 1.0 (linear RGB).
MATRICES = {
    "normal": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
}


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _gamma(c: float) -> float:
    c = min(1.0, max(0.0, c))
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def rgb(hex_: str) -> tuple[float, float, float]:
    h = hex_.lstrip("#")
    return tuple(int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def simulate(hex_: str, vision: str) -> tuple[float, float, float]:
    """The sRGB colour (0..1) a viewer with ``vision`` sees for ``hex_``."""
    lin = [_linear(c) for c in rgb(hex_)]
    m = MATRICES[vision]
    return tuple(_gamma(sum(m[i][j] * lin[j] for j in range(3))) for i in range(3))  # type: ignore[return-value]


def lab(srgb: Iterable[float]) -> tuple[float, float, float]:
    """sRGB (0..1) -> CIELAB (D65)."""
    r, g, b = (_linear(c) for c in srgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def distance(a: str, b: str, vision: str = "normal") -> float:
    """CIE76 Delta E between two colours as ``vision`` sees them (about 2.3: just noticeable)."""
    la, lb = lab(simulate(a, vision)), lab(simulate(b, vision))
    return sum((p - q) ** 2 for p, q in zip(la, lb, strict=True)) ** 0.5


def min_distance(colors: dict[str, str], vision: str) -> tuple[float, tuple[str, str]]:
    """The closest pair of ``colors`` under ``vision``: (Delta E, (name, name))."""
    return min((distance(colors[p], colors[q], vision), (p, q)) for p, q in combinations(colors, 2))
