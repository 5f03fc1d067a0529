"""The HTTP API (FastAPI): OpenAI's chat and completion endpoints with an ``uncertainty`` object
in every choice, ``/v1/score`` for answers made elsewhere, ``/v1/ask`` (``isouq ask`` over
HTTP, the page's), ``/v1/models``, ``/health``, ``/metrics`` and the page at ``/``.

Every error is OpenAI's JSON shape ``{"error": {"message", "type", "param", "code"}}`` with a
message naming the field or the limit: malformed JSON 400, a field of the wrong type or range
422, over a size limit 413, no key 401, another model 404, queue full 429 (``Retry-After``),
shutting down 503, not answered within ``--request-timeout`` 504. A request that fails never
stops the server or another request.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from ..errors import IsouqError
from .batcher import Batcher
from .config import ServeSettings
from .engine import GenerateJob, Pair, ScoreJob
from .errors import RequestError
from .metrics import Metrics
from .model_thread import ModelThread
from .page import PAGE
from .schemas import AskRequest, ChatRequest, CompletionRequest, Message, ScoreRequest

#: paths with their own metrics label; anything else is counted as "other"
ENDPOINTS = ("/", "/health", "/metrics", "/v1/models", "/v1/chat/completions",
             "/v1/completions", "/v1/score", "/v1/ask")
#: HTTP status of a client that went away before its answer (nginx's convention)
CLIENT_GONE = 499
#: the scope key of a request's timestamps (``time.perf_counter``): ``arrived`` (set by the
#: middleware), ``delivered`` (the handler holds its answer); a dict shared by the scope's copies
MARKS = "isouq.marks"


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
    """The FastAPI application of a loaded model.

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
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        # uvicorn has answered the requests in flight by now (graceful shutdown); the worker
        # finishes anything still queued, then ends
        await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="isouq serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.batcher, app.state.engine, app.state.metrics = batcher, engine, metrics
    app.state.settings = settings
    app.add_middleware(_Limits, settings=settings, metrics=metrics)

    # -------------------------------------------------------------- errors
    @app.exception_handler(RequestError)
    async def on_request_error(request, exc: RequestError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request, exc: RequestValidationError):
        return _validation_response(exc)

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

    # -------------------------------------------------------------- helpers
    async def authorized(request: Request) -> None:
        if settings.api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode(), settings.api_key.encode()):
            raise RequestError("no valid API key: send the header 'Authorization: Bearer "
                               "<key>' with the key the server was started with",
                               status=401, code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})

    def check_model(name: str | None) -> None:
        if name is not None and name != settings.model_id:
            raise RequestError(f"model {name!r} is not served here; this server serves "
                               f"{settings.model_id!r} (fixed at start)", status=404,
                               param="model", code="model_not_found")

    def check_sampling(body, max_tokens: int, param_tokens: str) -> None:
        if max_tokens > settings.max_new_tokens:
            raise RequestError(f"{param_tokens} = {max_tokens} is over this server's limit of "
                               f"{settings.max_new_tokens} (--max-new-tokens)",
                               param=param_tokens, code="over_limit")
        if body.n > settings.max_n:
            raise RequestError(f"n = {body.n} is over this server's limit of {settings.max_n} "
                               "(--max-n)", param="n", code="over_limit")

    def check_messages(messages: list[Message], param: str = "messages") -> list[dict]:
        if len(messages) > settings.max_messages:
            raise RequestError(f"{param} holds {len(messages)} messages, over this server's "
                               f"limit of {settings.max_messages} (--max-messages)",
                               status=413, param=param, code="too_many_messages")
        return [m.as_dict() for m in messages]

    async def run(request: Request, work):
        """Queue ``work``, wait for its answer, its timeout or its client's departure."""
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
        """The Outcome of ``future``; 504 past ``--request-timeout``, _ClientGone when the
        client disconnects first (both take the job out of the queue if it has not started)."""
        answer = asyncio.wrap_future(future)
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())  # never unread

        async def gone():
            # the body has been read: the next message is the client's departure (or the end
            # of this response); no polling
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watch = asyncio.ensure_future(gone())
        try:
            done, _ = await asyncio.wait({answer, watch}, timeout=settings.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if answer not in done:
            batcher.cancel(future)
            if watch in done:
                raise _ClientGone()
            raise RequestError(f"not answered within {settings.request_timeout_s:g} s "
                               "(--request-timeout); retry, or send less per request",
                               status=504, code="timeout")
        return answer.result()

    @app.exception_handler(_ClientGone)
    async def on_gone(request, exc):
        return Response(status_code=CLIENT_GONE)

    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:24]}"

    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    # -------------------------------------------------------------- routes
    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE)

    @app.get("/health")
    async def health():
        ok = batcher.alive
        body = {"status": "ok" if ok else "unavailable", "model": settings.model_id,
                "queue": batcher.depth, "batches": batcher.batches}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def metrics_text():
        return Response(metrics.text(), media_type=metrics.content_type)

    def model_card() -> dict:
        cal = engine.calibration
        return {"id": settings.model_id, "object": "model", "created": created,
                "owned_by": "isouq",
                "isouq": {"params": engine.params_summary(),
                          "calibration": None if cal is None else cal.describe(),
                          "settings": settings.public(), **(model_info or {})}}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(name: str):
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat(body: ChatRequest, request: Request):
        check_model(body.model)
        max_tokens = body.max_completion_tokens or body.max_tokens or min(
            settings.max_new_tokens, 256)
        check_sampling(body, max_tokens, "max_completion_tokens" if body.max_completion_tokens
                       else "max_tokens")
        messages = check_messages(body.messages)
        work = GenerateJob([("messages", messages)], max_tokens=max_tokens,
                           temperature=body.temperature, top_p=body.top_p, n=body.n,
                           seed=body.seed, stop=body.stop_tuple(), param="messages",
                           spans=body.spans)
        result = (await run(request, work))[0]
        choices = [{"index": i, "message": {"role": "assistant", "content": c["text"]},
                    "logprobs": None, "finish_reason": c["finish_reason"],
                    "uncertainty": c["uncertainty"]} for i, c in enumerate(result["choices"])]
        doc = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
               "model": settings.model_id, "choices": choices,
               "usage": usage(result["prompt_tokens"],
                              sum(c["completion_tokens"] for c in result["choices"]))}
        if body.stream:
            return _stream_chat(doc)
        return doc

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        check_sampling(body, body.max_tokens, "max_tokens")
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) * body.n > settings.max_pairs:
            raise RequestError(f"prompt holds {len(prompts)} prompts × n = {body.n} answers, "
                               f"over this server's limit of {settings.max_pairs} "
                               "(--max-pairs)", status=413, param="prompt",
                               code="too_many_prompts")
        work = GenerateJob([("text", p) for p in prompts], max_tokens=body.max_tokens,
                           temperature=body.temperature, top_p=body.top_p, n=body.n,
                           seed=body.seed, stop=body.stop_tuple(), param="prompt",
                           spans=body.spans)
        result = await run(request, work)
        choices, n_prompt, n_done = [], 0, 0
        for per in result:
            n_prompt += per["prompt_tokens"]
            for c in per["choices"]:
                choices.append({"index": len(choices), "text": c["raw_text"], "logprobs": None,
                                "finish_reason": c["finish_reason"],
                                "uncertainty": c["uncertainty"]})
                n_done += c["completion_tokens"]
        doc = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
               "model": settings.model_id, "choices": choices, "usage": usage(n_prompt, n_done)}
        if body.stream:
            return _stream_completion(doc)
        return doc

    @app.post("/v1/score", dependencies=[Depends(authorized)])
    async def score(body: ScoreRequest, request: Request):
        check_model(body.model)
        pairs = body.all_pairs()
        if len(pairs) > settings.max_pairs:
            raise RequestError(f"pairs holds {len(pairs)} pairs, over this server's limit of "
                               f"{settings.max_pairs} (--max-pairs); send them in several "
                               "requests", status=413, param="pairs", code="too_many_pairs")
        work_pairs = []
        for i, p in enumerate(pairs):
            messages = None if p.messages is None else check_messages(
                p.messages, "messages" if body.single else f"pairs[{i}].messages")
            work_pairs.append(Pair(answer=p.answer, prompt=messages or p.prompt,
                                   question=p.question,
                                   key=None if p.key is None else str(p.key)))
        param = "answer" if body.single else "pairs"
        result = await run(request, ScoreJob(work_pairs, param=param, spans=body.spans))
        data = [{"index": i, **({"key": str(p.key)} if p.key is not None else {}),
                 "uncertainty": r["uncertainty"], "prompt_tokens": r["prompt_tokens"],
                 "answer_tokens": r["answer_tokens"]}
                for i, (p, r) in enumerate(zip(pairs, result, strict=True))]
        n_prompt = sum(r["prompt_tokens"] for r in result)
        n_answer = sum(r["answer_tokens"] for r in result)
        return {"object": "list", "model": settings.model_id, "data": data,
                "usage": {"prompt_tokens": n_prompt, "answer_tokens": n_answer,
                          "total_tokens": n_prompt + n_answer}}

    @app.post("/v1/ask", dependencies=[Depends(authorized)])
    async def ask(body: AskRequest, request: Request):
        from ..llm.prompts import DEFAULT_STOP

        max_tokens = body.max_tokens or min(settings.max_new_tokens, 50)
        if max_tokens > settings.max_new_tokens:
            raise RequestError(f"max_tokens = {max_tokens} is over this server's limit of "
                               f"{settings.max_new_tokens} (--max-new-tokens)",
                               param="max_tokens", code="over_limit")
        work = GenerateJob([("question", body.question.strip())], max_tokens=max_tokens,
                           temperature=0.0, stop=DEFAULT_STOP, param="question",
                           spans=body.spans)
        result = (await run(request, work))[0]
        c = result["choices"][0]
        return {"object": "isouq.ask", "model": settings.model_id, "question": body.question,
                "answer": c["text"], "finish_reason": c["finish_reason"],
                "answer_tokens": c["completion_tokens"], "uncertainty": c["uncertainty"],
                "calibration": (None if engine.calibration is None
                                else engine.calibration.describe())}

    return app


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _sse(events: list[dict]) -> StreamingResponse:
    async def gen():
        for e in events:
            yield f"data: {json.dumps(e, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def _stream_chat(doc: dict) -> StreamingResponse:
    """A finished chat completion as OpenAI's stream: per choice its role and whole text in one
    chunk, then its finish reason and ``uncertainty`` (known once the answer is scored)."""
    head = {k: doc[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    events = []
    for c in doc["choices"]:
        events.append({**head, "choices": [{"index": c["index"], "delta": {
            "role": "assistant", "content": c["message"]["content"]}, "logprobs": None,
            "finish_reason": None}]})
        events.append({**head, "choices": [{"index": c["index"], "delta": {}, "logprobs": None,
                                            "finish_reason": c["finish_reason"],
                                            "uncertainty": c["uncertainty"]}]})
    events.append({**head, "choices": [], "usage": doc["usage"]})
    return _sse(events)


def _stream_completion(doc: dict) -> StreamingResponse:
    head = {k: doc[k] for k in ("id", "created", "model")} | {"object": "text_completion"}
    events = [{**head, "choices": [c]} for c in doc["choices"]]
    return _sse(events)
