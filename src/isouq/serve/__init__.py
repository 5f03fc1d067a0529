"""``isouq serve``: an OpenAI-compatible HTTP server whose every answer carries its uncertainty.

The parts, each in its own module (docs/serve.md is the user's guide):

- :mod:`~isouq.serve.config`: :class:`ServeSettings`, the limits and batching settings (fixed at
  start; no request can change them or make the server load anything).
- :mod:`~isouq.serve.engine`: the model-side work of one micro-batch: prompts built and
  checked against the limits, greedy or sampled answers (``llm.generation``, the decoding of
  ``isouq ask``), every answer of the batch scored together (one ``score_sequences`` call per
  pass, passes by length), P(correct) from a calibration.
- :mod:`~isouq.serve.batcher`: the bounded queue and the one worker thread that owns the model
  and runs micro-batches (``max_batch`` answers, waiting at most ``max_wait_ms``).
- :mod:`~isouq.serve.schemas`: request bodies (pydantic), OpenAI's shapes plus ``/v1/score``.
- :mod:`~isouq.serve.metrics`: Prometheus metrics (``GET /metrics``).
- :mod:`~isouq.serve.routes`: the HTTP routes, one module per endpoint family (chat and
  completions, score, ask, models, health and metrics, the page).
- :mod:`~isouq.serve.app`: the FastAPI application (:func:`create_app` assembles the routes,
  the body limit, the request metrics and the error handlers).
- :mod:`~isouq.serve.page`: the page at ``/`` (inline HTML, CSS and JavaScript).
- :mod:`~isouq.serve.server`: loading the model and running uvicorn (:func:`run_server`).

Nothing here is imported by ``import isouq``; fastapi, uvicorn and prometheus_client come with
the ``serve`` extra (``pip install 'isouq[llm,serve]'``).
"""

from __future__ import annotations

from .config import ServeSettings

__all__ = ["ServeSettings"]
