"""The presenter's messages (``docs/protocol.md``): control, pause, resume, step, traffic,
reset and compare, and the traffic generator's task. A mixin of ``Server``. A ``kv_blocks`` the
machine's memory cannot hold is refused (``kv_over_memory``) before the cache is resized."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.errors import FluxoError, InvalidConfig, KVOverMemory
from engine.core.requests import Request, encode
from engine.server import protocol
from engine.server.connection import Comparison, Connection, Limits
from engine.workloads import capacity
from engine.workloads.traffic import CLIENT as TRAFFIC_CLIENT
from engine.workloads.traffic import MAX_RATE, TrafficParams, TrafficSource

if TYPE_CHECKING:  # types only
    from engine.core.engine import Engine

log = logging.getLogger("fluxo.server")
KV_MEMORY_SHARE = 0.5  # a bigger KV pool may take at most this share of the free memory


def check_kv_memory(engine, blocks: int) -> None:
    """Refuse (``kv_over_memory``) a KV pool the machine cannot hold: growing it allocates the new
    cache while the old one still lives, so the new one must fit in part of the free memory
    (``psutil`` on the CPU, the device's own free memory on CUDA)."""
    cache = getattr(getattr(engine, "model_runner", None), "cache", None)
    k = getattr(cache, "k", None)
    if cache is None or k is None or blocks + 1 <= cache.num_blocks:
        return  # no cache to size against, or one already as big: nothing is allocated
    per_block = 2 * k.element_size() * k.shape[0] * cache.block_size * k.shape[2] * k.shape[3]
    if k.device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(k.device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    need = (blocks + 1) * per_block
    if need > KV_MEMORY_SHARE * free:
        most = max(1, int(KV_MEMORY_SHARE * free // per_block) - 1)
        raise KVOverMemory(
            f"kv_blocks {blocks} needs {need / 2**30:.1f} GiB of KV cache; this machine has "
            f"{free / 2**30:.1f} GiB free (at most about {most} blocks)"
        )


class PresenterMessages:
    # What this mixin reads and sets of ``Server`` (engine/server/server.py sets them in __init__).
    engine: Engine
    limits: Limits
    conns: set[Connection]
    comparison: Comparison | None
    launch_config: dict[str, Any]
    config_view: dict[str, Any]
    traffic: TrafficParams | None
    traffic_stats: dict[str, int]
    traffic_capacity: float | None
    _shapes: dict[tuple, capacity.Shape]
    _traffic_task: asyncio.Task | None
    _compare_running: bool
    _compare_task: asyncio.Task | None
    if TYPE_CHECKING:  # and the Server method it calls
        broadcast_state: Callable[[], None]

    # -- presenter messages ------------------------------------------------------------------------
    async def _on_control(self, conn: Connection, msg: dict) -> None:
        changes = {k: v for k, v in msg.items() if k not in ("type", "ref")}
        if not changes:
            raise protocol.BadField(
                "control needs at least one of: " + ", ".join(self.launch_config)
            )
        if "kv_blocks" in changes:
            self.engine.config.updated(**changes).validate()  # its own range first
            check_kv_memory(self.engine, changes["kv_blocks"])
        new = self.engine.reconfigure(**changes)
        self.config_view = new.live()
        self.broadcast_state()

    async def _on_pause(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("pause")
        await asyncio.to_thread(self.engine.pause)
        self.broadcast_state()

    def _refuse_while_comparing(self, what: str) -> None:
        if self._compare_running:
            raise protocol.CompareRunning(
                f"the live engine is held while a comparison runs; {what} when it ends"
            )

    async def _on_resume(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("resume")
        self.engine.resume()
        self.broadcast_state()

    async def _on_step(self, conn: Connection, msg: dict) -> None:
        self._refuse_while_comparing("step")
        if not self.engine.paused:
            raise protocol.NotPaused("step works while the engine is paused; send pause first")
        record = await asyncio.to_thread(self.engine.single_step)
        self.broadcast_state()
        if record is None:
            raise protocol.NothingToRun(
                "nothing is queued or running (or a static batch is still filling): the step did "
                "nothing"
            )

    async def _on_traffic(self, conn: Connection, msg: dict) -> None:
        action = msg.get("action")
        if action not in ("start", "stop"):
            raise protocol.BadField(
                f"traffic action must be start or stop, got {protocol.show(action)}"
            )
        if action == "start":
            params = TrafficParams.from_message(
                {k: v for k, v in msg.items() if k not in ("type", "action", "ref")}
            )
            # Off the loop: counting the shape tokenizes a hundred prompts (~50 ms on SmolLM2).
            cap = await asyncio.to_thread(self.capacity, params)
            if params.load is not None:
                if cap is None:
                    raise InvalidConfig(
                        "traffic load needs the cost model, which has not seen enough steps yet "
                        "(a server started with --no-calibrate): give rate in requests/s"
                    )
                params.rate = round(min(MAX_RATE, params.load * cap), 3)
        self._stop_traffic()
        if action == "start":
            self.traffic, self.traffic_stats = params, {"sent": 0, "dropped": 0}
            self.traffic_capacity = cap
            self._traffic_task = asyncio.create_task(self._traffic_loop(params))
        self.broadcast_state()

    def capacity(self, params: TrafficParams) -> float | None:
        """Requests/s at which the engine, as configured once queued changes apply, would be 100 %
        busy with ``params``' traffic (``engine/workloads/capacity.py``); None before the cost
        model is fitted. The shape is counted once per traffic (rate and load aside)."""
        key = tuple(v for k, v in params.to_dict().items() if k not in ("rate", "load"))
        if key not in self._shapes:
            tok = self.engine.tokenizer
            self._shapes[key] = capacity.shape_of(params, lambda p: encode(tok, prompt=p))
        config = self.engine.config.updated(**self.config_view)
        return capacity.capacity(self.engine.cost_model, self._shapes[key], config)

    def _stop_traffic(self) -> None:
        if self._traffic_task is not None:
            self._traffic_task.cancel()
            self._traffic_task = None
        self.traffic = None

    async def _traffic_loop(self, params: TrafficParams) -> None:
        source = TrafficSource(params)
        while True:
            arrival = source.next()
            await asyncio.sleep(arrival.delay_s)
            while self._compare_running:  # held: a comparison measures only itself
                await asyncio.sleep(0.1)
            # Arrivals go on while the engine is paused (the queue visibly grows, and stepping has
            # work); beyond the queue limit they are dropped and counted, as a real server would
            # refuse them.
            if self.engine.queue_len() >= self.limits.queue_limit:
                self.traffic_stats["dropped"] += 1
                continue
            try:
                request = Request(
                    prompt=arrival.prompt,
                    max_new_tokens=arrival.max_new_tokens,
                    ignore_eos=arrival.ignore_eos,
                    client=TRAFFIC_CLIENT,
                )
                self.engine.submit(request)
                self.traffic_stats["sent"] += 1
            except (
                FluxoError
            ) as exc:  # e.g. a KV budget shrunk below a long prompt: skip it, say so
                self.traffic_stats["dropped"] += 1
                log.info("traffic request refused: %s", exc.message)

    async def _on_reset(self, conn: Connection, msg: dict) -> None:
        self._stop_traffic()
        self.engine.resume()
        self.engine.cancel_client(None)
        new = self.engine.reconfigure(**self.launch_config)
        self.config_view = new.live()
        deadline = time.monotonic() + 30
        while (
            self.engine.live_requests() or self.engine.has_work()
        ) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.engine.telemetry.clear()
        for c in self.conns:
            if c.subscribed:
                c.tele.clear()
                c.send({"type": "history", "steps": [], "requests": []})
        self.broadcast_state()

    async def _on_compare(self, conn: Connection, msg: dict) -> None:
        if self.comparison is None:
            raise protocol.CompareUnavailable("this server was started without a comparison runner")
        if self._compare_running:
            raise protocol.CompareRunning("a comparison is already running; wait for its result")
        workload = msg.get("workload")
        if workload not in self.comparison.workloads:
            raise protocol.BadField(
                f"workload must be one of {', '.join(self.comparison.workloads)}, got "
                f"{protocol.show(workload)}"
            )
        a, b = msg.get("a", {}), msg.get("b", {})
        if not isinstance(a, dict) or not isinstance(b, dict):
            raise protocol.BadField("a and b must be objects of live config fields")
        for side in (a, b):
            self.engine.config.updated(**side).validate()
        scale = protocol.get_float(msg, "scale", 1.0, 0.05, 1.0)
        # A comparison never shares the device with live work: the live engine is paused (its
        # step in progress ends first) and the traffic generator holds its arrivals until the
        # replays are done; people's chats are queued meanwhile (state.comparing says why).
        # It runs as a task of its own, so this connection's other messages are answered meanwhile.
        self._compare_running = True  # refuses pause/resume/step at once; said once held
        ref = msg.get("ref") if isinstance(msg.get("ref"), str) else None
        self._compare_task = asyncio.create_task(
            self._compare(conn, self.comparison.run, workload, a, b, scale, ref)
        )

    async def _compare(
        self,
        conn: Connection,
        compare,
        workload: str,
        a: dict,
        b: dict,
        scale: float,
        ref: str | None,
    ) -> None:
        was_paused = self.engine.paused
        try:
            if not was_paused:
                await asyncio.to_thread(self.engine.pause)
            self.broadcast_state()  # state.comparing: the live engine is held from now on
            result = await asyncio.to_thread(
                compare, self.engine.model, self.engine.tokenizer, workload, a, b, scale
            )
        except FluxoError as exc:
            conn.error(exc.code, exc.message, ref=ref)
            return
        except Exception as exc:  # noqa: BLE001 - a failed replay answers its presenter, the server goes on
            log.exception("comparison failed")
            conn.error("internal", f"the comparison failed: {type(exc).__name__}", ref=ref)
            return
        finally:
            self._compare_running = False
            if not was_paused:
                self.engine.resume()
            self.broadcast_state()
        result["held"] = {"live_engine_paused": True, "traffic_held": self.traffic is not None}
        conn.send({"type": "compare", **({"ref": ref} if ref else {}), **result})
