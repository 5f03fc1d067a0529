"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's chat and completion
endpoints, each choice with its ``uncertainty``; with ``stream``, the finished answer as
OpenAI's chunks (the scores need the whole answer, so the text is not streamed token by
token)."""

from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ..engine import GenerateJob
from ..errors import RequestError
from ..schemas import ChatRequest, CompletionRequest
from .checks import authorized, check_messages, check_model, check_sampling
from .jobs import answer
from .state import server_of

router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request):
    """A chat completion: the messages through the model's chat template, answered, scored."""
    settings = server_of(request).settings
    check_model(settings, body.model)
    max_tokens = body.max_completion_tokens or body.max_tokens or min(
        settings.max_new_tokens, 256)
    check_sampling(settings, body, max_tokens,
                   "max_completion_tokens" if body.max_completion_tokens else "max_tokens")
    messages = check_messages(settings, body.messages)
    work = GenerateJob([("messages", messages)], max_tokens=max_tokens,
                       temperature=body.temperature, top_p=body.top_p, n=body.n,
                       seed=body.seed, stop=body.stop_tuple(), param="messages",
                       spans=body.spans, blocks=body.blocks)
    result = (await answer(request, work))[0]
    choices = [{"index": i, "message": {"role": "assistant", "content": c["text"]},
                "logprobs": None, "finish_reason": c["finish_reason"],
                "uncertainty": c["uncertainty"]} for i, c in enumerate(result["choices"])]
    doc = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
           "model": settings.model_id, "choices": choices,
           "usage": usage(result["prompt_tokens"],
                          sum(c["completion_tokens"] for c in result["choices"]))}
    if body.stream:
        return stream_chat(doc)
    return doc


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    """Completions of a prompt or a list of prompts (used as given, no chat template)."""
    settings = server_of(request).settings
    check_model(settings, body.model)
    check_sampling(settings, body, body.max_tokens, "max_tokens")
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) * body.n > settings.max_pairs:
        raise RequestError(f"prompt holds {len(prompts)} prompts × n = {body.n} answers, over "
                           f"this server's limit of {settings.max_pairs} (--max-pairs)",
                           status=413, param="prompt", code="too_many_prompts")
    work = GenerateJob([("text", p) for p in prompts], max_tokens=body.max_tokens,
                       temperature=body.temperature, top_p=body.top_p, n=body.n,
                       seed=body.seed, stop=body.stop_tuple(), param="prompt",
                       spans=body.spans, blocks=body.blocks)
    result = await answer(request, work)
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
        return stream_completion(doc)
    return doc


def new_id(prefix: str) -> str:
    """A response id as OpenAI's look (``chatcmpl-…``, ``cmpl-…``)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _sse(events: list[dict]) -> StreamingResponse:
    async def gen():
        for e in events:
            yield f"data: {json.dumps(e, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def stream_chat(doc: dict) -> StreamingResponse:
    """A finished chat completion as OpenAI's stream: per choice its role and whole text in one
    chunk, then its finish reason and ``uncertainty`` (known once the answer is scored), then
    the usage."""
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


def stream_completion(doc: dict) -> StreamingResponse:
    """A finished completion as OpenAI's stream: one chunk per choice."""
    head = {k: doc[k] for k in ("id", "created", "model")} | {"object": "text_completion"}
    return _sse([{**head, "choices": [c]} for c in doc["choices"]])
