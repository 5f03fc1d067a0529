"""What every route reads: the server's engine, settings, batcher and metrics, held by the app
(``app.state.server``) rather than by a closure, so that a route module needs no app to
define its routes."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from ..batcher import Batcher
from ..config import ServeSettings
from ..metrics import Metrics

#: the scope key of a request's timestamps (``time.perf_counter``): ``arrived`` (set by the
#: app's middleware), ``delivered`` (the handler holds its answer); a dict shared by the scope's
#: copies
MARKS = "isouq.marks"


@dataclass
class ServerState:
    """One server's parts.

    engine: the :class:`~isouq.serve.engine.Engine` (model, tokenizer, calibration).
    settings: the :class:`~isouq.serve.config.ServeSettings`.
    batcher: the queue and its worker.
    metrics: the Prometheus metrics.
    model_info: what ``GET /v1/models`` adds about the model (e.g. its files).
    created: when the app was made (Unix seconds; ``created`` of the model card).
    """

    engine: object
    settings: ServeSettings
    batcher: Batcher
    metrics: Metrics
    model_info: dict = field(default_factory=dict)
    created: int = 0


def server_of(request: Request) -> ServerState:
    """The :class:`ServerState` of the app answering ``request``."""
    return request.app.state.server
