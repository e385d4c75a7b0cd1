"""Sending records without ever blocking the engine: a ZMQ PUSH socket, non-blocking sends.

A reader that is slow, gone or never came leaves at most ``HWM`` records queued in ZMQ; past that
``send`` raises ``zmq.Again`` at once and the record is dropped and counted (the next record
carries the count, so the reader knows how many it missed).
"""

from __future__ import annotations

import json
import os

import zmq

from fluxo_vllm_observer import ENV_ADDR

HWM = 4096  # records queued for a slow reader: ~4096 x ~1 KB, at most ~4 MB of the engine's memory


class Publisher:
    def __init__(self, addr: str | None = None, hwm: int = HWM) -> None:
        self.addr = addr if addr is not None else os.environ.get(ENV_ADDR, "")
        self.sent = 0
        self.dropped = 0
        self._sock = None
        if self.addr:
            ctx = zmq.Context.instance()
            self._sock = ctx.socket(zmq.PUSH)
            self._sock.setsockopt(zmq.SNDHWM, hwm)
            self._sock.setsockopt(zmq.LINGER, 0)  # never hold vLLM's exit for a reader
            self._sock.connect(self.addr)

    @property
    def on(self) -> bool:
        return self._sock is not None

    def send(self, record: dict) -> bool:
        """Queue ``record`` for the reader, or drop and count it; never waits."""
        if self._sock is None:
            return False
        try:
            self._sock.send(json.dumps(record, separators=(",", ":")).encode(), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
