"""A request's job queued and its answer awaited: the answer, a 504 past
``--request-timeout``, or :class:`ClientGone` when the client disconnects first (either takes
the job out of the queue if it has not started). The per-request stages ``parse`` and
``deliver`` of ``isouq_stage_seconds`` are measured here."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from ...errors import IsouqError
from ..errors import RequestError
from .state import MARKS, server_of

#: HTTP status of a client that went away before its answer (nginx's convention)
CLIENT_GONE = 499


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def answer(request: Request, work):
    """Queue ``work`` (an ``engine.ScoreJob`` or ``engine.GenerateJob``) and return its result.

    Args:
        request: the request the work answers (its client's departure cancels the work).
        work: the job.

    Returns:
        The job's ``Outcome.result``.

    Raises:
        RequestError: the job's own error (a limit, a bad prompt), 429/503 from the queue, or
            504 past the timeout.
        ClientGone: the client disconnected first.
    """
    server = server_of(request)
    batcher, metrics = server.batcher, server.metrics
    marks = request.scope.get(MARKS, {})
    queued = time.perf_counter()  # before the worker can take the GIL to run the batch
    future = batcher.submit(work, track=True)
    if "arrived" in marks:
        metrics.observe_stage("parse", queued - marks["arrived"])
    try:
        outcome = await _wait(request, future)
    finally:  # the answer is handed over (or never will be): the next batch knows
        batcher.delivered(future)
    marks["delivered"] = time.perf_counter()
    finished = getattr(outcome, "finished", None)
    if finished is not None:
        metrics.observe_stage("deliver", marks["delivered"] - finished)
    if outcome.error is not None:
        e = outcome.error
        if isinstance(e, RequestError):
            raise e
        if isinstance(e, IsouqError):
            raise RequestError(str(e), param=getattr(work, "param", None))
        raise e
    return outcome.result


async def _wait(request: Request, future):
    """The Outcome of ``future``; 504 past ``--request-timeout``, ClientGone when the client
    disconnects first."""
    server = server_of(request)
    timeout = server.settings.request_timeout_s
    waiting = asyncio.wrap_future(future)
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # never unread

    async def gone():
        # the body has been read: the next message is the client's departure (or the end of
        # this response); no polling
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({waiting, watch}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if waiting not in done:
        server.batcher.cancel(future)
        if watch in done:
            raise ClientGone()
        raise RequestError(f"not answered within {timeout:g} s (--request-timeout); retry, "
                           "or send less per request", status=504, code="timeout")
    return waiting.result()
