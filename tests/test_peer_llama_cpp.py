"""llama.cpp beside the roofline (engine/lab/peer_llama_cpp.py): its batched decode step read from
``llama-batched-bench``'s JSONL, placed against the same read roof as a stored Fluxo run, and
skipped (said so) where no build is present. The run itself needs a build
(scripts/build_llama_cpp.sh, ~10 minutes on 2 cores); CI has none: that test runs where one is."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from engine.lab import peer_llama_cpp
from engine.lab.roofline_model import Shape, step_bytes

LESSON_RUN = Path(__file__).resolve().parents[1] / "lessons" / "01-why-batches" / "roofline.json"
# The two lines llama-batched-bench printed to stdout on this machine (2026-11-30 21:01 UTC, 2
# threads, the bundled GGUF, -npp 128 -ntg 16 -npl 1,8; some of their fields left out), and the
# empty line that followed them.
JSONL = """
{"n_kv_max": 4096, "pp": 128, "tg": 16, "pl": 1, "n_kv": 144, "t_pp": 0.719112, "t_tg": 0.218677}
{"n_kv_max": 4096, "pp": 128, "tg": 16, "pl": 8, "n_kv": 1152, "t_pp": 5.127311, "t_tg": 1.080582}
"""


def _stored_result() -> dict:
    """The roofline run lesson 1 shows, as ``engine.bench roofline`` returned it."""
    doc = json.loads(LESSON_RUN.read_text())
    return copy.deepcopy(doc["scenarios"]["roofline"])


def test_batched_bench_lines_become_step_times():
    got = peer_llama_cpp.parse_batched(JSONL)
    assert set(got) == {1, 8}
    assert got[1]["step_ms"] == pytest.approx(1000 * 0.218677 / 16)
    assert got[8]["step_ms"] == pytest.approx(1000 * 1.080582 / 16)
    assert got[8]["ctx"] == 128 + 8  # the prompt, then half the decoded tokens on average


def test_without_a_build_the_roofline_says_it_skipped_llama_cpp(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLUXO_LLAMA_CPP", str(tmp_path))  # an install folder with nothing in it
    result = _stored_result()
    before = dict(result["ratios"])
    peer_llama_cpp.roofline_peer(result)
    assert "no llama-batched-bench" in result["llama_cpp"]["skipped"]
    assert "llama.cpp skipped" in capsys.readouterr().out
    assert result["ratios"] == before


def test_without_q4_there_is_nothing_to_compare():
    result = _stored_result()
    del result["formats"]["q4"]
    peer_llama_cpp.roofline_peer(result)
    assert result["llama_cpp"]["skipped"].startswith("no q4 in this run")


@pytest.mark.skipif(
    (lc := peer_llama_cpp.find()) is None or lc.batched is None,
    reason="no llama.cpp build with llama-batched-bench (scripts/build_llama_cpp.sh)",
)
def test_llama_cpp_steps_against_the_same_roof():
    result = _stored_result()
    peer_llama_cpp.roofline_peer(result)
    peer = result["llama_cpp"]
    assert peer["kv"] == "f16" and {p["rows"] for p in peer["points"]} == {1, 8}
    shape = Shape(**{**result["formats"]["q4"]["shape"], "kv_itemsize": 2})
    bw = result["machine"]["bandwidth"]["read_gbs"]
    for p in peer["points"]:
        assert p["step_ms"] > 0
        assert p["bytes_per_step"] == step_bytes(shape, p["rows"], round(p["ctx"]))
        read_ms = p["bytes_per_step"] / (bw * 1e6)
        assert p["fraction_of_bandwidth"] == pytest.approx(read_ms / p["step_ms"])
    ours = {p["rows"]: p["step_ms"] for p in result["formats"]["q4"]["points"]}
    eight = next(p for p in peer["points"] if p["rows"] == 8)
    assert result["ratios"]["q4_step_speedup_over_llama_cpp_8_rows"] == pytest.approx(
        eight["step_ms"] / ours[8]
    )
