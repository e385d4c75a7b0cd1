"""Where a quantized decode step's time goes, beside ``python -m engine.bench roofline``.

The one-call step (``kernels/cpu_quant_decode.cpp``) can add each thread's seconds per phase to a
tensor: the layers' weight products, the vocabulary head, the KV write and attention, the norms and
the activations' quantization, and the waits at the barriers between them. This module times a
batch's steps that way and sets each phase against its own roof, measured in the same run:

- the products (layers and head) against the tiles' own roof (``cpu_quant.tile_macs_per_s``: the
  products' inner kernel on a tile that stays in L1, so only its instructions bound it; taken in
  turn with the int8 roof, maddubs + add alone, and reported as a share of it): their
  multiply-adds are counted, so each achieved G ops/s is exact arithmetic over a measured time;
- attention against the read roof: it reads each row's K and V, a count of bytes.

From these, ``floor_ms``: the step with every weight product at its tile roof and attention at the
read roof, one after the other as the step runs them, and nothing else (norms, waits, Python) taking
time; ``fraction_ceiling``: the share of the read roof such a step reaches. No change outside the
kernels' instructions goes past it. It also measures the int8 roof on one thread beside all of
torch's threads (how much arithmetic a second thread adds on this machine).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine.core.metrics import median
from engine.lab.kernel_ab import prefill_batch
from engine.lab.roofline import decode_batch, shape_of
from engine.lab.roofline_model import step_bytes
from kernels import cpu_quant

Result = dict[str, Any]


def _macs(fw) -> tuple[int, int]:
    """Multiply-adds per row of the layers' products and of the vocabulary head (``shape_of``
    counts them together)."""
    head = fw.model.lm_head.weight.numel()
    return shape_of(fw, fw.weights).weight_params - head, head


def tile_roofs(reps: int = 5) -> dict[str, float]:
    """Each block format's tile roof on all of torch's threads and the int8 roof, taken in turn
    ``reps`` times (G int8 ops/s, 2 per multiply-add, best of each), with each tile roof's ratio to
    the int8 roof (the machine's speed moves between runs; the ratio, taken together, less)."""
    runs: dict[str, list[float]] = {"q4_1": [], "q8_0": [], "int8": []}
    for _ in range(reps):
        for fmt in ("q4_1", "q8_0"):
            runs[fmt].append(2 * cpu_quant.tile_macs_per_s(fmt, iters=100_000) / 1e9)
        runs["int8"].append(2 * cpu_quant.int8_macs_per_s() / 1e9)
    best = {k: max(v) for k, v in runs.items()}
    return {
        **best,
        "q4_1_over_int8": best["q4_1"] / best["int8"],
        "q8_0_over_int8": best["q8_0"] / best["int8"],
    }


def measure(
    fw, rows: int, ctx: int = 128, steps: int = 40, block_size: int = 16, prefill: bool = False
) -> Result:
    """``steps`` fused decode steps of ``rows`` rows with ``ctx`` cached tokens each (``prefill``:
    one prompt chunk of ``rows`` tokens from position 0 instead): the step's median wall time and
    each phase's mean seconds a step (averaged over the threads)."""
    if prefill:
        fb, blocks = prefill_batch(rows), -(-rows // block_size)
    else:
        fb, blocks = decode_batch(rows, ctx, block_size)
    cache = fw.new_cache(blocks + 1, block_size)
    gen = torch.Generator().manual_seed(0)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    threads = torch.get_num_threads()
    fw.forward(fb, cache)  # warm-up: first touches
    fw.fused.phases = torch.zeros(threads, len(cpu_quant.PHASES), dtype=torch.float64)
    walls = []
    try:
        for _ in range(steps):
            t = time.perf_counter()
            fw.forward(fb, cache)
            walls.append(time.perf_counter() - t)
        per_step = fw.fused.phases.mean(0) / steps  # [phases]: seconds a step, mean over threads
    finally:
        fw.fused.phases = None
    phases_ms = {n: float(v) * 1e3 for n, v in zip(cpu_quant.PHASES, per_step, strict=True)}
    return {
        "rows": rows,
        "steps": steps,
        "threads": threads,
        "step_ms": median(walls) * 1e3,
        "mean_step_ms": sum(walls) / steps * 1e3,
        "phases_ms": phases_ms,
    }


def against_roofs(point: Result, fw, weights: str, ctx: int, roofs: Result) -> Result:
    """Adds each phase's rate and share of its roof to ``point`` (from ``measure``), the step's
    floor and its ceiling share of the read roof. ``roofs``: ``read_gbs`` and ``tiles``
    (``tile_roofs``)."""
    rows, ph, read = point["rows"], point["phases_ms"], roofs["read_gbs"]
    layer_macs, head_macs = _macs(fw)
    shape = shape_of(fw, weights)
    nbytes = step_bytes(shape, rows, ctx)
    kv_bytes = nbytes - shape.weight_bytes
    qm = fw.quant
    layer_roof = roofs["tiles"][qm.layers[0][0].w.fmt]  # G ops/s
    head_roof = roofs["tiles"][qm.head.w.fmt]
    head_bytes = qm.head.w.nbytes
    products_gops = 2 * rows * layer_macs / (ph["products"] * 1e6)
    head_gops = 2 * rows * head_macs / (ph["head"] * 1e6)
    attention_gbs = kv_bytes / (ph["attention"] * 1e6)
    floor = (  # ms: each product at the slower of its arithmetic and its reading, then attention
        max(2 * rows * layer_macs / layer_roof, (shape.weight_bytes - head_bytes) / read)
        + max(2 * rows * head_macs / head_roof, head_bytes / read)
        + kv_bytes / read
    ) / 1e6
    read_ms = nbytes / (read * 1e6)
    point.update(
        {
            "products_gops": products_gops,
            "products_fraction_of_tile_roof": products_gops / layer_roof,
            "head_gops": head_gops,
            "head_fraction_of_tile_roof": head_gops / head_roof,
            "attention_kv_bytes": kv_bytes,
            "attention_gbs": attention_gbs,
            "attention_fraction_of_read_roof": attention_gbs / read,
            "outside_kernel_ms": point["mean_step_ms"] - sum(ph.values()),
            "read_ms": read_ms,
            "fraction_of_bandwidth": read_ms / point["mean_step_ms"],
            "floor_ms": floor,
            "fraction_ceiling": read_ms / floor,
        }
    )
    return point


def prefill_against_roofs(point: Result, fw, weights: str, roofs: Result) -> Result:
    """A prompt chunk's ``point`` (``measure(..., prefill=True)``) per prompt token, against the
    int8 roof (``roofs["int8"]``, G ops/s) and the read roof: ``floor_ms_per_token`` is the
    layers' multiply-adds at the int8 roof or the weights read once a chunk, whichever is slower;
    attention, the head (one row) and the rest are left out of it."""
    n, ph = point["rows"], point["phases_ms"]
    layer_macs, _ = _macs(fw)
    shape = shape_of(fw, weights)
    int8_ms = 2 * layer_macs / (roofs["int8"] * 1e6)  # a token's products at the int8 roof
    read_ms = shape.weight_bytes / (roofs["read_gbs"] * 1e6) / n
    products_gops = 2 * n * layer_macs / (ph["products"] * 1e6)
    point.update(
        {
            "ms_per_token": point["mean_step_ms"] / n,
            "phases_ms_per_token": {k: v / n for k, v in ph.items()},
            "products_gops": products_gops,
            "products_fraction_of_int8_roof": products_gops / roofs["int8"],
            "floor_ms_per_token": max(int8_ms, read_ms),
            "fraction_of_floor": max(int8_ms, read_ms) / (point["mean_step_ms"] / n),
        }
    )
    return point


def int8_thread_scaling(reps: int = 3) -> Result:
    """The int8 roof on one thread and on all of torch's threads, best of ``reps`` each, taken in
    turn (G int8 ops/s, 2 per multiply-add)."""
    threads = torch.get_num_threads()
    one, every = [], []
    for _ in range(reps):
        one.append(2 * cpu_quant.int8_macs_per_s(threads=1) / 1e9)
        every.append(2 * cpu_quant.int8_macs_per_s(threads=threads) / 1e9)
    return {
        "threads": threads,
        "one_thread_gops": max(one),
        "all_threads_gops": max(every),
        "all_over_one": max(every) / max(one),
    }


def roofline_phases(
    model,
    result: Result,
    rows: tuple[int, ...] = (1, 8),
    steps: int = 40,
    prompts: tuple[int, ...] = (16, 64, 256, 512),
) -> None:
    """Beside a ``roofline`` result: each fused quantized format's step phases at ``rows``, against
    the run's read roof and the tile roofs (measured here, in turn with the int8 roof), a prompt
    chunk of each of ``prompts`` tokens per token against the int8 and read roofs, and the int8
    roof's thread scaling; ``{"skipped": why}`` where the quantized kernels do not build or the run
    measured no int8 roof."""
    from engine.core import device

    m = result["machine"]
    if not cpu_quant.available() or not m.get("int8"):
        result["phases"] = {"skipped": "no quantized CPU kernels here"}
        return
    roofs = {
        "read_gbs": m["bandwidth"]["read_gbs"],
        "tiles": device.run(tile_roofs),
    }
    out: Result = {"int8_threads": device.run(int8_thread_scaling), "roofs": roofs}
    for w in ("q4", "q8"):
        if w in result["formats"]:
            _format_phases(model, w, result, out, (rows, prompts), steps)
    for fmt in ("q4_1", "q8_0"):
        result["ratios"][f"{fmt}_tile_roof_over_int8_roof"] = roofs["tiles"][f"{fmt}_over_int8"]
    result["ratios"]["int8_roof_all_threads_over_one"] = out["int8_threads"]["all_over_one"]
    result["phases"] = out


def _format_phases(
    model, w: str, result: Result, out: Result, shapes: tuple[tuple[int, ...], ...], steps: int
) -> None:
    """``roofline_phases`` for one weight format: ``out[w]`` the decode steps at ``rows``,
    ``out[w + "_prefill"]`` the prompt chunks, and their ratios into ``result``."""
    from engine.core import device
    from engine.core.llama import LlamaForward

    (rows, prompts), ctx, roofs = shapes, result["ctx"], out["roofs"]
    fw = device.run(LlamaForward, model, max(ctx, *prompts) + 2, w)
    if fw.fused is None:
        return
    out[w] = [
        against_roofs(device.run(measure, fw, r, ctx, steps), fw, w, ctx, roofs) for r in rows
    ]
    for p in out[w]:
        n = "1_row" if p["rows"] == 1 else f"{p['rows']}_rows"
        for key in ("products_fraction_of_tile_roof", "fraction_ceiling"):
            result["ratios"][f"{w}_{key}_{n}"] = p[key]
    prefill_roofs = {"int8": roofs["tiles"]["int8"], "read_gbs": roofs["read_gbs"]}
    out[f"{w}_prefill"] = [
        prefill_against_roofs(
            device.run(measure, fw, n, ctx, max(3, steps // 8), prefill=True), fw, w, prefill_roofs
        )
        for n in prompts
    ]
    for p in out[f"{w}_prefill"]:
        key = f"{w}_prefill_{p['rows']}_fraction_of_int8_roof"
        result["ratios"][key] = p["products_fraction_of_int8_roof"]


def table(result: Result) -> str:
    """The phases' lines of the roofline table."""
    ph = result.get("phases", {})
    if "skipped" in ph or not ph:
        return f"step phases skipped: {ph.get('skipped', 'not measured')}"
    s, tiles = ph["int8_threads"], ph["roofs"]["tiles"]
    lines = [
        f"int8 roof on 1 thread {s['one_thread_gops']:.0f} G ops/s, on {s['threads']} "
        f"{s['all_threads_gops']:.0f} ({s['all_over_one']:.2f}x); tile roofs (the products' "
        f"kernel from L1): q4_1 {tiles['q4_1']:.0f}, q8_0 {tiles['q8_0']:.0f} G ops/s, "
        f"{tiles['q4_1_over_int8']:.2f} and {tiles['q8_0_over_int8']:.2f} of the int8 roof "
        f"{tiles['int8']:.0f} measured in turn with them",
        f"{'weights':<8}{'rows':>5}{'step ms':>9}"
        + "".join(f"{n:>11}" for n in cpu_quant.PHASES)
        + f"{'other':>7}{'prod/tile':>10}{'head/tile':>10}{'attn/read':>10}{'floor':>7}"
        f"{'of roof':>8}{'ceiling':>8}",
    ]
    for w in ("q4", "q8"):
        for p in ph.get(w, []):
            lines.append(
                f"{w:<8}{p['rows']:>5}{p['mean_step_ms']:>9.2f}"
                + "".join(f"{p['phases_ms'][n]:>11.2f}" for n in cpu_quant.PHASES)
                + f"{p['outside_kernel_ms']:>7.2f}{p['products_fraction_of_tile_roof']:>10.2f}"
                f"{p['head_fraction_of_tile_roof']:>10.2f}"
                f"{p['attention_fraction_of_read_roof']:>10.2f}{p['floor_ms']:>7.2f}"
                f"{p['fraction_of_bandwidth']:>8.2f}{p['fraction_ceiling']:>8.2f}"
            )
    lines.append(
        "  (phases: ms a step, mean of the threads; floor: the products at their tile roofs and "
        "attention at the read roof,\n   nothing else; ceiling: the read roof's share at the floor)"
    )
    return "\n".join(lines + _prefill_lines(ph))


def _prefill_lines(ph: Result) -> list[str]:
    """The prompt chunks' lines: ms per prompt token, by phase, against the int8 roof."""
    lines = [
        f"{'weights':<8}{'prompt':>7}{'ms/token':>9}"
        + "".join(f"{n:>11}" for n in cpu_quant.PHASES)
        + f"{'prod G ops/s':>13}{'of int8':>8}{'floor':>7}{'of floor':>9}"
    ]
    for w in ("q4", "q8"):
        for p in ph.get(f"{w}_prefill", []):
            lines.append(
                f"{w:<8}{p['rows']:>7}{p['ms_per_token']:>9.3f}"
                + "".join(f"{p['phases_ms_per_token'][n]:>11.3f}" for n in cpu_quant.PHASES)
                + f"{p['products_gops']:>13.0f}{p['products_fraction_of_int8_roof']:>8.2f}"
                f"{p['floor_ms_per_token']:>7.3f}{p['fraction_of_floor']:>9.2f}"
            )
    lines.append(
        "  (a prompt chunk from position 0, ms per prompt token; floor: the layers' products at "
        "the int8 roof, or the weights\n   read once a chunk at the read roof if slower)"
    )
    return lines if len(lines) > 2 else []


def phases(model, tok=None, rows: tuple[int, ...] = (1, 8), steps: int = 60) -> Result:
    """``python -m engine.bench phases``: the read and int8 roofs measured, then the phases of the
    q4 and q8 steps at ``rows`` (``roofline_phases``), without the whole roofline's decode sweep."""
    from engine.core import device
    from engine.lab.roofline import measure_bandwidth, measure_int8

    result: Result = {
        "machine": {"bandwidth": device.run(measure_bandwidth), "int8": device.run(measure_int8)},
        "ctx": 128,
        "formats": {"q4": {}, "q8": {}},
        "ratios": {},
    }
    roofline_phases(model, result, rows, steps)
    return result
