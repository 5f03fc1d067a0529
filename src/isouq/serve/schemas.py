"""Request bodies: OpenAI's chat and completion requests (the fields isouq honours), the
``/v1/score`` pairs and the page's ``/v1/ask``. Fields isouq does not know are ignored, as
OpenAI-compatible servers do; a known field of the wrong type or range is a 422 naming it.
The server's own limits (``ServeSettings``) are checked by the app, which knows them.

``spans`` (``"sentences"`` or ``"lines"``) and ``blocks`` (``true``) are isouq extensions beside
OpenAI's fields, on every request that scores answers: each answer's ``uncertainty`` then lists
its spans and their scores (``isouq.spans``), or its block profile (‖∇θ_b p̄‖² per block
``b`` of the model, from the same backward: ``isouq.blocks``)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

_CONFIG = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextPart(BaseModel):
    """One part of a message's content; only text parts can be read by a text model."""

    model_config = _CONFIG
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """A chat message; ``developer`` (OpenAI's newer name for system) is read as ``system``."""

    model_config = _CONFIG
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_dict(self) -> dict:
        text = (self.content if isinstance(self.content, str)
                else "".join(p.text for p in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


Stop = str | list[str] | None
#: the ``spans`` field: score each answer's sentences or lines too (``isouq.spans.SPLITTERS``)
Spans = Literal["sentences", "lines"] | None


def _stops(v: Stop) -> Stop:
    items = [v] if isinstance(v, str) else (v or [])
    if len(items) > 4:
        raise ValueError(f"at most 4 stop sequences, got {len(items)}")
    if any(s == "" for s in items):
        raise ValueError("a stop sequence is empty; give non-empty strings")
    return v


class _Sampling(BaseModel):
    model_config = _CONFIG
    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: Stop = None
    stream: bool = False
    spans: Spans = None
    blocks: bool = False

    _check_stop = field_validator("stop")(_stops)

    def stop_tuple(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Sampling):
    """``POST /v1/completions`` (a prompt string, or a list of them)."""

    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        items = [v] if isinstance(v, str) else v
        if not items:
            raise ValueError("the list of prompts is empty; give at least one")
        if any(not p.strip() for p in items):
            raise ValueError("a prompt is blank; give the prompt text")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v):
        if v:
            raise ValueError("echo is not supported; the response holds the completion only")
        return v


class PairIn(BaseModel):
    """One (prompt, answer) pair to score: ``prompt`` (text), ``messages`` (chat) or
    ``question`` (put in ``isouq ask``'s QA prompt); ``answer`` as text or token ids."""

    model_config = _CONFIG
    prompt: str | None = None
    messages: list[Message] | None = None
    question: str | None = None
    answer: str | list[int]
    key: str | int | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        given = [f for f in ("prompt", "messages", "question") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'prompt', 'messages' or 'question' (got "
                             f"{', '.join(given) or 'none'})")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("'prompt' is blank; give the prompt text")
        if self.question is not None and not self.question.strip():
            raise ValueError("'question' is blank; give the question")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty; give at least one message")
        if isinstance(self.answer, str) and not self.answer.strip():
            raise ValueError("'answer' is blank; every pair needs an answer")
        if isinstance(self.answer, list) and (not self.answer or min(self.answer) < 0):
            raise ValueError("'answer' as token ids must be a non-empty list of whole numbers "
                             "≥ 0")
        return self


class ScoreRequest(BaseModel):
    """``POST /v1/score``: ``pairs``, or one pair's fields at the top level."""

    model_config = _CONFIG
    model: str | None = None
    pairs: list[PairIn] | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    question: str | None = None
    answer: str | list[int] | None = None
    key: str | int | None = None
    spans: Spans = None
    blocks: bool = False
    _single: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _pairs(self):
        single = {f: getattr(self, f) for f in ("prompt", "messages", "question", "answer",
                                                  "key") if getattr(self, f) is not None}
        if self.pairs is not None:
            if single:
                raise ValueError("give either 'pairs' or one pair's fields at the top level, "
                                 f"not both (found {', '.join(single)} beside 'pairs')")
            if not self.pairs:
                raise ValueError("'pairs' is empty; give at least one pair")
        elif "answer" not in single:
            raise ValueError("give 'pairs' (a list of {prompt|messages|question, answer}) or "
                             "one pair's 'answer' with its 'prompt', 'messages' or 'question'")
        else:
            try:
                self.pairs = [PairIn(**single)]
                self._single = True
            except ValidationError as e:
                raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    @property
    def single(self) -> bool:
        """Whether the pair's fields were given at the top level (not in ``pairs``)."""
        return self._single

    def all_pairs(self) -> list[PairIn]:
        """The pairs (one when the pair's fields were given at the top level)."""
        return list(self.pairs or [])


class AskRequest(BaseModel):
    """``POST /v1/ask`` (the page's): one question, answered as ``isouq ask`` answers it."""

    model_config = _CONFIG
    question: str
    max_tokens: int | None = Field(None, ge=1)
    spans: Spans = None
    blocks: bool = False

    @field_validator("question")
    @classmethod
    def _question(cls, v):
        if not v.strip():
            raise ValueError("the question is blank; write a question")
        return v
