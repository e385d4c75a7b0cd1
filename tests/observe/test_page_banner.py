"""The page's line for a watched engine (app/observed.py), on the state the sidecar really sends
(engine/observe/server.py, fed the captured 2-rank records), and none on Fluxo's own state."""

from __future__ import annotations

from pathlib import Path

from app.observed import banner, short_version
from engine.observe.launch import free_port
from engine.observe.server import ObservedServer
from engine.observe.source import ObservedEngine

DP2 = Path(__file__).parent / "fixtures" / "vllm_0.32_dp2.jsonl"


def sidecar_state() -> dict:
    engine = ObservedEngine(f"tcp://127.0.0.1:{free_port()}", 8192, dp=2, max_num_seqs=8)
    for line in DP2.read_text().splitlines():
        engine.take(line.encode())
    server = ObservedServer(engine, "http://127.0.0.1:8010", "0.32.0", port=0)
    return server.state()


def test_the_banner_names_vllm_read_only_its_tier_and_ranks():
    state = sidecar_state()
    line = banner(state, "en")
    assert line.startswith("**vLLM 0.32, observed, read-only**")
    assert "data tier: scheduler" in line and "2 data-parallel ranks" in line
    assert "`http://127.0.0.1:8010/v1`" in line and "missed" not in line
    assert banner(state, "pt-BR").startswith("**vLLM 0.32, observado, somente leitura**")
    assert state["config"]["max_slots"] == 16 and state["config"]["kv_blocks"] == 2 * 727


def test_fluxos_own_engine_has_no_banner_and_a_gap_is_said():
    assert banner({"config": {}, "running": 0}) is None
    state = sidecar_state()
    state["observed"]["missed"] = 3
    assert "3 records missed" in banner(state)
    assert short_version("0.32.0") == "0.32" and short_version("1") == "1"
