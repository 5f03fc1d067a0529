"""Micro-batching: a bounded queue and its worker, run on the one thread that owns the model
(:class:`~isouq.serve.model_thread.ModelThread`).

Requests are queued as jobs (``engine.ScoreJob`` / ``engine.GenerateJob``). The worker takes
the jobs that fit in ``max_batch`` answers (always at least one) and runs them as one batch
(``Engine.run``: the batch scored together, in passes by length): every job queued when they all
fit, else the oldest and the jobs of the queue's front whose rows are closest to it in length
(:func:`choose`: less padding, as ``isouq score`` buckets its rows; a job passed over
:data:`MAX_PASSED` times goes first). Each job's answer comes
back through a ``concurrent.futures.Future``. When a batch starts:

- at once when ``max_batch`` answers are queued;
- when the server was idle (no batch just answered): ``max_wait_ms`` after the first waiting
  job arrived, so a request waits at most that long for others to join it;
- after a batch: the clients it answered usually send again, and the next batch waits for them
  (without it, concurrent clients split into groups that take turns, each batch part full:
  while one group's batch runs the other group queues, and it would start alone the moment the
  batch ends, before the answered clients are back). The next batch starts when the queue
  holds as many answers as were waiting when the batch ended plus the batch's own (the
  answered clients are all back; at most ``max_batch``), or once ``max_wait_ms`` have passed
  since the last of these events: the batch ended, one of its answers was handed to its
  client (:meth:`Batcher.delivered`; an answer the app reports is awaited, at most
  :data:`DELIVERY_GRACE_S`), a request arrived. Each answered client that comes back gives the
  others ``max_wait_ms`` more, and at most as many as the batch answered can come back before
  it starts, so the wait is bounded; clients that do not come back cost ``max_wait_ms``.

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
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from .config import ServeSettings
from .errors import RequestError
from .model_thread import ModelThread

#: the longest the next batch waits for the app to hand the last batch's answers to their
#: clients (:meth:`Batcher.delivered`; the app reports every one, this only bounds a lost report)
DELIVERY_GRACE_S = 0.5
#: why a batch started (the ``reason`` of ``isouq_batch_starts_total``)
REASONS = ("full", "back", "waited", "stopping")


#: answers queued beyond the first ``max_batch`` that the worker looks through to fill a batch
#: with rows of similar length, in multiples of ``max_batch``
LOOKAHEAD_BATCHES = 2
#: a job passed over this many times (a younger job of closer length went first) goes into the
#: next batch before any job chosen by length
MAX_PASSED = 4
#: characters per token assumed by :func:`length_hint` for a generation's new tokens
CHARS_PER_TOKEN = 4


@dataclass
class Job:
    work: object  # engine.ScoreJob | engine.GenerateJob
    units: int
    submitted: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)
    tracked: bool = False  # the app reports when its answer is handed over (delivered)
    length: int = 0  # length_hint(work): how long its longest row is, in characters
    passed: int = 0  # batches that took a younger job and left this one waiting


def length_hint(work) -> int:
    """The length of the job's longest row (prompt + answer) in characters, known without
    tokenizing (the model thread tokenizes): a stand-in for its token count, to put rows of
    similar length in one batch. A token-id answer counts :data:`CHARS_PER_TOKEN` characters
    per id, a generation its prompt and ``max_tokens`` new tokens."""

    def size(x) -> int:
        if x is None:
            return 0
        if isinstance(x, str):
            return len(x)
        if isinstance(x, dict):
            return len(str(x.get("content", "")))
        if isinstance(x, (list, tuple)):
            return sum(size(v) if not isinstance(v, int) else CHARS_PER_TOKEN for v in x)
        return len(str(x))

    if hasattr(work, "pairs"):
        return max((size(p.prompt) + size(p.question) + size(p.answer) for p in work.pairs),
                   default=0)
    if hasattr(work, "prompts"):
        new = CHARS_PER_TOKEN * int(getattr(work, "max_tokens", 0))
        return max((size(v) for _, v in work.prompts), default=0) + new
    return 0


def choose(queue: deque[Job], max_batch: int) -> list[Job]:
    """Take the next batch out of ``queue``: at most ``max_batch`` answers (the first job
    alone if it holds more).

    When everything queued fits, that is the batch. Otherwise the batch holds the oldest job,
    then every job passed over :data:`MAX_PASSED` times (oldest first), then, from the jobs
    among the first ``(1 + LOOKAHEAD_BATCHES) × max_batch`` answers queued, those whose
    :func:`length_hint` is closest to the oldest job's: rows of similar length padded together,
    as ``isouq score`` buckets its rows. A job left waiting while a younger one went is passed
    over once more, and goes first once passed over ``MAX_PASSED`` times: in a steady stream
    of mixed lengths none goes more than ``MAX_PASSED`` batches later than first come, first
    served would send it (``tests/serve/test_batching.py``).
    """
    if sum(j.units for j in queue) <= max_batch:
        batch = list(queue)
        queue.clear()
        return batch
    window, seen = [], 0
    for job in queue:
        if window and seen + job.units > (1 + LOOKAHEAD_BATCHES) * max_batch:
            break
        window.append(job)
        seen += job.units
    head = window[0]
    batch, units = [head], head.units
    first = [j for j in window[1:] if j.passed >= MAX_PASSED]
    rest = sorted((j for j in window[1:] if j.passed < MAX_PASSED),
                  key=lambda j: abs(j.length - head.length))
    for job in first + rest:
        if units + job.units <= max_batch:
            batch.append(job)
            units += job.units
    place = {id(j): i for i, j in enumerate(window)}
    taken = {id(j) for j in batch}
    youngest = max(place[id(j)] for j in batch)
    for job in window[:youngest]:
        if id(job) not in taken:
            job.passed += 1
    kept = [j for j in queue if id(j) not in taken]
    queue.clear()
    queue.extend(kept)
    return sorted(batch, key=lambda j: place[id(j)])


@dataclass
class _Turn:
    """The clients the last batch answered, whom the next batch waits for."""

    end: float  # when the batch ended (perf_counter)
    expect: int  # answers queued once they are all back: waiting at the end + the batch's
    undelivered: set[int]  # id() of its tracked jobs whose answers are not handed over yet
    last: float  # the latest of: the end, a delivery, an arrival

    def closes(self, wait: float) -> float:
        """When the wait for these clients is over."""
        if self.undelivered:
            return self.end + DELIVERY_GRACE_S
        return min(self.last + wait, self.end + DELIVERY_GRACE_S + (self.expect + 1) * wait)


class Batcher:
    """The queue and its worker.

    Args:
        engine: runs a batch (``Engine.run(list of work) -> list of Outcome``).
        settings: ``max_batch``, ``max_wait_ms``, ``max_queue``.
        metrics: a :class:`~isouq.serve.metrics.Metrics` (or None).
        thread: the :class:`ModelThread` that loaded the engine's model (the worker runs on it;
            default: a new one).
    """

    def __init__(self, engine, settings: ServeSettings, metrics=None,
                 thread: ModelThread | None = None):
        self.engine, self.settings, self.metrics = engine, settings, metrics
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running = 0  # jobs in the batch being run
        self._batch_seconds = 0.0  # moving average, for Retry-After
        self._turn: _Turn | None = None  # the clients the last batch answered
        self._model_thread = thread
        self._worker: Future | None = None  # the worker loop, once started
        self._last_end: float | None = None  # when the last batch ended (perf_counter)
        self.batches = 0

    # ------------------------------------------------------------ the handlers' side
    def start(self) -> Batcher:
        """Start the worker on the model thread (once); it holds that thread until
        :meth:`stop`."""
        if self._worker is None:
            self._model_thread = self._model_thread or ModelThread()
            self._worker = self._model_thread.submit(self._work)
        return self

    @property
    def _running_worker(self) -> bool:
        return self._worker is not None and not self._worker.done()

    @property
    def alive(self) -> bool:
        return self._running_worker and not self._stopping

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

    def submit(self, work, *, track: bool = False) -> Future:
        """Queue ``work``; its Future gets the ``Outcome``. RequestError 429 when the queue is
        full, 503 when the server is stopping.

        Args:
            work: an ``engine.ScoreJob`` or ``engine.GenerateJob``.
            track: the caller reports with :meth:`delivered` when it has handed the answer to
                its client (the next batch waits for that client from then on).
        """
        job = Job(work, max(int(work.units), 1), tracked=track, length=length_hint(work))
        with self._cond:
            if self._stopping or not self._running_worker:
                raise RequestError("the server is shutting down; retry on another instance",
                                   status=503, code="shutting_down")
            if len(self._queue) >= self.settings.max_queue:
                raise RequestError(
                    f"the queue is full ({self.settings.max_queue} requests waiting, "
                    "--max-queue); retry after the seconds in Retry-After", status=429,
                    code="queue_full", headers={"Retry-After": str(self.retry_after())})
            self._queue.append(job)
            t = self._turn
            if t is not None:  # an arrival while the last batch's clients are awaited, or after
                if job.submitted < t.closes(self.settings.max_wait_ms / 1000):
                    t.last = max(t.last, job.submitted)
                else:
                    self._turn = None
            self._gauge()
            self._cond.notify_all()
        return job.future

    def delivered(self, future: Future) -> None:
        """The answer of ``future`` (submitted with ``track=True``) has been handed to its
        client, or never will be (an error, a timeout, a client that left)."""
        with self._cond:
            t = self._turn
            if t is not None and id(future) in t.undelivered:
                t.undelivered.discard(id(future))
                t.last = max(t.last, time.perf_counter())
                self._cond.notify_all()

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
        if self._worker is not None:
            wait_futures([self._worker], timeout)

    # ------------------------------------------------------------ the worker
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))

    def _take(self) -> tuple[list[Job], str] | None:
        """The next batch and why it starts (None: stopped and nothing left)."""
        s = self.settings
        wait = s.max_wait_ms / 1000
        with self._cond:
            while True:
                if not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                units = sum(j.units for j in self._queue)
                if units >= s.max_batch:
                    reason = "full"
                    break
                if self._stopping:
                    reason = "stopping"
                    break
                now = time.perf_counter()
                t = self._turn
                if t is not None and units >= t.expect:
                    reason = "back"
                    break
                until = self._queue[0].submitted + wait
                if t is not None:
                    until = max(until, t.closes(wait))
                if now >= until:
                    reason = "waited"
                    break
                self._cond.wait(until - now)
            batch = [job for job in choose(self._queue, s.max_batch)
                     if job.future.set_running_or_notify_cancel()]
            self._running = len(batch)
            self._turn = None
            self._gauge()
            return batch, reason

    def _work(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, reason = taken
            if not batch:  # every job taken had been cancelled
                continue
            t0 = time.perf_counter()
            error = None
            try:
                outcomes = self.engine.run([j.work for j in batch])
            except BaseException as e:  # noqa: BLE001 - the batch's jobs get it; the worker goes on
                outcomes, error = None, e
            dt = time.perf_counter() - t0
            gap = None if self._last_end is None else t0 - self._last_end
            self._last_end = t0 + dt
            self.batches += 1
            self._batch_seconds = dt if not self._batch_seconds else (
                0.8 * self._batch_seconds + 0.2 * dt)
            if self.metrics is not None:
                stages = dict(outcomes[0].seconds) if outcomes else {}
                if gap is not None:
                    stages["gap"] = gap
                self.metrics.observe_batch(sum(j.units for j in batch), len(batch),
                                           [t0 - j.submitted for j in batch], stages, reason,
                                           busy=dt)
            with self._cond:  # the turn first, then the answers: no delivery comes before it
                self._running = 0
                if self.settings.max_wait_ms > 0:
                    end = time.perf_counter()
                    waiting = sum(j.units for j in self._queue)
                    self._turn = _Turn(
                        end=end, last=end,
                        expect=min(self.settings.max_batch,
                                   waiting + sum(j.units for j in batch)),
                        undelivered={id(j.future) for j in batch if j.tracked})
                self._cond.notify_all()
            for j, o in zip(batch, outcomes or [None] * len(batch), strict=True):
                if error is not None:
                    j.future.set_exception(error)
                else:
                    j.future.set_result(o)
