"""``POST /v1/ask``: ``isouq ask`` over HTTP (the page's endpoint): one question in the QA
prompt, answered greedily, scored, with P(correct) when the server has a calibration."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ...llm.prompts import DEFAULT_STOP
from ..engine import GenerateJob
from ..errors import RequestError
from ..schemas import AskRequest
from .checks import authorized
from .jobs import answer
from .state import server_of

router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/ask")
async def ask(body: AskRequest, request: Request):
    """The answer, its finish reason and token count, its ``uncertainty`` and the
    calibration that gave P(correct)."""
    server = server_of(request)
    settings, calibration = server.settings, server.engine.calibration
    max_tokens = body.max_tokens or min(settings.max_new_tokens, 50)
    if max_tokens > settings.max_new_tokens:
        raise RequestError(f"max_tokens = {max_tokens} is over this server's limit of "
                           f"{settings.max_new_tokens} (--max-new-tokens)",
                           param="max_tokens", code="over_limit")
    work = GenerateJob([("question", body.question.strip())], max_tokens=max_tokens,
                       temperature=0.0, stop=DEFAULT_STOP, param="question", spans=body.spans,
                       blocks=body.blocks)
    result = (await answer(request, work))[0]
    c = result["choices"][0]
    return {"object": "isouq.ask", "model": settings.model_id, "question": body.question,
            "answer": c["text"], "finish_reason": c["finish_reason"],
            "answer_tokens": c["completion_tokens"], "uncertainty": c["uncertainty"],
            "calibration": None if calibration is None else calibration.describe()}
