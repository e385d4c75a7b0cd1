"""The one thread that does the process's heavy tensor work (loading, packing, every forward).

On the 2-core CPU, tensor work split across threads is slow: after one thread has run the model,
a forward on a second thread took 67 ms instead of 40 ms, and sync steps slowed alike. So the
model is loaded and run on a single process-wide "device" thread, for every engine and runner;
the async runner overlaps the caller's thread (scheduling, streaming) with it, which is exactly
the CPU/accelerator split the lessons show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fluxo-device")
        return _executor


def on_device_thread() -> bool:
    return threading.current_thread().name.startswith("fluxo-device")


def submit(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future:
    return executor().submit(fn, *args, **kwargs)


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on the device thread and wait (inline when already there)."""
    if on_device_thread():
        return fn(*args, **kwargs)
    return submit(fn, *args, **kwargs).result()
