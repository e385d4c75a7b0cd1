"""What a weight format costs in accuracy: ``python -m engine.bench accuracy``.

- Perplexity on a fixed text (``engine/lab/perplexity_text.txt``, written for this project, public
  domain; ~1,700 SmolLM2 tokens): the text is fed in chunks of 32 tokens through the paged cache,
  each chunk attending to everything before it, so every token but the first is scored with its
  whole left context. 32-row products run through the same kernels a decode step uses.
- Greedy agreement with fp32: the bundled chat prompts, greedy, a fixed number of tokens each,
  through the engine; the share of generated tokens equal to fp32's up to the first difference,
  and how many answers are identical.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

TEXT = Path(__file__).with_name("perplexity_text.txt")


def nll_chunks(forward, ids: list[int], chunk: int = 32, block_size: int = 16) -> tuple[float, int]:
    """Sum of the negative log-likelihood of ``ids[1:]`` under ``forward`` (a ``LlamaForward``),
    and the number of tokens scored. The cache holds the whole text in disjoint slots."""
    from engine.core.llama import ForwardBatch, PrefillSpan

    n = len(ids)
    cache = forward.new_cache(-(-n // block_size) + 1, block_size)
    all_slots = torch.arange(n)
    tokens = torch.tensor(ids, dtype=torch.long)
    total, count = 0.0, 0
    for start in range(0, n - 1, chunk):
        end = min(start + chunk, n - 1)  # the last token has no next token to score
        fb = ForwardBatch(
            input_ids=tokens[start:end],
            positions=torch.arange(start, end),
            write_slots=all_slots[start:end],
            num_decode=0,
            decode_slots=None,
            decode_mask=None,
            prefills=[PrefillSpan(0, end - start, start, all_slots[:end])],
            logits_rows=torch.arange(end - start),
        )
        logits = forward.forward(fb, cache).double()  # [end - start, vocab]
        total += torch.nn.functional.cross_entropy(
            logits, tokens[start + 1 : end + 1], reduction="sum"
        ).item()
        count += end - start
    return total, count


def nll_decode(forward, ids: list[int], block_size: int = 16) -> tuple[float, int]:
    """As ``nll_chunks``, but one decode step per token: the path a served answer takes (for the
    quantized formats, the one-call decode step of ``engine.core.quant.FusedStep``)."""
    from engine.core.llama import ForwardBatch

    n = len(ids)
    cache = forward.new_cache(-(-n // block_size) + 1, block_size)
    slots = torch.arange(n)
    total = 0.0
    for pos in range(n - 1):
        fb = ForwardBatch(
            input_ids=torch.tensor([ids[pos]]),
            positions=torch.tensor([pos]),
            write_slots=slots[pos : pos + 1],
            num_decode=1,
            decode_slots=slots[None, : pos + 1],
            decode_mask=torch.ones(1, 1, 1, pos + 1, dtype=torch.bool),
            logits_rows=torch.arange(1),
        )
        logits = forward.forward(fb, cache).double()  # [1, vocab]
        total += torch.nn.functional.cross_entropy(
            logits, torch.tensor([ids[pos + 1]]), reduction="sum"
        ).item()
    return total, n - 1


def perplexity(forward, tok, text: str | None = None, chunk: int = 32) -> dict[str, float]:
    """Perplexity of ``text`` (default: the fixed text); ``chunk=0`` scores it by decode steps."""
    ids = list(tok.encode(text if text is not None else TEXT.read_text(), add_special_tokens=False))
    total, count = nll_chunks(forward, ids, chunk) if chunk else nll_decode(forward, ids)
    return {"perplexity": math.exp(total / count), "nll_per_token": total / count, "tokens": count}


def greedy_answers(
    model, tok, weights: str, prompts: list[str], new_tokens: int
) -> list[list[int]]:
    """Greedy answers (EOS ignored: every answer has ``new_tokens`` tokens) through the engine."""
    from engine.core.config import EngineConfig
    from engine.core.engine import Engine

    engine = Engine(
        EngineConfig(weights=weights, max_slots=len(prompts)), model=model, tokenizer=tok
    )
    handles = [engine.submit(prompt=p, max_new_tokens=new_tokens, ignore_eos=True) for p in prompts]
    engine.run_until_idle()
    return [list(h.token_ids) for h in handles]


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Share of tokens equal to the reference's before the first difference; identical answers."""
    same = 0
    identical = 0
    for a, b in zip(reference, other, strict=False):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        same += k
        identical += k == len(a) == len(b)
    total = sum(len(a) for a in reference)
    return {
        "token_agreement": same / total if total else 1.0,
        "identical_answers": identical,
        "answers": len(reference),
    }


def accuracy(
    model,
    tok,
    weights: tuple[str, ...] = ("fp32", "q8", "q4"),
    prompts: int = 8,
    new_tokens: int = 32,
) -> dict[str, Any]:
    """Perplexity per format and greedy agreement with fp32; ``ratios`` for the README."""
    from engine.core import device
    from engine.core.llama import LlamaForward
    from engine.workloads.canonical import CHAT_PROMPTS

    out: dict[str, Any] = {"runs": {}, "text_tokens": None}
    answers = {}
    for w in weights:
        fwd = device.run(LlamaForward, model, 4096, w)
        ppl = device.run(perplexity, fwd, tok)
        answers[w] = greedy_answers(model, tok, w, list(CHAT_PROMPTS[:prompts]), new_tokens)
        out["runs"][w] = {
            "perplexity": ppl["perplexity"],
            "nll_per_token": ppl["nll_per_token"],
            "effective_weights": fwd.weights,
        }
        if (
            fwd.weights != "fp32"
        ):  # the decode path too (fp32's is the same function as its chunks')
            out["runs"][w]["decode_perplexity"] = device.run(perplexity, fwd, tok, None, 0)[
                "perplexity"
            ]
        out["text_tokens"] = ppl["tokens"]
    ratios = {}
    for w in weights:
        agree = agreement(answers["fp32"], answers[w]) if "fp32" in answers else {}
        out["runs"][w].update(agree)
        if w != "fp32" and "fp32" in out["runs"]:
            ratios[f"{w}_perplexity_over_fp32"] = (
                out["runs"][w]["perplexity"] / out["runs"]["fp32"]["perplexity"]
            )
            ratios[f"{w}_greedy_token_agreement"] = agree["token_agreement"]
            if "decode_perplexity" in out["runs"][w]:
                ratios[f"{w}_decode_perplexity_over_fp32"] = (
                    out["runs"][w]["decode_perplexity"] / out["runs"]["fp32"]["perplexity"]
                )
    out["ratios"] = ratios
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        f"perplexity on engine/lab/perplexity_text.txt ({result['text_tokens']} tokens scored); "
        "greedy agreement with fp32 on the chat prompts",
        f"{'weights':<8}{'ppl':>10}{'nll/tok':>10}{'agree':>8}{'identical':>11}",
    ]
    for w, r in result["runs"].items():
        lines.append(
            f"{w:<8}{r['perplexity']:>10.3f}{r['nll_per_token']:>10.4f}"
            f"{r.get('token_agreement', 1):>8.3f}"
            f"{r.get('identical_answers', 0):>6}/{r.get('answers', 0):<4}"
            + (f"  decode ppl {r['decode_perplexity']:.3f}" if "decode_perplexity" in r else "")
        )
    for k, v in result["ratios"].items():
        lines.append(f"  {k:<40} {v:8.4f}")
    return "\n".join(lines)
