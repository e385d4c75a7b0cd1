"""Engine configuration: one slotted dataclass; the live-tunable fields are validated in one
place."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from engine.core.errors import InvalidConfig, UnknownMode
from engine.core.numbers import is_int, is_number
from engine.core.policy import registry

POLICIES = registry.BUILTIN_NAMES  # ("static", "continuous", "chunked"); loaded ones: names()
RUNNERS = ("sync", "async")
KV_LAYOUTS = ("reserved", "paged")  # the naive one first, as in POLICIES and RUNNERS
DTYPES = ("float32", "bfloat16", "float64")
DEVICES = ("cpu", "cuda")
# Weight formats of the CPU float32 forward (engine/core/quant.py): the fp32 reference, the GGUF's
# own Q4_1/Q8_0 blocks ("q4"), or Q8_0 throughout ("q8"). Not live: it changes the loaded weights.
WEIGHTS = ("fp32", "q4", "q8")


def lab_weights(model: str = "smollm2") -> str:
    """The weights the lab serves by default, and so the ones every lesson run, recording and
    comparison uses (one engine for the page and the lessons): the bundled GGUF's own q4 blocks
    for SmolLM2, fp32 for other models. Where the q4 kernels cannot build, the forward falls back
    to fp32 and says so (``engine.core.quant.build``), on the page and in the lessons alike."""
    return "q4" if model == "smollm2" else "fp32"


# What a presenter may change between steps, without reloading the model.
LIVE_FIELDS = (
    "policy",
    "runner",
    "max_slots",
    "kv_layout",
    "kv_blocks",
    "chunk_budget",
    "fill_timeout_s",
    "host_work_ms",
    "prefix_cache",
)

# vLLM's names for the same switches, accepted beside Fluxo's (docs/protocol.md, "vLLM's flags"):
# vLLM always chunks prefills within --max-num-batched-tokens, Fluxo's chunked policy does.
VLLM_FLAGS: dict[str, str] = {
    "max_slots": "--max-num-seqs",
    "chunk_budget": "--max-num-batched-tokens",
    "prefix_cache": "--enable-prefix-caching",
}

# The fields `python -m engine.serve` sets with one flag each, field: (flag, choices, help); the
# flag's default and type are the field's own (tests/test_serve_flags.py holds every live field to
# one). `--weights`, `--device`, `--threads` and `--cpus` are written by hand in engine/serve.py.
FLAGS: dict[str, tuple[str, tuple[str, ...] | None, str | None]] = {
    "model": ("--model", None, "smollm2 (bundled), tiny (random, for tests) or a checkpoint dir"),
    "dtype": ("--dtype", DTYPES, None),
    "max_model_len": ("--max-model-len", None, "longest context (prompt + answer) in tokens"),
    "policy": ("--policy", None, f"{', '.join(POLICIES)} or one of --policy-file"),
    "runner": ("--runner", RUNNERS, None),
    "max_slots": ("--slots", None, None),
    "kv_blocks": ("--kv-blocks", None, "the KV budget, in blocks of block_size tokens"),
    "kv_layout": ("--kv-layout", KV_LAYOUTS, None),
    "block_size": ("--block-size", None, "tokens per KV block"),
    "chunk_budget": ("--chunk-budget", None, "tokens per step under the chunked policy"),
    "prefix_cache": ("--prefix-cache", None, "reuse computed prompt prefixes' KV (lesson 10)"),
    "fill_timeout_s": ("--fill-timeout-s", None, "static: seconds a partial batch waits to fill"),
    "host_work_ms": ("--host-work-ms", None, "simulated host work in each step, ms (lesson 9)"),
}


@dataclass(slots=True)
class EngineConfig:
    model: str = (
        "smollm2"  # "smollm2" (bundled GGUF), "tiny" (random, for tests) or a local checkpoint dir
    )
    dtype: str = "float32"
    device: str = "cpu"  # "cpu" or "cuda"; on CUDA the decode attention is the Triton paged kernel
    policy: str = "continuous"
    runner: str = "sync"
    max_slots: int = 8
    kv_layout: str = "paged"
    kv_blocks: int = 1024  # KV budget, in blocks of block_size tokens
    block_size: int = 16
    chunk_budget: int = 64  # tokens per step under the chunked policy (decodes included)
    fill_timeout_s: float = 0.5  # static: how long a partial batch waits to fill before it starts
    # Reuse the KV blocks of prompt prefixes already computed (engine/core/block_manager.py); off
    # forgets every cached block. On by default: `python -m engine.bench prefix` measures its cost.
    prefix_cache: bool = True
    # Simulated host work: ms of extra host-side delay in every step's prepare stage (a teaching
    # knob: it stands in for a GPU host loop's Python, tensor building and launches). The sync
    # runner leaves the device idle for it; the async runner hides it under the previous compute.
    host_work_ms: float = 0.0
    max_model_len: int = 2048
    max_new_tokens_limit: int = 1024
    seed: int = 0
    threads: int | None = None  # torch threads; None: torch's default (one per core)
    cpus: tuple[int, ...] | None = (
        None  # cores the process computes on (see engine/core/cpu.py); None: all
    )
    weights: str = (
        "fp32"  # see WEIGHTS; the serve/bench flags default to "q4" (6x fewer bytes a step)
    )
    # CUDA only: replay captured graphs for decode-only steps (engine/core/cuda_exec.py); off runs
    # every step eagerly, so a lesson can compare. Not live: the graphs are captured at start.
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.policy not in registry.names():
            raise UnknownMode(
                f"unknown policy {self.policy!r}; choose one of {', '.join(registry.names())}"
            )
        if self.runner not in RUNNERS:
            raise UnknownMode(f"unknown runner {self.runner!r}; choose one of {', '.join(RUNNERS)}")
        if self.kv_layout not in KV_LAYOUTS:
            raise UnknownMode(
                f"unknown KV layout {self.kv_layout!r}; choose one of {', '.join(KV_LAYOUTS)}"
            )
        if self.device not in DEVICES:
            raise UnknownMode(f"unknown device {self.device!r}; choose cpu or cuda")
        if self.dtype not in DTYPES:
            raise UnknownMode(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.weights not in WEIGHTS:
            raise UnknownMode(
                f"unknown weights {self.weights!r}; choose one of {', '.join(WEIGHTS)}"
            )
        for name, lo, hi in (
            ("max_slots", 1, 256),
            ("kv_blocks", 1, 1 << 20),
            ("block_size", 1, 1024),
            ("chunk_budget", 1, 1 << 16),
            ("max_model_len", 2, 1 << 17),
        ):
            value = getattr(self, name)
            if not is_int(value) or not lo <= value <= hi:
                raise InvalidConfig(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.threads is not None and (not is_int(self.threads) or not 1 <= self.threads <= 1024):
            raise InvalidConfig(f"threads must be an integer in [1, 1024], got {self.threads!r}")
        if self.cpus is not None and (
            not isinstance(self.cpus, tuple)
            or not self.cpus
            or not all(isinstance(c, int) and c >= 0 for c in self.cpus)
        ):
            raise InvalidConfig(f"cpus must be a non-empty tuple of core ids, got {self.cpus!r}")
        if (
            not isinstance(self.fill_timeout_s, (int, float))
            or not 0 <= self.fill_timeout_s <= 3600
        ):
            raise InvalidConfig(
                f"fill_timeout_s must be in [0, 3600] seconds, got {self.fill_timeout_s!r}"
            )
        if not isinstance(self.cuda_graphs, bool):
            raise InvalidConfig(f"cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if not isinstance(self.prefix_cache, bool):
            raise InvalidConfig(f"prefix_cache must be true or false, got {self.prefix_cache!r}")
        if not is_number(self.host_work_ms) or not 0 <= self.host_work_ms <= 1000:
            raise InvalidConfig(f"host_work_ms must be in [0, 1000] ms, got {self.host_work_ms!r}")

    def updated(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes``: values as a control message sent them, checked by ``replace``'s
        ``__post_init__``."""
        unknown = set(changes) - set(LIVE_FIELDS)
        if unknown:
            raise InvalidConfig(
                f"cannot change {', '.join(sorted(unknown))} live; live fields: "
                f"{', '.join(LIVE_FIELDS)}"
            )
        return replace(self, **changes)

    def live(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in LIVE_FIELDS}
