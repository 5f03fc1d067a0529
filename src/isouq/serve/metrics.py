"""Prometheus metrics of a server (``GET /metrics``, text exposition format).

- ``isouq_requests_total{endpoint, status}``: requests answered, by endpoint and HTTP status;
- ``isouq_request_seconds{endpoint}``: time from the request's arrival to its answer;
- ``isouq_batch_answers`` / ``isouq_batch_requests``: answers and requests per micro-batch
  (``isouq_batch_answers_count`` is the number of batches);
- ``isouq_queue_depth``: requests waiting for the worker;
- ``isouq_stage_seconds{stage}``: ``queue`` (per request: waiting before its batch starts),
  and per batch ``prepare`` (prompts built and checked), ``generate`` (decoding), ``score``
  (the one ``score_sequences`` call), ``calibrate`` (P(correct)).

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
        self.queue_depth = Gauge("isouq_queue_depth", "requests waiting for the worker",
                                 registry=r)
        self.stage_seconds = Histogram("isouq_stage_seconds",
                                       "seconds per stage: queue (per request), prepare, "
                                       "generate, score, calibrate (per batch)", ["stage"],
                                       buckets=SECONDS, registry=r)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.request_seconds.labels(endpoint).observe(seconds)

    def observe_batch(self, answers: int, requests: int, waits: list[float],
                      stages: dict[str, float]) -> None:
        self.batch_answers.observe(answers)
        self.batch_requests.observe(requests)
        for w in waits:
            self.stage_seconds.labels("queue").observe(max(w, 0.0))
        for stage, s in stages.items():
            self.stage_seconds.labels(stage).observe(s)

    def text(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
