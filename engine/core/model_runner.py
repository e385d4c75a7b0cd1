"""Turns a scheduled batch into the flat tensors of one forward, runs it, and samples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.config import EngineConfig
from engine.core.llama import BATCH_TENSORS, ForwardBatch, KVCache, LlamaForward, PrefillSpan
from engine.core.sampler import sample
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import PLACEHOLDER, Sequence
from kernels.attention import decode_mask, slots_from_block_tables


class ModelRunner:
    def __init__(self, hf_model, config: EngineConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.forward_impl = LlamaForward(hf_model, config.max_model_len + 1, config.weights)
        # One block past the budget is scratch: static dead slots write their K/V there.
        self.cache: KVCache = self.forward_impl.new_cache(config.kv_blocks + 1, config.block_size)

    def ensure_capacity(self, blocks: int) -> None:
        if blocks + 1 > self.cache.num_blocks:
            self.cache = self.cache.resized(blocks + 1)

    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def build(self, batch: ScheduledBatch) -> tuple[ForwardBatch, list[Sequence | None]]:
        """Returns the forward inputs and, row by row of the logits, the sequence that samples from
        it (``None`` for dead slots and mid-prompt chunks: computed, then thrown away).

        The flat batch: one row per decoding sequence (and per static dead slot) first, then each
        prefill span's tokens."""
        decode = [s for s, n in batch.items if n == 1]
        flat, rows = self._decode_rows(decode, batch.dead)
        attention = self._decode_attention(decode, batch.dead, flat.pos)
        prefills = self._prefill_spans(batch, flat, rows)
        fb = ForwardBatch(
            input_ids=torch.tensor(flat.ids, dtype=torch.long),
            positions=torch.tensor(flat.pos, dtype=torch.long),
            write_slots=torch.tensor(flat.write, dtype=torch.long),
            num_decode=len(decode) + len(batch.dead),
            decode_slots=attention.slots,
            decode_mask=attention.mask,
            prefills=prefills,
            logits_rows=torch.tensor(flat.logit_rows, dtype=torch.long),
        )
        if not batch.dead and attention.tables is not None and self.cache.k.is_cuda:
            assert attention.lens is not None  # built with the tables
            fb.decode_tables = attention.tables.to(torch.int32)  # the Triton kernel / graphs
            fb.decode_lens = attention.lens.to(torch.int32)
        _carry_over(fb, flat)
        return fb, rows

    def _decode_rows(
        self, decode: list[Sequence], dead: list[Sequence]
    ) -> tuple[_Flat, list[Sequence | None]]:
        """One row per decoding sequence, then per dead slot (its K/V goes to scratch)."""
        # A one-token prefill chunk rides with the decodes but must not sample until its prompt is
        # whole.
        rows: list[Sequence | None] = [
            s if s.num_computed + 1 == s.num_tokens else None for s in decode
        ]
        rows += [None] * len(dead)
        dec_all = decode + dead
        flat = _Flat(
            ids=[s.token_at(min(s.num_computed, s.num_tokens - 1)) for s in dec_all],
            owners=list(dec_all),
            pos=[s.num_computed for s in dec_all],
            write=[self._slot(s, s.num_computed) for s in decode]
            + [self.cache.scratch_slot] * len(dead),
            logit_rows=list(range(len(dec_all))),
        )
        return flat, rows

    def _decode_attention(
        self, decode: list[Sequence], dead: list[Sequence], pos: list[int]
    ) -> _DecodeAttention:
        """The decode rows' context slots (block tables expanded) and padding mask, built once per
        step and read by every layer."""
        dec_all = decode + dead
        if not dec_all:
            return _DecodeAttention()
        width = max(len(s.block_table) for s in dec_all)
        tables = torch.tensor(
            [s.block_table + [0] * (width - len(s.block_table)) for s in dec_all],
            dtype=torch.long,
        )
        lens = torch.tensor([p + 1 for p in pos[: len(dec_all)]], dtype=torch.long)
        slots = slots_from_block_tables(tables, lens, self.block_size)
        if dead:  # a dead slot's new K/V went to scratch; its query must read it there
            nd = len(decode)
            slots[torch.arange(nd, len(dec_all)), lens[nd:] - 1] = self.cache.scratch_slot
        return _DecodeAttention(slots, decode_mask(lens, slots.shape[1]), tables, lens)

    def _prefill_spans(
        self, batch: ScheduledBatch, flat: _Flat, rows: list[Sequence | None]
    ) -> list[PrefillSpan]:
        """Each prefill chunk's tokens appended to ``flat``; a completed prompt samples its last."""
        prefills: list[PrefillSpan] = []
        offset = len(flat.ids)
        for seq, n in batch.items:
            if n == 1:
                continue
            start = seq.num_computed
            table = torch.tensor([seq.block_table], dtype=torch.long)
            ctx = slots_from_block_tables(table, torch.tensor([start + n]), self.block_size)[0]
            flat.ids.extend(seq.tokens(start, start + n))
            flat.owners.extend([seq] * n)
            flat.pos.extend(range(start, start + n))
            flat.write.extend(ctx[start:].tolist())
            prefills.append(PrefillSpan(offset, offset + n, start, ctx))
            offset += n
            if start + n == seq.num_tokens:  # the prompt is complete: its last row gives a token
                flat.logit_rows.append(offset - 1)
                rows.append(seq)
        return prefills

    def to_device(self, fb: ForwardBatch) -> ForwardBatch:
        """Host-to-device copy of the step's inputs (pinned, asynchronous); nothing to do on CPU."""
        device = self.cache.k.device
        if device.type == "cpu":
            return fb
        for name in (*BATCH_TENSORS, "carry_dst", "carry_src"):
            t = getattr(fb, name)
            if t is not None:
                setattr(fb, name, t.pin_memory().to(device, non_blocking=True))
        for span in fb.prefills:
            span.ctx_slots = span.ctx_slots.pin_memory().to(device, non_blocking=True)
        return fb

    def execute(
        self,
        fb: ForwardBatch,
        rows: list[Sequence | None],
        seed: int,
        prev_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward + sampling: everything that would run on the accelerator. Returns token ids, one
        per logits row (rows whose sequence is ``None`` included; the caller ignores them).

        ``prev_tokens`` is the output of the step that was still in flight when this batch was
        built; placeholders are filled from it here, just before the forward.
        """
        if fb.carry_dst is not None:
            assert prev_tokens is not None and fb.carry_src is not None  # the step in flight's
            fb.input_ids[fb.carry_dst] = prev_tokens[fb.carry_src]
        tokens = sample(self.forward_impl.forward(fb, self.cache), rows, seed)
        if tokens.is_cuda:  # the span must end when the device is done, not when the launch returns
            torch.cuda.current_stream().synchronize()
        return tokens


@dataclass(slots=True)
class _Flat:
    """The flat batch's rows as lists, before they become tensors."""

    ids: list[int]  # input token ids (a PLACEHOLDER where the step in flight computes it)
    owners: list[Sequence]  # the sequence of each row
    pos: list[int]  # positions
    write: list[int]  # KV cache slot each row's K/V is written to
    logit_rows: list[int]  # rows whose logits are computed (those that sample, and dead slots)


@dataclass(slots=True)
class _DecodeAttention:
    slots: torch.Tensor | None = None  # [D, ctx] context slots of the decode rows
    mask: torch.Tensor | None = None  # [D, ctx] padding mask
    tables: torch.Tensor | None = None  # [D, W] block tables
    lens: torch.Tensor | None = None  # [D] context lengths, the new token included


def _carry_over(fb: ForwardBatch, flat: _Flat) -> None:
    """Async runner: a token still being computed by the step in flight is a placeholder here;
    remember where it goes and which output row of that step will hold it."""
    carry = [(i, flat.owners[i].carry_row) for i, t in enumerate(flat.ids) if t == PLACEHOLDER]
    if carry:
        fb.carry_dst = torch.tensor([d for d, _ in carry], dtype=torch.long)
        fb.carry_src = torch.tensor([s for _, s in carry], dtype=torch.long)
