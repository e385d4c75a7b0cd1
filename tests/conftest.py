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

    def make(weights_of=None, **overrides) -> Engine:
        """``weights_of``: another (model, tokenizer) than the float64 tiny one (set its dtype)."""
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
        m, t = weights_of or (model, tok)
        return Engine(EngineConfig(**cfg), model=m, tokenizer=t)

    return make


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests (``pytest.mark.usefixtures``): the tiny model gains
    nothing from intra-op threads, and on a busy 2-core machine they cost ~100x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- lanes: `make test-fast` runs what needs neither SmolLM2, nor Chromium, nor a lesson replay ----
# Declared, not guessed: ``model`` from the ``smollm2`` fixture or the test's own mark (a test that
# starts a server or CLI on SmolLM2 marks itself; the server fixture refuses an unmarked one),
# ``browser`` from the ``browser`` fixture or the e2e folder, ``slow`` by each module's pytestmark.


def pytest_collection_modifyitems(config, items):
    """Marks what a test's fixtures and folder declare: ``model`` (the ``smollm2`` fixture) and
    ``browser`` (the ``browser`` fixture, or ``tests/e2e/``)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "smollm2" in names:
            item.add_marker(pytest.mark.model)
        if "browser" in names or "e2e" in item.path.parts:
            item.add_marker(pytest.mark.browser)
