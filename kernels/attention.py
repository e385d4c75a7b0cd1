"""Torch reference attention over a paged KV cache.

The cache of one layer is a flat tensor ``[num_blocks * block_size, kv_heads, head_dim]``; a token
of a sequence lives at slot ``block_table[pos // block_size] * block_size + pos % block_size``.
The runner turns block tables into slot indices once per step, and every layer reuses them.
GQA is handled by SDPA's ``enable_gqa`` (query heads grouped over fewer KV heads, no copy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slots_from_block_tables(
    block_tables: torch.Tensor, ctx_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``[B, max_blocks]`` block ids -> ``[B, max_len]`` flat slot ids (padding points at slot
    0)."""
    max_len = int(ctx_lens.max()) if ctx_lens.numel() else 0
    pos = torch.arange(max_len, device=block_tables.device)
    blocks = block_tables.long().gather(
        1,
        (pos // block_size).expand(block_tables.shape[0], -1).clamp(max=block_tables.shape[1] - 1),
    )
    slots = blocks * block_size + pos % block_size
    return torch.where(pos[None, :] < ctx_lens[:, None], slots, torch.zeros_like(slots))


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx_slots: torch.Tensor,
    q_start: int,
    scale: float,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``q`` ``[Tq, H, D]`` (absolute positions ``q_start..q_start+Tq-1``) over
    the sequence's context ``ctx_slots`` (``q_start + Tq`` slots, cached tokens then new ones).

    When nothing was cached before (``q_start == 0``) the freshly projected ``k_new``/``v_new`` are
    the whole context, so the gather from the cache is skipped.
    """
    tq = q.shape[0]
    if q_start == 0 and k_new is not None:
        assert v_new is not None  # given with k_new
        k, v = k_new, v_new
    else:
        k, v = k_cache.index_select(0, ctx_slots), v_cache.index_select(0, ctx_slots)
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q_start == 0:
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        ctx = torch.arange(k.shape[0], device=q.device)
        mask = ctx[None, :] <= (q_start + torch.arange(tq, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out[0].transpose(0, 1)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx_slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: ``q`` ``[B, H, D]`` over padded contexts ``ctx_slots``
    ``[B, L]``.

    ``mask`` ``[B, 1, 1, L]`` is True where a slot belongs to the sequence; the runner builds it
    once per step because it is the same for every layer.
    """
    b, n = ctx_slots.shape
    flat = ctx_slots.reshape(
        -1
    )  # index_select on a flat index is ~3x faster than 2-D advanced indexing
    k = k_cache.index_select(0, flat).view(b, n, *k_cache.shape[1:]).transpose(1, 2)
    v = v_cache.index_select(0, flat).view(b, n, *v_cache.shape[1:]).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q[:, :, None], k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out[:, :, 0]


def decode_mask(ctx_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    return (torch.arange(max_len, device=ctx_lens.device)[None, :] < ctx_lens[:, None])[
        :, None, None, :
    ]


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """Block-table form of :func:`decode_attention`; the reference the Triton kernel is tested
    against.

    ``k_cache``/``v_cache``: ``[num_blocks * block_size, KVH, D]``; ``block_tables``:
    ``[B, max_blocks]`` int; ``ctx_lens``: ``[B]`` int, each >= 1.
    """
    ctx_lens = ctx_lens.long()
    slots = slots_from_block_tables(block_tables, ctx_lens, block_size)
    return decode_attention(
        q, k_cache, v_cache, slots, decode_mask(ctx_lens, slots.shape[1]), scale
    )
