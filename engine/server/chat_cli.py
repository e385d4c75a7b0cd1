"""``python -m engine.client "Hello"``: stream one answer from a running Fluxo server."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from websockets.asyncio.client import connect


async def chat(
    url: str,
    prompt: str,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: int | None = None,
    out=sys.stdout,
) -> dict:
    """Send one chat, write the streamed text to ``out``; returns the final ``done`` message
    (raises RuntimeError with the server's code on an ``error``)."""
    async with connect(url, max_size=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "seed": seed,
                    "ref": "cli",
                }
            )
        )
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "token":
                out.write(msg["text"])
                out.flush()
            elif msg["type"] == "done":
                out.write("\n")
                return msg
            elif msg["type"] == "error":
                raise RuntimeError(f"{msg['code']}: {msg['message']}")
    raise RuntimeError("the server closed the connection before the answer ended")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.client", description=__doc__)
    ap.add_argument("prompt")
    ap.add_argument("--url", default="ws://127.0.0.1:8765")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        done = asyncio.run(
            chat(args.url, args.prompt, args.max_tokens, args.temperature, args.seed)
        )
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    s = done["stats"]
    ttft = "-" if s["ttft_s"] is None else f"{s['ttft_s'] * 1000:.0f} ms"
    itl = "-" if s["itl_p50_s"] is None else f"{s['itl_p50_s'] * 1000:.0f} ms"
    print(
        f"[{done['status']}: {s['output_tokens']} tokens, TTFT {ttft}, ITL p50 {itl}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
