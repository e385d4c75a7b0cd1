"""Shared fixtures: the tiny float64 model (exact arithmetic) and SmolLM2 (the real one), each
loaded once."""

from __future__ import annotations

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import Engine
from engine.core.model import load_model, tiny_llama


@pytest.fixture(scope="session")
def tiny():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2", "float32")


@pytest.fixture
def make_tiny_engine(tiny):
    model, tok = tiny

    def make(**overrides) -> Engine:
        cfg = dict(
            model="tiny",
            dtype="float64",
            max_slots=4,
            kv_blocks=64,
            block_size=4,
            chunk_budget=8,
            fill_timeout_s=0.0,
        )
        cfg.update(overrides)
        return Engine(EngineConfig(**cfg), model=model, tokenizer=tok)

    return make


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests (``pytest.mark.usefixtures``): the tiny model gains
    nothing from intra-op threads, and on a busy 2-core machine they cost ~100x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
