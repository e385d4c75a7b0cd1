"""Attention ops over Fluxo's paged KV cache: a torch reference (any device) and Triton kernels
(CUDA)."""

from kernels.attention import (
    decode_attention,
    paged_decode_attention,
    prefill_attention,
    slots_from_block_tables,
)

__all__ = [
    "decode_attention",
    "paged_decode_attention",
    "prefill_attention",
    "slots_from_block_tables",
]
