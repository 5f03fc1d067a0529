"""`isouq qa short`: Kuhn et al.'s few-shot prompt, canonical example answers, alias-match labels."""

from __future__ import annotations

import json

import pytest

from isouq.data.qa import QAItem
from isouq.errors import DataError, InputError
from isouq.runio import read_jsonl
from isouq.study.qa import short
from isouq.study.qa.runner import QAConfig

from .conftest import scripted


def test_shot_answer_picks_the_alias_the_others_contain():
    assert short.shot_answer(["RMS Lusitania", "Lusitania", "Lusitania (ship)",
                              "The Lusitania"]) == "Lusitania"
    assert short.shot_answer(["🚁", "Helicopters", "Cargo helicopter", "Helicopter"]) == "Helicopter"
    # ambiguous alias lists (two normalized forms tie) give no example
    assert short.shot_answer(["Kit Carson", "Waa-Nibe", "Rope Thrower"]) is None
    assert short.shot_answer(["One half", "Half", "0.5", "0.5 (number)"]) is None


def test_few_shot_prompt_format():
    items = [QAItem("a", "Q1?", ["Paris", "City of Paris"]), QAItem("b", "Q2?", ["x", "y"]),
             QAItem("c", "Q3?", ["Blue", "Blue colour"])]
    prefix = short.few_shot_prefix(items)
    assert prefix == ("This is a bot that correctly answers questions. \n"
                      "Question: Q1? Answer: Paris Question: Q3? Answer: Blue ")
    assert short.short_prompt("Q4?", prefix) == prefix + "Question: Q4? Answer:"


def test_alias_match():
    assert short.alias_match(" The Beatles", ["Beatles", "Fab Four"])
    assert short.alias_match("Paris, France", ["paris"])
    assert not short.alias_match("Parisian", ["Paris"])
    assert not short.alias_match("", ["Paris"])


@pytest.fixture
def shipped_shots():
    """The runner's few-shot prefix comes from the shipped TriviaQA train split."""
    try:
        short.few_shot_prefix()
    except DataError as e:  # pragma: no cover - without the shared data folder
        pytest.skip(str(e))


def _data(tmp_path):
    p = tmp_path / "tq.jsonl"
    rows = [{"id": "t0", "question": "What is the capital of France?", "answers": ["Paris"]},
            {"id": "t1", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_runner_labels_by_alias_and_refuses_another_prompt(tmp_path, tok, rule_lm,
                                                            shipped_shots):
    lm = rule_lm(scripted(tok, " Paris", eos=True))

    def loader(name):
        return lm, tok, {"name": name}

    cfg = QAConfig(dataset="triviaqa", data_path=str(_data(tmp_path)), model="rule", limit=None,
                   methods=("naive_entropy",), k=2, k_p_true=1, max_new_tokens=4,
                   judge_model=None)
    path = short.ShortRunner(cfg, tmp_path / "out", loader=loader, progress=False).run()
    rows = read_jsonl(path)
    assert [r["answer"].strip() for r in rows] == ["Paris", "Paris"]
    assert [r["correct"] for r in rows] == [1, 0]
    assert {r["label_source"] for r in rows} == {"alias_match"}
    # the open study keys these questions t0, t1: the short-answer rows have their own keys,
    # the caches (and the samples' seeds) keep the dataset's
    assert [r["key"] for r in rows] == ["short-t0", "short-t1"]
    assert [short.source_key(r["key"]) for r in rows] == ["t0", "t1"]
    for name in ("greedy", "samples"):
        cached = read_jsonl(tmp_path / "out" / "cache" / f"triviaqa__rule.{name}.jsonl")
        assert sorted(r["key"] for r in cached) == ["t0", "t1"]
    assert rows[0]["prompt"].startswith(short.HEADER)
    assert rows[0]["prompt"].endswith("Question: What is the capital of France? Answer:")
    run = json.loads((tmp_path / "out" / "qa_triviaqa__rule.run.json").read_text())
    assert run["config"]["extra"]["prompt"] == short.PROMPT_NAME
    run["config"]["extra"]["prompt"] = "another"
    (tmp_path / "out" / "qa_triviaqa__rule.run.json").write_text(json.dumps(run))
    cfg2 = QAConfig(**{**cfg.__dict__, "methods": ("naive_entropy", "p_true"), "extra": {}})
    with pytest.raises(InputError, match="other settings"):
        short.ShortRunner(cfg2, tmp_path / "out", loader=loader, progress=False).run()


def test_gradient_rows_carry_epistemic_log(tmp_path, tok, tiny_lm, monkeypatch):
    # the tiny tokenizer spells the 10 real examples in > 512 tokens: one short example here
    prefix = short.few_shot_prefix([QAItem("a", "Who wrote Hamlet?", ["x"])])
    monkeypatch.setattr(short, "few_shot_prefix", lambda: prefix)
    cfg = QAConfig(dataset="triviaqa", data_path=str(_data(tmp_path)), model="tiny", limit=None,
                   methods=("gradient",), max_new_tokens=3, judge_model=None)
    path = short.ShortRunner(cfg, tmp_path / "out", loader=lambda n: (tiny_lm, tok, {}),
                             progress=False).run()
    for r in read_jsonl(path):
        s = r["scores"]
        assert s["epistemic_log"] == pytest.approx(s["epistemic"] / s["mean_prob"] ** 2)
        assert s["semgrad"] > 0 and s["lm_head_grad"] > 0 and "hybridgrad" in s
        assert r["correct"] == int(short.alias_match(r["answer"], r["references"]))


def test_judge_is_refused(tmp_path):
    with pytest.raises(InputError, match="alias match"):
        short.ShortRunner(QAConfig(dataset="triviaqa"), tmp_path)



def test_semantic_entropy_on_a_nested_subset_keeps_the_other_rows(tmp_path, tok, rule_lm, tiny_nli,
                                                                 shipped_shots):
    """The costly baseline on the first `limit` questions, into the same folder: those rows gain
    semantic entropy from the cached samples (as computed directly from them), the others stay
    as they were."""
    from isouq.study.qa.baselines.semantic_entropy import NLIEntailment, semantic_entropy
    from isouq.study.qa.runner import _sampled_from

    lm = rule_lm(scripted(tok, " Paris", eos=True))
    models = {"rule": (lm, tok, {"name": "rule"}), "nli": (tiny_nli, tok, {"name": "nli"})}
    out = tmp_path / "out"
    first = dict(model="rule", out=out, methods=("naive_entropy",), k=3, max_new_tokens=4,
                 loader=models.__getitem__, progress=False)
    before = read_jsonl(short.run_short(limit=2, **first))  # the shipped TriviaQA's first two
    after = read_jsonl(short.run_short(limit=1, **{**first, "methods": ("naive_entropy",
                                                                          "semantic_entropy")},
                                       entailment_model="nli"))
    assert sorted(r["key"] for r in after) == sorted(r["key"] for r in before)
    before = {r["key"]: r for r in before}  # the subset's row first, then the other one
    assert after[1] == before[after[1]["key"]]
    assert "semantic_entropy" not in after[1]["scores"]
    samples = {short.short_key(r["key"]): _sampled_from(r)
               for r in read_jsonl(out / "cache" / "triviaqa__rule.samples.jsonl")}
    want = semantic_entropy([after[0]["question"]], [samples[after[0]["key"]]],
                            NLIEntailment(tiny_nli, tok))[0]
    assert after[0]["scores"]["semantic_entropy"] == pytest.approx(want.value, abs=1e-9)
    assert after[0]["scores"]["naive_entropy"] == before[after[0]["key"]]["scores"]["naive_entropy"]
    run = json.loads((out / "qa_triviaqa__rule.run.json").read_text())
    assert run["entailment"]["kind"] == "NLIEntailment"


def _migrate_script():
    import by_path

    return by_path.module("scripts/migrate_qa_short.py")


def test_rows_keyed_before_the_prefix_are_refused_then_migrated(tmp_path, tok, rule_lm,
                                                               shipped_shots):
    """Rows as `qa short` wrote them before keys had the prefix: a resume names the fix, which
    gives rows and hand labels the prefix (nothing else) and the run resumes as complete."""
    from isouq.study.qa.runner import dataset_sha

    lm = rule_lm(scripted(tok, " Paris", eos=True))
    out = tmp_path / "out"
    cfg = dict(dataset="triviaqa", data_path=str(_data(tmp_path)), model="rule", limit=None,
               methods=("naive_entropy",), k=2, k_p_true=1, max_new_tokens=4, judge_model=None)
    runner = short.ShortRunner(QAConfig(**cfg), out, loader=lambda n: (lm, tok, {}),
                               progress=False)
    path = runner.run()
    new_rows, new_run = path.read_text(), (out / "qa_triviaqa__rule.run.json").read_text()
    # as written before: TriviaQA's keys, and run.json's digest of them
    path.write_text(new_rows.replace('"key": "short-', '"key": "'))
    run = json.loads(new_run)
    run["dataset_sha"] = dataset_sha(short.QARunner.items(runner))
    (out / "qa_triviaqa__rule.run.json").write_text(json.dumps(run, indent=2))
    (out / "gold").mkdir()
    gold = [{"key": k, "dataset": "triviaqa", "model": "rule", "gold_correct": k == "t0",
             "note": ""} for k in ("t0", "t1")]
    gold_file = out / "gold" / "triviaqa__rule.gold.jsonl"
    gold_file.write_text("".join(json.dumps(g) + "\n" for g in gold))

    def no_model(name):
        raise AssertionError("a complete run loads no model")

    with pytest.raises(InputError, match=f"migrate_qa_short.py {out}` once"):
        short.ShortRunner(QAConfig(**cfg), out, loader=no_model, progress=False).run()
    said = _migrate_script().migrate(out)
    assert len(said) == 3 and _migrate_script().migrate(out) == []  # a second run: nothing
    assert path.read_text() == new_rows
    assert json.loads((out / "qa_triviaqa__rule.run.json").read_text()) == json.loads(new_run)
    assert [g["key"] for g in read_jsonl(gold_file)] == ["short-t0", "short-t1"]
    short.ShortRunner(QAConfig(**cfg), out, loader=no_model, progress=False).run()
