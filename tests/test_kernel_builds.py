"""One kernel build per instruction set, chosen at load (kernels/cpu_quant_build.py): every build
this CPU runs gives bit-identical logits and K/V (the same integer sums, fewer instructions with
VNNI), FLUXO_KERNELS forces one (or none), and the engine says which build serves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.llama import LlamaForward
from engine.core.model import tiny_llama
from kernels import cpu_quant, cpu_quant_build
from tests.test_fused_step import _batch, _caches

ROOT = Path(__file__).resolve().parents[1]
RUNS = [b for b in cpu_quant_build.BUILDS if cpu_quant_build.cpu_ok(b) is None]


def _forced(value: str) -> str:
    code = "from kernels import cpu_quant as q; print(q.build_name(), q.unavailable_reason())"
    env = {**os.environ, "FLUXO_KERNELS": value, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("build", list(cpu_quant_build.BUILDS))
def test_every_build_this_cpu_runs_gives_the_same_bits(build):
    if build not in RUNS:
        pytest.skip(f"the {build} build: {cpu_quant_build.cpu_ok(build)}")
    model, _ = tiny_llama(seed=1, dtype=torch.float32)
    fwd = LlamaForward(model, 64, "q4")
    fb = _batch([(5, [0, 1]), (13, [2, 3, 4, 5])], [(6, 5, [6, 7, 8]), (0, 9, [9, 10, 11])])
    out = {}
    for name in ("avx2", build):
        cache = _caches(fwd, 1)[0]
        with cpu_quant.using(cpu_quant_build.load(build=name)):
            out[name] = (fwd.forward(fb, cache), cache.k.clone(), cache.v.clone())
    for a, b in zip(out["avx2"], out[build], strict=True):
        assert torch.equal(a, b)


def test_the_best_build_serves_by_default_and_fluxo_kernels_forces_one():
    if RUNS and "FLUXO_KERNELS" not in os.environ:  # the fastest build this CPU runs serves
        assert cpu_quant.build_name() == RUNS[0] == cpu_quant_build.choose_build()
    assert _forced("avx2").startswith("avx2 None")
    assert _forced("fp32") == "None FLUXO_KERNELS=fp32 asks for no kernels"
    assert "choose avx512vnni, avx2 or fp32" in _forced("sse9")
    if "avx512vnni" not in RUNS:
        assert "CPU lacks" in _forced("avx512vnni")
