"""The HTTP routes of ``isouq serve``, one module per endpoint family (``create_app`` in
:mod:`isouq.serve.app` assembles them):

- :mod:`.chat`: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI's, with an
  ``uncertainty`` object in every choice; ``stream`` as OpenAI's chunks);
- :mod:`.score`: ``POST /v1/score``, answers made elsewhere scored as ``isouq score`` scores them;
- :mod:`.ask`: ``POST /v1/ask``, ``isouq ask`` over HTTP (the page's);
- :mod:`.models`: ``GET /v1/models`` and ``GET /v1/models/{name}``;
- :mod:`.health`: ``GET /health`` (no key) and ``GET /metrics`` (Prometheus);
- :mod:`.page`: ``GET /``, the page.

What they share: :mod:`.state` (the server's engine, settings, batcher and metrics, read from
the app), :mod:`.checks` (the key, the model name, the limits a request is checked against
before it is queued) and :mod:`.jobs` (a job queued and its answer awaited, with the request's
timeout and its client's departure).
"""

from __future__ import annotations

from . import ask, chat, health, models, page, score

#: every router, in the order ``create_app`` includes them
ROUTERS = (page.router, health.router, models.router, chat.router, score.router, ask.router)

__all__ = ["ROUTERS"]
