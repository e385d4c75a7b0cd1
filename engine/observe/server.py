"""The sidecar's websocket server: Fluxo's own ``Server`` (roles, origins, limits, telemetry
fan-out, exports, /metrics) over an ``ObservedEngine``, read-only.

Viewers subscribe, export and authenticate as on Fluxo's server; every message that would drive
an engine (chat, cancel, and the presenter's controls) is answered ``read_only``: the engine is
vLLM, driven through its own OpenAI API, whose address ``hello`` gives in ``http_url``. The state
adds ``observed`` (which engine, which tier of data, records received, missed and refused).
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import FluxoError
from engine.observe.source import ObservedEngine
from engine.server.connection import Connection
from engine.server.server import Server

# What the records hold (docs/observe.md): exact batch membership from the scheduler.
TIER = "scheduler"


class ReadOnly(FluxoError):
    """A message that would drive the engine, sent to a sidecar that only watches vLLM."""

    code = "read_only"


DRIVING = ("chat", "cancel", "control", "pause", "resume", "step", "traffic", "reset", "compare")


class ObservedServer(Server):
    def __init__(self, engine: ObservedEngine, vllm_url: str, vllm_version: str, **kw: Any) -> None:
        super().__init__(engine, http_port=None, comparison=None, **kw)
        self.http_url = vllm_url.rstrip("/")  # chats go to vLLM's own OpenAI API
        self.vllm_version = vllm_version

    @property
    def loopback(self) -> bool:
        """Nobody presents without the token, not even this machine: nothing here drives vLLM,
        so the page shows every client the viewer's page (controls folded, greyed)."""
        return False

    def state(self, conn: Connection | None = None) -> dict[str, Any]:
        engine: ObservedEngine = self.engine  # type: ignore[assignment]
        state = super().state(conn)
        state["config"] = engine.config.live()  # vLLM's limits as its records give them
        state["observed"] = {
            "engine": "vllm",
            "version": self.vllm_version,
            "read_only": True,
            "tier": TIER,
            "ranks": sorted(engine.ranks),
            "data_parallel_size": engine.dp,
            "received": engine.received,
            "missed": engine.translator.missed,
            "refused": engine.refused,
            "http_url": self.http_url,
            "model": self.model_name,  # the name its OpenAI API serves the model under
        }
        return state

    async def _read_only(self, conn: Connection, msg: dict) -> None:
        raise ReadOnly(
            f"{msg['type']!r}: this is vLLM {self.vllm_version}, observed read-only; send chats "
            f"to its OpenAI API at {self.http_url}/v1"
        )


for _kind in DRIVING:
    setattr(ObservedServer, f"_on_{_kind}", ObservedServer._read_only)
