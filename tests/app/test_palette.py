"""The phase colours stay apart for colour-blind viewers (app/palette.py: Machado et al. 2009
simulation, CIELAB distance), and every chart uses them."""

from __future__ import annotations

import json

import pytest

from app import charts, palette

# Delta E 76 between the closest two phases, as each viewer sees them. The old palette (dead red
# #E03131, prefill orange #F08C00) had its closest pair 28.6 apart under deuteranopia.
MIN_DELTA_E = 35.0
OLD = {"prefill": "#F08C00", "decode": "#1C7ED6", "dead": "#E03131", "idle": "#DEE2E6"}


@pytest.mark.parametrize("vision", ["normal", "deuteranopia", "protanopia", "tritanopia"])
def test_phases_stay_apart(vision):
    d, pair = palette.min_distance(charts.PHASE_COLORS, vision)
    assert d >= MIN_DELTA_E, (vision, pair, d)


def test_dead_and_prefill_no_longer_collide():
    for vision in ("deuteranopia", "protanopia"):
        new = palette.distance(charts.PHASE_COLORS["dead"], charts.PHASE_COLORS["prefill"], vision)
        old = palette.distance(OLD["dead"], OLD["prefill"], vision)
        assert new > old + 10, (vision, new, old)


def test_simulation_is_the_published_one():
    """Sanity of the simulation: greys are unchanged, and red and green collapse for a
    deuteranope."""
    for grey in ("#000000", "#777777", "#ffffff"):
        assert palette.distance(grey, grey, "deuteranopia") == 0
        assert palette.distance(grey, grey, "normal") == pytest.approx(0)
        r, g, b = palette.simulate(grey, "protanopia")
        assert abs(r - g) < 0.02 and abs(g - b) < 0.02
    assert palette.distance("#ff0000", "#00ff00", "normal") > 150
    assert palette.distance("#cc3333", "#669933", "deuteranopia") < 0.3 * palette.distance(
        "#cc3333", "#669933"
    )


def test_every_chart_uses_the_phase_colours():
    text = json.dumps(charts.named_charts())
    for colour in charts.PHASE_COLORS.values():
        assert colour in text
    for colour in OLD.values():
        assert colour not in text or colour in charts.KV_COLORS.values()
