"""The HTTP API of `isouq serve` on a tiny model: OpenAI's shapes with an `uncertainty` object,
/v1/score as `isouq score` scores, errors naming the field or the limit, the key, the metrics,
and the official `openai` client against a live server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from isouq.serve.engine import SCORE_FIELDS

from .conftest import live, make_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "who wrote hamlet"}],
        "max_tokens": 4, "temperature": 0}


def check_uncertainty(u: dict, calibrated: bool = False):
    for k in SCORE_FIELDS:
        assert isinstance(u[k], float), (k, u)
    assert 0 < u["mean_prob"] <= 1 and u["epistemic"] >= 0 and u["n_tokens"] >= 1
    assert u["epistemic_log"] == pytest.approx(u["epistemic"] / u["mean_prob"] ** 2, rel=1e-5)
    assert u["params"]["spec"] == "all" and u["params"]["n_params"] > 0
    assert ("p_correct" in u) == calibrated


def test_chat_completion(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "n": 2})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "chat.completion" and doc["model"] == "tiny"
    assert [c["index"] for c in doc["choices"]] == [0, 1]
    for c in doc["choices"]:
        assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
        assert c["finish_reason"] in ("stop", "length")
        check_uncertainty(c["uncertainty"])
    assert doc["choices"][0] == {**doc["choices"][1], "index": 0}  # greedy: the same answer
    u = doc["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0


def test_completions_several_prompts_sampled_with_a_seed(client):
    body = {"prompt": ["the cat", "who wrote"], "max_tokens": 4, "n": 2, "seed": 7,
            "temperature": 1.0}
    a = client.post("/v1/completions", json=body).json()
    b = client.post("/v1/completions", json=body).json()
    assert a["object"] == "text_completion" and len(a["choices"]) == 4
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]  # seeded
    for c in a["choices"]:
        check_uncertainty(c["uncertainty"])
    other = client.post("/v1/completions", json={**body, "seed": 8}).json()
    assert [c["text"] for c in other["choices"]] != [c["text"] for c in a["choices"]]


def test_a_temperature_next_to_zero_decodes_greedily(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "temperature": 1e-300})  # fuzz-found
    assert r.status_code == 200, r.text
    greedy = client.post("/v1/chat/completions", json=CHAT).json()
    assert r.json()["choices"][0]["message"] == greedy["choices"][0]["message"]


def test_stop_strings_cut_the_answer(client):
    free = client.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 8,
                                                "temperature": 0}).json()["choices"][0]
    words = free["text"].split()
    assert len(words) >= 2
    cut = client.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 8,
                                               "temperature": 0, "stop": [words[1]]}).json()
    c = cut["choices"][0]
    assert words[1] not in c["text"] and c["finish_reason"] == "stop"


def test_score_pairs_as_score_sequences_scores_them(client, lm):
    import isouq
    from isouq.llm.prompts import qa_prompt

    model, tok = lm
    pairs = [{"prompt": "what is the capital of france", "answer": "paris", "key": "a"},
             {"messages": [{"role": "user", "content": "who wrote hamlet"}],
              "answer": "shakespeare"},
             {"question": "why is the sky blue", "answer": [20, 21, 22]}]
    r = client.post("/v1/score", json={"pairs": pairs})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and data[0]["key"] == "a"
    prompts = [pairs[0]["prompt"], pairs[1]["messages"], qa_prompt(tok, pairs[2]["question"])]
    for d, p, pair in zip(data, prompts, pairs, strict=True):
        check_uncertainty(d["uncertainty"])
        alone = isouq.score_sequences(model, tok, [p], [pair["answer"]])
        for k in ("epistemic", "aleatoric", "mean_prob"):
            assert d["uncertainty"][k] == pytest.approx(float(getattr(alone, k)[0]), rel=1e-5)
    one = client.post("/v1/score", json=pairs[0]).json()["data"]  # one pair, top level
    assert one[0]["uncertainty"]["epistemic"] == pytest.approx(
        data[0]["uncertainty"]["epistemic"], rel=1e-5)


def test_score_equals_isouq_score_on_a_file(tmp_path, tiny_llama_dir):
    """The same pairs through `isouq score` (a file) and POST /v1/score give the same scores."""
    from isouq.cli import main
    from isouq.models import load_model
    from isouq.runio import read_jsonl
    from isouq.serve.config import ServeSettings
    from isouq.serve.engine import Engine

    rows = [{"key": "q1", "question": "who wrote hamlet", "answer": "shakespeare wrote"},
            {"key": "q2", "prompt": [{"role": "user", "content": "what is the moon made of"}],
             "answer": "cheese"},
            {"key": "q3", "prompt": "the cat sat on", "answer": "the mat"}]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(src), "--out", str(out), "--model", str(tiny_llama_dir)]) == 0
    want = {r["key"]: r["scores"] for r in read_jsonl(out)}
    model, tok, _ = load_model(str(tiny_llama_dir))
    s = ServeSettings(model_id="tiny")
    with TestClient(make_app((model, tok), engine=Engine(model, tok, s))) as c:
        pairs = [{"key": r["key"], "answer": r["answer"],
                  **({"question": r["question"]} if "question" in r else
                     {"messages": r["prompt"]} if isinstance(r["prompt"], list)
                     else {"prompt": r["prompt"]})} for r in rows]
        got = c.post("/v1/score", json={"pairs": pairs}).json()["data"]
    for d in got:
        for k in ("epistemic", "epistemic_log", "aleatoric", "mean_prob"):
            assert d["uncertainty"][k] == pytest.approx(want[d["key"]][k], rel=1e-5), (d, k)


def test_ask_is_isouq_ask(client, lm):
    from isouq.ask import answer_and_score

    r = client.post("/v1/ask", json={"question": "who wrote hamlet", "max_tokens": 6})
    assert r.status_code == 200, r.text
    doc = r.json()
    want = answer_and_score(*lm, ["who wrote hamlet"], max_new_tokens=6)[0]
    assert doc["answer"] == want["answer"]
    for k in ("epistemic", "aleatoric", "mean_prob"):
        assert doc["uncertainty"][k] == pytest.approx(want["scores"][k], rel=1e-5)


def test_models_health_and_page(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny"
    assert models["data"][0]["isouq"]["params"]["n_params"] > 0
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    assert client.get("/v1/models/other").status_code == 404
    h = client.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    page = client.get("/")
    assert page.status_code == 200 and "<script>" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 422, "body"),
    ({"messages": "hi"}, 422, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 422, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 422, "messages[0].content"),
    ({"messages": []}, 422, "messages"),
    ({**CHAT, "temperature": -1}, 422, "temperature"),
    ({**CHAT, "temperature": "hot"}, 422, "temperature"),
    ({**CHAT, "max_tokens": 9}, 422, "--max-new-tokens"),
    ({**CHAT, "n": 4}, 422, "--max-n"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, 422, "stop"),
    ({**CHAT, "model": "gpt-4"}, 404, "serves 'tiny'"),
    ({**CHAT, "messages": [{"role": "user", "content": "hi"}] * 5}, 413, "--max-messages"),
    ({**CHAT, "messages": [{"role": "user", "content": "cat " * 70}]}, 413,
     "--max-prompt-tokens"),
])
def test_chat_errors_name_the_field_or_the_limit(client, body, status, words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    err = error_of(client.post("/v1/chat/completions", **kw), status)
    assert words in err["message"], err
    assert client.get("/health").status_code == 200  # the server goes on


@pytest.mark.parametrize("body, status, words", [
    ({"answer": "x"}, 422, "exactly one of"),
    ({"prompt": "hi"}, 422, "answer"),
    ({"pairs": []}, 422, "empty"),
    ({"pairs": [{"prompt": "a", "answer": "b"}], "answer": "c"}, 422, "not both"),
    ({"pairs": [{"prompt": "a", "answer": " "}]}, 422, "blank"),
    ({"prompt": "a", "answer": [1, -2]}, 422, "≥ 0"),
    ({"prompt": "a", "answer": [10**6]}, 422, "vocabulary"),
    ({"prompt": "a", "answer": "cat " * 20}, 413, "--max-answer-tokens"),
    ({"pairs": [{"prompt": "a", "answer": "b"}] * 9}, 413, "--max-pairs"),
    ({"prompt": "a " * 3000, "answer": "b"}, 413, "--max-body-bytes"),
])
def test_score_errors_name_the_field_or_the_limit(client, body, status, words):
    err = error_of(client.post("/v1/score", json=body), status)
    assert words in err["message"], err


def test_other_errors(client):
    assert "no endpoint" in error_of(client.get("/v1/nothing"), 404)["message"]
    assert "not allowed" in error_of(client.get("/v1/score"), 405)["message"]
    assert "echo" in error_of(client.post("/v1/completions", json={"prompt": "a", "echo": True}),
                              422)["message"]
    assert "blank" in error_of(client.post("/v1/completions", json={"prompt": " "}),
                               422)["message"]
    assert "blank" in error_of(client.post("/v1/ask", json={"question": ""}), 422)["message"]


def test_a_failing_request_does_not_disturb_the_next(client):
    bad = client.post("/v1/score", json={"prompt": "a", "answer": [10**6]})
    assert bad.status_code == 422
    good = client.post("/v1/score", json={"prompt": "a", "answer": "b"})
    assert good.status_code == 200


def test_api_key(lm, monkeypatch):
    with TestClient(make_app(lm, api_key="s3cret")) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/").status_code == 200  # the static page; it asks for the key
        for path in ("/v1/models", "/metrics"):
            err = error_of(c.get(path), 401)
            assert "Authorization: Bearer" in err["message"]
        assert c.post("/v1/score", json={"prompt": "a", "answer": "b"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/models", headers=ok).status_code == 200
        assert c.post("/v1/score", json={"prompt": "a", "answer": "b"},
                      headers=ok).status_code == 200
        r = c.get("/v1/models", headers=ok).json()
        assert "s3cret" not in json.dumps(r) and r["data"][0]["isouq"]["settings"]["auth"]


def test_api_key_from_the_environment(monkeypatch):
    from isouq.serve.server import resolve_api_key

    monkeypatch.setenv("ISOUQ_API_KEY", "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("given") == "given"
    monkeypatch.delenv("ISOUQ_API_KEY")
    assert resolve_api_key(None) is None


def test_metrics(client):
    client.post("/v1/score", json={"prompt": "a", "answer": "b"})
    client.post("/v1/score", json={"prompt": "a"})
    text = client.get("/metrics").text
    assert 'isouq_requests_total{endpoint="/v1/score",status="200"}' in text
    assert 'isouq_requests_total{endpoint="/v1/score",status="422"}' in text
    for name in ("isouq_batch_answers_bucket", "isouq_queue_depth",
                 'isouq_stage_seconds_count{stage="score"}',
                 'isouq_stage_seconds_count{stage="queue"}',
                 'isouq_stage_seconds_count{stage="generate"}'):
        assert name in text, name


def calibrator(features=("epistemic",)):
    """A Platt map of the tiny model on ``features`` (default: the gradient score alone)."""
    from isouq.calibration import Calibrator

    rng = np.random.default_rng(0)
    rows = []
    for i in range(80):
        p = rng.uniform(0.01, 0.08)
        rows.append({"key": str(i), "model": "tiny", "correct": bool(rng.random() < p * 12),
                     "scores": {"epistemic": float(np.exp(rng.normal(-4, 1))),
                                "aleatoric": p * (1 - p), "mean_prob": p}})
    return Calibrator.fit(rows, labels="judge", model="tiny", max_risk=0.6, delta=0.2,
                          features=list(features), kinds=("platt",))


def test_calibration_adds_p_correct_and_withheld(lm):
    cal = calibrator()
    with TestClient(make_app(lm, calibration=cal)) as c:
        chat = c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["uncertainty"]
        scored = c.post("/v1/score", json={"prompt": "a", "answer": "b"}).json()
        asked = c.post("/v1/ask", json={"question": "who wrote hamlet"}).json()
        card = c.get("/v1/models").json()["data"][0]["isouq"]
    for u in (chat, scored["data"][0]["uncertainty"], asked["uncertainty"]):
        check_uncertainty(u, calibrated=True)
        assert 0 <= u["p_correct"] <= 1 and isinstance(u["withheld"], bool)
        assert u["withheld"] == (u["p_correct"] < cal.threshold)
        want = cal.predict({k: [u[k]] for k in ("epistemic", "aleatoric", "mean_prob")})[0]
        assert u["p_correct"] == pytest.approx(float(want), rel=1e-6)
    assert card["calibration"].startswith("P(ok)") and asked["calibration"]


def test_a_calibration_that_reads_no_gradient_is_served_without_a_backward(lm):
    """A map on p̄ alone: every answer is scored by the forward pass only (no gradient score),
    with its P(correct)."""
    cal = calibrator(("mean_prob",))
    assert not cal.needs_backward
    with TestClient(make_app(lm, calibration=cal)) as c:
        scored = c.post("/v1/score", json={"prompt": "a", "answer": "b"}).json()
    u = scored["data"][0]["uncertainty"]
    assert u["epistemic"] is None and u["epistemic_log"] is None and 0 < u["mean_prob"] <= 1
    assert u["p_correct"] == pytest.approx(float(cal.predict({"mean_prob": [u["mean_prob"]]})[0]),
                                           rel=1e-6)


@pytest.fixture(scope="module")
def server(lm):
    with live(make_app(lm)) as url:
        yield url


def test_the_openai_client_reads_the_uncertainty(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=4,
                                       temperature=0, n=2)
    for choice in r.choices:
        check_uncertainty(choice.uncertainty)  # an extra field, read as an attribute
        assert choice.model_extra["uncertainty"] == choice.uncertainty
    c = client.completions.create(model="tiny", prompt="the cat", max_tokens=3, temperature=0)
    check_uncertainty(c.choices[0].uncertainty)
    s = client.post("/score", body={"prompt": "the cat", "answer": "sat"}, cast_to=object)
    check_uncertainty(s["data"][0]["uncertainty"])
    from openai import NotFoundError, UnprocessableEntityError

    with pytest.raises(NotFoundError, match="serves 'tiny'"):
        client.chat.completions.create(model="gpt-4", messages=CHAT["messages"])
    with pytest.raises(UnprocessableEntityError, match="--max-new-tokens"):
        client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=99)


def test_streaming_with_the_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="tiny", messages=CHAT["messages"],
                                           max_tokens=4, temperature=0)
    text, last = "", None
    for chunk in client.chat.completions.create(model="tiny", messages=CHAT["messages"],
                                                max_tokens=4, temperature=0, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.finish_reason is not None:
                last = ch
    assert text == whole.choices[0].message.content
    assert last.uncertainty["epistemic"] == pytest.approx(
        whole.choices[0].uncertainty["epistemic"], rel=1e-5)
    parts = list(client.completions.create(model="tiny", prompt="the cat", max_tokens=3,
                                           temperature=0, stream=True))
    check_uncertainty(parts[0].choices[0].uncertainty)
