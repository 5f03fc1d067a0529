"""The settings of a running server: batching, limits, the key. Fixed when the server starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import InputError

#: the environment variable that gives the API key when ``--api-key`` is not given
API_KEY_ENV = "ISOUQ_API_KEY"


@dataclass(frozen=True)
class ServeSettings:
    """What a server allows and how it batches (the ``isouq serve`` options of the same names).

    model_id: the name the server answers to (``GET /v1/models``; a request naming another
        model gets 404).
    max_batch: answers scored together in one backward pass (and prompts decoded together).
    max_wait_ms: how long the first request of a batch waits for others to join it.
    max_queue: requests waiting for the worker; one more is answered 429 with Retry-After.
    request_timeout_s: a request not answered by then is answered 504 (and leaves the queue).
    max_body_bytes: request body size (413 above it).
    max_messages: chat messages per request (413).
    max_prompt_tokens: prompt tokens, chat template included (413).
    max_answer_tokens: tokens of an answer sent to ``/v1/score`` (413).
    max_new_tokens: the largest ``max_tokens`` a request may ask for (422).
    max_n: the largest ``n`` (choices per request, 422).
    max_pairs: (prompt, answer) pairs per ``/v1/score`` request (413).
    memory_budget: bytes the process may use while scoring (None: no plan): a batch whose
        predicted peak (``isouq.memory_plan.peak_bytes``) is over it is scored in as few
        ``score_sequences`` calls as fit, and a request whose one answer cannot fit is a 413.
    params: the parameters that take part in the gradient (``isouq.params.select_params``:
        None for all, ``"last_layer"`` or name patterns).
    api_key: when set, every endpoint but ``/health`` (and the static page) needs
        ``Authorization: Bearer <api_key>``.
    pass_tokens: the fixed cost of one scoring pass, in tokens' worth of work: a batch's
        answers are scored in the passes of least predicted time (``isouq.prepare.split_padded``:
        rows of very different lengths apart where padding costs more than a pass). None: timed
        when the engine warms up (``Engine.measure_pass_tokens``); ``math.inf``: one pass per
        batch.
    """

    model_id: str = "model"
    max_batch: int = 16
    max_wait_ms: float = 5.0
    max_queue: int = 64
    request_timeout_s: float = 120.0
    max_body_bytes: int = 1 << 20
    max_messages: int = 64
    max_prompt_tokens: int = 2048
    max_answer_tokens: int = 1024
    max_new_tokens: int = 256
    max_n: int = 8
    max_pairs: int = 64
    memory_budget: int | None = None
    params: object = None
    api_key: str | None = field(default=None, repr=False)
    pass_tokens: float | None = None

    def __post_init__(self):
        for name in ("max_batch", "max_queue", "max_body_bytes", "max_messages",
                     "max_prompt_tokens", "max_answer_tokens", "max_new_tokens", "max_n",
                     "max_pairs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{name} = {v!r}: give a whole number ≥ 1 "
                                 f"(--{name.replace('_', '-')})")
        if self.memory_budget is not None and (isinstance(self.memory_budget, bool) or not isinstance(
                self.memory_budget, int) or self.memory_budget < 1):
            raise InputError(f"memory_budget = {self.memory_budget!r}: give a number of bytes "
                             "≥ 1, e.g. --memory-budget 8GB")
        if not self.max_wait_ms >= 0:
            raise InputError(f"max_wait_ms = {self.max_wait_ms!r}: give a number ≥ 0 "
                             "(--max-wait-ms)")
        if not self.request_timeout_s > 0:
            raise InputError(f"request_timeout_s = {self.request_timeout_s!r}: give a number "
                             "of seconds > 0 (--request-timeout)")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError(f"the API key is blank; give a non-empty --api-key or "
                             f"{API_KEY_ENV}, or neither")

    def public(self) -> dict:
        """The settings a client may see (``GET /v1/models``): all but the key."""
        out = {k: v for k, v in asdict(self).items() if k != "api_key"}
        out["auth"] = self.api_key is not None
        return out
