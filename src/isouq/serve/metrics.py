"""Prometheus metrics of a server (``GET /metrics``, text exposition format).

- ``isouq_requests_total{endpoint, status}``: requests answered, by endpoint and HTTP status;
- ``isouq_request_seconds{endpoint}``: time from the request's arrival to its answer;
- ``isouq_batch_answers`` / ``isouq_batch_requests``: answers and requests per micro-batch
  (``isouq_batch_answers_count`` is the number of batches);
- ``isouq_batches_total{answers}``: batches by their exact number of answers (the histogram's
  buckets cannot tell 15 from 16);
- ``isouq_model_busy_seconds_total``: seconds the model thread spent running batches (its
  share of the wall time is how busy the model is);
- ``isouq_batch_starts_total{reason}``: why each batch started: ``full`` (``max_batch``
  answers queued), ``back`` (the clients the last batch answered are all back), ``waited``
  (``max_wait_ms`` passed), ``stopping``;
- ``isouq_queue_depth``: requests waiting for the worker;
- ``isouq_stage_seconds{stage}``: per request ``parse`` (from its arrival to its job queued:
  the body read, validated and checked), ``queue`` (waiting before its batch starts) and
  ``deliver`` (from its batch's end to its handler holding the answer: the hand-off from the
  worker thread to the event loop), ``respond`` (from then to the response's last byte
  handed to the server: the response built, encoded as JSON and sent); per batch ``prepare``
  (prompts built, tokenized and checked), ``generate`` (decoding), ``score`` (the one
  ``score_sequences`` call), ``calibrate`` (P(correct)), and ``gap``: from the end of the
  batch before to this one's start, the model idle (the batch waiting to form, or nothing
  queued). A request's seconds are the sum of
  its stages and its batch's.

Each server has its own registry (several apps in one process, as in the tests, do not mix).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The server's counters, gauges and histograms, in their own registry."""

    content_type = CONTENT_TYPE

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("isouq_requests", "requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.request_seconds = Histogram("isouq_request_seconds",
                                         "seconds from a request's arrival to its answer",
                                         ["endpoint"], buckets=SECONDS, registry=r)
        self.batch_answers = Histogram("isouq_batch_answers",
                                       "answers per micro-batch (scored in one call)",
                                       buckets=SIZES, registry=r)
        self.batch_requests = Histogram("isouq_batch_requests", "requests per micro-batch",
                                        buckets=SIZES, registry=r)
        self.batch_starts = Counter("isouq_batch_starts", "batches started, by reason: full, "
                                    "back (the last batch's clients are back), waited, "
                                    "stopping", ["reason"], registry=r)
        self.batch_sizes = Counter("isouq_batches", "batches by their number of answers",
                                   ["answers"], registry=r)
        self.busy_seconds = Counter("isouq_model_busy_seconds", "seconds the model thread "
                                    "spent running batches", registry=r)
        self.queue_depth = Gauge("isouq_queue_depth", "requests waiting for the worker",
                                 registry=r)
        self.stage_seconds = Histogram("isouq_stage_seconds",
                                       "seconds per stage: parse, queue, deliver, respond "
                                       "(per request), prepare, generate, score, calibrate, "
                                       "gap (per batch)", ["stage"],
                                       buckets=SECONDS, registry=r)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.request_seconds.labels(endpoint).observe(seconds)

    def observe_batch(self, answers: int, requests: int, waits: list[float],
                      stages: dict[str, float], reason: str | None = None,
                      busy: float | None = None) -> None:
        """One batch: its answers and requests, each request's wait in the queue, the batch's
        seconds per stage, why it started and the seconds it held the model."""
        self.batch_answers.observe(answers)
        self.batch_sizes.labels(str(answers)).inc()
        if busy is not None:
            self.busy_seconds.inc(max(busy, 0.0))
        self.batch_requests.observe(requests)
        if reason is not None:
            self.batch_starts.labels(reason).inc()
        for w in waits:
            self.stage_seconds.labels("queue").observe(max(w, 0.0))
        for stage, s in stages.items():
            self.stage_seconds.labels(stage).observe(s)

    def observe_stage(self, stage: str, seconds: float) -> None:
        """One request's seconds in ``stage`` (``parse``, ``deliver``, ``respond``)."""
        self.stage_seconds.labels(stage).observe(max(seconds, 0.0))

    def text(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
