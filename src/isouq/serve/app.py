"""The HTTP API (FastAPI), assembled: the routes (``isouq.serve.routes``, one module per
endpoint family: OpenAI's chat and completion endpoints with an ``uncertainty`` object in every
choice, ``/v1/score`` for answers made elsewhere, ``/v1/ask`` (``isouq ask`` over HTTP, the
page's), ``/v1/models``, ``/health``, ``/metrics`` and the page at ``/``), the middleware that
limits bodies and counts requests, and the error handlers.

Every error is OpenAI's JSON shape ``{"error": {"message", "type", "param", "code"}}`` with a
message naming the field or the limit: malformed JSON 400, a field of the wrong type or range
422, over a size limit 413, no key 401, another model 404, queue full 429 (``Retry-After``),
shutting down 503, not answered within ``--request-timeout`` 504. A request that fails never
stops the server or another request.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from .batcher import Batcher
from .config import ServeSettings
from .errors import RequestError
from .metrics import Metrics
from .model_thread import ModelThread
from .routes import ROUTERS
from .routes.jobs import CLIENT_GONE, ClientGone
from .routes.state import MARKS, ServerState

#: paths with their own metrics label; anything else is counted as "other"
ENDPOINTS = ("/", "/health", "/metrics", "/v1/models", "/v1/chat/completions",
             "/v1/completions", "/v1/score", "/v1/ask")


class _Limits:
    """Pure ASGI middleware: the body size limit (413 from the Content-Length header, or while
    the body streams in) and the per-endpoint request metrics."""

    def __init__(self, app, settings: ServeSettings, metrics: Metrics):
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        marks = {"arrived": t0}  # the handler's parse stage starts here
        scope = {**scope, MARKS: marks}
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else (
            "/v1/models" if path.startswith("/v1/models/") else "other")
        status = {"code": 500}
        limit = self.settings.max_body_bytes

        async def send_and_count(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
            if (message["type"] == "http.response.body" and not message.get("more_body")
                    and "delivered" in marks):  # the answer encoded and sent
                self.metrics.observe_stage("respond", time.perf_counter() - marks["delivered"])

        length = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if length is not None and length.isdigit() and int(length) > limit:
                await _too_large(limit)(scope, receive, send_and_count)
                return
            # the body is read here, at most `limit` bytes, then handed on whole
            body, more = b"", scope.get("method") in ("POST", "PUT", "PATCH")
            while more:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                body += message.get("body", b"")
                if len(body) > limit:
                    await _too_large(limit)(scope, receive, send_and_count)
                    return
                more = message.get("more_body", False)
            sent = False

            async def replay():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            if scope.get("method") in ("POST", "PUT", "PATCH"):
                # every body is read as JSON, whatever the client called it (curl -d says
                # application/x-www-form-urlencoded): malformed JSON is then a 400 naming it
                scope = {**scope, "headers": [
                    *((k, v) for k, v in scope.get("headers") or [] if k != b"content-type"),
                    (b"content-type", b"application/json")]}
            await self.app(scope, replay, send_and_count)
        finally:
            self.metrics.observe_request(endpoint, status["code"], time.perf_counter() - t0)


def _too_large(limit: int) -> JSONResponse:
    err = RequestError(f"the request body is over this server's limit of {limit} bytes "
                       "(--max-body-bytes); send less per request", status=413,
                       code="body_too_large")
    return JSONResponse(err.body(), status_code=413)


def _field(loc) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        err = RequestError(f"the body is not valid JSON ({ctx.get('error', 'malformed')}); send "
                           "one JSON object", status=400, code="invalid_json")
        return JSONResponse(err.body(), status_code=400)
    param = _field(first.get("loc", ()))
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" \
        if len(errors) > 1 else ""
    err = RequestError(f"{param}: {msg}{more}", status=422, param=param, code="invalid_field")
    return JSONResponse(err.body(), status_code=422)


def create_app(engine, settings: ServeSettings, *, batcher: Batcher | None = None,
               metrics: Metrics | None = None, model_info: dict | None = None,
               thread: ModelThread | None = None) -> FastAPI:
    """The FastAPI application of a loaded model: the routes of ``isouq.serve.routes``, the
    body limit and request metrics, OpenAI-shaped errors.

    Args:
        engine: the :class:`~isouq.serve.engine.Engine` (model, tokenizer, calibration).
        settings: the server's :class:`ServeSettings`.
        batcher: the queue and worker (default: a new one, started with the app and stopped,
            after the requests in flight, when the app shuts down).
        metrics: the metrics (default: new).
        model_info: what ``GET /v1/models`` says about the model (e.g. its files).
        thread: the :class:`~isouq.serve.model_thread.ModelThread` that loaded the model, for
            the new batcher to run on (default: a new thread; on the CPU, load the model on the
            thread that runs it: ``serve/model_thread.py`` says why).

    Returns:
        The app; run it with uvicorn (``serve.server.run_server``) or a TestClient.
    """
    metrics = metrics or Metrics()
    batcher = batcher or Batcher(engine, settings, metrics, thread=thread)

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        # uvicorn has answered the requests in flight by now (graceful shutdown); the worker
        # finishes anything still queued, then ends
        await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="isouq serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = ServerState(engine, settings, batcher, metrics, dict(model_info or {}),
                                   int(time.time()))
    app.state.batcher, app.state.engine, app.state.metrics = batcher, engine, metrics
    app.state.settings = settings
    app.add_middleware(_Limits, settings=settings, metrics=metrics)
    _add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON shape; a bug is one 500 and the server goes on."""

    @app.exception_handler(RequestError)
    async def on_request_error(request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request, exc: RequestValidationError):
        return _validation_response(exc)

    @app.exception_handler(ClientGone)
    async def on_gone(request, exc):
        return Response(status_code=CLIENT_GONE)

    async def on_http(request, exc):  # the router's own: unknown path, wrong method, ...
        code = getattr(exc, "status_code", 400)
        message = {404: f"no endpoint {request.url.path}; see GET /v1/models, POST "
                        "/v1/chat/completions, /v1/completions, /v1/score",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
            code, str(getattr(exc, "detail", "bad request")))
        err = RequestError(message, status=code, code="http_error")
        return JSONResponse(err.body(), status_code=code, headers=getattr(exc, "headers", None))

    for code in (400, 404, 405, 413, 415):
        app.add_exception_handler(code, on_http)

    @app.exception_handler(Exception)
    async def on_anything(request, exc: Exception):  # a bug: one 500, the server goes on
        err = RequestError(f"internal error ({type(exc).__name__}); the server goes on. "
                           "Please report it with the request", status=500, code="internal")
        return JSONResponse(err.body(), status_code=500)
