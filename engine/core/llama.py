"""Fluxo's own forward for Llama-family models over a flat, ragged batch and a paged KV cache.

The weights and the small per-token modules (projections, norms, MLP, rotary table) are the
transformers model's own, so numerics match it; what is ours is the batch layout and attention:
every scheduled token of every sequence sits in one flat ``[T, hidden]`` tensor, K/V are written
into the paged cache by slot index, and attention reads back through those slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.core.packed import Linear, packable, packed
from engine.core.quant import FusedStep
from engine.core.quant import build as build_quant
from kernels.attention import decode_attention, prefill_attention

if TYPE_CHECKING:  # types only: the layers of a model_type "llama" checkpoint (model.ARCHITECTURES)
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer


@dataclass(slots=True)
class PrefillSpan:
    start: int  # offset of the sequence's new tokens in the flat batch
    end: int
    q_start: int  # absolute position of its first new token (= tokens already cached)
    ctx_slots: torch.Tensor  # [q_start + (end - start)] cache slots of the whole context


@dataclass(slots=True)
class ForwardBatch:
    """Flat batch: decode tokens first (one per sequence), then each prefill's tokens."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    write_slots: torch.Tensor  # [T] where each token's K/V goes
    num_decode: int
    decode_slots: torch.Tensor | None  # [B, L] padded context slots of the decode rows
    decode_mask: torch.Tensor | None  # [B, 1, 1, L]
    prefills: list[PrefillSpan] = field(default_factory=list)
    logits_rows: torch.Tensor | None = None  # rows of the flat batch whose next token is sampled
    decode_tables: torch.Tensor | None = (
        None  # [B, max_blocks] block tables of the decode rows (Triton path)
    )
    decode_lens: torch.Tensor | None = None  # [B] their context lengths
    carry_dst: torch.Tensor | None = None  # input positions filled from the in-flight step's output
    carry_src: torch.Tensor | None = None  # ... from these rows of it


# The batch's host tensors by name, as they travel to the device (carry-over indices aside).
BATCH_TENSORS = (
    "input_ids",
    "positions",
    "write_slots",
    "decode_slots",
    "decode_mask",
    "logits_rows",
    "decode_tables",
    "decode_lens",
)


def projections(layer: LlamaDecoderLayer) -> tuple[torch.nn.Linear, ...]:
    """A decoder layer's seven weight matrices, in the order the forward uses them:
    q, k, v, o, gate, up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return (
        attn.q_proj,
        attn.k_proj,
        attn.v_proj,
        attn.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )


class KVCache:
    """Per layer, one flat K and one flat V tensor of ``[slots, kv_heads, head_dim]``."""

    def __init__(
        self,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks  # the last block is scratch space for static dead slots
        shape = (layers, num_blocks * block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)

    def to(self, device: torch.device) -> KVCache:
        self.k, self.v = self.k.to(device), self.v.to(device)
        return self

    @property
    def scratch_slot(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    def resized(self, num_blocks: int) -> KVCache:
        """A bigger cache holding the same contents at the same slots (used when the budget
        grows)."""
        layers, _, kvh, d = self.k.shape
        new = KVCache(layers, num_blocks, self.block_size, kvh, d, self.k.dtype).to(self.k.device)
        n = (self.num_blocks - 1) * self.block_size
        new.k[:, :n] = self.k[:, :n]
        new.v[:, :n] = self.v[:, :n]
        return new


class LlamaForward:
    def __init__(self, hf_model, max_len: int, weights: str = "fp32") -> None:
        cfg = hf_model.config
        self.model = hf_model
        self.layers = hf_model.model.layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.dtype = next(hf_model.parameters()).dtype
        self.device = next(hf_model.parameters()).device
        self.triton_decode = None
        if self.device.type == "cuda":
            from kernels.triton_attention import TRITON_AVAILABLE, paged_decode_attention_triton

            self.triton_decode = paged_decode_attention_triton if TRITON_AVAILABLE else None
        self.fast = packable(hf_model.lm_head.weight)
        # Quantized projections (engine/core/quant.py): None on the fp32 reference path, and where
        # the kernels cannot run (then ``weights`` says "fp32": what the forward really reads).
        self.quant = build_quant(hf_model, weights) if weights != "fp32" else None
        self.weights = self.quant.weights if self.quant is not None else "fp32"
        # Per layer: q, k, v, o, gate, up, down, as packed callables where the weights allow
        # (the quantized path reads self.quant.layers instead).
        if self.quant is None:
            self.proj_layers: list[tuple[Linear, ...]] = [
                tuple(packed(m) for m in projections(layer)) if self.fast else projections(layer)
                for layer in self.layers
            ]
            if self.fast:
                self.packed_head = packed(hf_model.lm_head)
        # The rotary table from the model's own module, once: identical numbers, no per-step cost.
        probe = torch.zeros(1, dtype=self.dtype)
        cos, sin = hf_model.model.rotary_emb(
            probe.to(self.device), torch.arange(max_len, device=self.device)[None]
        )
        self.cos, self.sin = cos[0], sin[0]
        # Every step on quantized CPU weights, decode rows and prompt chunks alike: the whole step
        # in one kernel call (quant.FusedStep).
        self.fused = None
        if self.quant is not None and FusedStep.supports(hf_model):
            self.fused = FusedStep(self.quant, hf_model, self.cos, self.sin)

    def new_cache(self, num_blocks: int, block_size: int) -> KVCache:
        cache = KVCache(
            len(self.layers), num_blocks, block_size, self.num_kv_heads, self.head_dim, self.dtype
        )
        return cache.to(self.device)

    def _decode(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, batch: ForwardBatch, bs: int
    ) -> torch.Tensor:
        if self.triton_decode is not None and batch.decode_tables is not None:
            assert batch.decode_lens is not None  # set with the tables
            return self.triton_decode(
                q, kc, vc, batch.decode_tables, batch.decode_lens, bs, self.scale
            )
        assert batch.decode_slots is not None and batch.decode_mask is not None  # decode rows
        return decode_attention(q, kc, vc, batch.decode_slots, batch.decode_mask, self.scale)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Returns logits ``[len(batch.logits_rows), vocab]``."""
        if self.fused is not None and not cache.k.is_cuda:
            return self._fused_step(self.fused, batch, cache)
        h = self.model.model.embed_tokens(batch.input_ids)  # [T, hidden]
        cos = self.cos[batch.positions][:, None, :]  # [T, 1, head_dim]
        sin = self.sin[batch.positions][:, None, :]
        for i, layer in enumerate(self.layers):  # one call per layer, nothing else added
            h = self._layer(i, layer, h, cos, sin, batch, cache)
        h = self.model.model.norm(h[batch.logits_rows])
        return self._lm_head(h)

    def _layer(
        self,
        i: int,
        layer: LlamaDecoderLayer,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        cache: KVCache,
    ) -> torch.Tensor:
        """Decoder layer ``i`` over the flat batch: ``h [T, hidden] -> [T, hidden]``, writing the
        batch's K/V into the cache on the way."""
        t = h.shape[0]
        x = layer.input_layernorm(h)
        o_proj: Linear  # a QuantLinear on the quantized path, else the (packed) module
        down: Linear
        if self.quant is not None:  # q, k, v in one product over the row-stacked weights
            qkv, o_proj, gate_up, down = self.quant.layers[i]
            q, k, v = qkv(x).split(self.quant.qkv_sizes, dim=1)
        else:
            q_proj, k_proj, v_proj, o_proj, gate, up, down = self.proj_layers[i]
            q, k, v = q_proj(x), k_proj(x), v_proj(x)
        q = q.view(t, self.num_heads, self.head_dim)  # [T, heads * d] -> [T, heads, d]
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, kv_heads * d] -> [T, kv_heads, d]
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q = q * cos + self._rotate_half(q) * sin
        k = k * cos + self._rotate_half(k) * sin
        kc, vc = cache.k[i], cache.v[i]
        kc.index_copy_(0, batch.write_slots, k)
        vc.index_copy_(0, batch.write_slots, v)
        if not batch.prefills:
            o = self._decode(q, kc, vc, batch, cache.block_size)
        else:
            o = self._mixed_attention(q, k, v, kc, vc, batch, cache.block_size)
        h = h + o_proj(o.reshape(t, self.num_heads * self.head_dim))  # [T, heads, d] -> [T, hd]
        x = layer.post_attention_layernorm(h)
        if self.quant is not None:
            g, u = gate_up(x).chunk(2, dim=1)  # [t, 2 * inter] -> two [t, inter] views
            return h + down(layer.mlp.act_fn(g) * u)
        if self.fast:
            return h + down(layer.mlp.act_fn(gate(x)) * up(x))
        return h + layer.mlp(x)

    def _mixed_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        batch: ForwardBatch,
        bs: int,
    ) -> torch.Tensor:
        """Attention of a batch holding prefills: the decode rows first, then each prefill span
        over its own context; ``[T, heads, d]`` in the batch's row order."""
        nd = batch.num_decode
        parts = [self._decode(q[:nd], kc, vc, batch, bs)] if nd else []
        for p in batch.prefills:
            parts.append(
                prefill_attention(
                    q[p.start : p.end],
                    kc,
                    vc,
                    p.ctx_slots,
                    p.q_start,
                    self.scale,
                    k[p.start : p.end],
                    v[p.start : p.end],
                )
            )
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _fused_step(self, fused: FusedStep, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Any batch on quantized weights (decode rows, prompt chunks, both): one kernel call."""
        ctx_slots, ctx_start = fused_contexts(batch)
        h = self.model.model.embed_tokens(batch.input_ids)  # [T, hidden]
        rows = batch.logits_rows
        if rows is None:
            rows = torch.arange(batch.input_ids.shape[0])
        return fused(
            h, batch.positions, batch.write_slots, ctx_slots, ctx_start, rows, cache.k, cache.v
        )  # [len(rows), vocab]

    def _lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection, the largest matrix read each step (49152 x 576 for SmolLM2).

        Packed when possible; otherwise, on the CPU, a few-row product streams it at ~7 GB/s when
        done whole and ~11 GB/s in 2048-row slices (17.9 -> 11.4 ms at 8 rows).
        """
        if self.quant is not None:
            return self.quant.head(h)
        if self.fast:
            return self.packed_head(h)
        head = self.model.lm_head
        if h.is_cuda or head.bias is not None or h.shape[0] > 64:
            return head(h)
        w = head.weight
        out = torch.empty(h.shape[0], w.shape[0], dtype=h.dtype)
        for i in range(0, w.shape[0], 2048):
            torch.mm(h, w[i : i + 2048].T, out=out[:, i : i + 2048])
        return out


def fused_contexts(batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's context as the fused step reads it: the lists back to back, and where each
    row's list starts. A decode row has its own (its padded ``decode_slots`` row); the rows of a
    prompt chunk share their span's ``ctx_slots`` and differ only in length (position + 1), which
    is what makes the chunk causal."""
    parts, starts, offset = [], [], 0
    if batch.num_decode:
        slots = batch.decode_slots  # [D, L]
        assert slots is not None  # the model runner builds them for every decode row
        width = slots.shape[1]
        parts.append(slots.reshape(-1))  # [D, L] -> [D * L]
        starts.append(torch.arange(batch.num_decode, dtype=torch.long) * width)
        offset = batch.num_decode * width
    for span in batch.prefills:
        parts.append(span.ctx_slots)
        starts.append(torch.full((span.end - span.start,), offset, dtype=torch.long))
        offset += span.ctx_slots.shape[0]
    if not parts:
        return torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(parts), torch.cat(starts)
