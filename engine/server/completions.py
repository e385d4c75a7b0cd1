"""One completion on its way out: the engine's token events queued for the HTTP side
(``Stream``), turned into text deltas with stop strings applied (``Generation``), answered whole
(``whole_answer``) or as server-sent events (``event_stream``) in the OpenAI API's shapes.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from engine.core.errors import EmptyPrompt, FluxoError
from engine.core.requests import encode
from engine.server import protocol
from engine.server.http11 import Conn, Gone, Request
from engine.server.openai_shapes import STATUS, CompletionArgs, StopCutter

if TYPE_CHECKING:
    from engine.core.engine import Engine


class Coded(FluxoError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """What ``Server.open_request`` delivers to: the protocol's token/done/error messages, queued on
    the server's loop (``open`` and ``closed`` are what the server's delivery reads)."""

    __slots__ = ("open", "closed", "queue")

    def __init__(self) -> None:
        self.open: dict[int, dict] = {}
        self.closed = False
        self.queue: asyncio.Queue[dict] = asyncio.Queue()

    def send(self, msg: dict) -> None:
        if not self.closed:
            self.queue.put_nowait(msg)


class Generation:
    """Text deltas of one request, stop strings applied; ``finish`` and ``usage`` at the end."""

    def __init__(
        self, engine: Engine, stream: Stream, request: int, args: CompletionArgs, prompt_tokens: int
    ) -> None:
        self.engine, self.stream, self.request, self.args = engine, stream, request, args
        self.cutter = StopCutter(args.stop)
        self.prompt_tokens = prompt_tokens
        self.tokens = 0
        self.last_token: int | None = None
        self.finish: str | None = None
        self.ended = False  # the engine has ended the request (done or error arrived)

    @property
    def usage(self) -> dict:
        """OpenAI's usage, with the prompt tokens the prefix cache served (lesson 10)."""
        record = self.engine.telemetry.requests.get(self.request) or {}
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
            "prompt_tokens_details": {"cached_tokens": int(record.get("cached_tokens") or 0)},
        }

    async def next(self) -> str | None:
        """The next non-empty text delta, or None once finished (then ``finish`` is set). Raises
        ``Gone`` when the client left and a coded error when the engine failed the request."""
        while self.finish is None:
            msg = await self.stream.queue.get()
            kind = msg["type"]
            if kind == "token":
                self.tokens += 1
                self.last_token = msg["token_id"]
                text = self.cutter.feed(msg["text"])
                if self.cutter.stopped:
                    self.finish = "stop"
                if text:
                    return text
            elif kind == "done":
                self.ended = True
                if msg["status"] == "finished":
                    eos = self.last_token in self.engine.eos_ids and not self.args.ignore_eos
                    self.finish = "stop" if eos else "length"
                else:
                    self.finish = "abort"  # cancelled by the presenter (cancel, reset): vLLM's word
                text = self.cutter.flush()
                if text:
                    return text
            elif kind == "error":
                self.ended = True
                raise Coded(msg["code"], msg["message"])
            else:  # "gone"
                raise Gone()
        return None

    def close(self) -> None:
        """Called once the HTTP side is done: a request still running (stopped by a stop string,
        or its client gone) is cancelled, which frees its KV at the next step boundary."""
        self.stream.closed = True
        if not self.ended:
            self.engine.cancel(self.request)


def _ids(gen: Generation) -> tuple[str, str]:
    if gen.args.kind == "chat":
        return f"chatcmpl-{gen.request}", "chat.completion"
    return f"cmpl-{gen.request}", "text_completion"


async def whole_answer(conn: Conn, req: Request, gen: Generation, model_id: str) -> bool:
    """The whole answer as one JSON body."""
    parts = []
    while (text := await gen.next()) is not None:
        parts.append(text)
    text = "".join(parts)
    rid, obj = _ids(gen)
    if gen.args.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": gen.finish,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish}
    body = {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model_id,
        "choices": [choice],
        "usage": gen.usage,
    }
    await conn.send(200, protocol.dumps(body).encode(), "application/json", req.keep_alive)
    return req.keep_alive


async def event_stream(conn: Conn, req: Request, gen: Generation, model_id: str) -> bool:
    """The answer as server-sent events (chunks, the finish, usage if asked, ``[DONE]``)."""
    keep = await conn.start_events(req)
    rid, obj = _ids(gen)
    chat = gen.args.kind == "chat"
    base = {
        "id": rid,
        "object": f"{obj}.chunk" if chat else obj,
        "created": int(time.time()),
        "model": model_id,
    }
    usage_null = {"usage": None} if gen.args.include_usage else {}

    def chunk(text: str | None, finish: str | None, role: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return protocol.dumps({**base, "choices": [choice], **usage_null})

    try:
        # The first chunk carries the first token (with the assistant's role), as vLLM's does:
        # tools that time the first chunk (vllm bench serve, guidellm) then read the real TTFT,
        # not the ~15 ms an empty role chunk sent at once took (issue 38, item 8).
        first = chat
        while (text := await gen.next()) is not None:
            await conn.event(chunk(text, None, role=first))
            first = False
        if first:  # nothing streamed (a stop string at once): the role still opens the answer
            await conn.event(chunk(None, None, role=True))
        await conn.event(chunk(None, gen.finish))
        if gen.args.include_usage:
            await conn.event(protocol.dumps({**base, "choices": [], "usage": gen.usage}))
    except FluxoError as exc:  # the engine failed the request after the stream began
        await conn.event(_error_event(exc))
    except (ConnectionError, OSError):
        raise Gone() from None
    await conn.event("[DONE]")
    await conn.end_events()
    return keep


def _error_event(exc: FluxoError) -> str:
    """An error inside a stream, in the shape of an error answer (then ``[DONE]``)."""
    _, kind = STATUS.get(exc.code, (500, "server_error"))
    error = {"message": exc.message, "type": kind, "param": None, "code": exc.code}
    return protocol.dumps({"error": error})


def default_max(engine: Engine, n_prompt: int) -> int:
    """No max_tokens: as long as the context and the KV budget allow (as vLLM does)."""
    cfg = engine.config
    room = min(
        cfg.max_new_tokens_limit,
        cfg.max_model_len - n_prompt,
        cfg.kv_blocks * cfg.block_size - n_prompt,
    )
    return max(1, room)


def prompt_and_max(engine: Engine, args: CompletionArgs) -> tuple[list[int], int]:
    """The request's token ids and the tokens it may generate (checked: at least 1)."""
    tok = engine.tokenizer
    if args.messages is not None:
        token_ids = encode(tok, messages=args.messages)
    elif args.prompt_ids is not None:
        token_ids = args.prompt_ids
    else:
        assert args.prompt is not None  # the parser sets messages, prompt_ids or prompt
        if not args.prompt.strip():
            raise EmptyPrompt("the prompt is empty")
        token_ids = list(tok.encode(args.prompt))
    max_tokens = (
        args.max_tokens if args.max_tokens is not None else default_max(engine, len(token_ids))
    )
    if max_tokens < 1:
        exc = protocol.BadField(f"max_tokens must be at least 1, got {max_tokens}")
        exc.param = "max_tokens"
        raise exc
    return token_ids, max_tokens
