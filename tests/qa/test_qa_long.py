"""`isouq qa long`: numbered prompts of 5 questions, composed and generated answers, every
sentence labelled, resumable runs, the evaluation's tables and the report section."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from isouq.data.qa import QAItem, pick
from isouq.errors import InputError
from isouq.llm.generation import Generation
from isouq.runio import read_jsonl
from isouq.study.analysis import long_spans
from isouq.study.qa import long

ITEMS = [QAItem(f"tqa-val-{i:05d}", f"What is the capital of France {i}?", ["Paris", f"p{i}"])
         for i in range(40)]


def _gen(tok, text: str, reason: str = "stop") -> Generation:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return Generation(text=text.strip(), raw_text=text, token_ids=ids, logprobs=[0.0] * len(ids),
                      model_logprobs=[0.0] * len(ids), stop_reason=reason)


def _short_dir(tmp_path, pool, n: int):
    """Kept short rows of the first ``n`` pool questions: "Paris" (correct) every third one,
    "London" (wrong) otherwise."""
    d = tmp_path / "short"
    d.mkdir()
    with open(d / "qa_triviaqa__tiny.jsonl", "w") as f:
        for j, it in enumerate(pool[:n]):
            ok = j % 3 == 0
            f.write(json.dumps({"key": "short-" + it.key, "answer": "Paris" if ok else "London",
                                "correct": int(ok)}) + "\n")
    return d


def _kw(tok, tiny_lm, tmp_path, **kw):
    pool = long.question_pool(30, 0, ITEMS)
    short = _short_dir(tmp_path, pool, kw.pop("kept", 30))
    return dict(questions=30, short_dir=short, items=ITEMS, loader=lambda n: (tiny_lm, tok, None),
                progress=False, **kw), pool


# ------------------------------------------------------------------ composition
def test_prompt_and_composed_answer_are_exact():
    p = long.long_prompt(["Who?", "What\nnow?"])
    assert p == (long.HEADER + "Questions:\n1. Who?\n2. What now?\nAnswers:\n")
    text, ranges = long.compose_answer(["Paris", " St. Louis ", "1. x"])
    assert text == "1. Paris\n2. St. Louis\n3. 1. x"
    assert [text[a:b] for a, b in ranges] == ["Paris", "St. Louis", "1. x"]
    for bad in ([""], ["a\nb"], ["  "]):
        with pytest.raises(InputError, match="empty or spans lines"):
            long.compose_answer(bad)


def test_align_lines_by_number():
    text = "1. Paris\n2) London\nfoo\n4. Rome\n4. again\n9. far\n5:   \n3. Oslo "
    al = long.align_lines(text)
    got = [None if r is None else text[r[0]:r[1]] for r in al.ranges]
    assert got == ["Paris", "London", "Oslo", "Rome", None]
    assert al.missing == 1
    assert al.dropped_lines == {"unnumbered": 1, "repeated": 1, "out_of_range": 1, "empty": 1}


def test_cut_after_the_last_item(tok):
    text = "1. a\n2. b\n3. c\n4. d\n5. e\nThe correct answer is 1."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    kept, cut = long.cut_after_last(tok, ids)
    assert tok.decode(kept) == "1. a\n2. b\n3. c\n4. d\n5. e" and cut > 0
    short = tok("1. a\n2. b", add_special_tokens=False)["input_ids"]
    assert long.cut_after_last(tok, short) == (short, 0)


def test_echo_of_the_question():
    q, aliases = "Which US state is known as the Palmetto State?", ["South Carolina",
                                                                    "Palmetto State"]
    assert long.echo_only("The Palmetto State", q, aliases)
    assert not long.echo_only("South Carolina, the Palmetto State", q, aliases)
    assert not long.echo_only("Georgia", q, aliases)  # wrong, not an echo
    assert long.echo_only("Beograd", "Which capital is known as Beograd?", ["Beograd"])
    rows = [{"setting": "generated", "model": "m", "key": "g0", "whole": {},
             "sentences": [{"index": 1, "correct": 1, "echo": True, "scores": {"x": 1}},
                           {"index": 2, "correct": 1, "echo": False, "scores": {"x": 1}}]}]
    assert [r["wrong"] for r in long_spans.sentence_rows(rows)] == [0, 0]
    assert [r["wrong"] for r in long_spans.sentence_rows(rows, label="no_echo")] == [1, 0]


def test_question_pool_is_the_short_study_subset_kept_first():
    for n in (5, 12, 30):
        pool = long.question_pool(n, 0, ITEMS)
        assert {it.key for it in pool} == {it.key for it in pick(ITEMS, n, 0)}
        assert pool == long.question_pool(40, 0, ITEMS)[:n]  # nested: smaller limits first
    groups = long.groups_of(long.question_pool(12, 0, ITEMS))
    assert [k for k, _ in groups] == ["g0000", "g0001"] and all(len(q) == 5 for _, q in groups)


# ------------------------------------------------------------------ runs
def test_composed_run_carries_labels_to_their_sentences(tok, tiny_lm, tmp_path):
    kw, pool = _kw(tok, tiny_lm, tmp_path, kept=20)  # 10 more answered by the run itself
    calls = []

    def gen(model, tk, prompts, **g):
        calls.append(len(prompts))
        return [_gen(tk, "Paris" if "France 1?" in p else "Rome") for p in prompts]

    long.run_long(["tiny"], tmp_path / "out", settings=["composed"], generator=gen,
                  n_bootstrap=20, **kw)
    rows = read_jsonl(tmp_path / "out" / "composed__tiny.jsonl")
    assert [r["key"] for r in rows] == [f"g{g:04d}" for g in range(6)]
    kept = {it.key: j for j, it in enumerate(pool[:20])}
    for r in rows:
        assert [s["index"] for s in r["sentences"]] == [1, 2, 3, 4, 5]
        for s, q in zip(r["sentences"], r["questions"], strict=True):
            assert s["question_key"] == q["key"]
            assert r["answer"][s["start"]:s["end"]] == s["text"]
            if q["key"] in kept:  # the kept row's label, on this question's sentence
                j = kept[q["key"]]
                assert (s["text"], s["correct"]) == (("Paris", 1) if j % 3 == 0 else ("London", 0))
            else:  # answered here, labelled by alias match
                assert s["correct"] == int(s["text"] == "Paris")
            sc = s["scores"]
            assert sc["min_prob"] <= sc["mean_prob"] + 1e-6
            assert sc["mean_prob_check"] == pytest.approx(sc["mean_prob"], rel=1e-4)
            assert sc["epistemic_log"] == pytest.approx(sc["epistemic"] / sc["mean_prob"] ** 2)
        assert r["whole"]["min_prob"] <= min(s["scores"]["min_prob"] for s in r["sentences"])
        assert r["prompt"] == long.long_prompt([q["question"] for q in r["questions"]])
    assert sum(calls) == 10  # only the questions the kept rows lack
    assert len(read_jsonl(tmp_path / "out" / "short__tiny.jsonl")) == 10
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["experiment"] == "qa-long" and doc["figures"] == [long.FIGURE]
    assert doc["tables"]["auroc_no_echo"] and doc["tables"]["counts_no_echo"]
    assert all(s["echo"] is False for r in rows for s in r["sentences"])
    assert (tmp_path / "out" / long.FIGURE).is_file()
    assert (tmp_path / "out" / "tables.md").is_file()


def test_a_run_resumes_after_interruption(tok, tiny_lm, tmp_path, monkeypatch):
    kw, _ = _kw(tok, tiny_lm, tmp_path)
    out = tmp_path / "out"
    long.run_long(["tiny"], out, settings=["composed"], answers=3, n_bootstrap=10, **kw)
    path = out / "composed__tiny.jsonl"
    first = read_jsonl(path)
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] == ["tiny composed: 3 of 6 answers"]  # --answers stopped it
    with open(path, "a") as f:  # a crash in the middle of a row
        f.write('{"key": "g0003", "model": "ti')
    scored = []
    real = long.score_answers

    def counting(model, tk, prompts, answers, ranges, **o):
        scored.append(len(answers))
        return real(model, tk, prompts, answers, ranges, **o)

    monkeypatch.setattr(long, "score_answers", counting)
    long.run_long(["tiny"], out, settings=["composed"], n_bootstrap=10, **kw)
    rows = read_jsonl(path)
    assert [r["key"] for r in rows] == [f"g{g:04d}" for g in range(6)]
    assert rows[:3] == first and sum(scored) == 3
    run = json.loads((out / "composed__tiny.run.json").read_text())
    assert run["status"] == "complete" and run["answers_written"] == 6
    assert json.loads((out / "results.json").read_text())["partial"] == []
    # nothing left: nothing scored; other content settings: refused
    long.run_long(["tiny"], out, settings=["composed"], n_bootstrap=10, **kw)
    assert sum(scored) == 3
    with pytest.raises(InputError, match="other settings"):
        long.run_long(["tiny"], out, settings=["composed"], n_bootstrap=10,
                      **{**kw, "seed": 1})


def test_partial_run_is_marked(tok, tiny_lm, tmp_path):
    kw, _ = _kw(tok, tiny_lm, tmp_path)
    out = tmp_path / "out"
    runner = long.LongRunner("tiny", out, **{k: v for k, v in kw.items() if k != "progress"},
                             progress=False)
    path = runner.path("composed")
    rows = runner._composed(runner.groups[:1], runner.settings("composed"))
    path.write_text(json.dumps(rows[0]) + "\n")
    runner._write_run("composed", status="running", written=1)
    doc = json.loads(long.write_long_results(out, n_bootstrap=10).read_text())
    prog = doc["tables"]["progress"]
    assert prog[0]["partial"] and prog[0]["written"] == 1 and prog[0]["planned"] == 6
    assert doc["partial"] == ["tiny composed: 1 of 6 answers"]


def test_generated_run_aligns_and_labels_by_alias_match(tok, tiny_lm, tmp_path):
    kw, _ = _kw(tok, tiny_lm, tmp_path)
    texts = ["1. Paris\n2. London\nfoo\n4. Paris\n4. x\n5. \nThe end",
             "1. p7\n2. Paris\n3. Rome\n4. Paris\n5. Oslo\nThe correct answer is 1."]

    def gen(model, tk, prompts, **g):
        return [_gen(tk, texts[i % 2]) for i, _ in enumerate(prompts)]

    long.run_long(["tiny"], tmp_path / "out", settings=["generated"], generator=gen,
                  batch_size=2, n_bootstrap=10, **kw)
    rows = read_jsonl(tmp_path / "out" / "generated__tiny.jsonl")
    a, b = rows[0], rows[1]
    assert [s["index"] for s in a["sentences"]] == [1, 2, 4]
    assert [(s["text"], s["correct"]) for s in a["sentences"]] == [("Paris", 1), ("London", 0),
                                                                    ("Paris", 1)]
    assert a["dropped"]["missing"] == 2 and a["dropped"]["lines_unnumbered"] == 2
    assert a["dropped"]["lines_repeated"] == 1 and a["dropped"]["lines_empty"] == 1
    assert b["answer"] == "1. p7\n2. Paris\n3. Rome\n4. Paris\n5. Oslo"  # cut after item 5
    assert b["tokens_cut_after_last_item"] > 0
    q1 = next(it for it in ITEMS if it.key == b["questions"][0]["key"])
    assert b["sentences"][0]["correct"] == int("p7" in q1.answers)
    for r in rows:
        for s in r["sentences"]:
            assert r["answer"][s["start"]:s["end"]] == s["text"]
            assert s["question_key"] == r["questions"][s["index"] - 1]["key"]
    assert (tmp_path / "out" / "cache" / "generated__tiny.jsonl").is_file()


# ------------------------------------------------------------------ evaluation
def _sentences(n_answers: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for a in range(n_answers):
        whole = {"epistemic": rng.random(), "epistemic_log": rng.random(),
                 "aleatoric": rng.random(), "mean_prob": rng.random(), "min_prob": rng.random()}
        for j in range(1, 6):
            wrong = int(rng.random() < 0.6)
            span = {"epistemic": rng.random() + wrong, "epistemic_log": rng.random(),
                    "aleatoric": rng.random(), "mean_prob": rng.random(),
                    "min_prob": rng.random()}
            for st in ("composed", "generated"):
                rows.append({"setting": st, "model": "m", "answer": f"g{a}", "index": j,
                             "wrong": wrong, "span": span, "whole": whole})
    return rows


def test_evaluation_tables_shape():
    t = long_spans.long_tables(_sentences(30), n_bootstrap=50)
    assert set(t) == {"counts", "auroc", "paired", "within", "pooled", "paired_pooled"}
    assert not t["pooled"]  # one model per setting
    assert len(t["counts"]) == 2 and t["counts"][0]["sentences"] == 150
    assert len(t["auroc"]) == 2 * len(long_spans.SCORES)
    n_ours = sum(s.family == long_spans.SPAN_SCORE for s in long_spans.SCORES)
    assert len(t["paired"]) == 2 * n_ours * (len(long_spans.SCORES) - n_ours)
    by = {(r["setting"], r["score"]): r for r in t["auroc"]}
    r = by[("composed", "span epistemic")]
    assert r["auroc"] > 0.8 and r["ci_low"] <= r["auroc"] <= r["ci_high"]
    assert r["direction"] == "higher = wrong"
    assert all(0 <= w["top_is_wrong"] <= 1 for w in t["within"])
    assert {w["score"] for w in t["within"]} == {s.name for s in long_spans.SCORES
                                                 if s.source == "span"}
    lines = long_spans.verdict(t)
    assert len(lines) == 2 + 3 and "span epistemic" in lines[0]
    assert lines[2].startswith("In sum, span epistemic over the 2 (setting, model) groups: "
                               "higher on the wrong sentences (interval above 0.5) in 2")


def test_pooled_over_models():
    rows = _sentences(20) + [{**r, "model": "m2"} for r in _sentences(20, seed=1)]
    t = long_spans.long_tables(rows, n_bootstrap=50)
    assert len(t["pooled"]) == 2 * len(long_spans.SCORES)
    single = {(r["setting"], r["model"], r["score"]): r["auroc"] for r in t["auroc"]}
    for r in t["pooled"]:
        assert r["models"] == 2
        assert r["auroc"] == pytest.approx((single[(r["setting"], "m", r["score"])]
                                            + single[(r["setting"], "m2", r["score"])]) / 2)
    n_ours = sum(s.family == long_spans.SPAN_SCORE for s in long_spans.SCORES)
    assert len(t["paired_pooled"]) == 2 * n_ours * (len(long_spans.SCORES) - n_ours)
    assert any(line.startswith("Pooled over the 2 models") for line in long_spans.verdict(t))


def test_cluster_resamples_keep_answers_whole():
    clusters = ["a", "a", "b", "c", "c", "c"]
    for idx in long_spans.cluster_resamples(clusters, 20, np.random.default_rng(0)):
        got = [clusters[i] for i in idx]
        for c in set(got):
            assert got.count(c) % clusters.count(c) == 0


def test_one_class_gets_counts_only():
    rows = [{**r, "wrong": 1} for r in _sentences(3)]
    t = long_spans.long_tables(rows, n_bootstrap=10)
    assert len(t["counts"]) == 2 and not t["auroc"]
    assert "one class only" in long_spans.verdict(t)[0]


def test_report_section(tok, tiny_lm, tmp_path):
    from isouq.study.report import build_report

    kw, _ = _kw(tok, tiny_lm, tmp_path)
    out = tmp_path / "out"
    long.run_long(["tiny"], out, settings=["composed"], answers=4, n_bootstrap=10, **kw)
    html = build_report([out], tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "qa-long" in html.read_text()
    assert any(s["id"] == "qa-long" for s in doc["sections"])
    md = (tmp_path / "report" / "tables.md").read_text()
    assert "do span scores find the wrong ones" in md
    assert (tmp_path / "report" / "qa-long" / long.FIGURE).is_file()
