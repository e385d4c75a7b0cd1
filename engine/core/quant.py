"""Quantized weights for the CPU forward: the GGUF's own blocks, read as-is.

Formats (``EngineConfig.weights``):

- ``fp32``: the reference. The model's fp32 weights (for SmolLM2, the GGUF dequantized once at
  load), pre-packed for oneDNN (``engine/core/packed.py``). Every parity test runs on it.
- ``q4``: the bundled GGUF's blocks, byte for byte: Q4_1 (fp16 scale d and min m per 32 weights,
  20 bytes) for the 210 layer matrices and Q8_0 (fp16 d + 32 int8, 34 bytes) for the tied
  embedding / vocabulary projection. ``w = q * d + m`` is exactly what the fp32 reference holds
  (tested bit for bit): 96 MB of weights a step instead of 540 MB. Every product, the head's
  too, takes int8 activations (quantized per 32, as llama.cpp's Q4_1 x Q8_1), so ``q4`` is
  close to, not equal to, ``fp32``: perplexity +0.2-0.5 %, and greedy answers part from fp32's
  after some tokens (``python -m engine.bench accuracy``). For a model with no GGUF (the tiny test
  model, a local checkpoint) the fp32 weights are quantized to Q4_1 / Q8_0 here.
- ``q8``: every matrix as Q8_0, quantized here from the fp32 weights (34 bytes per 32, 143 MB a
  step).

The matmuls are ``kernels/cpu_quant.py`` (AVX2 C++ compiled at first use); every CPU step, decode
rows and prompt chunks alike, is one batch-invariant call (``FusedStep``); ``QuantLinear``, layer
by layer, is its tests' reference and serves the models the fused step does not cover.
Where it cannot be built (no compiler, no AVX2), the forward falls back to ``fp32`` and says so
(``effective``). The GGUF reading is ``engine/core/gguf_blocks.py``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

from engine.core.gguf_blocks import GGUF_NAMES, gguf_blocks
from kernels import cpu_quant

log = logging.getLogger("fluxo.engine")
_SAID: set[tuple[str, str | None]] = set()  # (weights, reason) fallbacks logged already

QK = cpu_quant.QK
# The fp32-activation products (``QuantLinear(int8_activations=False)``; the vocabulary head took
# them until it moved to int8 activations) dequantize the weight and run one oneDNN GEMM above
# this many rows: that block kernel re-expands each block per 4 rows. At 32 rows it was
# still 1.1-1.3x oneDNN's time on cache-resident matrices and 2.7x on the head (the table in
# kernels/cpu_quant.py); 48 is a guess between measured points, not a measured crossover. The
# int8 products of the layers have no such switch (QuantLinear.__call__).
DEQUANT_ABOVE_ROWS = 48


# -- block formats in torch: the reference the kernels are tested against ---------------------
def _fp16_field(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """``[N, nb, B]`` uint8 -> ``[N, nb, 1]`` fp32 from the 2 bytes at ``start`` (little endian)."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).float()


def dequantize_ref(blocks: torch.Tensor, fmt: str, k: int) -> torch.Tensor:
    """Pure-torch dequantization, rounding as gguf-py does (``d * q`` then ``+ m``): ``[N, K]``."""
    n = blocks.shape[0]
    b = blocks.view(n, k // QK, -1)  # [N, nb, bytes per block]
    d = _fp16_field(b, 0)
    if fmt == "q8_0":
        q = b[..., 2:34].view(torch.int8).float()  # [N, nb, 32]
        return (d * q).reshape(n, k)  # [N, K]
    if fmt == "q4_1":
        m = _fp16_field(b, 2)
        qs = b[..., 4:20]
        q = torch.cat((qs & 15, qs >> 4), dim=-1).float()  # [N, nb, 32]: low nibbles first
        return (d * q + m).reshape(n, k)  # [N, K]
    raise ValueError(f"unknown block format {fmt!r}")


def quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 ``[N, K]`` -> blocks ``[N, K/32 * bytes]`` (round to nearest, scales in fp16)."""
    n, k = w.shape
    if k % QK:
        raise ValueError(f"K={k} is not a multiple of {QK}")
    x = w.detach().float().reshape(n, k // QK, QK)  # [N, nb, 32]
    if fmt == "q8_0":
        d = (x.abs().amax(-1, keepdim=True) / 127).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d.float()))
        q = (x * inv).round().clamp(-127, 127).to(torch.int8)
        out = torch.cat((d.view(torch.uint8), q.view(torch.uint8)), dim=-1)  # [N, nb, 34]
    elif fmt == "q4_1":
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        d, m = ((hi - lo) / 15).half(), lo.half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d.float()))
        q = ((x - m.float()) * inv).round().clamp(0, 15).to(torch.uint8)  # [N, nb, 32]
        qs = q[..., :16] | (q[..., 16:] << 4)  # [N, nb, 16]
        out = torch.cat((d.view(torch.uint8), m.view(torch.uint8), qs), dim=-1)  # [N, nb, 20]
    else:
        raise ValueError(f"unknown block format {fmt!r}")
    return out.reshape(n, -1).contiguous()  # [N, nb * bytes]


# -- linear layers -----------------------------------------------------------------------------
@dataclass(slots=True)
class QuantWeight:
    fmt: str  # "q4_1" or "q8_0"
    blocks: torch.Tensor  # [N, K/32 * bytes] uint8
    k: int
    exact: bool  # True when the blocks are the GGUF's own (dequantized, they equal the fp32 weight)
    tiles: torch.Tensor | None = None  # the blocks in the register tiles' layout (or None)

    @property
    def n(self) -> int:
        return self.blocks.shape[0]

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


class QuantLinear:
    """``y = x @ W.T`` with W in blocks (matrices of one K may be row-stacked into one)."""

    def __init__(self, weight: QuantWeight, int8_activations: bool = True) -> None:
        self.w = weight
        self.int8 = int8_activations  # False: fp32 activations (the block-dequantizing kernel)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # int8 products at every row count: a row's result then does not depend on how its prompt
        # was chunked or cached. They were no slower than dequantize + oneDNN GEMM up to 128 rows
        # and even at 256 (3072x576, 1 thread: 32 rows 2.03 vs 5.01 ms, 128: 8.2 vs 14.0, 256:
        # 21.8 vs 19.7; thread CPU time, p10 of 30, machine at load ~10).
        if self.int8:
            return cpu_quant.qmatmul(x, self.w.blocks, self.w.fmt, tiles=self.w.tiles)
        if x.shape[0] > DEQUANT_ABOVE_ROWS:
            return torch.mm(x, cpu_quant.dequantize(self.w.blocks, self.w.fmt, self.w.k).T)
        return cpu_quant.matmul(x, self.w.blocks, self.w.fmt)


def stack(weights: list[QuantWeight]) -> QuantWeight:
    """Row-stack matrices of one format and K (q, k, v -> one qkv; gate, up -> one)."""
    fmt, k = weights[0].fmt, weights[0].k
    if any(w.fmt != fmt or w.k != k for w in weights):
        raise ValueError("only matrices of one format and K stack")
    return QuantWeight(
        fmt, torch.cat([w.blocks for w in weights]).contiguous(), k, all(w.exact for w in weights)
    )


def with_tiles(w: QuantWeight) -> QuantWeight:
    """``w`` with its tile-layout copy (``cpu_quant.tiles``), which the products at 2 or more rows
    read (Q4_1: instead of packing each 8-row tile per call); the blocks stay for one row."""
    w.tiles = cpu_quant.tiles(w.blocks, w.fmt, w.k)
    return w


def model_weights(hf_model, weights: str) -> dict[str, QuantWeight]:
    """Every projection of a Llama model (7 per layer + ``lm_head``) in the format ``weights`` asks.

    ``q4`` takes the GGUF's own blocks when the model came from the bundled GGUF and they match its
    fp32 weights bit for bit (checked here, matrix by matrix); otherwise it quantizes.
    """
    names = [
        f"model.layers.{i}.{m}"
        for i in range(len(hf_model.model.layers))
        for m in GGUF_NAMES.values()
    ]
    names.append("lm_head")
    mods = dict(hf_model.named_modules())
    from_file: dict[str, tuple[str, torch.Tensor]] = {}
    if weights == "q4" and getattr(hf_model, "_fluxo_gguf", None):
        from_file = gguf_blocks(hf_model._fluxo_gguf, hf_model.config)
    out: dict[str, QuantWeight] = {}
    for name in names:
        w = mods[name].weight.detach()
        if w.dtype != torch.float32:
            w = w.float()
        k = w.shape[1]
        if name in from_file:
            fmt, blocks = from_file[name]
            # Every 16th row checked bit for bit (all of them took ~50 s on the loaded 2-core
            # machine): enough to catch a wrong matrix or row order; tests check whole matrices.
            if blocks.shape[0] == w.shape[0] and torch.equal(
                dequantize_ref(blocks[::16].contiguous(), fmt, k), w[::16]
            ):
                out[name] = QuantWeight(fmt, blocks, k, True)
                continue
            warnings.warn(
                f"{name}: the GGUF's blocks do not reproduce the loaded weight; quantizing it",
                stacklevel=2,
            )
        fmt = "q8_0" if weights == "q8" or name == "lm_head" else "q4_1"
        out[name] = QuantWeight(fmt, quantize(w, fmt), k, False)
    return out


def weight_bytes(qw: dict[str, QuantWeight]) -> int:
    return sum(w.nbytes for w in qw.values())


@dataclass(slots=True)
class QuantModel:
    """A Llama model's projections as quantized callables, fused where rows stack."""

    weights: str  # "q4" or "q8"
    # per layer: qkv, o, gate+up, down
    layers: list[tuple[QuantLinear, QuantLinear, QuantLinear, QuantLinear]]
    head: QuantLinear
    qkv_sizes: tuple[int, int, int]  # output columns of q, k, v inside the fused qkv product
    nbytes: int  # weight bytes one step reads (every matrix once)
    exact: bool  # every matrix is the GGUF's own blocks


def build(hf_model, weights: str) -> QuantModel | None:
    """The quantized projections of ``hf_model``, or None (with a warning) where the kernels are
    unavailable or the model is not an fp32 CPU model; the caller then stays on fp32."""
    p = hf_model.lm_head.weight
    if weights == "fp32" or p.device.type != "cpu" or p.dtype != torch.float32:
        return None
    if not cpu_quant.available():
        why = cpu_quant.unavailable_reason()
        if (weights, why) not in _SAID:  # once a process: benchmarks and lessons build many
            _SAID.add((weights, why))
            log.warning("weights=%s unavailable, serving fp32: %s", weights, why)
        return None
    # Engines sharing one loaded model (benchmarks, lesson runs) share its quantized copy too.
    built = hf_model.__dict__.setdefault("_fluxo_quant", {})
    if weights not in built:
        built[weights] = _build(hf_model, weights)
    return built[weights]


def _build(hf_model, weights: str) -> QuantModel:
    qw = model_weights(hf_model, weights)
    layers = []
    for i in range(len(hf_model.model.layers)):
        pre = f"model.layers.{i}."
        w = {name: qw[pre + mod] for name, mod in GGUF_NAMES.items()}
        qkv = stack([w["attn_q"], w["attn_k"], w["attn_v"]])
        gate_up = stack([w["ffn_gate"], w["ffn_up"]])
        layers.append(
            (
                QuantLinear(with_tiles(qkv)),
                QuantLinear(with_tiles(w["attn_output"])),
                QuantLinear(with_tiles(gate_up)),
                QuantLinear(with_tiles(w["ffn_down"])),
            )
        )
    pre = "model.layers.0."
    q, k, v = (qw[pre + m].n for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
    return QuantModel(
        weights,
        layers,
        QuantLinear(with_tiles(qw["lm_head"])),
        (q, k, v),
        weight_bytes(qw),
        all(w.exact for w in qw.values()),
    )


def _desc(w: QuantWeight) -> list[int]:
    """A product as the decode step's descriptor lists it: blocks, Q4_1?, tiles (0: none)."""
    return [
        w.blocks.data_ptr(),
        int(w.fmt == "q4_1"),
        w.tiles.data_ptr() if w.tiles is not None else 0,
    ]


class FusedStep:
    """A whole forward step (every layer, the final norm, the vocabulary head) in one kernel call
    for any CPU batch, decode rows and prompt chunks alike (``cpu_quant.forward_step``): int8
    activations, the KV cache read and written in place, the threads splitting each product's
    output rows, each row's numbers independent of the others'. It is ``QuantLinear``'s path with
    the norms, rotary and attention in C++ (tests/core/test_fused_step.py holds it to that path)."""

    def __init__(self, qm: QuantModel, hf_model, cos: torch.Tensor, sin: torch.Tensor) -> None:
        cfg = hf_model.config
        inner = hf_model.model
        desc: list[int] = []
        for (qkv, o, gate_up, down), layer in zip(qm.layers, inner.layers, strict=True):
            for lin in (qkv, o, gate_up, down):
                desc += _desc(lin.w)
            desc += [
                layer.input_layernorm.weight.data_ptr(),
                layer.post_attention_layernorm.weight.data_ptr(),
            ]
        desc += _desc(qm.head.w) + [inner.norm.weight.data_ptr()]
        self.desc = torch.tensor(desc, dtype=torch.int64)
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.vocab = qm.head.w.n
        self.dims = torch.tensor(
            [
                len(qm.layers),
                cfg.hidden_size,
                heads,
                kv_heads,
                head_dim,
                cfg.intermediate_size,
                self.vocab,
            ],
            dtype=torch.int64,
        )
        self.eps_scale = torch.tensor([cfg.rms_norm_eps, head_dim**-0.5], dtype=torch.float32)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()  # [max_len, head_dim]
        self.keep = (qm, hf_model)  # the pointers above point into these
        # None, or a float64 [threads, len(cpu_quant.PHASES)] tensor that every step adds its
        # threads' seconds per phase to (engine.lab.roofline's step breakdown)
        self.phases: torch.Tensor | None = None

    @staticmethod
    def supports(hf_model) -> bool:
        cfg = hf_model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return (
            getattr(cfg, "hidden_act", "") == "silu"
            and head_dim % 8 == 0
            and not getattr(cfg, "attention_bias", False)
            and not getattr(cfg, "mlp_bias", False)
        )

    def __call__(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        ctx_slots: torch.Tensor,
        ctx_start: torch.Tensor,
        head_rows: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """``h [T, hidden]`` embeddings (overwritten) -> logits ``[len(head_rows), vocab]``; row
        ``b`` attends to ``positions[b] + 1`` slots of ``ctx_slots`` from ``ctx_start[b]``."""
        logits = torch.empty(head_rows.shape[0], self.vocab, dtype=torch.float32)
        h, positions = h.contiguous(), positions.contiguous()
        w, c, s, r = (t.contiguous() for t in (write_slots, ctx_slots, ctx_start, head_rows))
        head = (self.desc, self.dims, self.eps_scale)
        cpu_quant.forward_step(
            *head, h, positions, self.cos, self.sin, k, v, w, c, s, r, logits, self.phases
        )
        return logits
