"""One kernel build per instruction set, chosen at load (kernels/cpu_quant_build.py): every build
this CPU runs gives bit-identical logits and K/V (the same integer sums, fewer instructions with
VNNI), FLUXO_KERNELS forces one (or none), and the engine says which build serves, or why none
does. A compiler without OpenMP (Apple clang without libomp) still builds the kernels, for one
thread, with the OpenMP build's bits. (The neon build: tests/kernels/test_kernel_neon.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.llama import LlamaForward
from engine.core.model import tiny_llama
from kernels import cpu_features, cpu_quant, cpu_quant_build
from tests.core.test_fused_step import _batch, _caches

ROOT = Path(__file__).resolve().parents[2]
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
    assert "choose avx512vnni, avxvnni, avx2, neon or fp32" in _forced("sse9")
    for vnni in ("avx512vnni", "avxvnni"):
        if vnni not in RUNS:
            assert "CPU lacks" in _forced(vnni)


def _tiny_forward(lib, threads: int) -> tuple[torch.Tensor, ...]:
    model, _ = tiny_llama(seed=1, dtype=torch.float32)
    fwd = LlamaForward(model, 64, "q4")
    fb = _batch([(5, [0, 1]), (13, [2, 3, 4, 5])], [(6, 5, [6, 7, 8]), (0, 9, [9, 10, 11])])
    cache = _caches(fwd, 1)[0]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with cpu_quant.using(lib):
            return fwd.forward(fb, cache), cache.k.clone(), cache.v.clone()
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not RUNS, reason=f"{cpu_quant_build.cpu_ok()}")
def test_a_build_without_openmp_gives_the_openmp_builds_bits_on_one_thread():
    serial = cpu_quant_build.load(build=RUNS[0], openmp=False)
    assert not serial.fluxo_threads_ok and serial.fluxo_openmp() == 0
    reference = _tiny_forward(cpu_quant_build.load(build=RUNS[0]), threads=1)
    for threads in (1, 2):  # asking for 2 runs 1: the same bits
        for a, b in zip(reference, _tiny_forward(serial, threads), strict=True):
            assert torch.equal(a, b)


@pytest.mark.skipif(not RUNS, reason=f"{cpu_quant_build.cpu_ok()}")
def test_a_compiler_without_openmp_falls_back_to_one_thread(tmp_path, monkeypatch, caplog):
    cxx = tmp_path / "no-openmp-c++"  # a compiler that rejects -fopenmp, as Apple clang does
    real = shutil.which("g++")
    cxx.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = -fopenmp ] && '
        "echo \"clang: error: unsupported option '-fopenmp'\" >&2 && exit 1; done\n"
        f'exec {real} "$@"\n'
    )
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("FLUXO_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="fluxo.kernels"):
        lib = cpu_quant_build.load(build=RUNS[0])
    assert not lib.fluxo_threads_ok
    assert "has no usable OpenMP (tried -fopenmp): the kernels build for one thread" in caplog.text
    assert len(list((tmp_path / "cache" / "kernels").glob("*.so"))) == 1
    assert cpu_quant_build.load(build=RUNS[0]).fluxo_threads_ok is False  # cached: no probe


def test_macos_tries_libomp_before_no_openmp(tmp_path, monkeypatch):
    brew = tmp_path / "homebrew" / "opt" / "libomp"
    (brew / "lib").mkdir(parents=True)
    (brew / "include").mkdir()
    torch_lib = tmp_path / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    monkeypatch.setattr(cpu_quant_build, "HOMEBREW_LIBOMP", (brew,))
    monkeypatch.setattr(cpu_quant_build, "_torch_lib", lambda: torch_lib)
    names = [n for n, _ in cpu_quant_build.openmp_variants("Darwin")]
    assert names == ["openmp", "libomp", "none"]
    libomp = cpu_quant_build.openmp_variants("Darwin")[1][1]  # Homebrew's: torch has none
    assert libomp == ["-Xpreprocessor", "-fopenmp", f"-I{brew}/include", f"-L{brew}/lib", "-lomp",
                      f"-Wl,-rpath,{brew}/lib"]  # fmt: skip
    (torch_lib / "libomp.dylib").write_bytes(b"")  # torch's own runtime: one OpenMP in the process
    assert f"-L{torch_lib}" in cpu_quant_build.openmp_variants("Darwin")[1][1]
    assert [n for n, _ in cpu_quant_build.openmp_variants("Linux")] == ["openmp", "none"]
    assert cpu_quant_build.build_flags("neon", []) == [
        "-O3", "-shared", "-fPIC", "-std=c++17", "-march=armv8.2-a+dotprod", "-ffp-contract=off"
    ]  # fmt: skip


_REASON = (
    "import torch\n"
    "from engine.core.config import EngineConfig\n"
    "from engine.core.engine import Engine\n"
    "from engine.core.model import tiny_llama\n"
    "model, tok = tiny_llama(seed=1, dtype=torch.float32)\n"
    "cfg = EngineConfig(model='tiny', dtype='float32', weights='q4', kv_blocks=64, block_size=4)\n"
    "e = Engine(cfg, model=model, tokenizer=tok).execution()\n"
    "print(e['weights'], e['kernels'], e['kernels_reason'])\n"
)


def test_the_engine_says_why_q4_fell_back_to_fp32():
    env = {**os.environ, "FLUXO_KERNELS": "fp32", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _REASON], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "fp32 None FLUXO_KERNELS=fp32 asks for no kernels"
    # the one-line warning at engine start (unconfigured logging: Python's last-resort handler)
    assert "weights=q4 unavailable, serving fp32: FLUXO_KERNELS=fp32 asks for no kernels" in (
        out.stderr
    )


@pytest.mark.skipif(not RUNS, reason=f"{cpu_quant_build.cpu_ok()}")
def test_the_engine_names_the_build_that_serves(make_tiny_engine):
    model, tok = tiny_llama(seed=1, dtype=torch.float32)
    e = make_tiny_engine(weights_of=(model, tok), dtype="float32", weights="q4").execution()
    assert (e["weights"], e["kernels"], e["kernels_reason"]) == ("q4", cpu_quant.build_name(), None)


@pytest.mark.skipif(
    cpu_features.machine_arch() != "x86_64" or not shutil.which("g++"),
    reason="the cpuid probe is for x86 CPUs, built with g++",
)
def test_without_cpuinfo_or_sysctl_cpuid_picks_the_same_build(monkeypatch):
    """Windows has neither /proc/cpuinfo nor sysctl: the compiler's cpuid probe says the same."""
    with open("/proc/cpuinfo") as f:
        linux = cpu_features.parse_cpuinfo(f.read())
    best = cpu_quant_build.choose_build() if "FLUXO_KERNELS" not in os.environ else None

    def no_file(*args, **kwargs):
        raise FileNotFoundError("/proc/cpuinfo")

    monkeypatch.setattr(cpu_features, "open", no_file, raising=False)
    monkeypatch.setattr(cpu_features, "_sysctl", lambda *names: "")
    cpu_features.cpuid_flags.cache_clear()
    flags = cpu_features.cpu_flags()
    assert flags == linux & set(cpu_features.CPUID_X86.values())
    monkeypatch.setattr(cpu_quant_build, "cpu_flags", cpu_features.cpu_flags)
    if best is not None:
        assert cpu_quant_build.choose_build() == best
    assert cpu_features.cpuid_flags("/nonexistent/c++") is None
