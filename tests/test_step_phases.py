"""The decode step's phase clocks and the tiles' roof (engine/lab/step_phases.py,
kernels/cpu_quant_decode.cpp's Laps, cpu_quant_tile.cpp's fluxo_tile_macs_per_s)."""

from __future__ import annotations

import time

import pytest
import torch

from engine.lab import step_phases
from engine.lab.roofline import decode_batch, shape_of
from engine.lab.roofline_model import step_bytes
from kernels import cpu_quant

pytestmark = pytest.mark.skipif(
    not cpu_quant.available(), reason=f"{cpu_quant.unavailable_reason()}"
)


def _tiny(weights: str = "q4"):
    from engine.core.llama import LlamaForward
    from engine.core.model import tiny_llama

    model, _ = tiny_llama(seed=1, dtype=torch.float32)
    fw = LlamaForward(model, 64, weights)
    assert fw.fused is not None
    return fw


def _filled_cache(fw, blocks: int, block_size: int):
    cache = fw.new_cache(blocks + 1, block_size)
    gen = torch.Generator().manual_seed(3)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    return cache


@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_timing_the_phases_changes_no_number_and_adds_up(weights):
    """The timed step writes the same logits and K/V bit for bit; every phase is measured, the
    clocks add up across calls, and a thread's phases never exceed the calls' wall time."""
    fw = _tiny(weights)
    fb, blocks = decode_batch(3, 9, 4)
    caches = [_filled_cache(fw, blocks, 4) for _ in range(2)]
    plain = fw.forward(fb, caches[0])
    threads = torch.get_num_threads()
    fw.fused.phases = torch.zeros(threads, len(cpu_quant.PHASES), dtype=torch.float64)
    t = time.perf_counter()
    timed = fw.forward(fb, caches[1])
    wall = time.perf_counter() - t
    once = fw.fused.phases.clone()
    fw.forward(fb, caches[1])
    twice = fw.fused.phases
    fw.fused.phases = None
    assert (twice >= once).all() and twice.sum() > once.sum()
    assert torch.equal(plain, timed)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    assert (once >= 0).all() and (once.sum(1) <= wall).all()
    for name in ("products", "head", "attention", "norms"):  # every thread runs every phase
        assert (once[:, cpu_quant.PHASES.index(name)] > 0).all(), name


def test_phases_of_the_wrong_shape_or_type_are_refused():
    fw = _tiny()
    fb, blocks = decode_batch(2, 5, 4)
    cache = _filled_cache(fw, blocks, 4)
    threads = torch.get_num_threads()
    for bad in (
        torch.zeros(threads, len(cpu_quant.PHASES), dtype=torch.float32),
        torch.zeros(threads + 1, len(cpu_quant.PHASES), dtype=torch.float64),
    ):
        fw.fused.phases = bad
        with pytest.raises(ValueError, match="phases must be float64"):
            fw.forward(fb, cache)
    fw.fused.phases = None


def test_measure_reports_each_phase_a_step_and_restores_the_untimed_step():
    fw = _tiny()
    point = step_phases.measure(fw, rows=2, ctx=6, steps=3, block_size=4)
    assert point["rows"] == 2 and point["steps"] == 3 and fw.fused.phases is None
    assert set(point["phases_ms"]) == set(cpu_quant.PHASES)
    assert sum(point["phases_ms"].values()) <= point["mean_step_ms"]


def test_against_roofs_floor_and_ceiling():
    """With free arithmetic the floor is the bytes at the read roof (ceiling 1); with slow
    arithmetic it is the multiply-adds at the tile roofs plus K/V at the read roof."""
    fw = _tiny()
    point = {"rows": 4, "mean_step_ms": 10.0}
    point["phases_ms"] = {"products": 2.0, "head": 1.0, "attention": 1.0, "norms": 0.5, "waits": 0}
    free = step_phases.against_roofs(
        dict(point), fw, "q4", 8, {"read_gbs": 10.0, "tiles": {"q4_1": 1e9, "q8_0": 1e9}}
    )
    nbytes = step_bytes(shape_of(fw, "q4"), 4, 8)
    assert free["read_ms"] == pytest.approx(nbytes / 1e7)
    assert free["floor_ms"] == pytest.approx(free["read_ms"])
    assert free["fraction_ceiling"] == pytest.approx(1.0)
    assert free["fraction_of_bandwidth"] == pytest.approx(free["read_ms"] / 10.0)
    assert free["outside_kernel_ms"] == pytest.approx(5.5)
    layer_macs, head_macs = step_phases._macs(fw)
    slow = step_phases.against_roofs(
        dict(point), fw, "q4", 8, {"read_gbs": 1e9, "tiles": {"q4_1": 1e-3, "q8_0": 2e-3}}
    )
    kv = nbytes - shape_of(fw, "q4").weight_bytes
    want = (8 * layer_macs / 1e-3 + 8 * head_macs / 2e-3 + kv / 1e9) / 1e6
    assert slow["floor_ms"] == pytest.approx(want)
    assert slow["products_gops"] == pytest.approx(8 * layer_macs / 2e6)
    assert slow["products_fraction_of_tile_roof"] == pytest.approx(slow["products_gops"] / 1e-3)


def test_the_table_says_when_phases_were_skipped_and_prints_every_phase():
    assert "skipped" in step_phases.table({"phases": {"skipped": "no kernels"}})
    fw = _tiny()
    roofs = {"read_gbs": 10.0, "tiles": {"q4_1": 100.0, "q8_0": 80.0}}
    roofs["tiles"] |= {"int8": 150.0, "q4_1_over_int8": 0.67, "q8_0_over_int8": 0.53}
    point = step_phases.against_roofs(
        step_phases.measure(fw, rows=2, ctx=6, steps=2, block_size=4), fw, "q4", 6, roofs
    )
    scaling = {
        "threads": 2,
        "one_thread_gops": 90.0,
        "all_threads_gops": 150.0,
        "all_over_one": 1.67,
    }
    text = step_phases.table({"phases": {"int8_threads": scaling, "roofs": roofs, "q4": [point]}})
    assert all(name in text for name in cpu_quant.PHASES)
    assert "q4_1 100" in text and "ceiling" in text


def _lesson_run() -> dict:
    import copy
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "lessons" / "01-why-batches" / "roofline.json"
    return copy.deepcopy(json.loads(path.read_text())["scenarios"]["roofline"])


def test_roofline_phases_on_smollm2_beside_a_stored_roofline_run(smollm2):
    """Lesson 1's roofline run gains each quantized format's phases at 1 and 8 rows, against its
    own read roof and tile roofs measured now, and the ratios the README quotes."""
    result = _lesson_run()
    step_phases.roofline_phases(smollm2[0], result, rows=(1, 8), steps=3, prompts=(16, 40))
    ph = result["phases"]
    assert set(ph) == {"int8_threads", "roofs", "q4", "q8", "q4_prefill", "q8_prefill"}
    for w in ("q4", "q8"):  # a prompt chunk per token: its phases add up below its step
        assert [p["rows"] for p in ph[f"{w}_prefill"]] == [16, 40]
        for p in ph[f"{w}_prefill"]:
            assert sum(p["phases_ms_per_token"].values()) <= p["ms_per_token"] * (1 + 1e-9)
            assert 0 < p["fraction_of_floor"] <= 1.0 and 0 < p["products_fraction_of_int8_roof"]
            assert f"{w}_prefill_{p['rows']}_fraction_of_int8_roof" in result["ratios"]
    for w in ("q4", "q8"):
        assert [p["rows"] for p in ph[w]] == [1, 8]
        for p in ph[w]:
            assert p["floor_ms"] > 0 and 0 < p["fraction_ceiling"] <= 1.0 + 1e-9
            assert p["read_ms"] == pytest.approx(p["fraction_of_bandwidth"] * p["mean_step_ms"])
        for key in ("products_fraction_of_tile_roof", "fraction_ceiling"):
            assert f"{w}_{key}_8_rows" in result["ratios"]
    assert result["ratios"]["int8_roof_all_threads_over_one"] > 0
    assert "ceiling" in step_phases.table(result) and "ms/token" in step_phases.table(result)


def test_roofline_phases_skip_without_an_int8_roof():
    result = {"machine": {"bandwidth": {"read_gbs": 10.0}, "int8": None}, "ctx": 8, "ratios": {}}
    step_phases.roofline_phases(None, result)
    assert result["phases"] == {"skipped": "no quantized CPU kernels here"}


@pytest.mark.parametrize("lang", ["en", "pt-BR"])
def test_lesson_1_cites_its_phases_run(lang):
    """Every number of lesson 1's "where a step's time goes" section is its stored ``bench phases``
    run's, as that language writes it, and its table adds up to the step."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "lessons" / "01-why-batches"
    doc = json.loads((folder / "phases.json").read_text())
    at = {p["rows"]: p for p in doc["scenarios"]["phases"]["phases"]["q4"]}
    cited: list[str] = []
    for r in (1, 8):
        p = at[r]
        cited += [f"{v:.2f}" for v in p["phases_ms"].values()]
        cited += [f"{p['outside_kernel_ms']:.2f}", f"{p['mean_step_ms']:.2f}"]
        cited.append(f"{p['products_fraction_of_tile_roof']:.2f}")
        assert sum(p["phases_ms"].values()) + p["outside_kernel_ms"] == pytest.approx(
            p["mean_step_ms"]
        )
    for phase in ("products", "attention"):
        cited.append(f"{at[8]['phases_ms'][phase] / at[1]['phases_ms'][phase]:.2f}x")
    from engine.lab.prose import NUMBER

    def plain(text: str) -> str:  # as the page shows it: the markers' values, not the markers
        return NUMBER.sub(lambda m: m["value"], text)

    text = plain((folder / f"{lang}.md").read_text())
    section = text.split("<!-- roofline -->", 1)[1].split("\n## ", 2)[1]
    for number in cited:
        written = number.replace(".", ",") if lang == "pt-BR" else number
        assert written in section, (lang, written)
    assert doc["machine"]["date"] in section and "lessons/01-why-batches/phases.json" in section
    # the answer key quotes the same run
    teacher = plain((folder / f"teacher.{lang}.md").read_text())
    shares = [f"{at[r]['products_fraction_of_tile_roof']:.2f}" for r in (1, 8)]
    for number in [*shares, cited[-1]]:  # the products' shares and attention's growth
        assert (number.replace(".", ",") if lang == "pt-BR" else number) in teacher, number
