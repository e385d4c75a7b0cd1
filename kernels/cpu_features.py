"""What the CPU reports: its architecture and its feature flags, as /proc/cpuinfo names them
(Linux x86's ``flags``, aarch64's ``Features``), as macOS's ``sysctl`` says them, or (anywhere
else with a C++ compiler: Windows with MinGW, the BSDs) as cpuid answers a small probe built with
that compiler. The parsers take text, so a test can feed them another machine's
(``tests/kernels/test_kernel_neon.py``); ``kernels.cpu_quant_build`` picks the kernel build from
them."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path


def machine_arch(machine: str | None = None) -> str:
    """``x86_64`` or ``arm64`` (aarch64 and arm64 alike), else the machine's own name."""
    m = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64e": "arm64"}.get(m, m)


def parse_cpuinfo(text: str) -> set[str] | None:
    """The first ``flags`` (x86) or ``Features`` (aarch64) line of a /proc/cpuinfo, as a set."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


# macOS `sysctl hw.optional` (Apple Silicon: 1 or 0 per feature) -> /proc/cpuinfo's names
SYSCTL_ARM = {
    "hw.optional.neon": "asimd",
    "hw.optional.AdvSIMD": "asimd",
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
}
# an Intel Mac's `sysctl machdep.cpu.features machdep.cpu.leaf7_features` words
SYSCTL_X86 = {"AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX512F": "avx512f"}
SYSCTL_X86 |= {"AVX512BW": "avx512bw", "AVX512VL": "avx512vl", "AVX512VNNI": "avx512_vnni"}


def parse_sysctl(text: str) -> set[str] | None:
    """CPU flags, as /proc/cpuinfo names them, from macOS ``sysctl`` lines (``name: value``):
    ``hw.optional.*`` booleans (Apple Silicon) and ``machdep.cpu.*features`` word lists (Intel).
    macOS 11 has no ``hw.optional.arm.FEAT_*`` names; there ``hw.optional.arm64: 1`` stands for
    the dot product too (every Apple Silicon chip has it)."""
    found: set[str] = set()
    arm64 = feat = False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if key.startswith("machdep.cpu."):
            found |= {SYSCTL_X86[w] for w in value.replace(".", " ").split() if w in SYSCTL_X86}
        elif key.startswith("hw.optional."):
            feat = feat or key.startswith("hw.optional.arm.FEAT_")
            on = value == "1"
            arm64 = arm64 or (key == "hw.optional.arm64" and on)
            if on and key in SYSCTL_ARM:
                found.add(SYSCTL_ARM[key])
    if arm64 and not feat:
        found |= {"asimd", "asimddp"}
    return found or None


def _sysctl(*names: str) -> str:
    try:
        return subprocess.run(
            ["sysctl", *names], capture_output=True, text=True, timeout=5
        ).stdout  # unknown names are said on stderr; the known ones still print
    except (OSError, subprocess.SubprocessError):
        return ""


# the x86 features the kernel builds need: __builtin_cpu_supports's name -> /proc/cpuinfo's
CPUID_X86 = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f"}
CPUID_X86 |= {"avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni"}
CPUID_X86 |= {"avxvnni": "avx_vnni"}


def compiler() -> str | None:
    """The C++ compiler that builds the kernels (and the cpuid probe): $CXX, else g++, else c++."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


@functools.cache
def cpuid_flags(cxx: str | None = None) -> set[str] | None:
    """The x86 flags of ``CPUID_X86`` that this CPU has, asked through cpuid by a probe that
    ``cxx`` (default: $CXX, g++ or c++) builds and runs (g++ and clang's
    ``__builtin_cpu_supports``, which also checks that the OS saves the AVX-512 registers); None
    where there is no compiler, the probe does not build (an ARM compiler), or it does not run."""
    cxx = cxx or compiler()
    if not cxx:
        return None
    checks = " ".join(f'printf("%s ", __builtin_cpu_supports("{n}") ? "{f}" : "");'
                      for n, f in CPUID_X86.items())  # fmt: skip
    body = f"#include <cstdio>\nint main() {{ __builtin_cpu_init(); {checks} return 0; }}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "cpuid.cpp", Path(tmp) / "cpuid.exe"
        src.write_text(body)
        try:
            subprocess.run([cxx, str(src), "-o", str(exe)], capture_output=True, timeout=60,
                           check=True)  # fmt: skip
            out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
    return set(out.stdout.split())


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as /proc/cpuinfo names them (Linux: x86's ``flags``, aarch64's
    ``Features``), or from ``sysctl`` on macOS (Apple Silicon: hw.optional.neon -> asimd,
    hw.optional.arm.FEAT_DotProd -> asimddp; Intel: AVX2 -> avx2, AVX512VNNI -> avx512_vnni, ...),
    or on another x86 system from cpuid (``cpuid_flags``); None where none answers."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = parse_cpuinfo(f.read())
        if flags is not None:
            return flags
    except OSError:
        pass
    text = _sysctl("hw.optional") + _sysctl("machdep.cpu.features", "machdep.cpu.leaf7_features")
    flags = parse_sysctl(text)
    if flags is None and machine_arch() == "x86_64":
        flags = cpuid_flags()
    return flags
