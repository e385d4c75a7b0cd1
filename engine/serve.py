"""``python -m engine.serve``: the engine behind a websocket server (protocol: docs/protocol.md).

This command is where the layers meet: it builds the core's ``Engine``, hands the lab's scenario
replay to the server as its ``Comparison`` (the server itself never imports the lab), and serves.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import secrets
import signal
from pathlib import Path

import torch

from engine.core import cpu, threads
from engine.core.config import DEVICES, FLAGS, VLLM_FLAGS, WEIGHTS, EngineConfig, lab_weights
from engine.core.engine import Engine
from engine.core.errors import FluxoError
from engine.core.policy import registry as policy
from engine.lab import trace_compare
from engine.server.connection import Comparison, Limits
from engine.server.guard import Origins
from engine.server.server import Server

SMOLLM2_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what vLLM-style clients send as model


def fluxo_version() -> str:
    import engine

    return engine.__version__


def _engine_flags(ap: argparse.ArgumentParser, *names: str) -> None:
    """A flag per field from ``config.FLAGS``: its default and type the config's own."""
    defaults = EngineConfig()
    for name in names:
        flag, choices, help_ = FLAGS[name]
        flags = (flag, VLLM_FLAGS[name]) if name in VLLM_FLAGS else (flag,)
        default = getattr(defaults, name)
        if isinstance(default, bool):
            ap.add_argument(
                *flags,
                dest=name,
                default=default,
                help=help_,
                action=argparse.BooleanOptionalAction,
            )
        else:
            ap.add_argument(
                *flags, dest=name, default=default, type=type(default), choices=choices, help=help_
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.serve", description=__doc__)
    ap.add_argument("--version", action="version", version=f"Fluxo {fluxo_version()}")
    for add in (_network_args, _model_args, _scheduler_args, _limit_args, _cpu_args):
        add(ap)  # in this order: --help lists them so
    return ap.parse_args(argv)


def _network_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="OpenAI-compatible HTTP API port (default: --port + 1; 0: off)",
    )
    ap.add_argument(
        "--token",
        default=os.environ.get("FLUXO_TOKEN"),
        help="presenter token (or FLUXO_TOKEN); an empty one counts as none",
    )
    ap.add_argument(
        "--page-port",
        type=int,
        action="append",
        default=None,
        help="the lab page's port, whose origins may connect (repeatable; default: "
        "FLUXO_PAGE_PORT or 8501); a page on this machine's loopback may use any port",
    )
    ap.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="another browser origin that may connect, e.g. https://lab.school.example behind a "
        "reverse proxy (repeatable; also FLUXO_ALLOW_ORIGINS, comma-separated)",
    )
    ap.add_argument(
        "--cors-any-origin",
        action="store_true",
        help="let a page of any origin read the HTTP API (Access-Control-Allow-Origin: *), for a "
        "browser front end on a machine of your own; never in a classroom",
    )
    ap.add_argument(
        "--served-model-name",
        default=None,
        help="the model's name in the HTTP API and hello (default: smollm2, tiny, or the "
        "checkpoint folder's name); SmolLM2's Hugging Face id is accepted too",
    )


def _model_args(ap: argparse.ArgumentParser) -> None:
    _engine_flags(ap, "model", "dtype")
    ap.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file replacing the tokenizer's own (as vLLM's flag)",
    )
    _engine_flags(ap, "max_model_len")
    ap.add_argument(
        "--weights",
        choices=WEIGHTS,
        default=None,  # lab_weights(--model): q4 for smollm2, fp32 otherwise
        help="CPU weight format: the GGUF's Q4_1/Q8_0 blocks (q4; the default for smollm2), "
        "Q8_0 (q8) or the fp32 reference (the default for other models); the state "
        "reports what the forward reads",
    )
    ap.add_argument(
        "--device",
        default=os.environ.get("FLUXO_DEVICE", EngineConfig().device),
        choices=DEVICES,
        help="cpu or cuda (or FLUXO_DEVICE); "
        "cuda without a GPU is an error, never a silent CPU run",
    )


def _scheduler_args(ap: argparse.ArgumentParser) -> None:
    _engine_flags(ap, "policy")
    ap.add_argument(
        "--policy-file",
        action="append",
        default=[],
        help="a Python file of this machine's defining Policy subclasses (engine/core/policy/), "
        "loaded at start and switched live like the built-ins (repeatable); never uploaded",
    )
    _engine_flags(ap, "runner", "max_slots", "kv_blocks", "kv_layout", "block_size", "chunk_budget")
    _engine_flags(ap, "prefix_cache", "fill_timeout_s", "host_work_ms")


def _limit_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--queue-limit", type=int, default=Limits().queue_limit)
    ap.add_argument(
        "--max-open",
        type=int,
        default=Limits().max_open_requests,
        help="open requests per student address",
    )
    ap.add_argument(
        "--rate-limit",
        type=float,
        default=Limits().max_requests_per_s,
        help="requests/s per student address",
    )
    ap.add_argument(
        "--history",
        type=int,
        default=20_000,
        help="step records kept for late subscribers and export",
    )
    ap.add_argument(
        "--metrics-window",
        type=float,
        default=Limits().metrics_window_s,
        help="seconds the headline metrics summarize (the lesson preflight's short visits: less)",
    )
    ap.add_argument(
        "--max-conns",
        type=int,
        default=Limits().max_connections_per_address,
        help="websocket connections per student address (this machine and presenters: no cap)",
    )


def _cpu_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--threads",
        type=int,
        default=EngineConfig().threads,
        help="torch threads (default: one per core it may use)",
    )
    ap.add_argument(
        "--cpus",
        default=os.environ.get("FLUXO_ENGINE_CPUS"),
        help="cores the engine computes on, e.g. 1 or 1-3 (default: all; the lab launcher keeps "
        "one for the page and the browser)",
    )
    ap.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip the ~3 s start-up run that calibrates the cost model behind the stall chart's "
        "expected step times (it then learns from live steps only)",
    )


def config_from(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        **{name: getattr(args, name) for name in FLAGS},
        threads=args.threads,
        cpus=cpu.parse(args.cpus),
        device=args.device,
        weights=args.weights or lab_weights(args.model),
    )


def _say_threads(config: EngineConfig) -> None:
    """One line on what the engine computes with; ``cpus`` is None wherever nothing is pinned
    (macOS, Windows, one core, ``--no-pin``)."""
    if not (config.cpus or config.threads):
        return
    where = ""
    if config.cpus:
        where = f" on core(s) {','.join(map(str, config.cpus))} {cpu.platform_note()}"
    print(f"engine computes with {torch.get_num_threads()} torch thread(s){where}", flush=True)


def on_stop_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Future) -> str:
    """Resolve ``stop`` on SIGINT/SIGTERM. The loop's own handler API where it has one (POSIX);
    elsewhere (Windows: every event loop raises ``NotImplementedError``) ``signal.signal``, whose
    handler runs in the main thread and hands the stop to the loop thread-safely. Returns which."""

    def fire() -> None:
        if not stop.done():
            stop.set_result(None)

    sigs = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
    try:
        for sig in sigs:
            loop.add_signal_handler(sig, fire)
        return "loop"
    except (NotImplementedError, AttributeError, RuntimeError):
        for sig in sigs:
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(fire))
        return "signal"


def _serve(server: Server) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        on_stop_signals(loop, stop)
        await server.serve(stop)

    asyncio.run(run())


def _server(args: argparse.Namespace, engine: Engine, token, limits: Limits, http_port) -> Server:
    """The websocket and HTTP server around ``engine``, as the flags ask."""
    page_ports = args.page_port or [int(os.environ.get("FLUXO_PAGE_PORT") or 8501)]
    allow = args.allow_origin + os.environ.get("FLUXO_ALLOW_ORIGINS", "").split(",")
    served = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    return Server(
        engine,
        args.host,
        args.port,
        token,
        limits,
        model_name=served,
        http_port=http_port,
        # the replays run on the live engine's weights: what the class sees is what they measure
        # (and a request trace: the shipped one or the live engine's own, engine/lab/trace_compare)
        comparison=Comparison(
            functools.partial(trace_compare.compare, weights=engine.config.weights, engine=engine),
            trace_compare.WORKLOADS,
        ),
        origins=Origins.build(args.host, page_ports, allow, cors_any=args.cors_any_origin),
        model_aliases=(SMOLLM2_HF_ID,) if args.model == "smollm2" else (),
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not one line per connection

    token = args.token or None  # "--token ''" or "FLUXO_TOKEN=" is no token: never presenter by ""
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        token = secrets.token_urlsafe(12)
        print(f"presenter token (bound to {args.host}, control needs it): {token}", flush=True)
    try:
        loaded = [name for path in args.policy_file for name in policy.load_file(path)]
        if loaded:
            print(f"policies loaded from files: {', '.join(loaded)}", flush=True)
        config = config_from(args)
        engine = Engine(
            config, max_telemetry_steps=args.history, max_telemetry_requests=args.history
        )
        if args.chat_template:
            engine.tokenizer.chat_template = Path(args.chat_template).read_text()
    except FluxoError as exc:  # a bad device, model or setting: one coded line, no traceback
        raise SystemExit(f"error [{exc.code}]: {exc.message}") from None
    except OSError as exc:
        raise SystemExit(f"error [invalid_config]: {exc}") from None
    limits = Limits(
        queue_limit=args.queue_limit,
        max_open_requests=args.max_open,
        max_requests_per_s=args.rate_limit,
        max_connections_per_address=args.max_conns,
        metrics_window_s=args.metrics_window,
    )
    http_port = (
        (args.port + 1 if args.port else 0) if args.http_port is None else (args.http_port or None)
    )
    _say_threads(config)
    if not args.no_calibrate:
        took = engine.calibrate()
        print(f"cost model calibrated on quiet steps in {took:.1f} s", flush=True)
    server = _server(args, engine, token, limits, http_port)
    if http_port:  # (an ephemeral port is logged once bound)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"OpenAI-compatible HTTP API: http://{host}:{http_port}/v1 (health and metrics also on "
            f"http://{host}:{args.port}/health and /metrics)",
            flush=True,
        )
    _serve(server)


if __name__ == "__main__":
    threads.enable()  # a busy neighbour costs its share (engine/core/threads.py); so `make lab`
    main()
