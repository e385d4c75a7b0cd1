"""What the page's connection to the engine (``app/engine_client.py``) answers with and keeps: the
server's error as an exception, one chat's stream, a snapshot of the buffers, and which message
answers each request (``docs/protocol.md``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# What answers each presenter/viewer message (the first message of these types after sending it,
# or an ``error`` carrying its ``ref``).
ANSWERS = {
    "control": {"state"},
    "pause": {"state"},
    "resume": {"state"},
    "step": {"state"},
    "traffic": {"state"},
    "reset": {"state"},
    "auth": {"state"},
    "export": {"export"},
    "compare": {"compare"},
    "unsubscribe": {"ok"},
    "subscribe": {"state"},
}


class EngineError(Exception):
    """An ``error`` message from the server, or no answer / no connection (``code`` says which)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass
class ChatStream:
    """One chat request's stream, filled by the client thread as tokens arrive."""

    ref: str
    prompt: str
    sent_at: float = field(default_factory=time.time)
    request: int | None = None
    text: str = ""
    tokens: int = 0
    first_token_at: float | None = None
    status: str = "sent"  # sent -> accepted -> streaming -> finished / cancelled / error
    error: str | None = None
    stats: dict = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status in ("finished", "cancelled", "error")


@dataclass
class Snapshot:
    status: str
    error: str | None
    hello: dict
    state: dict
    metrics: dict
    steps: list[dict]
    requests: list[dict]
    people: set[int]
    lag_ms: list[float]
    received_steps: int
    skipped_steps: int
