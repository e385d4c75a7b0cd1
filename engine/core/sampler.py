"""Next-token choice: greedy for the whole batch at once, seeded temperature/top-p per request."""

from __future__ import annotations

import torch

from engine.core.sequence import Sequence

# The nucleus almost always lies within the few most likely tokens; looking there first (exactly:
# falling back to a full sort when their mass is short of top_p) avoids sorting a 49k vocabulary
# per row, which cost ~5 ms a row on the 2-core CPU.
TOP_K_PROBE = 64


def _generator(seq: Sequence, engine_seed: int, device: torch.device) -> torch.Generator:
    if seq.generator is None:
        g = torch.Generator(device=device)
        g.manual_seed(
            seq.params.seed if seq.params.seed is not None else engine_seed * 1_000_003 + seq.id
        )
        seq.generator = g
    return seq.generator


def _nucleus(sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest prefix of descending probabilities whose mass reaches ``top_p``."""
    return sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)


def sample(logits: torch.Tensor, seqs: list[Sequence | None], engine_seed: int = 0) -> torch.Tensor:
    """``logits`` ``[N, V]``, one row per entry of ``seqs`` -> token ids ``[N]`` (greedy where
    None)."""
    out = logits.argmax(dim=-1)
    drawn = [(i, s) for i, s in enumerate(seqs) if s is not None and s.params.temperature > 0]
    if not drawn:
        return out
    rows = [i for i, _ in drawn]
    temps = torch.tensor([s.params.temperature for _, s in drawn], device=logits.device)
    probs = torch.softmax(logits[rows].float() / temps[:, None], dim=-1)
    k = min(TOP_K_PROBE, probs.shape[-1])
    top_vals, top_idx = probs.topk(k, dim=-1)
    mass = top_vals.sum(-1).tolist()
    for j, (i, seq) in enumerate(drawn):
        p, g = seq.params, _generator(seq, engine_seed, logits.device)
        if p.top_p >= 1.0:
            out[i] = torch.multinomial(probs[j], 1, generator=g)[0]
        elif mass[j] >= p.top_p:
            out[i] = top_idx[j][
                torch.multinomial(_nucleus(top_vals[j], p.top_p), 1, generator=g)[0]
            ]
        else:
            sorted_p, order = probs[j].sort(descending=True)
            out[i] = order[torch.multinomial(_nucleus(sorted_p, p.top_p), 1, generator=g)[0]]
    return out
