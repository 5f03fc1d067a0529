"""Span scores in the server's answers (``"spans": "sentences" | "lines"``): the entries
``isouq score --spans`` writes, scored in the batch's one ``score_sequences`` call, equal to
``isouq score --spans``, ``isouq ask --spans`` and ``score_sequences(spans=...)`` on the same
pair; answers of the batch without spans keep the scores they get alone."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

import isouq
from isouq.defaults import SPAN_SCORE
from isouq.serve.config import ServeSettings
from isouq.serve.engine import Engine, GenerateJob, Pair, ScoreJob

from .conftest import make_app

#: two sentences and two lines (the tiny tokenizer splits "." off as a token of its own)
ANSWER = "the cat sat on the mat.\nthe dog sat on the cat. yes"
SPAN_SCORES = ("epistemic", "epistemic_log", "aleatoric", "normalized_epistemic", "mean_prob")


def same_spans(got: list[dict], want: list[dict]) -> None:
    """The span entries agree: text, range and tokens exactly, scores within 1e-5 relative."""
    assert [(s["text"], s["start"], s["end"], s["n_tokens"]) for s in got] == \
        [(s["text"], s["start"], s["end"], s["n_tokens"]) for s in want]
    for g, w in zip(got, want, strict=True):
        for k in SPAN_SCORES:
            assert g["scores"][k] == pytest.approx(w["scores"][k], rel=1e-5), (k, g, w)


def test_score_with_spans_equals_isouq_score_spans(tmp_path, tiny_llama_dir):
    """POST /v1/score with spans gives the spans `isouq score --spans` writes for the file."""
    from isouq.cli import main
    from isouq.models import load_model
    from isouq.runio import read_jsonl

    rows = [{"key": "q1", "question": "who wrote hamlet", "answer": ANSWER},
            {"key": "q2", "prompt": [{"role": "user", "content": "what is the moon made of"}],
             "answer": "cheese. rock"},
            {"key": "q3", "prompt": "the cat sat on", "answer": "the mat"}]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for splitter in ("sentences", "lines"):
        out = tmp_path / f"scores_{splitter}.jsonl"
        assert main(["score", str(src), "--out", str(out), "--model", str(tiny_llama_dir),
                     "--spans", splitter]) == 0
        want = {r["key"]: r for r in read_jsonl(out)}
        model, tok, _ = load_model(str(tiny_llama_dir))
        s = ServeSettings(model_id="tiny")
        with TestClient(make_app((model, tok), engine=Engine(model, tok, s))) as c:
            pairs = [{"key": r["key"], "answer": r["answer"],
                      **({"question": r["question"]} if "question" in r else
                         {"messages": r["prompt"]} if isinstance(r["prompt"], list)
                         else {"prompt": r["prompt"]})} for r in rows]
            r = c.post("/v1/score", json={"pairs": pairs, "spans": splitter})
        assert r.status_code == 200, r.text
        for d in r.json()["data"]:
            u, w = d["uncertainty"], want[d["key"]]
            same_spans(u["spans"], w["spans"])
            for k in ("epistemic", "epistemic_log", "aleatoric", "mean_prob"):
                assert u[k] == pytest.approx(w["scores"][k], rel=1e-5), (k, d)
            by = [sp["scores"][SPAN_SCORE] for sp in w["spans"]]
            worst = max(range(len(by)), key=by.__getitem__) if len(by) > 1 else None
            assert u["least_trusted_span"] == worst and u["least_trusted_by"] == SPAN_SCORE
        assert len(want["q1"]["spans"]) == (3 if splitter == "sentences" else 2)


def test_a_batch_with_and_without_spans_is_one_call(lm, monkeypatch):
    """Jobs asking for spans and jobs that do not share the batch's one score_sequences call;
    the answers without spans get no spans and the scores they get alone."""
    import isouq.serve.engine as engine_mod

    calls = []
    real = engine_mod.score_sequences

    def counting(*a, **kw):
        calls.append((len(a[2]), kw.get("spans") is not None))
        return real(*a, **kw)

    monkeypatch.setattr(engine_mod, "score_sequences", counting)
    model, tok = lm
    engine = Engine(model, tok, ServeSettings(max_new_tokens=4))
    plain = ScoreJob([Pair("paris", prompt="what is the capital of france")])
    spanned = ScoreJob([Pair(ANSWER, prompt="the cat")], spans="sentences")
    chat = GenerateJob([("messages", [{"role": "user", "content": "who wrote hamlet"}])],
                       max_tokens=4, temperature=0, spans="lines")
    out = engine.run([plain, spanned, chat])
    assert all(o.error is None for o in out), [o.error for o in out]
    assert calls == [(3, True)]
    u_plain = out[0].result[0]["uncertainty"]
    assert "spans" not in u_plain
    alone = isouq.score_sequences(model, tok, ["what is the capital of france"], ["paris"])
    for k in ("epistemic", "aleatoric", "mean_prob"):
        assert u_plain[k] == pytest.approx(float(getattr(alone, k)[0]), rel=1e-5), k
    want = isouq.score_sequences(model, tok, ["the cat"], [ANSWER], spans="sentences")
    same_spans(out[1].result[0]["uncertainty"]["spans"], want.row_spans(0))
    # the generated answer: its spans as score_sequences gives them for its token ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "who wrote hamlet"}],
                                     tokenize=False, add_generation_prompt=True)
    from isouq.llm.generation import generate_greedy

    g = generate_greedy(model, tok, [prompt], max_new_tokens=4, stop=())[0]
    got = out[2].result[0]["choices"][0]["uncertainty"]
    want = isouq.score_sequences(model, tok, [prompt], [g.token_ids], spans="lines")
    same_spans(got["spans"], want.row_spans(0))
    assert got["epistemic"] == pytest.approx(float(want.epistemic[0]), rel=1e-5)


def test_chat_completions_and_ask_carry_spans(client, lm):
    from isouq.ask import answer_and_score

    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "who wrote hamlet"}], "max_tokens": 6,
        "temperature": 0, "spans": "sentences"})
    assert chat.status_code == 200, chat.text
    u = chat.json()["choices"][0]["uncertainty"]
    assert len(u["spans"]) >= 1 and {"text", "start", "end", "n_tokens", "scores"} <= set(
        u["spans"][0])
    plain = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "who wrote hamlet"}], "max_tokens": 6,
        "temperature": 0}).json()["choices"][0]["uncertainty"]
    assert "spans" not in plain and "least_trusted_span" not in plain
    assert plain["epistemic"] == pytest.approx(u["epistemic"], rel=1e-5)
    comp = client.post("/v1/completions", json={"prompt": ["the cat", "who wrote"],
                                                "max_tokens": 4, "temperature": 0,
                                                "spans": "lines"}).json()
    assert all("spans" in c["uncertainty"] for c in comp["choices"])
    # /v1/ask with spans is `isouq ask --spans`
    doc = client.post("/v1/ask", json={"question": "who wrote hamlet", "max_tokens": 6,
                                       "spans": "sentences"}).json()
    want = answer_and_score(*lm, ["who wrote hamlet"], max_new_tokens=6, spans="sentences")[0]
    assert doc["answer"] == want["answer"]
    same_spans(doc["uncertainty"]["spans"], want["spans"])


@pytest.mark.parametrize("url, body", [
    ("/v1/score", {"prompt": "a", "answer": "b", "spans": "words"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "spans": ["sentences"]}),
    ("/v1/ask", {"question": "who", "spans": 1}),
])
def test_an_unknown_spans_value_is_a_422_naming_it(client, url, body):
    r = client.post(url, json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == "spans" and "'sentences' or 'lines'" in err["message"], err


def test_span_scores_that_are_not_finite_are_null():
    from isouq.serve.engine import _finite_span

    span = {"text": "a", "start": 0, "end": 1, "n_tokens": 1,
            "scores": {"epistemic": 1.0, "epistemic_log": math.inf, "aleatoric": 0.0,
                       "normalized_epistemic": math.nan, "mean_prob": 0.0}}
    got = _finite_span(span)
    assert got["scores"]["epistemic_log"] is None and got["scores"]["normalized_epistemic"] is None
    assert got["scores"]["epistemic"] == 1.0 and got["text"] == "a"
