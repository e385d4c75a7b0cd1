"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` on Fluxo's HTTP port: load tools (``vllm
bench serve``, guidellm) count a prompt's tokens through them, and a class can see what the model
reads (issue 38, item 8).

- ``/tokenize``: ``{"prompt": "..."}`` (the text as a completion reads it) or ``{"messages":
  [...]}`` (through the chat template, as a chat completion reads it) ->
  ``{"count", "max_model_len", "tokens", "token_strs": null}``;
- ``/detokenize``: ``{"tokens": [ids]}`` -> ``{"prompt": "..."}``.

Both take the same body checks as the completions (``openai_shapes``), run on the one tokenizer
thread, never on the event loop, and count against a student's requests/s.
"""

from __future__ import annotations

import json
from typing import Any

from engine.core.engine import Engine
from engine.core.requests import check_token_ids
from engine.server import protocol
from engine.server.completions import prompt_and_max
from engine.server.openai_shapes import parse_body

PATHS = ("/tokenize", "/detokenize")


def tokenize(engine: Engine, raw: bytes) -> dict[str, Any]:
    """``/tokenize``: the token ids of a prompt or a chat, as a completion would compute."""
    try:
        kind = "chat" if "messages" in json.loads(raw) else "text"
    except (ValueError, RecursionError, TypeError):
        kind = "text"  # parse_body says what is wrong with it, coded
    args = parse_body(raw, kind)
    protocol.check_text_size(engine.config.max_model_len, args.messages, args.prompt)
    ids, _ = prompt_and_max(engine, args)
    return {
        "count": len(ids),
        "max_model_len": engine.config.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }


def detokenize(engine: Engine, raw: bytes) -> dict[str, Any]:
    """``/detokenize``: the text of token ids (each in the model's vocabulary)."""
    args = parse_body(
        json.dumps({"prompt": _tokens(raw, engine.config.max_model_len)}).encode(), "text"
    )
    ids = args.prompt_ids or []
    check_token_ids(ids, engine.model.config.vocab_size)
    return {"prompt": engine.tokenizer.decode(ids)}


def _tokens(raw: bytes, most: int) -> list:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise protocol.BadJson("the body is not a JSON object with tokens") from None
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not 0 < len(tokens) <= most:
        raise protocol.BadField(f"tokens must be a list of 1 to {most} token ids")
    return tokens
