"""Next-token choice: greedy for the whole batch at once, seeded temperature/top-p per request."""
from __future__ import annotations

import torch

from engine.sequence import Sequence


def _generator(seq: Sequence, engine_seed: int, device: torch.device) -> torch.Generator:
    if seq.generator is None:
        g = torch.Generator(device=device)
        g.manual_seed(seq.params.seed if seq.params.seed is not None else engine_seed * 1_000_003 + seq.id)
        seq.generator = g
    return seq.generator


def sample(logits: torch.Tensor, seqs: list[Sequence | None], engine_seed: int = 0) -> torch.Tensor:
    """``logits`` ``[N, V]``, one row per entry of ``seqs`` -> token ids ``[N]`` (greedy where None)."""
    out = logits.argmax(dim=-1)
    for row, seq in enumerate(seqs):
        if seq is None:
            continue
        p = seq.params
        if p.temperature <= 0:
            continue
        probs = torch.softmax(logits[row].float() / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            # keep the smallest prefix whose mass reaches top_p (the top token always stays)
            drop = sorted_p.cumsum(0) - sorted_p >= p.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        out[row] = torch.multinomial(probs, 1, generator=_generator(seq, engine_seed, logits.device))[0]
    return out
