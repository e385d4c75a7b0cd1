"""Every build's bits through a driver of the kernels (the ARM64 NEON build under qemu, where this
machine cannot run it), and how a build is chosen.

- ``tests/kernels/kernel_check.cpp`` (the kernels plus deterministic inputs, every output printed
  as raw bits) is compiled natively with the avx2 build's flags, natively with every other x86
  build's this CPU runs (avxvnni, avx512vnni: its two-tiles-a-zmm kernels included), and with
  ``aarch64-linux-gnu-g++ -static`` with the neon build's, that one run under
  ``qemu-aarch64 -cpu max``: every output must be bit for bit the avx2 build's (the products, the
  tiles, Q8_1 quantization, exp8, and the whole forward step's logits, hidden states and K/V), and
  on each build a row alone, or at 2 threads, gives the batch's bits. A build is skipped, saying
  why, where this CPU lacks it or the cross compiler or qemu is missing (CI installs both:
  .ci/run).
- ``FLUXO_KERNELS=neon`` on an x86 CPU is refused with a coded reason, and the CPU flags of an
  aarch64 /proc/cpuinfo and of macOS ``sysctl`` output choose the builds they should.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernels import cpu_features as cf
from kernels import cpu_quant_build as cb

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "kernels" / "kernel_check.cpp"
CROSS = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")
NATIVE = os.environ.get("CXX") or shutil.which("g++")
COMMON = ["-O3", "-std=c++17", "-fopenmp"]


def _parse(text: str) -> dict[str, list[str]]:
    out = {}
    for line in text.splitlines():
        name, count, *words = line.split()
        assert int(count) == len(words), name
        out[name] = words
    return out


def _build_and_run(cmd: list[str], exe: Path, run: list[str]) -> dict[str, list[str]]:
    subprocess.run([*cmd, str(DRIVER), "-o", str(exe)], check=True, capture_output=True)
    proc = subprocess.run([*run, str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return _parse(proc.stdout)


OTHERS = [b for b in cb.BUILDS if b != "avx2"]


def _why_not(build: str) -> str | None:
    """Why the driver cannot be built and run for ``build`` here, or None."""
    if build == "neon":
        if not (CROSS and QEMU):
            return (
                "needs aarch64-linux-gnu-g++ and qemu-aarch64 (apt-get install "
                "g++-aarch64-linux-gnu qemu-user; .ci/run does)"
            )
        return None
    return "no native compiler" if NATIVE is None else cb.cpu_ok(build)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    """The driver's outputs on avx2 and on every other build that can run here."""
    if NATIVE is None or cb.cpu_ok("avx2") is not None:
        pytest.skip(f"no native avx2 build to compare with ({cb.cpu_ok('avx2')})")
    tmp = tmp_path_factory.mktemp("builds")
    jobs = {}
    for build in ["avx2", *OTHERS]:
        if _why_not(build) is None:
            flags = [*COMMON, *cb.BUILDS[build][1]]
            exe = tmp / f"check_{build}"
            if build == "neon":
                jobs[build] = ([CROSS, "-static", *flags], exe, [QEMU, "-cpu", "max"])
            else:
                jobs[build] = ([NATIVE, *flags], exe, [])
    with ThreadPoolExecutor(2) as pool:  # two compiles at once (~3 s each)
        futures = {k: pool.submit(_build_and_run, *job) for k, job in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def _present(outputs, build: str) -> dict[str, list[str]]:
    if build not in outputs:
        pytest.skip(f"the {build} build: {_why_not(build)}")
    return outputs[build]


@pytest.mark.parametrize("build", OTHERS)
def test_every_build_gives_the_avx2_builds_bits(outputs, build):
    avx2, other = outputs["avx2"], _present(outputs, build)
    assert other.keys() == avx2.keys() and len(avx2) > 70
    differ = {
        name: sum(a != b for a, b in zip(avx2[name], other[name], strict=True))
        for name in avx2
        if avx2[name] != other[name]
    }
    assert not differ, f"outputs whose bits differ (count of words): {differ}"
    assert other["openmp"] == ["1"]  # the OpenMP regions ran at 2 threads (neon: under qemu)


@pytest.mark.parametrize("build", list(cb.BUILDS))
def test_each_builds_rows_are_batch_and_thread_invariant(outputs, build):
    out = _present(outputs, build)
    checked = 0
    for name, words in out.items():
        for suffix in ("/alone", "/t2"):
            if name.endswith(suffix):
                assert words == out[name.removesuffix(suffix)], name
                checked += 1
    # every product x tiling x epilogue x format; the step: logits, h, K, V; a long prompt whole,
    # at 2 threads and in chunks: logits, K, V
    assert checked == 43


def _forced(value: str) -> str:
    code = (
        "from kernels import cpu_quant as q; "
        "print(q.build_name(), q.unavailable_code(), q.unavailable_reason())"
    )
    env = {**os.environ, "FLUXO_KERNELS": value, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(cb.machine_arch() != "x86_64", reason="an x86 CPU refuses the neon build")
def test_forcing_neon_on_x86_is_refused_with_a_coded_reason():
    assert _forced("neon") == (
        "None wrong_arch FLUXO_KERNELS=neon: the neon build needs an arm64 CPU; "
        "this one is x86_64 (the neon build)"
    )


GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8

processor\t: 1
Features\t: fp asimd
"""  # noqa: E501
PI4 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"  # A72
M1_SYSCTL = """hw.optional.arm.FEAT_FlagM: 1
hw.optional.arm.FEAT_DotProd: 1
hw.optional.arm.FEAT_FHM: 1
hw.optional.arm.FEAT_FP16: 1
hw.optional.arm.FEAT_I8MM: 0
hw.optional.floatingpoint: 1
hw.optional.AdvSIMD: 1
hw.optional.neon: 1
hw.optional.arm64: 1
"""
BIG_SUR_SYSCTL = "hw.optional.floatingpoint: 1\nhw.optional.neon: 1\nhw.optional.arm64: 1\n"
INTEL_MAC_SYSCTL = """machdep.cpu.features: FPU VME DE PSE TSC SSE SSE2 SSE3 FMA CX16 AVX1.0 F16C
machdep.cpu.leaf7_features: RDWRFSGS TSC_THREAD_OFFSET BMI1 AVX2 SMEP BMI2 ERMS INVPCID
hw.optional.arm64: 0
"""


def test_cpu_flags_are_read_from_aarch64_cpuinfo_and_macos_sysctl():
    g2 = cf.parse_cpuinfo(GRAVITON2)
    assert {"asimd", "asimddp", "asimdhp"} <= g2 and "i8mm" not in g2  # the first processor's
    assert cb.cpu_ok("neon", g2, "arm64") is None
    assert cb.cpu_ok("neon", cf.parse_cpuinfo(PI4), "arm64") == "CPU lacks asimddp"
    assert cb.cpu_ok("avx2", g2, "arm64") == "the avx2 build needs an x86_64 CPU; this one is arm64"
    assert cf.parse_cpuinfo("processor : 0\nflags : fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert cf.parse_cpuinfo("no such lines\n") is None

    assert cf.parse_sysctl(M1_SYSCTL) == {"asimd", "asimddp", "asimdhp"}  # I8MM: 0 is absent
    assert cf.parse_sysctl(BIG_SUR_SYSCTL) == {"asimd", "asimddp"}  # no FEAT_ names yet
    assert cf.parse_sysctl(INTEL_MAC_SYSCTL) == {"fma", "f16c", "avx2"}
    assert cf.parse_sysctl("") is None
    assert cf.machine_arch("aarch64") == cf.machine_arch("arm64") == "arm64"
    assert cf.machine_arch("AMD64") == "x86_64"


@pytest.mark.parametrize(
    ("arch", "flags", "chosen"),
    [
        ("arm64", cf.parse_sysctl(M1_SYSCTL), "neon"),
        ("arm64", cf.parse_cpuinfo(PI4), None),
        ("x86_64", cf.parse_sysctl(INTEL_MAC_SYSCTL), "avx2"),
    ],
)
def test_choose_build_picks_what_the_cpu_runs(monkeypatch, arch, flags, chosen):
    monkeypatch.delenv("FLUXO_KERNELS", raising=False)
    monkeypatch.setattr(cb, "cpu_flags", lambda: flags)
    monkeypatch.setattr(cb, "machine_arch", lambda machine=None: arch)
    assert cb.choose_build() == chosen
    if chosen is None:
        assert cb.why_no_build() == "neon: CPU lacks asimddp"
    monkeypatch.setenv("FLUXO_KERNELS", "neon")
    assert cb.choose_build() == "neon"  # forced: compile_source then says why it cannot run
