"""One row-preparation path (isouq.prepare): the same bad row gets the same reason code whether
``score_sequences`` raises it, ``isouq score``'s runner writes it as an error row, or the server
answers it with an HTTP status."""

from __future__ import annotations

import json

import pytest

import isouq
import tiny
from isouq.data.pairs import iter_pairs
from isouq.memory_plan import peak_bytes, shape_of
from isouq.prepare import (
    REASONS,
    TOO_LARGE,
    Limit,
    Limits,
    RowProblem,
    plan,
    prepare_pair,
    split_padded,
)
from isouq.runio import read_jsonl
from isouq.score_run import ScoreRun
from isouq.serve.config import ServeSettings
from isouq.serve.engine import Engine, Pair, ScoreJob

LONG = " ".join(["cat"] * 300)  # longer than the tiny model's context window

#: (row, spans, the reason every caller must give); a row is (prompt, answer); spans as
#: character ranges reach the two callers that take them (a request names a splitter only)
BAD = [
    (("who sat", [5, 10**6]), None, "token_out_of_vocabulary"),
    (("who sat", LONG), None, "context_length_exceeded"),
    (("who sat", "the cat sat. on the mat"), [[0, 99]], "invalid_spans"),
    (("who sat", "the cat sat. on the mat"), [[3, 2]], "invalid_spans"),
    (([{"role": "user", "content": "hi"}], "yes"), None, "invalid_prompt"),
]


@pytest.fixture(scope="module")
def lm():
    tok = tiny.tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    model = tiny.causal_lm("llama")
    model.config.max_position_embeddings = 64  # the window the checks read (LONG is 300)
    return model, tok


def reason_of_score_sequences(lm, prompt, answer, spans) -> str:
    with pytest.raises(RowProblem) as e:
        isouq.score_sequences(*lm, [prompt], [answer], spans=(
            None if spans is None else spans if isinstance(spans, str) else [spans]))
    return e.value.reason


def reason_of_score_run(lm, tmp_path, prompt, answer, spans) -> str:
    row = {"key": "k", "prompt": prompt, "answer": answer,
           **({"spans": spans} if isinstance(spans, list) else {})}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(row) + "\n", encoding="utf-8")
    ScoreRun(*lm, out, progress=False,
             spans=spans if isinstance(spans, str) else None).run(iter_pairs(inp))
    (got,) = read_jsonl(out)
    assert "error" in got
    return got["reason"]


def reason_of_server(lm, prompt, answer, spans) -> str | None:
    """The reason the server's engine answers with (None: spans as ranges, which a request
    cannot carry)."""
    if isinstance(spans, list):
        return None
    settings = ServeSettings(max_prompt_tokens=10**4, max_answer_tokens=10**4)
    (o,) = Engine(*lm, settings).run([ScoreJob([Pair(answer, prompt=prompt)], spans=spans)])
    assert o.error is not None
    assert o.error.status == (413 if o.error.code in TOO_LARGE else 422)
    return o.error.code


@pytest.mark.parametrize("row, spans, reason", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_the_same_bad_row_gets_the_same_reason_everywhere(lm, tmp_path, row, spans, reason):
    assert reason in REASONS
    got = {"score_sequences": reason_of_score_sequences(lm, *row, spans),
           "isouq score": reason_of_score_run(lm, tmp_path, *row, spans),
           "server": reason_of_server(lm, *row, spans)}
    assert set(got.values()) - {None} == {reason}, got


def test_memory_and_caller_limits_have_their_reasons(lm):
    model, tok = lm
    shape = shape_of(model)
    need = peak_bytes(shape, batch=1, length=40, answer_length=20)
    limits = Limits.of_model(model, prompt=Limit(3, "--max-prompt-tokens"),
                             answer=Limit(2, "--max-answer-tokens"), memory_budget=need // 2)
    with pytest.raises(RowProblem, match="--max-prompt-tokens") as e:
        prepare_pair(tok, "who sat on the mat today", "cat", limits)
    assert e.value.reason == "prompt_too_long"
    with pytest.raises(RowProblem, match="--max-answer-tokens") as e:
        prepare_pair(tok, "who", "the cat sat", limits)
    assert e.value.reason == "answer_too_long"
    roomy = Limits.of_model(model, memory_budget=peak_bytes(shape, batch=1, length=4,
                                                            answer_length=2))
    with pytest.raises(RowProblem, match="--memory-budget") as e:
        prepare_pair(tok, "who sat on the mat", "the cat sat on the mat all day", roomy)
    assert e.value.reason == "over_memory_budget" and e.value.reason in TOO_LARGE
    # the server answers the same reasons with 413 and the code
    engine = Engine(model, tok, ServeSettings(max_prompt_tokens=3))
    (o,) = engine.run([ScoreJob([Pair("cat", prompt="who sat on the mat today")])])
    assert (o.error.status, o.error.code) == (413, "prompt_too_long")


def test_plan_keeps_span_rows_apart_and_fits_the_budget(lm):
    model, tok = lm
    items = [prepare_pair(tok, "who", a, Limits.of_model(model),
                          spans="sentences" if i % 2 else None)
             for i, a in enumerate(["the cat. sat", "on the mat", "a dog. ran far", "yes"])]
    batches = plan(items, 8)
    assert sorted(len(b) for b in batches) == [2, 2]
    assert all(len({it.spans is None for it in b}) == 1 for b in batches)


def _cost(passes, lengths, per_pass):
    return sum(per_pass + len(p) * max(lengths[i] for i in p) for p in passes)


def _every_split(order, max_rows):
    """Every way to cut the sorted rows into consecutive passes of at most ``max_rows``."""
    for mask in range(1 << (len(order) - 1)):
        passes, cur = [], [order[0]]
        for k in range(1, len(order)):
            if mask >> (k - 1) & 1:
                passes.append(cur)
                cur = []
            cur.append(order[k])
        passes.append(cur)
        if max_rows is None or all(len(p) <= max_rows for p in passes):
            yield passes


@pytest.mark.parametrize("seed", range(40))
def test_split_padded_finds_the_cheapest_cuts_by_brute_force(seed):
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 9))]
    per_pass = rng.choice([0.0, 5.0, 30.0, 400.0])
    max_rows = rng.choice([None, 2, 4])
    got = split_padded(lengths, per_pass, max_rows)
    assert sorted(i for p in got for i in p) == list(range(len(lengths)))
    assert max_rows is None or all(len(p) <= max_rows for p in got)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = min(_cost(p, lengths, per_pass) for p in _every_split(order, max_rows))
    assert _cost(got, lengths, per_pass) == pytest.approx(best)


def test_split_padded_with_an_infinite_pass_cost_or_a_budget():
    lengths = [50, 10, 12, 48, 11]
    assert split_padded(lengths, float("inf")) == [[1, 4, 2, 3, 0]]  # whole, sorted
    # two passes at most 3 rows each, the one of less padding: 3 × 12 + 2 × 50 < 2 × 11 + 3 × 50
    assert split_padded(lengths, float("inf"), max_rows=3) == [[1, 4, 2], [3, 0]]
    assert split_padded(lengths, 0.0) == [[1], [4], [2], [3], [0]]  # no pad is free
    small = split_padded(lengths, float("inf"), fits=lambda idx: sum(lengths[i] for i in idx) <= 60)
    assert all(sum(lengths[i] for i in p) <= 60 for p in small) and len(small) == 3
    assert split_padded([], 5.0) == [] and split_padded([7], 5.0) == [[0]]
