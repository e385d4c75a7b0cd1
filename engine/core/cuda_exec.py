"""The engine's execute stage on a CUDA device: three streams ordered by events, two alternating
pinned host buffers, spans timed by the GPU itself, and CUDA-graph replay for decode-only steps.

What a step does here (``CudaExecutor.launch`` on the engine's thread, ``_execute`` on the device
thread, ``wait`` back on the engine's thread)::

    h2d stream      [copy step N+1 in]                     [copy step N+2 in]
    compute stream        wait(h2d N+1) [carry, forward, sample N+1] wait(h2d N+2) ...
    d2h stream                               wait(compute N+1) [tokens out]

- The host builds step N+1's inputs in pinned buffer set ``(N+1) % 2`` while step N, staged from
  the other set, is still being copied or computed; a set is reused only after the copy that
  read it has completed (its event is waited on).
- Nothing runs on the default stream: the three streams are ``torch.cuda.Stream``s, ordered by
  ``wait_event`` alone. Tensors made on one stream and read on another are ``record_stream``-ed
  so the caching allocator never hands their memory out while the other stream may still read.
- Carry-over (async runner): the placeholders of step N+1 are filled from step N's sampled
  tokens on the compute stream, which already ordered N before N+1: no host round trip.
- Spans: six timing events per step; ``elapsed_time`` from a reference event recorded when the
  executor starts, anchored to the engine clock, gives each lane's real start and end.
- CUDA graphs (``EngineConfig.cuda_graphs``): one graph per padded decode batch size in
  ``GRAPH_SIZES``, all sharing one memory pool, captured when the engine starts (and again after
  the KV cache is replaced). A decode-only step of n rows is padded to the next size: padding rows
  read and write only the scratch slot, their logits are dropped. Mixed and prefill steps, static
  batches with dead slots (no block tables) and batches over 64 rows run eagerly.

Everything that does not need a GPU is a plain function tested on the CPU
(tests/core/test_cuda_exec.py); the GPU parts are checked by tests/core/test_cuda.py and
scripts/gpu_check.sh. Run on an H200 on 2026-12-01 (docs/gpu/README.md): greedy tokens equal to
transformers' and to the CPU path in every mode; a replayed greedy decode step at 8 rows took
6.8 ms of compute lane against 13.5-24.5 ms eager; async moved the busy fraction 0.83 -> 0.97 but
the tokens/s only 1.4 % (sampling runs inside the compute lane, on the device thread, and a step
of so small a model is a chain of small kernels; docs/gpu/README.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any

import torch

from engine.core import device as device_thread
from engine.core.cuda_host import (  # the host-side parts (tested on the CPU)
    GRAPH_SIZES,
    DecodeInputs,
    PinnedStaging,
    anchor,
    bucket,
    fill_static,
    flatten_inputs,
    graph_size,
    graph_width,
    lane_spans,
    pad_decode,
    padding,
    rebuild,
)
from engine.core.llama import ForwardBatch
from engine.core.records import Lane, SpanRecord
from engine.core.sampler import sample

CUDA_LANES: tuple[Lane, ...] = ("h2d", "compute", "d2h")  # the spans of its three streams


# -- the GPU parts ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Graph:
    size: int
    graph: Any  # torch.cuda.CUDAGraph
    logits: torch.Tensor  # [size, vocab], the graph's output (in the shared pool)
    rows: torch.Tensor  # [size] its logits rows (arange): the graph reads it, so it must stay alive


@dataclass(slots=True)
class Launched:
    """One step on the device: its sampled tokens (device), their pinned host copy, its events."""

    tokens: torch.Tensor
    host: torch.Tensor
    marks: dict[Lane, tuple[Any, Any]]
    graph: int | None  # the padded size replayed, None when eager


class CudaExecutor:
    """Streams, events, pinned buffers and decode graphs of one engine on one CUDA device.
    Built on the device thread (engine/core/device.py), after the model and KV cache are on the
    GPU."""

    def __init__(self, model_runner, config, now: Callable[[], float]) -> None:
        self.model_runner, self.now = model_runner, now
        self.device = model_runner.cache.k.device
        # Model load and cache allocation ran on the default stream: done before ours start.
        torch.cuda.synchronize(self.device)
        self.h2d = torch.cuda.Stream(self.device)
        self.compute = torch.cuda.Stream(self.device)
        self.d2h = torch.cuda.Stream(self.device)
        self.staging = PinnedStaging(pin=True)
        self.outputs = [torch.empty(0, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self.ref = torch.cuda.Event(enable_timing=True)
        t0 = now()
        self.ref.record(self.compute)
        self.ref.synchronize()
        self.t_ref = anchor(t0, now())
        self.block_size = config.block_size
        self.width = graph_width(config.max_model_len, config.block_size)
        # Graphs need the Triton paged kernel (fixed-shape inputs); the torch decode path pads
        # its context per step, so without Triton every step is eager.
        self.graphs_on = (
            bool(config.cuda_graphs) and model_runner.forward_impl.triton_decode is not None
        )
        self.graphs: dict[int, _Graph] = {}
        self.replays = self.eager = 0
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._cache = None
        self._static: DecodeInputs | None = None
        if self.graphs_on:
            self.capture(
                tuple(s for s in GRAPH_SIZES if s <= (bucket(min(config.max_slots, 64)) or 64))
            )

    # -- graphs ------------------------------------------------------------------------------------
    def _reset_graphs(self) -> None:
        cache = self.model_runner.cache
        self.graphs.clear()
        self._pool = torch.cuda.graph_pool_handle()
        self._cache = cache
        self._static = padding(
            max(GRAPH_SIZES), self.width, cache.scratch_slot, self.block_size, self.device
        )

    def capture(self, sizes: tuple[int, ...]) -> None:
        """Capture the decode graphs of ``sizes`` (largest first, so the smaller ones reuse the
        pool's memory); on the device thread, with the compute stream idle."""
        if self._cache is not self.model_runner.cache:
            self._reset_graphs()
        # The warm-up forwards really run: every static row must be padding (scratch slot only),
        # not the last step's rows, whose slots may belong to other sequences by now. On the
        # compute stream, after any replay still reading the buffers.
        cache = self.model_runner.cache
        clean = padding(
            max(GRAPH_SIZES), self.width, cache.scratch_slot, self.block_size, self.device
        )
        self.compute.wait_stream(torch.cuda.current_stream(self.device))
        assert self._static is not None  # made by _reset_graphs, with the pool
        with torch.cuda.stream(self.compute):
            fill_static(self._static, clean)
        for t in clean.tensors().values():  # made on this thread's stream, read on compute
            t.record_stream(self.compute)
        for size in sorted(sizes, reverse=True):
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)

    def _capture(self, size: int) -> _Graph:
        s = self._static
        assert s is not None  # capture() made it first
        rows = torch.arange(size, device=self.device)
        fb = ForwardBatch(
            input_ids=s.input_ids[:size],
            positions=s.positions[:size],
            write_slots=s.write_slots[:size],
            num_decode=size,
            decode_slots=None,
            decode_mask=None,
            logits_rows=rows,
            decode_tables=s.tables[:size],
            decode_lens=s.lens[:size],
        )
        forward, cache = self.model_runner.forward_impl.forward, self.model_runner.cache
        self.compute.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.compute):  # warm-up: Triton compiles, cuBLAS picks its kernels
            for _ in range(2):
                forward(fb, cache)
        self.compute.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's own thread may stage the next step's copies meanwhile.
        with torch.cuda.graph(
            graph, pool=self._pool, stream=self.compute, capture_error_mode="thread_local"
        ):
            logits = forward(fb, cache)
        return _Graph(size, graph, logits, rows)

    def ensure_capacity(self, blocks: int) -> None:
        """The model runner's KV resize with every stream quiet around it (it copies on the default
        stream); graphs that point into the old cache are recaptured on the next decode step."""
        torch.cuda.synchronize(self.device)
        self.model_runner.ensure_capacity(blocks)
        torch.cuda.synchronize(self.device)

    # -- one step ----------------------------------------------------------------------------------
    def launch(self, fb: ForwardBatch, rows: list, seed: int, prev: Future | None) -> Future:
        """Stage ``fb`` into the next pinned set, copy it in on the h2d stream, and queue the
        compute on the device thread behind ``prev`` (the step in flight, whose sampled tokens
        fill this step's placeholders). Called when the step is prepared: under the async runner
        step N+1's copy and compute are queued while step N still computes, so the GPU never
        waits for the host to land N. The engine's bookkeeping for the step (``_launch``) needs
        nothing from the device. Returns a future of :class:`Launched`; an error (while staging,
        or ``prev`` failed) is set on it, and the engine fails the step's requests as it does for
        a failed forward (a step prepared behind a failed one is dropped unread)."""
        try:
            return self._launch(fb, rows, seed, prev)
        except Exception as exc:  # noqa: BLE001
            failed: Future = Future()
            failed.set_exception(exc)
            return failed

    def _launch(self, fb: ForwardBatch, rows: list, seed: int, prev: Future | None) -> Future:
        size = graph_size(fb, self.width) if self.graphs_on else None
        if size is not None:
            host = pad_decode(
                fb, size, self.width, self.model_runner.cache.scratch_slot, self.block_size
            ).tensors()
        else:
            host = flatten_inputs(fb)
        if fb.carry_dst is not None:
            assert fb.carry_src is not None  # set with carry_dst (model_runner._carry_over)
            host["carry_dst"], host["carry_src"] = fb.carry_dst, fb.carry_src
        k = self.staging.acquire()
        marks = {
            lane: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for lane in CUDA_LANES
        }
        with torch.cuda.stream(self.h2d):
            marks["h2d"][0].record(self.h2d)
            dev = {
                name: self.staging.stage(k, name, t).to(self.device, non_blocking=True)
                for name, t in host.items()
            }
            marks["h2d"][1].record(self.h2d)
        self.staging.fence(k, marks["h2d"][1])
        for (
            t
        ) in dev.values():  # made on h2d, read on compute: not reused before compute is past them
            t.record_stream(self.compute)
        return device_thread.submit(self._execute, fb, dev, rows, seed, prev, size, marks, k)

    def _execute(
        self,
        fb: ForwardBatch,
        dev: dict[str, torch.Tensor],
        rows: list,
        seed: int,
        prev: Future | None,
        size: int | None,
        marks: dict,
        k: int,
    ) -> Launched:
        n = len(rows)
        # The device thread runs steps in order: ``prev`` is done here (raises if it failed).
        # Its tokens were made on the compute stream, which this step's work follows.
        prev_tokens = prev.result().tokens if prev is not None and "carry_dst" in dev else None
        if size is not None and (
            self._cache is not self.model_runner.cache or size not in self.graphs
        ):
            self.capture((size,))  # after a KV resize, or max_slots raised past the sizes captured
        with torch.cuda.stream(self.compute):
            self.compute.wait_event(marks["h2d"][1])
            marks["compute"][0].record(self.compute)
            if size is not None:
                g = self.graphs[size]
                step = DecodeInputs(**{f.name: dev[f.name] for f in fields(DecodeInputs)})
                static = self._static
                assert static is not None  # a graph exists: capture() made it
                fill_static(static, step, dev.get("carry_dst"), dev.get("carry_src"), prev_tokens)
                g.graph.replay()
                logits = g.logits[:n]  # [size, V] -> the n real rows; padding rows dropped
                self.replays += 1
            else:
                batch = rebuild(fb, dev)
                if "carry_dst" in dev:
                    assert prev_tokens is not None  # carried only behind the step in flight
                    batch.input_ids[dev["carry_dst"]] = prev_tokens[dev["carry_src"]]
                logits = self.model_runner.forward_impl.forward(batch, self.model_runner.cache)
                self.eager += 1
            tokens = sample(logits, rows, seed)
            marks["compute"][1].record(self.compute)
        if self.outputs[k].numel() < n:
            self.outputs[k] = torch.empty(max(n, 64), dtype=torch.long, pin_memory=True)
        host = self.outputs[k][:n]
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(marks["compute"][1])
            marks["d2h"][0].record(self.d2h)
            host.copy_(tokens, non_blocking=True)
            marks["d2h"][1].record(self.d2h)
        tokens.record_stream(self.d2h)
        return Launched(tokens, host, marks, size)

    def wait(self, future: Future) -> tuple[torch.Tensor, list[int], list[SpanRecord]]:
        """Block until the step's tokens are on the host: (device tokens for the next step's
        carry-over, token ids, the h2d/compute/d2h spans on the engine clock)."""
        done: Launched = future.result()
        done.marks["d2h"][1].synchronize()  # after it, every earlier event of the step has happened
        ids = done.host.tolist()
        ms = {
            lane: (self.ref.elapsed_time(a), self.ref.elapsed_time(b))
            for lane, (a, b) in done.marks.items()
        }
        return done.tokens, ids, lane_spans(self.t_ref, ms)

    def stats(self) -> dict[str, Any]:
        return {
            "cuda_graphs": self.graphs_on,
            "graph_sizes": sorted(self.graphs),
            "replays": self.replays,
            "eager_steps": self.eager,
        }


def check_device(device: str) -> None:
    """``cuda`` without a GPU is a coded error at start (the engine raises the same), never a
    silent CPU run; for the commands that move the model before any engine exists."""
    if device == "cuda" and not torch.cuda.is_available():
        from engine.core.errors import DeviceUnavailable

        raise DeviceUnavailable(
            "device 'cuda' was asked for, but torch sees no CUDA device on this machine "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
        )


@functools.lru_cache(maxsize=4)
def device_name(device: str) -> str:
    """What the page shows beside the device: the GPU's name, or the CPU model."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
