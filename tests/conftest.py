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
# (what took over ~5 s a test in a full run: lesson replays, whole labs, subprocess servers)
SLOW_FILES = (
    "test_lessons.py",
    "test_live.py",
    "test_launcher_shapes.py",
    "test_lab.py",
    "test_load.py",
    "test_protocol.py",
    "test_device_flag.py",
    "test_triton_kernel.py",
    "test_kernel_build.py",
    "test_model_loading.py",
    "test_showcase.py",
)


def _mentions_smollm2(item) -> bool:
    import inspect

    fn = getattr(item, "function", None)
    try:
        return fn is not None and '"smollm2"' in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items):
    """Marks every test with the lanes it belongs to: ``model`` (SmolLM2: its fixture, or a server
    or engine started on it), ``browser`` (Chromium), ``slow`` (lesson replays, whole labs)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        path = str(item.path)
        if "smollm2" in names or _mentions_smollm2(item):
            item.add_marker(pytest.mark.model)
        if "browser" in names or "/e2e/" in path or item.path.name == "test_rows_js.py":
            item.add_marker(pytest.mark.browser)
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
