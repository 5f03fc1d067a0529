"""The one thread that runs every torch computation of a server: loading, warm-up, batches.

Why one thread. PyTorch's CPU operators run their parallel loops on OpenMP (libgomp in the
official wheels), which keeps a team of worker threads for each thread that has run a parallel
region. Once a second thread runs them (the model loaded on the main thread, the batches run on
a worker thread), the process holds more OpenMP threads than cores; libgomp then stops spinning
between regions and its workers sleep, so every small operator waits for them to wake. Measured
on a 2-core CPU (``benchmarks/worker_thread.py``): one SmolLM2 answer scored on a second thread
after the main thread had run torch took about a third longer than on the main thread, and an
element-wise loop five times longer; on a thread that is the process's only torch thread it is
as fast as on the main thread. So ``isouq serve`` loads the model, warms it up and runs every
batch on this one thread, and the event loop's thread runs no parallel torch work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ModelThread:
    """A single long-lived daemon thread that owns the model and runs what is submitted to it,
    in order (a daemon, as the server's worker always was: a process that exits without
    stopping the server does not wait for it).

    Args:
        name: the thread's name (seen in ``py-spy`` and debuggers).
    """

    def __init__(self, name: str = "isouq-model"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the Future
                future.set_exception(e)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the thread (after what was submitted before); its Future."""
        future: Future = Future()
        self._jobs.put((future, fn))
        return future

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the thread and return its result (its exception is
        raised here)."""
        return self.submit(lambda: fn(*args, **kwargs)).result()

    def shutdown(self) -> None:
        """End the thread once what was submitted has run."""
        self._jobs.put(None)
