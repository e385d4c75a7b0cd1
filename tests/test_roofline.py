"""The roofline (engine/lab/roofline_model.py, engine/lab/roofline.py): the model's arithmetic, the
int8 roof against the engine's own int8 product, and the figure lesson 1 shows from its stored run
(app/roofline_chart.py)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from engine.lab import roofline, roofline_model
from kernels import cpu_quant

SHAPE = roofline_model.Shape(
    weight_params=1000, weight_bytes=4000, layers=2, kv_heads=1, heads=2, head_dim=4, kv_itemsize=4
)
LESSON_RUN = Path(__file__).resolve().parents[1] / "lessons" / "01-why-batches" / "roofline.json"


def test_step_bytes_read_weights_once_and_kv_per_row():
    assert roofline_model.step_bytes(SHAPE, 1, 10) == 4000 + 1 * 10 * 2 * 2 * 1 * 4 * 4
    assert (
        roofline_model.step_bytes(SHAPE, 8, 10) - roofline_model.step_bytes(SHAPE, 4, 10)
        == 4 * 10 * 2 * 2 * 4 * 4
    )


def test_step_flops_and_the_compute_bound_row_count():
    assert roofline_model.step_flops(SHAPE, 2, 10) == 2 * 2 * 1000 + 4 * 2 * 10 * 2 * 2 * 4
    # intensity at r rows ~ 2 r 1000 / 4000 = r / 2 flop/byte (plus attention); balance 3 -> 8 rows
    assert roofline_model.compute_bound_rows(SHAPE, 0, bandwidth_gbs=10.0, gflops=30.0) == 8
    assert roofline_model.compute_bound_rows(SHAPE, 0, bandwidth_gbs=10.0, gflops=1e6) is None


def test_the_weights_run_at_their_own_roof_and_attention_at_fp32():
    # 2 rows, 10 tokens: 4000 weight operations, 4 x 2 x 10 x 2 layers x 2 heads x 4 = 1280 of
    # attention
    ms = roofline_model.compute_ms(SHAPE, 2, 10, gflops=4.0, attention_gflops=1.0)
    assert ms == pytest.approx(4000 / 4e6 + 1280 / 1e6)
    assert roofline_model.compute_ms(SHAPE, 2, 10, gflops=2.0) == pytest.approx(5280 / 2e6)
    # a twice faster roof for the weights moves the compute-bound row count from 8 to 16
    one = roofline_model.compute_bound_rows(SHAPE, 0, 10.0, 30.0, attention_gflops=30.0)
    two = roofline_model.compute_bound_rows(SHAPE, 0, 10.0, 60.0, attention_gflops=30.0)
    assert (one, two) == (8, 16)


def test_knee_rows_is_the_first_step_costing_half_again_the_single_row_one():
    assert roofline_model.knee_rows([1, 2, 4, 8], [10.0, 10.5, 14.0, 16.0]) == 8
    assert roofline_model.knee_rows([1, 2], [10.0, 11.0]) is None


def test_a_point_says_how_much_of_the_read_roof_its_arithmetic_leaves():
    # 1 row: 4000 + 640 bytes at 1 GB/s = 4.64 us; arithmetic 2000 + 640 ops at 1 G/s = 2.64 us
    d = roofline._format_result(SHAPE, {1: [8e-6], 4: [20e-6]}, 10, (1, 4), 1.0, 1.0, 1.0)
    one, four = d["points"]
    assert one["read_ms"] == pytest.approx(0.00464) and one["compute_ms"] == pytest.approx(0.00264)
    assert one["attainable_fraction"] == 1.0 and one["roofline_ms"] == one["read_ms"]
    # 4 rows: read 6560 bytes, arithmetic 10560 ops: at most 6.56 / 10.56 of the read roof
    assert four["attainable_fraction"] == pytest.approx(6560 / 10560)
    assert four["fraction_of_bandwidth"] == pytest.approx(6560 / 20e-6 / 1e9)
    assert d["compute_bound_rows_model"] == 4 and d["compute_roof_gops"] == 1.0


@pytest.mark.skipif(not cpu_quant.available(), reason="no quantized CPU kernels here")
def test_the_roofs_bound_the_engines_own_int8_product():
    """A roof must be above what the kernels built on its instructions reach. The tile roof (the
    Q4_1 tiles' inner kernel on a tile in L1) does the int8 roof's maddubs + add and more
    (unpacking, scaling), so it is below the int8 roof; a whole product at 8 rows on a
    cache-resident matrix pays memory and a call on top, so it is below the tile roof. One thread
    each, best of each, all three taken in turn in short samples (~0.1 ms): on a loaded core a
    long sample always holds a preemption, a short one often does not, so samples of one length
    compare fairly (7 ms tile samples read 81 G at load ~4 while 25 us products read 106 G)."""
    from engine.core.quant import quantize

    w = torch.randn(576, 576) * 0.05
    b = quantize(w, "q4_1")
    t, x = cpu_quant.tiles(b, "q4_1", 576), torch.randn(8, 576)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    roof, tile, best = 0.0, 0.0, math.inf
    try:
        for _ in range(100):
            roof = max(roof, cpu_quant.int8_macs_per_s(threads=1, iters=50_000))
            tile = max(tile, cpu_quant.tile_macs_per_s("q4_1", threads=1, iters=500))
            t0 = time.perf_counter()
            cpu_quant.qmatmul(x, b, "q4_1", tiles=t)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(roof) and 1e9 < roof < 1e12  # 1 G to 1 T multiply-adds a second a core
    assert 0 < tile < roof
    assert 576 * 576 * 8 / best < tile


def test_roofline_chart_spec_is_valid_vega_lite_with_every_measured_point():
    from app.charts import as_altair
    from app.roofline_chart import roofline_rows, roofline_spec

    points = [
        {
            "rows": r,
            "step_ms": 10.0 + r,
            "step_ms_min": 9.0 + r,
            "step_ms_max": 12.0 + r,
            "bytes_per_step": 96_000_000,
            "achieved_gbs": 9.6,
            "fraction_of_bandwidth": 0.5,
            "roofline_ms": 5.0,
        }
        for r in (1, 8)
    ]
    result = {
        "machine": {"bandwidth": {"read_gbs": 19.2}},
        "formats": {"fp32": {"points": points}, "q4": {"points": points}},
    }
    rows = roofline_rows(result)
    assert len(rows) == 2 * 2 * 2  # formats x row counts x (measured, bound)
    assert {r["ms"] for r in rows if r["series"] == "measured"} == {11.0, 18.0}
    spec = roofline_spec(result)
    as_altair(spec)  # raises if the spec does not validate against the Vega-Lite schema
    assert spec["hconcat"][1]["title"].endswith("(19.2 GB/s)")


def test_lesson_1s_figure_is_its_stored_run():
    """lessons/01-why-batches/roofline.json is a whole ``bench roofline --json`` run: every format
    at 1 to 64 rows, the int8 roof measured, and the figure draws every point of it."""
    from app.charts import as_altair
    from app.roofline_chart import lesson_figure

    doc = json.loads(LESSON_RUN.read_text())
    result = doc["scenarios"]["roofline"]
    assert set(result["formats"]) == {"fp32", "q8", "q4"} and result["machine"]["int8"]["gops"] > 0
    for d in result["formats"].values():
        assert [p["rows"] for p in d["points"]] == list(roofline_model.ROWS)
    spec, caption = lesson_figure(LESSON_RUN, "en")
    as_altair(spec)
    assert len(spec["data"]["values"]) == 3 * len(roofline_model.ROWS) * 2
    assert doc["machine"]["date"] in caption and "GB/s" in caption


@pytest.mark.parametrize("lang", ["en", "pt-BR"])
def test_lesson_1_cites_its_roofline_run(lang):
    """Every number of lesson 1's roofline section is its stored run's, as that language writes
    it; the figure sits where the text says."""
    result = json.loads(LESSON_RUN.read_text())["scenarios"]["roofline"]
    at = {f: {p["rows"]: p for p in d["points"]} for f, d in result["formats"].items()}
    m = result["machine"]
    cited = [
        f"{m['bandwidth']['read_gbs']:.1f} GB/s",
        f"{m['matmul']['gflops']:.0f}",
        f"{m['int8']['gops']:.0f} G",
        f"{at['q4'][1]['fraction_of_bandwidth']:.2f}",
        f"{at['fp32'][8]['step_ms'] / at['fp32'][1]['step_ms']:.2f}x",
        f"{at['q4'][8]['step_ms'] / at['q4'][1]['step_ms']:.2f}x",
    ]
    for f in ("fp32", "q4"):
        for r in (1, 8):
            cited += [f"{at[f][r]['step_ms']:.1f} ms", f"{at[f][r]['bytes_per_step'] / 1e6:.1f} MB"]
    for f in ("fp32", "q4"):  # "the arithmetic sets the bound from N rows on"
        rows = "linhas" if lang == "pt-BR" else "rows"
        cited.append(f"{result['formats'][f]['compute_bound_rows_model']:.0f} {rows}")
    from engine.lab.prose import NUMBER

    text = NUMBER.sub(lambda m: m["value"], (LESSON_RUN.parent / f"{lang}.md").read_text())
    section = text.split("roofline", 1)[1].split("<!-- roofline -->", 1)[0]
    for number in cited:
        written = number.replace(".", ",") if lang == "pt-BR" else number
        assert written in section, (lang, written)
