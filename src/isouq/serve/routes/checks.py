"""The checks a request passes before its job is queued: the API key, the model it names, and
the server's limits on sampling and messages. Each failure is a
:class:`~isouq.serve.errors.RequestError` naming the field or the limit and the option that
sets it."""

from __future__ import annotations

import secrets

from fastapi import Request

from ..config import ServeSettings
from ..errors import RequestError
from ..schemas import Message
from .state import server_of


async def authorized(request: Request) -> None:
    """FastAPI dependency: 401 unless the request carries the server's key (none set: any
    request passes)."""
    key = server_of(request).settings.api_key
    if key is None:
        return
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
            token.strip().encode(), key.encode()):
        raise RequestError("no valid API key: send the header 'Authorization: Bearer <key>' "
                           "with the key the server was started with", status=401,
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_model(settings: ServeSettings, name: str | None) -> None:
    """404 when a request names a model other than the one served (no name: the served one)."""
    if name is not None and name != settings.model_id:
        raise RequestError(f"model {name!r} is not served here; this server serves "
                           f"{settings.model_id!r} (fixed at start)", status=404,
                           param="model", code="model_not_found")


def check_sampling(settings: ServeSettings, body, max_tokens: int, param_tokens: str) -> None:
    """422 when ``max_tokens`` (named ``param_tokens`` in the request) or ``body.n`` is over the
    server's limit."""
    if max_tokens > settings.max_new_tokens:
        raise RequestError(f"{param_tokens} = {max_tokens} is over this server's limit of "
                           f"{settings.max_new_tokens} (--max-new-tokens)",
                           param=param_tokens, code="over_limit")
    if body.n > settings.max_n:
        raise RequestError(f"n = {body.n} is over this server's limit of {settings.max_n} "
                           "(--max-n)", param="n", code="over_limit")


def check_messages(settings: ServeSettings, messages: list[Message],
                   param: str = "messages") -> list[dict]:
    """The messages as ``{"role", "content"}`` dicts; 413 when there are more than the server
    allows."""
    if len(messages) > settings.max_messages:
        raise RequestError(f"{param} holds {len(messages)} messages, over this server's "
                           f"limit of {settings.max_messages} (--max-messages)",
                           status=413, param=param, code="too_many_messages")
    return [m.as_dict() for m in messages]
