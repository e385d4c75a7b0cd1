"""Building and loading the quantized CPU kernels (``kernels/cpu_quant*.cpp``): the sources as one
translation unit, compiled once per source version into the user's cache, and the C signatures
bound with ctypes. ``kernels.cpu_quant`` loads the working tree's build; ``engine.lab.kernel_ab``
also builds a git revision's sources to time the two side by side.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from kernels.cpu_features import compiler, cpu_flags, machine_arch

log = logging.getLogger("fluxo.kernels")

HERE = Path(__file__).resolve().parent
# one translation unit, in this order (each file uses what the ones before it define)
NAMES = (
    "cpu_quant.cpp",
    "cpu_quant_int8.cpp",
    "cpu_quant_tile.cpp",
    "cpu_quant_attend.cpp",
    "cpu_quant_decode.cpp",
)
SOURCES = tuple(HERE / f for f in NAMES)
LATER = frozenset({"cpu_quant_attend.cpp"})  # split out of cpu_quant_decode.cpp on 2026-12-03
BASE_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# One build per instruction set, chosen at load from what the CPU reports (FLUXO_KERNELS forces
# one: avx512vnni, avxvnni, avx2, neon, or fp32 for none), the first this CPU runs in this order.
# Every build computes the same integer sums and the same fp32 operations in the same order per
# row, so they give bit-identical results (tests/kernels/test_kernel_builds.py on this CPU's x86
# builds, tests/kernels/test_kernel_neon.py for neon under qemu); VNNI and sdot only take fewer
# instructions.
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
    # AVX-VNNI: vpdpbusd in its 256-bit VEX form, without AVX-512 (Intel Alder Lake and later
    # laptops; Zen 5 has both and takes avx512vnni): the same kernels as avx512vnni.
    "avxvnni": (
        ("avx2", "fma", "f16c", "avx_vnni"),
        ["-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-DFLUXO_VNNI=1"],
    ),
    "avx2": (("avx2", "fma", "f16c"), ["-mavx2", "-mfma", "-mf16c"]),
    # ARM64 with the dot-product extension (sdot): every Apple Silicon Mac, Graviton 2+, Ampere,
    # Raspberry Pi 5. -march=armv8.2-a+dotprod: g++ and Apple clang alike. -ffp-contract=off: the
    # only fused multiply-adds are the sources' explicit ones, the x86 builds' own, on any compiler.
    "neon": (("asimd", "asimddp"), ["-march=armv8.2-a+dotprod", "-ffp-contract=off"]),
}
BUILD_ARCH = {"avx512vnni": "x86_64", "avxvnni": "x86_64", "avx2": "x86_64", "neon": "arm64"}
FLAGS = BASE_FLAGS + BUILDS["avx2"][1]  # the AVX2 build's (older revisions knew only this one)


class KernelsUnavailable(RuntimeError):
    """Why no kernel build serves, with a stable ``code``: ``forced_fp32``, ``unknown_build``,
    ``wrong_arch``, ``cpu_lacks``, ``cpu_unknown``, ``no_compiler``, ``compile_failed``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def cpu_ok(
    build: str = "avx2", flags: set[str] | None = None, arch: str | None = None
) -> str | None:
    """Why this CPU (or one with ``flags`` and ``arch``) cannot run ``build``, or None."""
    return _cpu_why(build, flags, arch)[1]


def _cpu_why(build: str, flags: set[str] | None, arch: str | None) -> tuple[str, str | None]:
    arch = arch or machine_arch()
    need = BUILD_ARCH[build]
    if arch != need:
        return "wrong_arch", f"the {build} build needs an {need} CPU; this one is {arch}"
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return "cpu_unknown", "cannot read the CPU's features (/proc/cpuinfo, sysctl)"
    missing = [f for f in BUILDS[build][0] if f not in flags]
    return ("cpu_lacks", f"CPU lacks {', '.join(missing)}") if missing else ("", None)


def why_no_build(arch: str | None = None) -> str:
    """Why no build runs here: each build of this CPU's architecture with its reason."""
    arch = arch or machine_arch()
    mine = [b for b in BUILDS if BUILD_ARCH[b] == arch]
    if not mine:
        return f"no kernel build for {arch} CPUs (builds: {', '.join(BUILDS)})"
    return "; ".join(f"{b}: {cpu_ok(b, arch=arch)}" for b in mine)


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


# -- OpenMP: -fopenmp, else (macOS) Apple clang's -Xpreprocessor -fopenmp with a libomp, else none -
HOMEBREW_LIBOMP = (Path("/opt/homebrew/opt/libomp"), Path("/usr/local/opt/libomp"))


def _torch_lib() -> Path | None:
    spec = importlib.util.find_spec("torch")
    locations = spec.submodule_search_locations if spec else None
    return Path(next(iter(locations))) / "lib" if locations else None


def openmp_variants(system: str | None = None) -> list[tuple[str, list[str]]]:
    """The OpenMP flags to try, best first: (name, flags). ``-fopenmp`` (g++, LLVM clang); on
    macOS then Apple clang's ``-Xpreprocessor -fopenmp`` linked to torch's own libomp.dylib where
    torch has one (one OpenMP runtime in the process: a second copy aborts it with OMP Error #15),
    else to Homebrew's, with Homebrew's omp.h when installed (the sources declare the three calls
    they make without it); last, no OpenMP (the same results, one thread)."""
    variants = [("openmp", ["-fopenmp"])]
    if (system or platform.system()) == "Darwin":
        torch_lib = _torch_lib()
        brew = next((p for p in HOMEBREW_LIBOMP if (p / "lib").is_dir()), None)
        libdir = (
            torch_lib
            if torch_lib and (torch_lib / "libomp.dylib").exists()
            else (brew / "lib" if brew else None)
        )
        if libdir is not None:
            inc = [f"-I{brew / 'include'}"] if brew and (brew / "include").is_dir() else []
            link = [f"-L{libdir}", "-lomp", f"-Wl,-rpath,{libdir}"]
            variants.append(("libomp", ["-Xpreprocessor", "-fopenmp", *inc, *link]))
    variants.append(("none", []))
    return variants


def build_flags(build: str, omp: list[str] | None = None) -> list[str]:
    """The compiler flags of ``build`` with ``omp``'s OpenMP flags (default ``-fopenmp``)."""
    base = BASE_FLAGS if omp is None else [BASE_FLAGS[0], *omp, *BASE_FLAGS[2:]]
    return base + BUILDS[build][1]


_PROBE = """int fluxo_probe(int n) {
#pragma omp parallel for reduction(+ : n)
    for (int i = 0; i < 4; i++) n += i;
    return n;
}
"""


@functools.cache
def _compiles(cxx: str, flags: tuple[str, ...]) -> bool:
    """Whether ``cxx`` builds a small OpenMP library with ``flags`` (a second or so)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(_PROBE)
        proc = subprocess.run(
            [cxx, *flags, str(src), "-o", str(Path(tmp) / "probe.so")],
            capture_output=True,
            text=True,
        )
    return proc.returncode == 0


def build_dir() -> Path:
    return Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo")) / "kernels"


def tree_source() -> str:
    """The working tree's kernels as the one translation unit they compile as."""
    return "\n".join(p.read_text() for p in SOURCES)


def _target(source: str, flags: list[str]) -> Path:
    tag = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    return build_dir() / f"fluxo_cpu_quant_{tag}.so"


def compile_source(source: str, build: str = "avx2", openmp: bool | None = None) -> Path:
    """The shared library of ``source`` for ``build`` (compiled on first use, then cached by its
    hash and flags); raises ``KernelsUnavailable`` with the reason. ``openmp``: None, the best the
    compiler has (``openmp_variants``; without any, a one-thread build and a warning); True or
    False to require one or build without."""
    code, why = _cpu_why(build, None, None)
    if why:
        raise KernelsUnavailable(code, f"{why} (the {build} build)")
    variants = openmp_variants()
    if openmp is not None:
        variants = [v for v in variants if (v[0] != "none") == openmp]
    for _, omp in variants:  # built before (or by the Docker image's build stage): no compiler
        out = _target(source, build_flags(build, omp))
        if out.exists():
            return out
    cxx = compiler()
    if not cxx:
        raise KernelsUnavailable(
            "no_compiler", "no C++ compiler (g++) on PATH, and no build of these kernels cached"
        )
    for name, omp in variants:
        flags = build_flags(build, omp)
        if name == "none" or _compiles(cxx, tuple(flags)):
            break
    if name == "none" and openmp is None:
        log.warning(
            "%s has no usable OpenMP (tried %s): the kernels build for one thread",
            cxx,
            ", ".join(" ".join(o) for n, o in variants if n != "none"),
        )
    out = _target(source, flags)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "cpu_quant.cpp"
        src.write_text(source)
        so = Path(tmp) / out.name
        proc = subprocess.run(
            [cxx, *flags, str(src), "-o", str(so)], capture_output=True, text=True
        )
        if proc.returncode != 0:  # one line says why; the log's debug level has the rest
            lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
            first = next((ln for ln in lines if "error" in ln), lines[-1])
            log.debug("%s %s failed:\n%s", cxx, " ".join(flags), proc.stderr[-4000:])
            raise KernelsUnavailable(
                "compile_failed", f"compiling the quantized kernels failed: {first.strip()[:300]}"
            )
        os.replace(so, out)  # atomic: a concurrent process sees the whole file or none
    return out


class Library(ctypes.CDLL):
    """A loaded build of the kernels: its C functions, and the two facts ``load`` sets."""

    fluxo_build: str  # the build (avx2, ...)
    fluxo_threads_ok: bool  # honours thread counts (built with OpenMP)


def load(
    source: str | None = None,
    strict: bool = True,
    build: str = "avx2",
    openmp: bool | None = None,
) -> Library:
    """Compile ``source`` (default: the working tree's) for ``build`` if needed, load it and bind
    its functions' C signatures; ``lib.fluxo_build`` names the build, ``lib.fluxo_threads_ok``
    says whether it honours thread counts (built with OpenMP; older sources always were).
    ``strict=False`` binds only the functions the library has (an older revision's build, for
    ``engine.lab.kernel_ab``). ``openmp``: as ``compile_source``."""
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded before ours resolves the name)

    src = tree_source() if source is None else source
    lib = Library(str(compile_source(src, build, openmp)))
    lib.fluxo_build = build
    lib.fluxo_threads_ok = bool(lib.fluxo_openmp()) if hasattr(lib, "fluxo_openmp") else True
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
        "fluxo_openmp": ([], c_int),
    }
    legacy = ("fluxo_decode_step", "fluxo_decode_step_phases", "fluxo_openmp")
    for name, (args, result) in signatures.items():
        if (not strict or name in legacy) and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib
