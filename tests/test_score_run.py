"""The runner of `isouq score` as one object (ScoreRun): each row tokenized once, also across a
retry; the planned batches are the batches scored; rows that give their own span ranges score
as `score_sequences(spans=...)` does, and bad ranges are one line before the model loads."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import isouq
import tiny
from isouq import score_run
from isouq.cli import main
from isouq.data.pairs import iter_pairs
from isouq.distributed import DistEnv
from isouq.errors import InputError
from isouq.runio import read_jsonl
from isouq.score_run import ScoreRun, check_shard, score_rows
from isouq.sequences import encode
from isouq.spans import resolve_spans

ROWS = [
    {"key": "a", "prompt": "what is the capital of france",
     "answer": "paris is the capital. the cat sat on the mat!"},
    {"key": "b", "question": "who wrote hamlet", "answer": "shakespeare wrote hamlet. yes"},
    {"key": "boom", "prompt": "why is the sky blue", "answer": "boom because the sky. no"},
    {"key": "c", "prompt": [{"role": "user", "content": "is the moon made of cheese"}],
     "answer": "no the moon is rock. the sky is blue"},
    {"key": "ids", "prompt": "who sat on the mat", "answer": [6, 7, 8]},
]


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def by_key(path):
    return {r["key"]: r for r in read_jsonl(path)}


class CountingTokenizer:
    """The tiny tokenizer, recording every text it is called on (a tokenization)."""

    def __init__(self, tok):
        self._tok, self.calls = tok, []

    def __call__(self, text, *args, **kw):
        self.calls.append(text)
        return self._tok(text, *args, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.mark.parametrize("spans", [None, "sentences"])
def test_each_row_is_tokenized_once_also_across_a_retry(tmp_path, monkeypatch, spans):
    """One tokenizer call per prompt and per text answer, whatever the batching, the spans and
    a failing batch retried row by row; each score_sequences call is one planned batch."""
    model, tok = tiny.causal_lm("llama-tied"), CountingTokenizer(tiny.tokenizer())
    rows = [dict(r) for r in ROWS]
    rows[1]["spans"] = [[0, 24]]  # its own range: used with and without --spans
    inp = jsonl(tmp_path / "in.jsonl", rows)
    real, calls = score_run.score_sequences, []

    def flaky(model, tokenizer, prompts, answers, **kw):
        calls.append((len(answers), kw["batch_size"], len(kw["encoded"])))
        if "boom because the sky. no" in answers:
            raise RuntimeError("numerical trouble")
        return real(model, tokenizer, prompts, answers, **kw)

    monkeypatch.setattr(score_run, "score_sequences", flaky)
    out = tmp_path / "out.jsonl"
    res = score_rows(model, tok, iter_pairs(inp), out, batch_size=8, spans=spans,
                     progress=False)
    assert res["written"] == 4 and res["errors"] == 1
    got = by_key(out)
    assert got["boom"]["error"] == "RuntimeError: numerical trouble"
    assert all(got[k]["scores"]["epistemic"] > 0 for k in ("a", "b", "c", "ids"))
    assert [(s["start"], s["end"]) for s in got["b"]["spans"]] == [(0, 24)]
    assert ("spans" in got["a"]) == (spans is not None)
    # the retry ran: the failing batch, then its rows alone
    assert any(n > 1 for n, _, _ in calls) and (1, 1, 1) in calls
    assert all(n == b == e for n, b, e in calls)  # one planned batch = one scored batch
    # each prompt and each text answer went through the tokenizer exactly once
    answers = [r["answer"] for r in rows if isinstance(r["answer"], str)]
    assert len(tok.calls) == len(rows) + len(answers)
    count = Counter(tok.calls)
    assert all(count[a] == 1 for a in answers)
    assert all(n == 1 for n in count.values())


def test_encoded_rows_score_as_text_rows():
    """score_sequences(encoded=...) takes the ids as given: the same scores, no tokenization."""
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    prompts, answers = [r["prompt"] for r in ROWS[:1]] * 2, [ROWS[0]["answer"], "yes no"]
    want = isouq.score_sequences(model, tok, prompts, answers, spans=[[(0, 5)], [(4, 6)]])
    enc = encode(tok, prompts, answers, offsets=True)
    counting = CountingTokenizer(tok)
    got = isouq.score_sequences(model, counting, prompts, answers, encoded=enc,
                                spans=[[(0, 5)], [(4, 6)]])
    assert counting.calls == []
    torch.testing.assert_close(got.epistemic, want.epistemic, rtol=1e-6, atol=0)
    assert got.row_spans(1) == want.row_spans(1)
    resolved = resolve_spans(tok, answers, [[(0, 5)], [(4, 6)]], enc)  # resolved once, reused
    again = isouq.score_sequences(model, counting, prompts, answers, encoded=enc, spans=resolved)
    assert counting.calls == [] and again.row_spans(0) == want.row_spans(0)
    with pytest.raises(InputError, match="got 1 encoded pairs for 2 prompts"):
        isouq.score_sequences(model, tok, prompts, answers, encoded=enc[:1])


def test_score_run_is_the_runner_of_score_rows(tmp_path):
    """ScoreRun built by hand: settings recorded with method and spans, rows in input order."""
    model, tok = tiny.causal_lm("llama-tied"), tiny.tokenizer()
    inp = jsonl(tmp_path / "in.jsonl", [r for r in ROWS if r["key"] != "boom"])
    run = ScoreRun(model, tok, tmp_path / "out.jsonl", settings={"model": "tiny"},
                   spans="lines", batch_size=2, progress=False)
    assert run.settings == {"model": "tiny", "method": "ghost", "params": None,
                            "spans": "lines"}
    items = [run.prepare(r) for r in iter_pairs(inp)]  # measured once, then planned
    assert [len(b) for b in run.plan(items)] == [2, 2]
    res = run.run(iter_pairs(inp))
    assert res["written"] == 4 and [r["key"] for r in read_jsonl(tmp_path / "out.jsonl")] == [
        "a", "b", "c", "ids"]
    with pytest.raises(InputError, match="on_error='later' is not one of skip, stop"):
        ScoreRun(model, tok, tmp_path / "x.jsonl", on_error="later")


# ------------------------------------------------------------------ the rows' own spans
def _library(model_dir, rows, method="ghost"):
    from isouq.llm.prompts import qa_prompt
    from isouq.models import load_model

    model, tok, _ = load_model(str(model_dir))
    prompts = [r.get("prompt") or qa_prompt(tok, r["question"]) for r in rows]
    answers = [r["answer"] for r in rows]
    spans = [r["spans"] if "spans" in r else resolve_spans(tok, [r["answer"]], "sentences")[0]
             for r in rows]
    return isouq.score_sequences(model, tok, prompts, answers, spans=spans, method=method)


def _same(row, lib, j):
    for f in ("epistemic", "aleatoric", "mean_prob"):
        assert row["scores"][f] == pytest.approx(float(getattr(lib, f)[j]), rel=1e-6, abs=0)
    want = lib.row_spans(j)
    assert len(row["spans"]) == len(want)
    for s, w in zip(row["spans"], want, strict=True):
        assert (s["text"], s["start"], s["end"], s["n_tokens"]) == (
            w["text"], w["start"], w["end"], w["n_tokens"])
        for f, v in w["scores"].items():
            assert s["scores"][f] == pytest.approx(v, rel=1e-6, abs=0), f


GIVEN = [
    {"key": "g1", "prompt": "what is the capital of france",
     "answer": "paris is the capital. the cat sat on the mat!",
     "spans": [[22, 45], [0, 5]]},
    {"key": "g2", "question": "who wrote hamlet", "answer": "shakespeare wrote hamlet. yes",
     "spans": [[0, 11], [26, 29]]},
    {"key": "g3", "prompt": "who sat on the mat", "answer": [6, 7, 8, 9], "spans": [[0, 7]]},
    {"key": "plain", "prompt": "why is the sky blue", "answer": "because the sky. no"},
]


@pytest.mark.parametrize("method", ["ghost", "per_example"])
def test_given_ranges_score_as_the_library_does(tiny_llama_dir, tmp_path, capsys, method):
    inp = jsonl(tmp_path / "in.jsonl", GIVEN)
    out = tmp_path / "out.jsonl"
    argv = ["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir),
            "--batch-size", "8", "--no-bucketing", "--method", method]
    assert main(argv) == 0
    got = by_key(out)
    assert "spans" not in got["plain"]  # no --spans: only rows with their own ranges
    assert [s["text"] for s in got["g1"]["spans"]] == ["the cat sat on the mat!", "paris"]
    lib = _library(tiny_llama_dir, GIVEN[:3], method)
    for j, r in enumerate(GIVEN[:3]):
        _same(got[r["key"]], lib, j)
    # with --spans: the rows' own ranges win, the others are split into sentences
    out2 = tmp_path / "sentences.jsonl"
    assert main([*argv[:3], str(out2), *argv[4:], "--spans", "sentences"]) == 0
    got = by_key(out2)
    lib = _library(tiny_llama_dir, GIVEN, method)
    for j, r in enumerate(GIVEN):
        _same(got[r["key"]], lib, j)
    assert [s["text"] for s in got["plain"]["spans"]] == ["because the sky.", "no"]
    # the ranges are part of the row's input: changed ones are scored again
    capsys.readouterr()
    moved = [dict(r) for r in GIVEN]
    moved[0]["spans"] = [[0, 5]]
    assert main([*argv[:1], str(jsonl(inp, moved)), *argv[2:]]) == 0
    assert "scored 1 answers (3 already done, 1 of them again" in capsys.readouterr().out
    assert [s["text"] for s in by_key(out)["g1"]["spans"]] == ["paris"]


def no_load(monkeypatch):
    import isouq.models

    def boom(*args, **kw):
        raise AssertionError("the model was loaded before the error")
    monkeypatch.setattr(isouq.models, "load_model", boom)


ANSWER = "paris is the capital. the cat sat on the mat!"  # 45 characters


@pytest.mark.parametrize("spans, answer, words", [
    ([[0, 99]], ANSWER, ["outside the answer's 45 characters", "≤ 45"]),
    ([[0, 10], [6, 20]], ANSWER, ["overlap", "give disjoint ranges"]),
    ([[5, 5]], ANSWER, ["is empty", "start < end"]),
    ([[5, 6]], ANSWER, ["is empty", "only blanks"]),
    ([[0]], ANSWER, ["is not a (start, end) pair"]),
    ([], ANSWER, ["no spans given"]),
    ("0-5", ANSWER, ["spans must be a list of (start, end) character ranges"]),
    ([[-1, 2]], [6, 7, 8], ["outside the answer"]),  # token ids: the checks needing no text
    ([[0, 2], [1, 3]], [6, 7, 8], ["overlap"]),
])
def test_bad_given_ranges_are_one_line_before_the_model_loads(tiny_llama_dir, tmp_path,
                                                              monkeypatch, capsys, spans,
                                                              answer, words):
    rows = [{"key": "fine", "prompt": "q", "answer": "yes"},
            {"key": "claims", "prompt": "q", "answer": answer, "spans": spans}]
    inp = jsonl(tmp_path / "in.jsonl", rows)
    no_load(monkeypatch)
    assert main(["score", str(inp), "--out", str(tmp_path / "o.jsonl"), "--model",
                 str(tiny_llama_dir)]) == 2
    err = capsys.readouterr().err
    assert "answer 'claims'" in err and all(w in err for w in words), err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_a_range_without_a_token_of_its_own_is_an_error_row(tiny_llama_dir, tmp_path, capsys):
    """Known only once the tokenizer has placed the tokens: an error row (or, with --on-error
    stop, one line naming the key)."""
    rows = [{"key": "ok", "prompt": "q", "answer": "yes no", "spans": [[0, 3]]},
            {"key": "inside", "prompt": "q", "answer": ANSWER, "spans": [[1, 3]]}]
    inp, out = jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    argv = ["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir)]
    assert main(argv) == 0
    got = by_key(out)
    assert "no token of its own" in got["inside"]["error"] and len(got["ok"]["spans"]) == 1
    assert main([*argv[:3], str(tmp_path / "stop.jsonl"), *argv[4:], "--on-error",
                 "stop"]) == 2
    err = capsys.readouterr().err
    assert "row 'inside' (line 2): answer 'inside': span (1, 3)" in err
    assert "Traceback" not in err


def test_sharded_weights_refuse_rows_with_their_own_spans():
    with pytest.raises(InputError, match="row 'k' gives its own spans.*drop the rows' spans"):
        check_shard("fsdp", DistEnv(0, 2), method="ghost", load={}, spans_key="k")


@pytest.mark.parametrize("method", ["per_example", "loop"])
def test_memory_budget_is_planned_for_the_engine_that_scores(tmp_path, method):
    """``--method per_example --memory-budget``: the rows are planned with per_example's memory,
    not ghost's (a budget between the two needs tells them apart)."""
    from isouq.memory_plan import peak_bytes, shape_of

    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    row = ROWS[0]
    n = sum(len(e.prompt) + len(e.answer) for e in encode(tok, [row["prompt"]], [row["answer"]]))
    a = len(tok(row["answer"], add_special_tokens=False)["input_ids"])
    shape = shape_of(model)
    ghost, per_example = (peak_bytes(shape, batch=1, length=n, answer_length=a, method=m)
                          for m in ("ghost", "per_example"))
    assert per_example > ghost  # this model: one row's weight gradients outweigh its Grams
    budget = (ghost + per_example) // 2
    out = tmp_path / "out.jsonl"
    run = ScoreRun(model, tok, out, method=method, memory_budget=budget, progress=False)
    assert run.method == "per_example" and run.limits.memory.method == "per_example"
    run.run(iter_pairs(jsonl(tmp_path / "in.jsonl", [row])))
    got = by_key(out)["a"]  # per_example's plan refuses what ghost's plan would have scored
    assert got.get("reason") == "over_memory_budget" and "--memory-budget" in got["error"]
    ghost_out = tmp_path / "ghost.jsonl"
    ScoreRun(model, tok, ghost_out, method="ghost", memory_budget=budget,
             progress=False).run(iter_pairs(tmp_path / "in.jsonl"))
    assert "scores" in by_key(ghost_out)["a"]
