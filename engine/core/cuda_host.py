"""The host-side logic of the CUDA execute stage (``engine/core/cuda_exec.py``), plain functions
tested on the CPU (tests/core/test_cuda_exec.py): which captured graph a step replays, its padding,
the static buffers' fill, the two alternating pinned staging sets, and GPU event times mapped to
the engine clock.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from engine.core.llama import BATCH_TENSORS, ForwardBatch
from engine.core.numbers import ceil_div
from engine.core.records import Lane, SpanRecord

GRAPH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


# -- pure parts (CPU-testable) ---------------------------------------------------------------------
def bucket(n: int, sizes: tuple[int, ...] = GRAPH_SIZES) -> int | None:
    """The smallest captured batch size holding ``n`` rows; None when ``n`` is 0 or too big."""
    if n <= 0:
        return None
    return next((s for s in sorted(sizes) if s >= n), None)


def graph_width(max_model_len: int, block_size: int) -> int:
    """Block-table columns of the captured graphs: enough for a sequence of ``max_model_len``
    tokens plus the one being written."""
    return ceil_div(max_model_len + 1, block_size)


def graph_size(fb: ForwardBatch, width: int, sizes: tuple[int, ...] = GRAPH_SIZES) -> int | None:
    """The padded size a step replays at, or None when it must run eagerly: anything with a
    prefill span, no block tables (static dead slots, the torch decode path) or too many rows."""
    if fb.prefills or fb.decode_tables is None or fb.decode_lens is None:
        return None
    n = fb.num_decode
    if n != fb.input_ids.shape[0] or fb.decode_tables.shape[1] > width:
        return None
    return bucket(n, sizes)


@dataclass(slots=True)
class DecodeInputs:
    """The inputs a captured decode graph reads: one row per (padded) decode sequence."""

    input_ids: torch.Tensor  # [G] long
    positions: torch.Tensor  # [G] long
    write_slots: torch.Tensor  # [G] long
    tables: torch.Tensor  # [G, W] int32 block tables
    lens: torch.Tensor  # [G] int32 context lengths (the new token included)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def padding(
    size: int, width: int, scratch_slot: int, block_size: int, device: torch.device | str = "cpu"
) -> DecodeInputs:
    """``size`` padding rows: token 0 at position 0, K/V written to the scratch slot, and a
    context of one token read back from the scratch block. Their logits are never sampled."""
    tables = torch.zeros(size, width, dtype=torch.int32, device=device)  # [G, W]
    tables[:, 0] = scratch_slot // block_size
    return DecodeInputs(
        input_ids=torch.zeros(size, dtype=torch.long, device=device),
        positions=torch.zeros(size, dtype=torch.long, device=device),
        write_slots=torch.full((size,), scratch_slot, dtype=torch.long, device=device),
        tables=tables,
        lens=torch.ones(size, dtype=torch.int32, device=device),
    )


def pad_decode(
    fb: ForwardBatch, size: int, width: int, scratch_slot: int, block_size: int
) -> DecodeInputs:
    """A decode-only batch of n rows as ``size`` rows (host tensors): the real rows first, as
    built, then padding rows (see :func:`padding`)."""
    n = fb.num_decode
    assert fb.decode_tables is not None and fb.decode_lens is not None and n <= size
    out = padding(size, width, scratch_slot, block_size)
    out.input_ids[:n] = fb.input_ids
    out.positions[:n] = fb.positions
    out.write_slots[:n] = fb.write_slots
    # [n, w] into [G, W]; rest stays 0
    out.tables[:n, : fb.decode_tables.shape[1]] = fb.decode_tables
    out.lens[:n] = fb.decode_lens
    return out


def fill_static(
    static: DecodeInputs,
    step: DecodeInputs,
    carry_dst: torch.Tensor | None = None,
    carry_src: torch.Tensor | None = None,
    prev_tokens: torch.Tensor | None = None,
) -> None:
    """Copy one padded step into the first rows of the graph's static buffers (in place: the
    graph reads those addresses), then fill the carried-over tokens from the previous step."""
    size = step.input_ids.shape[0]
    for name, src in step.tensors().items():
        getattr(static, name)[:size].copy_(src)
    if carry_dst is not None:
        assert prev_tokens is not None and carry_src is not None  # carried with the step in flight
        static.input_ids[carry_dst] = prev_tokens[carry_src]


def event_time(t_ref: float, ms_since_ref: float) -> float:
    """Engine-clock seconds of a GPU event ``ms_since_ref`` ms (``Event.elapsed_time``) after the
    reference event, which the engine clock saw at ``t_ref``."""
    return t_ref + ms_since_ref / 1000.0


def anchor(t_before: float, t_after: float) -> float:
    """Engine time of a reference event recorded on an idle stream right after ``t_before`` and
    waited for until ``t_after``: the midpoint (off by at most half the interval, ~10 us)."""
    return (t_before + t_after) / 2.0


def lane_spans(t_ref: float, marks_ms: dict[Lane, tuple[float, float]]) -> list[SpanRecord]:
    """Telemetry spans (engine clock) from each lane's (start, end) in ms after the reference."""
    return [
        {"lane": lane, "start": event_time(t_ref, a), "end": event_time(t_ref, b)}
        for lane, (a, b) in marks_ms.items()
    ]


class PinnedStaging:
    """Two alternating sets of host buffers (pinned when ``pin``), one tensor per input name.

    Step k stages into set ``k % 2``. Before a set is written again, the fence left by the step
    that last used it (its host-to-device copy's end event) is waited on, so the copy of step
    N+1's inputs can proceed while step N computes without either ever reading a half-written
    buffer. Buffers grow (never shrink) to the largest step seen.
    """

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.sets: list[dict[str, torch.Tensor]] = [{}, {}]
        self.fences: list[Any] = [None, None]
        self.steps = 0

    def acquire(self) -> int:
        """The set the next step stages into, once its previous copy is done."""
        k = self.steps % 2
        self.steps += 1
        fence, self.fences[k] = self.fences[k], None
        if fence is not None:
            fence.synchronize()
        return k

    def stage(self, k: int, name: str, src: torch.Tensor) -> torch.Tensor:
        """``src`` copied into set ``k``'s buffer for ``name``; returns that buffer's view."""
        buf = self.sets[k].get(name)
        if buf is None or buf.dtype != src.dtype or buf.numel() < src.numel():
            numel = max(src.numel(), 2 * (buf.numel() if buf is not None else 0), 64)
            buf = torch.empty(numel, dtype=src.dtype, pin_memory=self.pin)
            self.sets[k][name] = buf
        view = buf[: src.numel()].view(src.shape)  # [numel] -> src's shape
        view.copy_(src)
        return view

    def fence(self, k: int, event: Any) -> None:
        """What ``acquire`` waits on before set ``k`` is written again (anything with
        ``synchronize()``: a ``torch.cuda.Event`` recorded after the copies that read the set)."""
        self.fences[k] = event


def flatten_inputs(fb: ForwardBatch) -> dict[str, torch.Tensor]:
    """The host tensors of an eager step, by name; the prefill spans' context slots travel as one
    concatenated tensor (``ctx_slots``) and are split again on the device."""
    out = {n: getattr(fb, n) for n in BATCH_TENSORS if getattr(fb, n) is not None}
    if fb.prefills:
        out["ctx_slots"] = torch.cat([p.ctx_slots for p in fb.prefills])
    return out


def rebuild(fb: ForwardBatch, dev: dict[str, torch.Tensor]) -> ForwardBatch:
    """``fb`` with its tensors replaced by the device copies in ``dev`` (see flatten_inputs)."""
    out = ForwardBatch(
        input_ids=dev["input_ids"],
        positions=dev["positions"],
        write_slots=dev["write_slots"],
        num_decode=fb.num_decode,
        decode_slots=dev.get("decode_slots"),
        decode_mask=dev.get("decode_mask"),
        logits_rows=dev.get("logits_rows"),
        decode_tables=dev.get("decode_tables"),
        decode_lens=dev.get("decode_lens"),
    )
    if fb.prefills:
        parts = dev["ctx_slots"].split([p.ctx_slots.shape[0] for p in fb.prefills])
        out.prefills = [
            type(p)(p.start, p.end, p.q_start, ctx)
            for p, ctx in zip(fb.prefills, parts, strict=False)
        ]
    return out
