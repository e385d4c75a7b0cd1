"""Turns a scheduled batch into the flat tensors of one forward, runs it, and samples."""
from __future__ import annotations

import torch

from engine.core.config import EngineConfig
from engine.core.llama import ForwardBatch, KVCache, LlamaForward, PrefillSpan
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
        it (``None`` for dead slots and mid-prompt chunks: computed, then thrown away)."""
        decode = [s for s, n in batch.items if n == 1]
        # A one-token prefill chunk rides with the decodes but must not sample until its prompt is whole.
        rows: list[Sequence | None] = [s if s.num_cached + 1 == s.num_tokens else None for s in decode]
        rows += [None] * len(batch.dead)
        dec_all = decode + batch.dead
        ids: list[int] = [s.token_at(min(s.num_cached, s.num_tokens - 1)) for s in dec_all]
        owners: list[Sequence] = list(dec_all)
        pos: list[int] = [s.num_cached for s in dec_all]
        write: list[int] = [self._slot(s, s.num_cached) for s in decode] + [self.cache.scratch_slot] * len(batch.dead)
        decode_slots = mask = None
        if dec_all:
            width = max(len(s.block_table) for s in dec_all)
            tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in dec_all], dtype=torch.long)
            lens = torch.tensor([p + 1 for p in pos], dtype=torch.long)
            decode_slots = slots_from_block_tables(tables, lens, self.block_size)
            if batch.dead:  # a dead slot's new K/V went to scratch; its query must read it there
                nd = len(decode)
                decode_slots[torch.arange(nd, len(dec_all)), lens[nd:] - 1] = self.cache.scratch_slot
            mask = decode_mask(lens, decode_slots.shape[1])
        prefills: list[PrefillSpan] = []
        logit_rows = list(range(len(dec_all)))
        offset = len(dec_all)
        for seq, n in batch.items:
            if n == 1:
                continue
            start = seq.num_cached
            table = torch.tensor([seq.block_table], dtype=torch.long)
            ctx = slots_from_block_tables(table, torch.tensor([start + n]), self.block_size)[0]
            ids.extend(seq.tokens(start, start + n))
            owners.extend([seq] * n)
            pos.extend(range(start, start + n))
            write.extend(ctx[start:].tolist())
            prefills.append(PrefillSpan(offset, offset + n, start, ctx))
            offset += n
            if start + n == seq.num_tokens:  # the prompt is complete: its last row gives a token
                logit_rows.append(offset - 1)
                rows.append(seq)
        fb = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(pos, dtype=torch.long),
            write_slots=torch.tensor(write, dtype=torch.long),
            num_decode=len(dec_all),
            decode_slots=decode_slots,
            decode_mask=mask,
            prefills=prefills,
            logits_rows=torch.tensor(logit_rows, dtype=torch.long),
        )
        if not batch.dead and dec_all and self.cache.k.is_cuda:
            fb.decode_tables, fb.decode_lens = tables.to(torch.int32), lens.to(torch.int32)
        # Async runner: a token still being computed by the in-flight step is a placeholder here;
        # remember where it goes and which output row of that step will hold it (carry-over).
        carry = [(i, owners[i].carry_row) for i, t in enumerate(ids) if t == PLACEHOLDER]
        if carry:
            fb.carry_dst = torch.tensor([d for d, _ in carry], dtype=torch.long)
            fb.carry_src = torch.tensor([s for _, s in carry], dtype=torch.long)
        return fb, rows

    def to_device(self, fb: ForwardBatch) -> ForwardBatch:
        """Host-to-device copy of the step's inputs (pinned, asynchronous); nothing to do on CPU."""
        device = self.cache.k.device
        if device.type == "cpu":
            return fb
        for name in ("input_ids", "positions", "write_slots", "decode_slots", "decode_mask", "logits_rows",
                     "decode_tables", "decode_lens", "carry_dst", "carry_src"):
            t = getattr(fb, name)
            if t is not None:
                setattr(fb, name, t.pin_memory().to(device, non_blocking=True))
        for span in fb.prefills:
            span.ctx_slots = span.ctx_slots.pin_memory().to(device, non_blocking=True)
        return fb

    def execute(self, fb: ForwardBatch, rows: list[Sequence | None], seed: int,
                prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Forward + sampling: everything that would run on the accelerator. Returns token ids, one
        per logits row (rows whose sequence is ``None`` included; the caller ignores them).

        ``prev_tokens`` is the output of the step that was still in flight when this batch was
        built; placeholders are filled from it here, just before the forward.
        """
        if fb.carry_dst is not None:
            fb.input_ids[fb.carry_dst] = prev_tokens[fb.carry_src]
        tokens = sample(self.forward_impl.forward(fb, self.cache), rows, seed)
        if tokens.is_cuda:  # the span must end when the device is done, not when the launch returns
            torch.cuda.current_stream().synchronize()
        return tokens
