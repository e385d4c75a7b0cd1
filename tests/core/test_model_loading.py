"""What ``--model`` accepts, as an engineer expects of a serving engine: a local checkpoint, or a
Hugging Face id already in the local hub cache (read offline, never downloaded); an architecture
the Llama forward does not implement is refused with a code instead of giving wrong text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import engine
from engine.core.errors import UnsupportedModel
from engine.core.model import checkpoint_dir

pytestmark = pytest.mark.slow  # make test-fast leaves it out (lesson replays, whole labs)

ROOT = Path(__file__).resolve().parents[2]


def _hub_cache(tmp: Path, repo: str, files: dict[str, str]) -> Path:
    """A hub cache laid out as huggingface_hub writes one: refs/main -> snapshots/<rev>/files."""
    base = tmp / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("0123abcd")
    return snap


def _resolve(cache: Path, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    code = (
        "from engine.core.model import checkpoint_dir\n"
        "from engine.core.errors import FluxoError\n"
        f"try:\n print(checkpoint_dir({name!r}))\n"
        "except FluxoError as e:\n print(e.code, e.message)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_cached_hub_id_resolves_offline_and_an_uncached_one_is_refused(tmp_path):
    snap = _hub_cache(
        tmp_path, "org/tiny-llama", {"config.json": json.dumps({"model_type": "llama"})}
    )
    out = _resolve(tmp_path, "org/tiny-llama")
    assert out.stdout.strip() == str(snap), out.stderr
    out = _resolve(tmp_path, "org/not-here")
    assert out.stdout.startswith("unsupported_model") and "never downloads" in out.stdout


@pytest.mark.parametrize("kind", ["qwen3", "gemma", None])
def test_an_architecture_the_forward_does_not_implement_is_refused(tmp_path, kind):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": kind} if kind else {}))
    with pytest.raises(UnsupportedModel) as err:
        checkpoint_dir(str(tmp_path))
    assert err.value.code == "unsupported_model" and "wrong text" in err.value.message


def test_a_name_that_is_neither_a_folder_nor_an_id_is_refused():
    with pytest.raises(UnsupportedModel):
        checkpoint_dir("no-such-model")


def test_the_converted_smollm2_checkpoint_serves_as_a_local_model(smollm2):
    """The bundled model's converted copy is an ordinary Llama checkpoint: it loads by its folder,
    through the same checks."""
    from engine.core.model import cache_dir, load_model

    folder = cache_dir() / "smollm2-135m-instruct"
    model, tok = load_model(str(folder))
    assert model.config.model_type == "llama" and tok.encode("Hello")


def test_version_is_the_packages():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert engine.__version__ == pyproject["project"]["version"]
    out = subprocess.run(
        [sys.executable, "-m", "engine.serve", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == f"Fluxo {engine.__version__}"
