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
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


def cpu_ok() -> str | None:
    """Why this CPU cannot run the kernels, or None."""
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return "cannot read /proc/cpuinfo"
    missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
    return f"CPU lacks {', '.join(missing)}" if missing else None


def build_dir() -> Path:
    return Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo")) / "kernels"


def tree_source() -> str:
    """The working tree's kernels as the one translation unit they compile as."""
    return "\n".join(p.read_text() for p in SOURCES)


def compile_source(source: str) -> Path:
    """The shared library of ``source`` (compiled on first use, then cached by its hash); raises
    with the reason."""
    why = cpu_ok()
    if why:
        raise RuntimeError(why)
    tag = hashlib.sha256((source + " ".join(FLAGS)).encode()).hexdigest()[:16]
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
            [cxx, *FLAGS, str(src), "-o", str(so)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the quantized kernels failed: {proc.stderr[-2000:]}")
        os.replace(so, out)  # atomic: a concurrent process sees the whole file or none
    return out


def load(source: str | None = None, strict: bool = True) -> ctypes.CDLL:
    """Compile ``source`` (default: the working tree's) if needed, load it and bind its
    functions' C signatures. ``strict=False`` binds only the functions the library has (an older
    revision's build, for ``engine.lab.kernel_ab``)."""
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded before ours resolves the name)

    lib = ctypes.CDLL(str(compile_source(tree_source() if source is None else source)))
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
