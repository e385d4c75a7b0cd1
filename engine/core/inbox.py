"""The engine's thread-safe inbox: what any thread hands the engine (new requests, cancels,
config changes) waits here until the engine thread drains it between two steps. It also keeps
the live requests (drained, not yet ended), so a client's requests are found in one place or
the other, never in neither."""

from __future__ import annotations

import threading

from engine.core.sequence import Sequence


class Inbox:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Event()  # set on anything new: the engine thread stops waiting
        self.incoming: list[Sequence] = []
        self.cancels: list[int] = []
        self.changes: list[dict] = []
        self.live: dict[int, Sequence] = {}  # drained and not ended (the engine thread's)

    def put(self, seq: Sequence) -> None:
        with self.lock:
            self.incoming.append(seq)
        self.wake.set()

    def cancel(self, request_id: int) -> None:
        with self.lock:
            self.cancels.append(request_id)
        self.wake.set()

    def cancel_client(self, client: str | None) -> int:
        """Cancel every live or incoming request of ``client`` (``None``: every one)."""
        with self.lock:
            live = list(self.live.values()) + self.incoming
            ids = [s.id for s in live if client is None or s.client == client]
            self.cancels.extend(ids)
        self.wake.set()
        return len(ids)

    def change(self, changes: dict) -> None:
        with self.lock:
            self.changes.append(changes)
        self.wake.set()

    def pending(self) -> bool:
        with self.lock:
            return bool(self.incoming or self.cancels or self.changes)

    def incoming_count(self) -> int:
        with self.lock:
            return len(self.incoming)

    def incoming_ids(self) -> list[int]:
        with self.lock:
            return [s.id for s in self.incoming]

    def drain(self) -> tuple[list[Sequence], list[int], list[dict]]:
        """Take everything; the new requests become live (under the lock: ``cancel_client``
        must find them in one place or the other)."""
        with self.lock:
            incoming, self.incoming = self.incoming, []
            cancels, self.cancels = self.cancels, []
            changes, self.changes = self.changes, []
            for seq in incoming:
                self.live[seq.id] = seq
        return incoming, cancels, changes
