"""The execute stage: a prepared step run on the process's device thread (``device.py``) or by the
CUDA executor (``cuda_exec.py``), and what a step holds while it runs (``InFlight``).

``Executor`` knows the model runner, the device thread and the clock, never the engine: it is
handed a step, launches it (behind the step in flight, whose sampled tokens fill the
placeholders on the device) and lands it (its tokens back, its compute and copy spans timed).
The order of the stages is the engine's (``Engine.step``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.core.config import EngineConfig
from engine.core.llama import ForwardBatch
from engine.core.model_runner import ModelRunner
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence
from engine.core.step_record import StepTrace

if TYPE_CHECKING:  # types only: cuda_exec imports torch.cuda machinery
    from engine.core.cuda_exec import CudaExecutor


@dataclass(slots=True, eq=False)
class InFlight:
    """One step from prepare to finish: what executes it and what it computed; the parts of its
    record ride along in ``trace``."""

    batch: ScheduledBatch
    rows: list[Sequence | None]  # the sequence each row's token belongs to (None: not sampled)
    fb: ForwardBatch
    trace: StepTrace
    # (row, sequence, output index) of every token this step computes for a sequence
    outputs: list[tuple[int, Sequence, int]] = field(default_factory=list)
    future: Future | None = None
    tokens: torch.Tensor | None = None  # the sampled tokens, on the device, once landed


class Executor:
    """Launches and lands steps on the device thread, or through the CUDA executor."""

    def __init__(
        self,
        model_runner: ModelRunner,
        device_pool: ThreadPoolExecutor,
        cuda: CudaExecutor | None,
        config: EngineConfig,
        now: Callable[[], float],
    ) -> None:
        self.model_runner, self.device_pool, self.cuda = model_runner, device_pool, cuda
        self.config, self.now = config, now  # the engine's own config: a live seed change holds

    def stage(self, step: InFlight, prev: InFlight | None) -> None:
        """CUDA: copy the step in now and queue it behind ``prev`` (at prepare); CPU: nothing."""
        if self.cuda is not None:
            prev_future = prev.future if prev is not None else None
            step.future = self.cuda.launch(step.fb, step.rows, self.config.seed, prev_future)

    def launch(self, step: InFlight, prev_tokens: torch.Tensor | None) -> None:
        """Start executing ``step`` (its inputs' placeholders come from ``prev_tokens``)."""
        if self.cuda is not None:  # already queued by ``stage``
            return
        model_runner, now, trace = self.model_runner, self.now, step.trace
        t = now()
        fb, rows, seed = model_runner.to_device(step.fb), step.rows, self.config.seed
        if fb.input_ids.is_cuda:
            trace.spans.append({"lane": "h2d", "start": t, "end": now()})

        def execute() -> tuple[torch.Tensor, float, float]:
            t0 = now()
            tokens = model_runner.execute(fb, rows, seed, prev_tokens)
            return tokens, t0, now()

        step.future = self.device_pool.submit(execute)

    def land(self, step: InFlight) -> list[int]:
        """Wait for ``step``'s sampled tokens; adds its compute and d2h spans."""
        assert step.future is not None  # ``launch`` (or, on CUDA, ``stage``) set it
        spans = step.trace.spans
        if self.cuda is not None:  # spans timed by CUDA events, on the engine clock
            step.tokens, ids, cuda_spans = self.cuda.wait(step.future)
            spans.extend(cuda_spans)
            return ids
        step.tokens, t0, t1 = step.future.result()
        spans.append({"lane": "compute", "start": t0, "end": t1})
        t = self.now()
        ids = step.tokens.tolist()
        spans.append({"lane": "d2h", "start": t, "end": self.now()})
        return ids
