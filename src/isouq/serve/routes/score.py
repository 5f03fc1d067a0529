"""``POST /v1/score``: (prompt or messages or question, answer) pairs made elsewhere, scored as
``isouq score`` scores them; one pair may be given at the top level, without ``pairs``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..engine import Pair, ScoreJob
from ..errors import RequestError
from ..schemas import ScoreRequest
from .checks import authorized, check_messages, check_model
from .jobs import answer
from .state import server_of

router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request):
    """Each pair's ``uncertainty`` and token counts, in the order sent (``key`` comes back)."""
    settings = server_of(request).settings
    check_model(settings, body.model)
    pairs = body.all_pairs()
    if len(pairs) > settings.max_pairs:
        raise RequestError(f"pairs holds {len(pairs)} pairs, over this server's limit of "
                           f"{settings.max_pairs} (--max-pairs); send them in several "
                           "requests", status=413, param="pairs", code="too_many_pairs")
    work_pairs = []
    for i, p in enumerate(pairs):
        messages = None if p.messages is None else check_messages(
            settings, p.messages, "messages" if body.single else f"pairs[{i}].messages")
        work_pairs.append(Pair(answer=p.answer, prompt=messages or p.prompt,
                               question=p.question, key=None if p.key is None else str(p.key)))
    param = "answer" if body.single else "pairs"
    result = await answer(request, ScoreJob(work_pairs, param=param, spans=body.spans,
                                              blocks=body.blocks))
    data = [{"index": i, **({"key": str(p.key)} if p.key is not None else {}),
             "uncertainty": r["uncertainty"], "prompt_tokens": r["prompt_tokens"],
             "answer_tokens": r["answer_tokens"]}
            for i, (p, r) in enumerate(zip(pairs, result, strict=True))]
    n_prompt = sum(r["prompt_tokens"] for r in result)
    n_answer = sum(r["answer_tokens"] for r in result)
    return {"object": "list", "model": settings.model_id, "data": data,
            "usage": {"prompt_tokens": n_prompt, "answer_tokens": n_answer,
                      "total_tokens": n_prompt + n_answer}}
