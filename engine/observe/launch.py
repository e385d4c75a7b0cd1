"""Starting vLLM from .venv-vllm on the bundled model's Hugging Face checkout."""

from __future__ import annotations

from pathlib import Path


def model_checkout() -> Path:
    """The bundled SmolLM2 as a Hugging Face checkout, written from the GGUF on first use."""
    import torch

    from engine.core import model

    path = model.cache_dir() / "smollm2-135m-instruct"
    if not (path / "config.json").exists():
        model._load_smollm2(torch.float32)  # converts the GGUF once (~15 s) and saves it here
    return path
