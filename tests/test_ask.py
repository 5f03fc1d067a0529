"""`isouq ask`: the user's own questions answered and scored, exactly as score_sequences would."""

import io
import json
import math
import os

import pytest

import isouq
import tiny
from isouq.answer_row import FIELDS
from isouq.ask import answer_and_score
from isouq.cli import main
from isouq.errors import InputError
from isouq.llm.generation import generate_greedy
from isouq.llm.prompts import qa_prompts

QUESTIONS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue"]


@pytest.fixture(scope="module")
def lm():
    return tiny.causal_lm("llama-tied"), tiny.tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, lm):
    d = tmp_path_factory.mktemp("tinyllama")
    lm[0].save_pretrained(d)
    lm[1].save_pretrained(d)
    return d


def test_scores_are_those_of_one_backward_per_answer(lm):
    model, tok = lm
    rows = answer_and_score(model, tok, QUESTIONS, max_new_tokens=6, batch_size=2)
    prompts = qa_prompts(tok, QUESTIONS)
    gens = generate_greedy(model, tok, prompts, max_new_tokens=6)
    assert [r["answer"] for r in rows] == [g.text for g in gens]
    for r, p, g in zip(rows, prompts, gens, strict=True):
        if not g.token_ids:
            assert math.isnan(r["scores"]["epistemic"]) and r["n_answer_tokens"] == 0
            continue
        ref = isouq.score_sequences(model, tok, [p], [g.token_ids], method="loop")
        assert r["scores"]["epistemic"] == pytest.approx(float(ref.epistemic[0]), rel=1e-4)
        assert r["scores"]["aleatoric"] == pytest.approx(float(ref.aleatoric[0]), rel=1e-5)
        assert r["scores"]["mean_prob"] == pytest.approx(float(ref.mean_prob[0]), rel=1e-5)
        assert r["n_answer_tokens"] == len(g.token_ids)
    assert any(r["n_answer_tokens"] > 0 for r in rows)


def test_cli_json_from_arguments_file_and_stdin(model_dir, tmp_path, capsys, monkeypatch):
    qfile = tmp_path / "q.txt"
    qfile.write_text(f"{QUESTIONS[1]}\n\n{QUESTIONS[2]}\n")
    monkeypatch.setattr("sys.stdin", io.StringIO(QUESTIONS[0] + "\n"))
    base = ["ask", "--model", str(model_dir), "--max-new-tokens", "6", "--json"]
    assert main([*base, QUESTIONS[0], "--file", str(qfile)]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{")]
    assert [r["question"] for r in got] == QUESTIONS
    assert all(set(FIELDS) <= set(r) for r in got)  # the one answer-row schema
    assert main([*base, "--file", "-"]) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert again[0]["answer"] == got[0]["answer"] and again[0]["scores"]["epistemic"] == pytest.approx(
        got[0]["scores"]["epistemic"], rel=1e-5, nan_ok=True)


def test_a_long_list_is_answered_a_batch_at_a_time_and_handed_out_as_done(model_dir, lm):
    """ask() over 3 questions with batch_size 2: two batches, handed to on_rows in order, keys
    0..2 over the whole list, the scores those of answering each batch on its own."""
    from isouq.ask import ask

    batches = []
    got = ask(QUESTIONS, model=str(model_dir), max_new_tokens=6, batch_size=2,
              on_rows=batches.append)
    assert [len(b) for b in batches] == [2, 1] and [r["key"] for r in got.rows] == ["0", "1", "2"]
    assert [r for b in batches for r in b] == got.rows
    model, tok = lm
    alone = answer_and_score(model, tok, QUESTIONS[2:], max_new_tokens=6, batch_size=2)
    assert got.rows[2]["answer"] == alone[0]["answer"]
    assert got.rows[2]["scores"]["epistemic"] == pytest.approx(alone[0]["scores"]["epistemic"],
                                                               rel=1e-5, nan_ok=True)


def test_cli_table(model_dir, capsys):
    assert main(["ask", "--model", str(model_dir), "--max-new-tokens", "4", *QUESTIONS[:2]]) == 0
    out = capsys.readouterr().out
    assert "epist." in out and "who wrote hamlet" in out and "epi. log" in out
    # no direction claim without a calibration: a caution instead
    assert "trust the answer less" not in out and "none of these is a probability" in out


@pytest.mark.parametrize("argv, problem", [
    (["ask"], "no questions given"),
    (["ask", "who wrote hamlet", "  "], "question 1 is empty"),
    (["ask", "--file", "/no/such/file.txt"], "--file /no/such/file.txt is not a file"),
    (["ask", "--file", "/"], "--file / is not a file"),
])
def test_bad_questions_are_one_clear_line_before_a_model_loads(argv, problem, capsys):
    assert main([*argv, "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


@pytest.mark.skipif(not os.path.exists("/dev/fd"), reason="needs /dev/fd (bash's <(...))")
def test_questions_read_from_a_pipe_as_bash_process_substitution_gives():
    import argparse

    from isouq.cli.ask import _questions

    r, w = os.pipe()
    os.write(w, b"who wrote hamlet\n\nwhat is 2 + 2\n")
    os.close(w)
    try:
        args = argparse.Namespace(questions=["first?"], file=f"/dev/fd/{r}")
        assert _questions(args) == ["first?", "who wrote hamlet", "what is 2 + 2"]
    finally:
        os.close(r)


def test_check_questions_strips():
    from isouq.ask import check_questions

    assert check_questions([" a? ", "b"]) == ["a?", "b"]
    with pytest.raises(InputError):
        check_questions([])


def qa_rows_file(path, model, epistemic, aleatoric):
    with open(path, "w") as f:
        for i, (e, a) in enumerate(zip(epistemic, aleatoric, strict=True)):
            f.write(json.dumps({"key": f"k{i}", "model": model, "dataset": "triviaqa",
                                "correct": i % 2 == 0,
                                "scores": {"epistemic": e, "aleatoric": a}}) + "\n")
    return path


def test_percentiles_count_the_reference_answers_at_or_below():
    from isouq.ask import add_percentiles

    ref = [{"scores": {"epistemic": e, "aleatoric": a}}
           for e, a in [(1.0, 0.1), (2.0, 0.2), (2.0, 0.3), (5.0, 0.4)]]
    rows = [{"scores": {"epistemic": e, "aleatoric": a}}
            for e, a in [(2.0, 0.05), (9.0, 0.35), (float("nan"), float("nan"))]]
    add_percentiles(rows, ref)
    for r in rows[:2]:
        for name in ("epistemic", "aleatoric"):
            brute = 100 * sum(x["scores"][name] <= r["scores"][name] for x in ref) / len(ref)
            assert r["percentiles"][name] == brute
    assert [r["percentiles"]["epistemic"] for r in rows[:2]] == [75.0, 100.0]
    assert math.isnan(rows[2]["percentiles"]["epistemic"])


def test_cli_reference_adds_percentiles(model_dir, tmp_path, capsys):
    ref = qa_rows_file(tmp_path / "qa_triviaqa__tiny.jsonl", str(model_dir),
                       [0.0, 1e-12, 1e9], [0.0, 0.1, 0.3])
    base = ["ask", "--model", str(model_dir), "--max-new-tokens", "4", "--reference", str(ref)]
    assert main([*base, "--json", *QUESTIONS]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{")]
    for r in got:
        if r["n_answer_tokens"]:  # a real ‖g‖² > 0 lies between the 2nd and 3rd reference
            assert r["percentiles"]["epistemic"] == pytest.approx(200 / 3)
    assert any(r["n_answer_tokens"] for r in got)
    assert main([*base, QUESTIONS[0]]) == 0
    out = capsys.readouterr().out
    assert "epist. pct" in out and f"percentile among 3 answers of {model_dir}" in out


def test_reference_without_the_model_is_one_clear_line(tmp_path, capsys):
    ref = qa_rows_file(tmp_path / "qa_triviaqa__other.jsonl", "other-model", [1.0], [0.1])
    assert main(["ask", "who wrote hamlet", "--model", "/no/such/model",
                 "--reference", str(ref)]) == 2
    err = capsys.readouterr().err
    assert "no QA rows of model '/no/such/model' (models there: other-model)" in err


@pytest.mark.parametrize("extra, problem", [
    (["--baselines", "p_true", "--k", "3", "--k-p-true", "4"], "k_p_true=4"),
    (["--baselines", "naive_entropy", "--k", "1"], "at least 2 sampled answers"),
    (["--baselines", "perplexity"], "invalid choice: 'perplexity'"),
    (["--baselines", "p_true", "--temperature", "0"], "0.0 must be > 0"),
])
def test_bad_baseline_settings_are_one_clear_line_before_a_model_loads(extra, problem, capsys):
    try:
        code = main(["ask", "who wrote hamlet", "--model", "/no/such/model", *extra])
    except SystemExit as stop:  # argparse's own checks
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


def test_percentiles_of_baselines_count_only_reference_rows_that_have_them():
    from isouq.ask import add_percentiles

    ref = [{"scores": {"epistemic": 1.0, "aleatoric": 0.1, "p_true": 0.2}},
           {"scores": {"epistemic": 2.0, "aleatoric": 0.2, "p_true": 0.9}},
           {"scores": {"epistemic": 3.0, "aleatoric": 0.3}}]
    rows = [{"scores": {"epistemic": 2.5, "aleatoric": 0.2, "p_true": 0.5,
                        "naive_entropy": 1.0}}]
    add_percentiles(rows, ref)
    assert rows[0]["percentiles"]["p_true"] == 50.0  # 1 of the 2 rows with P(True)
    assert rows[0]["percentiles"]["epistemic"] == pytest.approx(200 / 3)
    assert "naive_entropy" not in rows[0]["percentiles"]  # no reference row has it


def test_semantic_entropy_without_a_judge_is_refused():
    with pytest.raises(InputError, match="entailment judge"):
        answer_and_score(None, None, ["q"], baselines=["semantic_entropy"])
