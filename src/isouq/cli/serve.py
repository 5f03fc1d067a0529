"""``isouq serve``: an OpenAI-compatible HTTP server whose answers carry their uncertainty."""

from __future__ import annotations

import argparse

from ..runtime import configure
from .extras import require_extras
from .options import (
    add_model_options,
    add_params_option,
    calibration_of,
    load_kw,
    non_negative_float,
    params_value,
    positive_float,
    positive_int,
    whole_number,
)


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``isouq`` subcommands."""
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server whose answers carry "
                                     "their uncertainty (docs: serve.md)")
    add_model_options(p)
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration.json of `isouq calibrate` for this model: every answer "
                        "gets p_correct (and withheld, when it holds a threshold)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=whole_number(0), default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                        "(default: the ISOUQ_API_KEY environment variable, else none)")
    add_params_option(p)
    p.add_argument("--max-batch", type=positive_int, default=16,
                   help="answers scored together in one backward pass (memory grows with it)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="e.g. 8GB: a batch whose predicted peak memory is over it is scored in "
                        "as few passes as fit; a request that cannot fit alone gets 413")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a request waits for others to share its batch")
    p.add_argument("--pass-tokens", type=non_negative_float, default=None, metavar="TOKENS",
                   help="the fixed cost of one scoring pass in tokens' worth: a batch's answers "
                        "of very different lengths are scored in separate passes where padding "
                        "would cost more (default: timed at start; 'inf': one pass per batch)")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting; more are answered 429 with Retry-After")
    p.add_argument("--request-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                   help="a request not answered by then gets 504")
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20)
    p.add_argument("--max-messages", type=positive_int, default=64)
    p.add_argument("--max-prompt-tokens", type=positive_int, default=2048)
    p.add_argument("--max-answer-tokens", type=positive_int, default=1024,
                   help="tokens of an answer sent to /v1/score")
    p.add_argument("--max-new-tokens", type=positive_int, default=256,
                   help="the largest max_tokens a request may ask for")
    p.add_argument("--max-n", type=positive_int, default=8, help="the largest n (choices)")
    p.add_argument("--max-pairs", type=positive_int, default=64,
                   help="pairs per /v1/score request (and prompts × n per /v1/completions)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``isouq serve`` until interrupted."""
    require_extras("llm,serve", "isouq serve")
    from ..memory_plan import parse_bytes
    from ..serve.config import ServeSettings
    from ..serve.server import resolve_api_key, run_server

    configure()
    settings = ServeSettings(
        model_id=args.model, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue, request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes, max_messages=args.max_messages,
        max_prompt_tokens=args.max_prompt_tokens, max_answer_tokens=args.max_answer_tokens,
        max_new_tokens=args.max_new_tokens, max_n=args.max_n, max_pairs=args.max_pairs,
        memory_budget=None if args.memory_budget is None else parse_bytes(args.memory_budget),
        params=params_value(args), api_key=resolve_api_key(args.api_key),
        pass_tokens=args.pass_tokens)
    run_server(args.model, load=load_kw(args), calibration=calibration_of(args),
               settings=settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0
