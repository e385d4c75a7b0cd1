"""The bundled GGUF's Q4_1 / Q8_0 blocks, read as-is (for ``engine.core.quant``'s ``q4``).

A small header reader of its own (gguf-py decodes every metadata field, the 49,152-token vocabulary
among them, and took 62 s here) and the q/k row un-interleave transformers applies at load.
"""

from __future__ import annotations

from pathlib import Path

import torch

QK = 32


def unpermute_rows(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row interleave for rotary (transformers undoes it the same way)."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, -1).transpose(1, 2).reshape(rows.shape)  # [N, bytes]


GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


GGUF_TYPES = {3: ("q4_1", 20), 8: ("q8_0", 34)}  # ggml type id -> (format, bytes per block)
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


def gguf_tensors(path: str | Path) -> dict[str, tuple[int, list[int], int]]:
    """Name -> (ggml type, dims, absolute byte offset) from a GGUF file's header.

    A small reader of its own: gguf-py's reader decodes every metadata field (the 49,152-token
    vocabulary among them) and took 62 s here; this skips them and takes milliseconds.
    """
    import struct

    with open(path, "rb") as f:

        def read(fmt: str):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def string() -> bytes:
            return f.read(read("Q"))

        def skip(kind: int) -> None:
            if kind == 8:
                f.seek(read("Q"), 1)
            elif kind == 9:
                item, count = read("I"), read("Q")
                if item in _SCALAR:
                    f.seek(struct.calcsize(_SCALAR[item]) * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(struct.calcsize(_SCALAR[kind]), 1)

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("I")  # version
        n_tensors, n_kv = read("Q"), read("Q")
        align = 32
        for _ in range(n_kv):
            key, kind = string(), read("I")
            if key == b"general.alignment" and kind == 4:
                align = read("I")
            else:
                skip(kind)
        infos = []
        for _ in range(n_tensors):
            name = string().decode()
            dims = [read("Q") for _ in range(read("I"))]
            infos.append((name, read("I"), dims, read("Q")))
        data = -(-f.tell() // align) * align
    return {name: (kind, dims, data + off) for name, kind, dims, off in infos}


def gguf_blocks(path: str | Path, config) -> dict[str, tuple[str, torch.Tensor]]:
    """Module name -> (format, blocks) for every Q4_1 / Q8_0 matrix in the GGUF at ``path``.

    Rows are in the transformers model's order (q/k un-interleaved); bytes are the file's.
    """
    import numpy as np

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for name, (kind, dims, offset) in gguf_tensors(path).items():
        if kind not in GGUF_TYPES:
            continue
        fmt, nbytes = GGUF_TYPES[kind]
        k, n = dims[0], int(np.prod(dims[1:]))
        width = k // QK * nbytes
        rows = torch.from_numpy(np.array(raw[offset : offset + n * width])).view(
            n, width
        )  # [N, bytes]
        parts = name.split(".")
        if parts[0] == "token_embd":
            out["lm_head"] = (fmt, rows)
            continue
        if parts[0] != "blk" or parts[2] not in GGUF_NAMES:
            continue
        if parts[2] == "attn_q":
            rows = unpermute_rows(rows, config.num_attention_heads)
        elif parts[2] == "attn_k":
            rows = unpermute_rows(rows, config.num_key_value_heads)
        out[f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}"] = (fmt, rows.contiguous())
    return out
