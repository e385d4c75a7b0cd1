"""Lesson 11's claims, on the shipped trace (engine/workloads/traces/class.jsonl) and the example
policies (examples/policies/), replayed on the tiny model under the scorer's priced clock: the
clock counts what each step computes, so the ratios are those of SmolLM2's prompts up to their
tokenization (bytes here), and the same on any machine. They live here rather than in the
lesson's scenario.toml: a scenario's runs name canonical workloads and built-in policies, and
these need the trace and the loaded files. ``python -m engine.policy score`` gives the SmolLM2
numbers the lesson quotes.

Each claim can fail: it compares a policy with continuous on the same requests, and a policy that
changed nothing would give ratios of exactly 1 (continuous's own run is the control).
"""

from __future__ import annotations

import pytest

from engine.core.metrics import ratio
from engine.core.policy import registry
from engine.lab import score
from engine.lab.scenario import lesson_dir
from engine.workloads import trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EXAMPLES = lesson_dir(0).parents[1] / "examples" / "policies"


@pytest.fixture(scope="module")
def runs(tiny):
    for name in ("shortest_prompt_first", "fair_share", "latency_target"):
        registry.load_file(EXAMPLES / f"{name}.py")
    items = trace.load(trace.SHIPPED)
    out = {}
    for policy in ("continuous", "shortest-first", "fair-share", "latency-target"):
        steps, reqs = score.replay(*tiny, items, policy, "priced", model="tiny", dtype="float64")
        out[policy] = score.measure(steps, reqs, score.TTFT_TARGET_S, score.ITL_TARGET_S)
    return out


def _over(runs, policy, metric):
    return ratio(runs[policy][metric], runs["continuous"][metric])


def test_shortest_prompt_first_lowers_ttft_p50_and_fairness(runs):
    assert _over(runs, "shortest-first", "ttft_p50") <= 0.5
    assert _over(runs, "shortest-first", "fairness") <= 0.8
    assert runs["shortest-first"]["ttft_p99"] > runs["continuous"]["ttft_p99"]  # who starves


def test_fair_share_raises_the_flooded_class_goodput(runs):
    assert _over(runs, "fair-share", "goodput_rps_without_heaviest") >= 1.3
    assert runs["fair-share"]["fairness"] > runs["continuous"]["fairness"]


def test_latency_target_keeps_its_itl_target(runs):
    assert runs["latency-target"]["itl_p99"] <= 0.12 + 1e-9 < runs["continuous"]["itl_p99"]


def test_the_policies_move_when_tokens_come_not_the_throughput(runs):
    for policy, run in runs.items():
        assert run["throughput"] == pytest.approx(runs["continuous"]["throughput"], rel=0.02)
        assert run["policy_errors"] == 0 and run["preemptions"] == 0, policy


@pytest.mark.model  # SmolLM2
def test_lesson_11s_stored_scores_are_the_quick_replay_of_smollm2s_counts(capsys):
    """Every figure of ``score.json`` (the lesson's markers: SmolLM2 q4, the full replay) comes
    back from the quick score, which replays SmolLM2's token counts on a counting stand-in: the
    six policies' 100+ figures, equal, not near. A policy, a built-in or the scorer that changed
    what it decides would change them."""
    import json

    from engine.lab import score_cli

    stored = json.loads(score.STORED_FULL.read_text())
    files = [
        str(EXAMPLES / f"{n}.py") for n in ("shortest_prompt_first", "fair_share", "latency_target")
    ]
    result = score_cli.run_score(score_cli._args(["score", *files, "--model", "smollm2"]))
    assert result["weights"] == "counted" and stored["weights"] == "q4"
    assert result["runs"] == stored["runs"]
    assert result["full_check"]["equal"] and result["full_check"]["metrics"] >= 50
    assert "every one equal" in capsys.readouterr().out
