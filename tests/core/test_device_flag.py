"""``cuda`` asked for on a machine without a GPU is a coded error at start, never a silent CPU
run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.errors import DeviceUnavailable

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
    pytest.mark.slow,  # make test-fast leaves it out
]


def test_engine_refuses_cuda_without_a_gpu(tiny):
    model, tok = tiny
    with pytest.raises(DeviceUnavailable) as err:
        Engine(
            EngineConfig(model="tiny", dtype="float64", device="cuda"), model=model, tokenizer=tok
        )
    assert err.value.code == "device_unavailable" and "cuda" in err.value.message


def test_serve_exits_with_the_code_naming_the_device():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.serve",
            "--model",
            "tiny",
            "--device",
            "cuda",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 1 and "device_unavailable" in out.stderr and "cuda" in out.stderr
