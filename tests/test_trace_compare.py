"""The server's compare on a request trace (engine/lab/trace_compare.py, tiny model): a loaded
policy beside a built-in on the shipped class trace, scored as ``engine.policy score`` scores;
the live engine's own requests as a trace; a lesson's workload still goes to scenario.compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.errors import FluxoError
from engine.core.policy import load_file
from engine.lab import trace_compare

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_loaded_policy_is_scored_beside_a_builtin_on_the_class_trace(tiny):
    (name,) = load_file(ROOT / "examples" / "policies" / "shortest_prompt_first.py")
    lm, tok = tiny
    r = trace_compare.compare(lm, tok, "trace:class", {"policy": name}, {}, 0.1, "fp32")
    assert r["trace"]["requests"] == 11 and r["trace"]["clock"] == "priced"
    assert r["a"]["config"]["policy"] == name and r["b"]["config"]["policy"] == "continuous"
    for side in ("a", "b"):
        assert r[side]["score"]["policy_errors"] == 0 and r[side]["steps"]
    assert r["score_ratios"]["fairness_b_over_a"] > 0 and "throughput_b_over_a" in r["ratios"]


def test_the_live_engines_requests_are_a_trace(make_tiny_engine, tiny):
    e = make_tiny_engine()
    for i in range(3):
        e.submit(token_ids=[i + 1] * 6, max_new_tokens=3, client=f"s{i}")
    e.run_until_idle()
    lm, tok = tiny
    r = trace_compare.compare(lm, tok, "trace:live", {}, {"policy": "chunked"}, 1.0, engine=e)
    assert r["trace"]["requests"] == 3 and r["trace"]["clients"] == 3
    with pytest.raises(FluxoError, match="scale"):
        trace_compare.compare(lm, tok, "trace:class", {}, {}, 0.0)
    assert set(trace_compare.TRACES) < set(trace_compare.WORKLOADS)
