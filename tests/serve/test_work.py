"""What one request makes the server do, counted: each prompt and answer tokenized once (the ids
measured against the limits are the ids scored), a chat template rendered once, one
``score_sequences`` call (one set of ghost hooks) per batch, spans placed on the offsets of the
same tokenization."""

from __future__ import annotations

from collections import Counter

import pytest

import isouq.serve.engine as engine_mod


@pytest.fixture
def counted(lm, monkeypatch):
    """Counts of tokenizer calls (by text), chat-template renders, ``encode_checked`` calls
    (a tokenization inside ``score_sequences``), ``score_sequences`` calls and ghost hook set-ups
    while the test runs."""
    _, tok = lm
    n: Counter = Counter()
    texts: Counter = Counter()
    cls = type(tok)
    real_call, real_template = cls.__call__, cls.apply_chat_template

    def call(self, text, *a, **kw):
        n["tokenize"] += 1
        texts[text if isinstance(text, str) else repr(text)] += 1
        return real_call(self, text, *a, **kw)

    def template(self, *a, **kw):
        n["chat_template"] += 1
        return real_template(self, *a, **kw)

    import isouq.passes

    real_encode, real_score = isouq.sequences.encode_checked, engine_mod.score_sequences
    real_ghost = isouq.passes.GhostNorms

    def encode(*a, **kw):
        n["encode_inside_score_sequences"] += 1
        return real_encode(*a, **kw)

    def score(*a, **kw):
        n["score_sequences"] += 1
        return real_score(*a, **kw)

    def ghost(*a, **kw):
        n["ghost_hooks"] += 1
        return real_ghost(*a, **kw)

    monkeypatch.setattr(cls, "__call__", call)
    monkeypatch.setattr(cls, "apply_chat_template", template)
    monkeypatch.setattr(isouq.sequences, "encode_checked", encode)
    monkeypatch.setattr(engine_mod, "score_sequences", score)
    monkeypatch.setattr(isouq.passes, "GhostNorms", ghost)
    return n, texts


@pytest.mark.parametrize("pair, renders", [
    ({"prompt": "what is the capital of france", "answer": "paris"}, 0),
    ({"messages": [{"role": "user", "content": "who wrote hamlet"}], "answer": "shakespeare"},
     1),
    ({"question": "why is the sky blue", "answer": "because the sky is blue"}, 1),
])
def test_a_score_request_tokenizes_its_pair_once(client, counted, pair, renders):
    n, texts = counted
    r = client.post("/v1/score", json=pair)
    assert r.status_code == 200, r.text
    assert n["score_sequences"] == 1 and n["ghost_hooks"] == 1
    assert n["encode_inside_score_sequences"] == 0  # the ids measured are the ids scored
    assert n["tokenize"] == 2, texts  # the prompt once, the answer once
    assert texts[pair["answer"]] == 1
    assert n["chat_template"] == renders


def test_spans_reuse_the_answers_one_tokenization(client, counted):
    n, texts = counted
    answer = "the cat sat on the mat. the dog sat"
    r = client.post("/v1/score", json={"prompt": "the cat", "answer": answer,
                                       "spans": "sentences"})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["uncertainty"]["spans"]) == 2
    assert n["tokenize"] == 2 and texts[answer] == 1  # its offsets came with its ids
    assert n["score_sequences"] == 1 and n["encode_inside_score_sequences"] == 0


def test_a_chat_request_renders_its_template_once_and_scores_the_generated_ids(client,
                                                                               counted):
    n, texts = counted
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "who wrote hamlet"}], "max_tokens": 4,
        "temperature": 0})
    assert r.status_code == 200, r.text
    assert n["chat_template"] == 1
    assert n["score_sequences"] == 1 and n["encode_inside_score_sequences"] == 0
    # the rendered prompt: once to measure it (its ids are scored), once by the decoder
    # (llm.generation.generate_greedy tokenizes its prompts); the answer is ids, never text
    assert n["tokenize"] == 2 and set(texts.values()) == {2}, texts


def test_a_requests_stages_are_in_the_metrics_and_add_up(lm):
    """/metrics holds each stage of a request (parse, queue, its batch's prepare … calibrate,
    deliver, respond) once per request or batch; together they fit in its request seconds."""
    import re

    from fastapi.testclient import TestClient

    from .conftest import make_app

    with TestClient(make_app(lm, max_wait_ms=1.0)) as c:
        assert c.post("/v1/score", json={"prompt": "the cat", "answer": "sat"}).status_code == 200
        text = c.get("/metrics").text

    def value(name: str, label: str = "") -> float:
        m = re.search(rf"^{re.escape(name + label)} (\S+)$", text, re.M)
        assert m, (name, label)
        return float(m.group(1))

    stages = ("parse", "queue", "prepare", "generate", "score", "calibrate", "deliver",
              "respond")
    for stage in stages:
        assert value("isouq_stage_seconds_count", f'{{stage="{stage}"}}') == 1, stage
    total = sum(value("isouq_stage_seconds_sum", f'{{stage="{stage}"}}') for stage in stages)
    assert 0 < total <= value("isouq_request_seconds_sum", '{endpoint="/v1/score"}')
    assert value("isouq_batch_starts_total", '{reason="waited"}') == 1
