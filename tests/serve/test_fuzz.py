"""Schema-driven fuzzing of the HTTP API: hypothesis writes request bodies (near-valid ones
built from each endpoint's fields, arbitrary JSON, raw bytes) and every answer must be a 2xx
or a 4xx with OpenAI's error shape: never a 5xx, never a crash, and the server still healthy.
Example counts are bounded so that the whole file takes well under 30 s."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiny

from .conftest import make_app

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

words = st.lists(st.sampled_from(tiny.WORDS), min_size=0, max_size=6).map(" ".join)
text = st.one_of(words, st.text(max_size=12))
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                  max_size=3),
    max_leaves=8)


def mostly(valid, junk=json_value):
    """``valid`` nine times in ten, else any JSON value (so that most bodies reach the model
    and the rest probe the validation)."""
    return st.integers(0, 9).flatmap(lambda k: valid if k else junk)


small_int = mostly(st.integers(1, 4), st.integers(-2, 10) | json_value)
role = mostly(st.sampled_from(["user", "system", "assistant", "developer"]),
              st.sampled_from(["tool", ""]) | json_value)
part = st.fixed_dictionaries({"type": mostly(st.just("text"), st.just("image_url")),
                              "text": text})
message = st.fixed_dictionaries({"role": role,
                                 "content": mostly(text | st.lists(part, max_size=2))})
messages = mostly(st.lists(message, min_size=1, max_size=3), st.lists(message, max_size=6))
sampling = {"model": mostly(st.just("tiny"), st.just("other") | json_value),
            "temperature": mostly(st.sampled_from([0, 0.0, 0.7, 1]) | st.floats(0, 2),
                                  st.floats(-1, 3) | json_value),
            "top_p": mostly(st.floats(0.05, 1), st.floats(-0.5, 1.5) | json_value),
            "n": mostly(st.integers(1, 2), st.integers(-2, 10) | json_value),
            "seed": mostly(st.integers(-(2**40), 2**70)),
            "stop": mostly(text | st.lists(text, max_size=5)), "stream": mostly(st.booleans())}
answer = mostly(st.lists(st.sampled_from(tiny.WORDS), min_size=1, max_size=5).map(" ".join)
                | st.lists(st.integers(0, tiny.VOCAB - 1), min_size=1, max_size=5),
                text | st.lists(st.integers(-5, tiny.VOCAB + 5), max_size=6) | json_value)
key = mostly(text | st.integers())
pair = mostly(
    st.fixed_dictionaries({"prompt": mostly(text), "answer": answer}, optional={"key": key})
    | st.fixed_dictionaries({"messages": messages, "answer": answer}, optional={"key": key})
    | st.fixed_dictionaries({"question": mostly(text), "answer": answer}, optional={"key": key}),
    st.fixed_dictionaries({}, optional={"prompt": text, "messages": messages, "question": text,
                                        "answer": answer, "key": key}))
BODIES = {
    "/v1/chat/completions": st.fixed_dictionaries(
        {"messages": messages}, optional={**sampling, "max_tokens": small_int,
                                          "max_completion_tokens": small_int}),
    "/v1/completions": st.fixed_dictionaries(
        {"prompt": mostly(text | st.lists(text, max_size=4))},
        optional={**sampling, "max_tokens": small_int, "echo": mostly(st.booleans())}),
    "/v1/score": pair | st.fixed_dictionaries(
        {"pairs": mostly(st.lists(pair, min_size=1, max_size=3), st.lists(pair, max_size=9))},
        optional={"answer": mostly(st.nothing(), answer)}),
    "/v1/ask": st.fixed_dictionaries({"question": mostly(text)},
                                     optional={"max_tokens": small_int}),
}


@pytest.fixture(scope="module")
def fuzz_client():
    lm = tiny.causal_lm("llama-tied"), tiny.tokenizer()
    with TestClient(make_app(lm, max_new_tokens=4, max_n=2), raise_server_exceptions=False) as c:
        yield c


def check(c, path: str, r) -> None:
    assert r.status_code < 500, (path, r.status_code, r.text)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), r.text
        return
    doc = r.json()
    if r.status_code >= 400:
        assert set(doc["error"]) == {"message", "type", "param", "code"}, doc
        assert doc["error"]["message"]
    elif path != "/v1/score":
        assert "uncertainty" in json.dumps(doc)


@pytest.mark.parametrize("path", list(BODIES))
def test_fuzzed_bodies_never_give_a_5xx(fuzz_client, path):
    @FUZZ
    @given(body=mostly(BODIES[path]))
    def run(body):
        check(fuzz_client, path, fuzz_client.post(path, json=body))

    run()
    assert fuzz_client.get("/health").status_code == 200


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=40), path=st.sampled_from(list(BODIES)))
def test_raw_bytes_never_give_a_5xx(fuzz_client, raw, path):
    r = fuzz_client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (raw, r.text)
