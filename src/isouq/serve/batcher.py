"""Micro-batching: a bounded queue and the one worker thread that owns the model.

Requests are queued as jobs (``engine.ScoreJob`` / ``engine.GenerateJob``). The worker takes
the first waiting job, waits until ``max_batch`` answers are queued or ``max_wait_ms`` have
passed since that job arrived or the last batch ended, whichever is later (the clients a batch
just answered send again within it: without it, concurrent clients split into groups that take
turns, each batch half full), takes the jobs at the front that fit in ``max_batch`` answers
(always at least one) and runs them as one batch (``Engine.run``: one ``score_sequences`` call
over the batch). Each job's answer comes back through a ``concurrent.futures.Future``.

- A full queue refuses a job at once (429 with ``Retry-After``, the seconds the queue ahead
  should take); a stopping server refuses new jobs (503).
- :meth:`Batcher.cancel` takes a job that has not started out of the queue (a client that
  disconnected or timed out frees its place); a job already in a batch runs to its end and
  its answer is dropped.
- :meth:`Batcher.stop` lets the worker finish every job queued or running, then ends it.
- An exception inside a batch answers that batch's jobs with it; the worker goes on.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .config import ServeSettings
from .errors import RequestError


@dataclass
class Job:
    work: object  # engine.ScoreJob | engine.GenerateJob
    units: int
    submitted: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)


class Batcher:
    """The queue and its worker.

    Args:
        engine: runs a batch (``Engine.run(list of work) -> list of Outcome``).
        settings: ``max_batch``, ``max_wait_ms``, ``max_queue``.
        metrics: a :class:`~isouq.serve.metrics.Metrics` (or None).
    """

    def __init__(self, engine, settings: ServeSettings, metrics=None):
        self.engine, self.settings, self.metrics = engine, settings, metrics
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running = 0  # jobs in the batch being run
        self._batch_seconds = 0.0  # moving average, for Retry-After
        self._last_end = 0.0  # when the last batch ended (perf_counter)
        self._thread = threading.Thread(target=self._work, name="isouq-serve-worker",
                                        daemon=True)
        self.batches = 0

    # ------------------------------------------------------------ the handlers' side
    def start(self) -> Batcher:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def depth(self) -> int:
        """Jobs waiting (not yet in a batch)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Jobs waiting or running."""
        with self._cond:
            return len(self._queue) + self._running

    def retry_after(self) -> int:
        """Whole seconds the queue ahead should take (≥ 1)."""
        per = self._batch_seconds or 1.0
        return max(1, math.ceil(per * (self.depth / max(self.settings.max_batch, 1) + 1)))

    def submit(self, work) -> Future:
        """Queue ``work``; its Future gets the ``Outcome``. RequestError 429 when the queue is
        full, 503 when the server is stopping."""
        job = Job(work, max(int(work.units), 1))
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise RequestError("the server is shutting down; retry on another instance",
                                   status=503, code="shutting_down")
            if len(self._queue) >= self.settings.max_queue:
                raise RequestError(
                    f"the queue is full ({self.settings.max_queue} requests waiting, "
                    "--max-queue); retry after the seconds in Retry-After", status=429,
                    code="queue_full", headers={"Retry-After": str(self.retry_after())})
            self._queue.append(job)
            self._gauge()
            self._cond.notify_all()
        return job.future

    def cancel(self, future: Future) -> bool:
        """Take the job of ``future`` out of the queue if it has not started; True if so."""
        with self._cond:
            for job in self._queue:
                if job.future is future:
                    self._queue.remove(job)
                    self._gauge()
                    break
        return future.cancel()

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, let the queued and running ones finish, end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------ the worker
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))

    def _take(self) -> list[Job] | None:
        """The next batch (None: stopped and nothing left)."""
        s = self.settings
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            deadline = max(self._queue[0].submitted, self._last_end) + s.max_wait_ms / 1000
            while (sum(j.units for j in self._queue) < s.max_batch and not self._stopping
                   and (left := deadline - time.perf_counter()) > 0):
                self._cond.wait(left)
                if not self._queue:  # every waiting job was cancelled
                    return []
            batch, units = [], 0
            while self._queue and (not batch or units + self._queue[0].units <= s.max_batch):
                job = self._queue.popleft()
                if job.future.set_running_or_notify_cancel():
                    batch.append(job)
                    units += job.units
            self._running = len(batch)
            self._gauge()
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                outcomes = self.engine.run([j.work for j in batch])
            except BaseException as e:  # noqa: BLE001 - the batch's jobs get it; the worker goes on
                outcomes = None
                for j in batch:
                    j.future.set_exception(e)
            dt = time.perf_counter() - t0
            self.batches += 1
            self._batch_seconds = dt if not self._batch_seconds else (
                0.8 * self._batch_seconds + 0.2 * dt)
            if self.metrics is not None:
                self.metrics.observe_batch(sum(j.units for j in batch), len(batch),
                                           [t0 - j.submitted for j in batch],
                                           outcomes[0].seconds if outcomes else {})
            if outcomes is not None:
                for j, o in zip(batch, outcomes, strict=True):
                    j.future.set_result(o)
            with self._cond:
                self._running = 0
                self._last_end = time.perf_counter()
                self._cond.notify_all()
