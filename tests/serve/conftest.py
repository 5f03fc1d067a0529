"""Fixtures of the server tests: a tiny random Llama behind the app, in-process (TestClient) or
live (uvicorn on a free loopback port, in a thread)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

import tiny
from isouq.serve.app import create_app
from isouq.serve.config import ServeSettings
from isouq.serve.engine import Engine

SMALL = dict(model_id="tiny", max_new_tokens=8, max_n=3, max_pairs=8, max_messages=4,
             max_prompt_tokens=64, max_answer_tokens=16, max_body_bytes=4096)


@pytest.fixture(scope="package")
def lm():
    """(model, tokenizer): the tiny Llama with tied embeddings and its word-level tokenizer."""
    return tiny.causal_lm("llama-tied"), tiny.tokenizer()


def make_app(lm, calibration=None, engine=None, **settings):
    s = ServeSettings(**{**SMALL, "max_wait_ms": 0.0, **settings})
    engine = engine or Engine(*lm, s, calibration)
    if hasattr(engine, "warm_up"):
        engine.warm_up()
    return create_app(engine, s)


@pytest.fixture(scope="package")
def client(lm):
    """A TestClient of the tiny model's app (no key, no calibration)."""
    from fastapi.testclient import TestClient

    with TestClient(make_app(lm)) as c:
        yield c


@contextmanager
def live(app):
    """Run ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
