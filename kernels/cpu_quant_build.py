"""Building and loading the quantized CPU kernels (``kernels/cpu_quant*.cpp``): the sources as one
translation unit, compiled once per source version into the user's cache, and the C signatures
bound with ctypes. ``kernels.cpu_quant`` loads the working tree's build; ``engine.lab.kernel_ab``
also builds a git revision's sources to time the two side by side.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# one translation unit, in this order (each file uses what the ones before it define)
NAMES = ("cpu_quant.cpp", "cpu_quant_int8.cpp", "cpu_quant_tile.cpp", "cpu_quant_decode.cpp")
SOURCES = tuple(HERE / f for f in NAMES)
BASE_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# One build per instruction set, chosen at load from what the CPU reports (FLUXO_KERNELS forces
# one: avx2, avx512vnni, or fp32 for none). Both builds compute the same integer sums, so they give
# bit-identical results (tests/test_kernel_builds.py); VNNI only takes fewer instructions.
BUILDS: dict[str, tuple[tuple[str, ...], list[str]]] = {  # name: (CPU flags needed, compiler flags)
    "avx512vnni": (
        ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
        [
            "-mavx2",
            "-mfma",
            "-mf16c",
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512vnni",
            "-DFLUXO_VNNI=1",
        ],
    ),  # fmt: skip
    "avx2": (("avx2", "fma", "f16c"), ["-mavx2", "-mfma", "-mf16c"]),
}
FLAGS = BASE_FLAGS + BUILDS["avx2"][1]  # the AVX2 build's (older revisions knew only this one)


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as /proc/cpuinfo names them (Linux), or from ``sysctl`` on macOS
    (an Intel Mac: AVX2 -> avx2, AVX512VNNI -> avx512_vnni, ...); None where neither answers."""
    try:
        line = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags"))
        return set(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        pass
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = {"AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX512F": "avx512f"}
    names |= {"AVX512BW": "avx512bw", "AVX512VL": "avx512vl", "AVX512VNNI": "avx512_vnni"}
    found = {names[w] for w in out.replace(".", " ").split() if w in names}
    return found or None


def cpu_ok(build: str = "avx2") -> str | None:
    """Why this CPU cannot run ``build``, or None."""
    flags = cpu_flags()
    if flags is None:
        return "cannot read the CPU's features (/proc/cpuinfo, sysctl)"
    missing = [f for f in BUILDS[build][0] if f not in flags]
    return f"CPU lacks {', '.join(missing)}" if missing else None


def choose_build() -> str | None:
    """``FLUXO_KERNELS`` when set (``fp32``: None, no kernels), else the best build this CPU runs
    (None when none does). Raises ValueError for an unknown name."""
    forced = os.environ.get("FLUXO_KERNELS", "").strip()
    if forced:
        if forced == "fp32":
            return None
        if forced not in BUILDS:
            raise ValueError(f"FLUXO_KERNELS={forced!r}: choose {', '.join(BUILDS)} or fp32")
        return forced
    return next((b for b in BUILDS if cpu_ok(b) is None), None)


def build_dir() -> Path:
    return Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo")) / "kernels"


def tree_source() -> str:
    """The working tree's kernels as the one translation unit they compile as."""
    return "\n".join(p.read_text() for p in SOURCES)


def compile_source(source: str, build: str = "avx2") -> Path:
    """The shared library of ``source`` for ``build`` (compiled on first use, then cached by its
    hash); raises with the reason."""
    why = cpu_ok(build)
    if why:
        raise RuntimeError(f"{why} (the {build} build)")
    flags = FLAGS if build == "avx2" else BASE_FLAGS + BUILDS[build][1]
    tag = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    out = build_dir() / f"fluxo_cpu_quant_{tag}.so"
    if out.exists():  # built before (or by the Docker image's build stage): no compiler needed
        return out
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler (g++) on PATH, and no build of these kernels cached")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "cpu_quant.cpp"
        src.write_text(source)
        so = Path(tmp) / out.name
        proc = subprocess.run(
            [cxx, *flags, str(src), "-o", str(so)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the quantized kernels failed: {proc.stderr[-2000:]}")
        os.replace(so, out)  # atomic: a concurrent process sees the whole file or none
    return out


def load(source: str | None = None, strict: bool = True, build: str = "avx2") -> ctypes.CDLL:
    """Compile ``source`` (default: the working tree's) for ``build`` if needed, load it and bind
    its functions' C signatures; ``lib.fluxo_build`` names the build. ``strict=False`` binds only
    the functions the library has (an older revision's build, for ``engine.lab.kernel_ab``)."""
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded before ours resolves the name)

    lib = ctypes.CDLL(str(compile_source(tree_source() if source is None else source, build)))
    lib.fluxo_build = build
    i64, c_int, p = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    signatures = {  # name: (argument types, result type)
        "fluxo_q4_1_mm": ([p, i64, i64, p, i64, p, c_int], None),
        "fluxo_q8_0_mm": ([p, i64, i64, p, i64, p, c_int], None),
        "fluxo_q4_1_dequant": ([p, i64, i64, p, c_int], None),
        "fluxo_q8_0_dequant": ([p, i64, i64, p, c_int], None),
        "fluxo_quantize_q8_1": ([p, i64, i64, p, p, p], None),
        "fluxo_qmm": ([p, i64, i64, p, p, c_int, i64, p, c_int, c_int], None),
        "fluxo_q4_1_tiles": ([p, i64, i64, p], None),
        "fluxo_q8_0_tiles": ([p, i64, i64, p], None),
        "fluxo_forward_step": (
            [p, p, p, p, i64, p, p, p, p, p, i64, p, p, p, p, i64, p, c_int, p],
            None,
        ),
        # older builds' decode-only step (engine.lab.kernel_ab times a revision's kernels)
        "fluxo_decode_step": ([p, p, p, p, i64, p, p, p, p, p, i64, p, p, p, i64, p, c_int], None),
        "fluxo_decode_step_phases": (
            [p, p, p, p, i64, p, p, p, p, p, i64, p, p, p, i64, p, c_int, p],
            None,
        ),
        "fluxo_int8_macs_per_s": ([i64, c_int, p], ctypes.c_double),
        "fluxo_tile_macs_per_s": ([c_int, i64, c_int, p], ctypes.c_double),
    }
    legacy = ("fluxo_decode_step", "fluxo_decode_step_phases")
    for name, (args, result) in signatures.items():
        if (not strict or name in legacy) and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib
