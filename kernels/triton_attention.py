"""Triton paged-attention decode kernel: same contract as
:func:`kernels.attention.paged_decode_attention_torch`.

One program per (sequence, KV head). It loads each K/V block of that head once and uses it for every
query head of the GQA group, walking the sequence's block table with an online softmax (running max
and sum), so the context is never gathered into a padded copy as the torch reference does.

Triton is optional: the module imports without it (``TRITON_AVAILABLE`` says so) and the call
raises. CPU tensors only work under Triton's interpreter, which Triton picks when
``@triton.jit`` runs, i.e. when this module is imported: set ``TRITON_INTERPRET=1`` before
importing it.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    TRITON_AVAILABLE: bool = True
    _IMPORT_ERROR: str = ""
except ImportError as exc:  # the CPU image ships without triton; the reference covers it
    TRITON_AVAILABLE = False
    _IMPORT_ERROR = str(exc)

INTERPRETED: bool = False

if TRITON_AVAILABLE:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        bt_ptr,
        lens_ptr,
        out_ptr,
        scale,
        stride_qb,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_bt,
        stride_ob,
        stride_oh,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)  # padded to a power of two (tl.arange needs one); rows masked
        d = tl.arange(0, HEAD_DIM)
        t = tl.arange(0, BLOCK_SIZE)
        heads = kvh * GROUP + g
        g_ok = g < GROUP
        q = _load_rows(q_ptr + b * stride_qb, heads, d, g_ok, stride_qh)
        q = q.to(tl.float32) * scale  # fold the scale into q once instead of into every score
        ctx_len = tl.load(lens_ptr + b).to(tl.int32)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        lsum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        # Only blocks holding at least one token are visited, so every block has a finite max and
        # the first rescale is exp(-inf) = 0, never NaN; block-table padding is never read.
        for i in range(0, tl.cdiv(ctx_len, BLOCK_SIZE)):
            # int64: slot * stride overflows int32 on big caches.
            block = tl.load(bt_ptr + b * stride_bt + i).to(tl.int64)
            t_ok = i * BLOCK_SIZE + t < ctx_len
            slot = block * BLOCK_SIZE + t
            k = _load_rows(k_ptr + kvh * stride_kh, slot, d, t_ok, stride_kt)  # [BLOCK, D]
            v = _load_rows(v_ptr + kvh * stride_vh, slot, d, t_ok, stride_vt)
            m, lsum, acc = _online_softmax_step(q, k, v, t_ok, m, lsum, acc)
        # ctx_len == 0 (a padded batch row) yields zeros rather than 0/0.
        out = acc / tl.where(lsum > 0.0, lsum, 1.0)[:, None]
        out_rows = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])

    # base[rows[r] * stride + d]: [len(rows), HEAD_DIM], zeros where ok is false.
    @triton.jit
    def _load_rows(base, rows, d, ok, stride):
        return tl.load(base + rows[:, None] * stride + d[None, :], mask=ok[:, None], other=0.0)

    # One K/V block [BLOCK, D] folded into the running max m, sum lsum and output acc of the
    # group's query rows q [GROUP_PAD, D] (fp32, scaled); tokens where t_ok is false count not.
    @triton.jit
    def _online_softmax_step(q, k, v, t_ok, m, lsum, acc):
        # Broadcast-and-reduce rather than tl.dot: GQA groups are smaller than tl.dot's 16-row
        # minimum.
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GROUP_PAD, BLOCK]
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        return m_new, lsum, acc

    # Triton chose compiled vs interpreted at decoration time; remember which, for a clear CPU
    # error.
    INTERPRETED = not isinstance(_paged_decode_kernel, JITFunction)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_size: int,
) -> None:
    """Raises where the kernel cannot run here; asserts the shapes, dtypes and strides it
    assumes."""
    if not TRITON_AVAILABLE:
        raise RuntimeError(
            f"Triton is not installed ({_IMPORT_ERROR}); `pip install triton` or use "
            "kernels.attention.paged_decode_attention_torch"
        )
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing "
            "kernels.triton_attention, or use kernels.attention.paged_decode_attention_torch"
        )
    bsz, n_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    assert _is_pow2(head_dim), f"head_dim must be a power of two, got {head_dim}"
    assert _is_pow2(block_size), f"block_size must be a power of two, got {block_size}"
    assert n_heads % kv_heads == 0, f"{n_heads} query heads do not group over {kv_heads} KV heads"
    assert k_cache.shape == v_cache.shape and k_cache.shape[2] == head_dim
    assert block_tables.shape[0] == bsz and ctx_lens.shape == (bsz,)
    assert not block_tables.dtype.is_floating_point and not ctx_lens.dtype.is_floating_point
    # The kernel walks the head dim with unit stride and the block table row with unit stride.
    assert (
        q.stride(2) == 1
        and k_cache.stride(2) == 1
        and v_cache.stride(2) == 1
        and block_tables.stride(1) == 1
    )
    assert len({t.device for t in (q, k_cache, v_cache, block_tables, ctx_lens)}) == 1, (
        "all inputs on one device"
    )


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """``q`` ``[B, H, D]`` over the paged cache ``[num_blocks * block_size, KVH, D]``; returns
    ``[B, H, D]`` in ``q``'s dtype. ``block_tables`` ``[B, max_blocks]`` int, ``ctx_lens`` ``[B]``
    int (>= 1; 0 gives zeros)."""
    _check(q, k_cache, v_cache, block_tables, ctx_lens, block_size)
    bsz, n_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if bsz == 0:
        return out
    group = n_heads // kv_heads
    _paged_decode_kernel[(bsz, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        ctx_lens,
        out,
        float(scale),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
    )
    return out
