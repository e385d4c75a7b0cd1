"""The kernels' build cache: a machine (or the Docker image's runtime stage) with no compiler
loads a build made earlier, and says why when there is none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import cpu_quant, cpu_quant_build

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "from kernels import cpu_quant; print(cpu_quant.available(), cpu_quant.unavailable_reason())"
)


def _probe(cache: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(FLUXO_CACHE=str(cache), PATH=os.path.dirname(sys.executable), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not cpu_quant.available(), reason=f"{cpu_quant.unavailable_reason()}")
def test_a_cached_build_loads_without_a_compiler(tmp_path):
    built = cpu_quant_build.compile_source(
        cpu_quant_build.tree_source(), cpu_quant_build.choose_build()
    )
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / built.name).write_bytes(built.read_bytes())
    assert _probe(tmp_path) == "True None"


@pytest.mark.skipif(cpu_quant_build.cpu_ok() is not None, reason="this CPU cannot run the kernels")
def test_no_compiler_and_no_build_is_said(tmp_path):
    assert _probe(tmp_path).startswith("False no C++ compiler")
