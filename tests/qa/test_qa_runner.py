"""`isouq qa run`: every field of a row, resume after a crash, cached generations reused."""

import json

import pytest
import torch

from isouq.answer_row import FIELDS
from isouq.errors import DataError, InputError, ModelError
from isouq.runio import machine_label, read_jsonl
from isouq.study.analysis import study_tables
from isouq.study.qa.runner import QAConfig, QARunner, agreement


@pytest.fixture
def dataset(tmp_path):
    qs = [("What is the capital of France?", ["Paris"]), ("Who wrote Hamlet?", ["Shakespeare"]),
          ("What colour is the sky?", ["blue"]), ("What is two plus two?", ["four", "4"]),
          ("Where is Paris?", ["France"]), ("Who is William?", ["Shakespeare"])]
    p = tmp_path / "qa.jsonl"
    with open(p, "w") as f:
        for i, (q, a) in enumerate(qs):
            f.write(json.dumps({"id": f"q{i}", "question": q, "answers": a}) + "\n")
    return p


def make_runner(tmp_path, dataset, tiny_lm, tok, env=None, **kw):
    loads = []

    def loader(name):
        loads.append(name)
        return tiny_lm, tok, {"name": name}

    cfg = QAConfig(dataset=str(dataset), model="tiny", limit=None, k=3, k_p_true=2,
                   max_new_tokens=6, batch_size=4, judge_model="tiny-judge", **kw)
    return QARunner(cfg, tmp_path / "out", loader=loader, progress=False, env=env), loads


def test_rows_have_every_field_and_resume(tmp_path, dataset, tiny_lm, tok):
    runner, loads = make_runner(tmp_path, dataset, tiny_lm, tok)
    path = runner.run()
    rows = read_jsonl(path)
    assert [r["key"] for r in rows] == [f"q{i}" for i in range(6)]
    r = rows[0]
    assert all(set(FIELDS) <= set(row) for row in rows)  # the one answer-row schema
    for k in ("epistemic", "aleatoric", "normalized_epistemic", "naive_entropy",
              "semantic_entropy", "p_true"):
        assert isinstance(r["scores"][k], float), k
    assert r["passes"] == {"gradient": 1, "naive_entropy": 3, "semantic_entropy": 3,
                           "p_true": 3, "entailment_calls": r["passes"]["entailment_calls"]}
    assert set(r["seconds"]) >= {"gradient", "naive_entropy", "semantic_entropy", "p_true",
                                 "generation"}
    assert r["label_source"] == "judge" and isinstance(r["correct"], bool)
    assert 0 <= r["judge"]["p_yes"] <= 1 and "f1" in r["lexical"]
    run = json.loads(runner.paths["run"].read_text())
    assert run["status"] == "complete" and run["agreement"]["n"] == 6
    assert run["judge"]["judge"] == "tiny-judge"
    # crash: drop the last 2 rows; the re-run redoes only those, from cached generations
    greedy = read_jsonl(runner.paths["gens"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:4]))
    runner2, _ = make_runner(tmp_path, dataset, tiny_lm, tok)
    runner2.run()
    again = read_jsonl(path)
    assert [x["key"] for x in again] == [x["key"] for x in rows]
    for a, b in zip(again, rows, strict=True):
        assert a["answer"] == b["answer"]
        assert a["scores"]["epistemic"] == pytest.approx(b["scores"]["epistemic"], rel=1e-5)
        assert a["scores"]["naive_entropy"] == pytest.approx(b["scores"]["naive_entropy"])
    assert read_jsonl(runner.paths["gens"]) == greedy  # nothing regenerated
    # finished with the same settings: a re-run loads no model and leaves everything as it was
    run_before = runner.paths["run"].read_text()
    runner3, loads3 = make_runner(tmp_path, dataset, tiny_lm, tok)
    assert runner3.run() == path and loads3 == []
    assert read_jsonl(path) == again and runner.paths["run"].read_text() == run_before
    # other settings are not the finished run: it loads the models and records the settings
    runner4, loads4 = make_runner(tmp_path, dataset, tiny_lm, tok)
    runner4.cfg.batch_size = 2
    runner4.run()
    assert loads4 and json.loads(runner.paths["run"].read_text())["config"]["batch_size"] == 2


@pytest.mark.parametrize("setting,value", [("k", 4), ("temperature", 0.5), ("seed", 1),
                                           ("max_new_tokens", 7), ("k_p_true", 1)])
def test_resume_with_other_content_settings_is_refused(tmp_path, dataset, tiny_lm, tok,
                                                        setting, value):
    first, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",))
    before = first.run().read_text()
    again, loads = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",))
    setattr(again.cfg, setting, value)
    with pytest.raises(InputError, match=f"other settings.*'{setting}'"):
        again.run()
    assert loads == [] and first.paths["rows"].read_text() == before  # refused before any work


def test_semantic_entropy_of_another_entailment_judge_is_not_mixed_in(tmp_path, dataset,
                                                                      tiny_lm, tok):
    first, _ = make_runner(tmp_path, dataset, tiny_lm, tok,
                           methods=("gradient", "semantic_entropy"))
    first.run()
    other, loads = make_runner(tmp_path, dataset, tiny_lm, tok,
                               methods=("gradient", "semantic_entropy"),
                               entailment_model="another-judge")
    with pytest.raises(InputError, match="entailment model.*tiny-judge.*another-judge"):
        other.run()
    assert loads == []
    # without semantic entropy the entailment judge does not matter: the judge may change
    rejudged, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",),
                              judge_prompt="farquhar2024")
    rejudged.run()


def test_rerun_with_more_methods_adds_them_to_the_rows(tmp_path, dataset, tiny_lm, tok):
    first, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",))
    rows = read_jsonl(first.run())
    assert all("naive_entropy" not in r["scores"] for r in rows)
    greedy = read_jsonl(first.paths["gens"])
    here = machine_label("cpu")
    assert all(r["timed_on"] == {"gradient": here, "generation": here} for r in rows)
    more, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient", "naive_entropy"))
    more.machine = "another machine"  # e.g. the method added in a later session
    again = read_jsonl(more.run())
    assert [r["key"] for r in again] == [r["key"] for r in rows]  # one row per key, in order
    for a, b in zip(again, rows, strict=True):
        assert a["timed_on"] == {**b["timed_on"], "naive_entropy": "another machine"}
        assert a["revision"] == 1 and isinstance(a["scores"]["naive_entropy"], float)
        assert a["scores"]["epistemic"] == b["scores"]["epistemic"]  # kept, not recomputed
        assert a["judge"] == b["judge"] and a["answer"] == b["answer"]
        assert a["passes"]["naive_entropy"] == 3 and "naive_entropy" in a["seconds"]
    assert read_jsonl(more.paths["gens"]) == greedy  # greedy answers reused
    third, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("naive_entropy",))
    assert read_jsonl(third.run()) == again  # nothing left to add: nothing changes


def test_other_judge_prompt_relabels_rows_and_keeps_scores(tmp_path, dataset, tiny_lm, tok):
    first, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",),
                           judge_prompt="farquhar2024")
    rows = read_jsonl(first.run())
    assert all(r["judge"]["prompt"] == "farquhar2024" for r in rows)
    strict, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",))  # default
    again = read_jsonl(strict.run())
    for a, b in zip(again, rows, strict=True):
        assert a["judge"]["prompt"] == "strict" and a["judge_before"] == b["judge"]
        assert a["correct"] == a["judge"]["correct"] and a["revision"] == 1
        assert a["scores"] == b["scores"]
    assert json.loads(strict.paths["run"].read_text())["judge"]["prompt"] == "strict"


def test_contrast_prompt_rejudges_only_items_with_incorrect_answers(tmp_path, tiny_lm, tok):
    p = tmp_path / "tqa.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps({"id": "a", "question": "Is the moon cheese?", "answers": ["No"],
                            "incorrect_answers": ["Yes, it is cheese"]}) + "\n")
        f.write(json.dumps({"id": "b", "question": "Who wrote Hamlet?",
                            "answers": ["Shakespeare"]}) + "\n")
    first, _ = make_runner(tmp_path, p, tiny_lm, tok, methods=("gradient",))
    rows = {r["key"]: r for r in read_jsonl(first.run())}
    assert {k: r["judge"]["prompt"] for k, r in rows.items()} == {"a": "strict", "b": "strict"}
    second, _ = make_runner(tmp_path, p, tiny_lm, tok, methods=("gradient",),
                            judge_prompt="contrast")
    again = {r["key"]: r for r in read_jsonl(second.run())}
    assert again["a"]["judge"]["prompt"] == "contrast" and again["a"]["revision"] == 1
    assert again["a"]["judge_before"] == rows["a"]["judge"]
    assert again["b"] == rows["b"]  # no incorrect answers: the contrast prompt is the strict one


def test_needs_verdict_rules():
    from isouq.study.qa.runner import needs_verdict

    v = {"judge": "j", "prompt": "strict"}
    assert needs_verdict(None, "j", "strict")
    assert not needs_verdict({"answer": "Paris", "judge": v}, "j", "strict")
    assert needs_verdict({"answer": "Paris", "judge": v}, "k", "strict")  # another judge
    assert needs_verdict({"answer": "Paris", "judge": v}, "j", "farquhar2024")  # another prompt
    assert not needs_verdict({"answer": "Paris", "judge": v}, "j", "contrast")  # = strict here
    assert needs_verdict({"answer": "Paris", "judge": v}, "j", "contrast", ["Lyon"])
    assert needs_verdict({"answer": " ", "judge": v}, "j", "strict")  # empty, asked a judge
    assert not needs_verdict({"answer": "", "judge": {**v, "rule": "empty answer"}}, "j", "strict")
    assert not needs_verdict({"answer": "", "judge": v}, None, "strict")  # no judge: lexical


def test_gradient_score_matches_score_sequences(tmp_path, dataset, tiny_lm, tok):
    from isouq import score_sequences
    from isouq.llm.prompts import qa_prompts

    runner, _ = make_runner(tmp_path, dataset, tiny_lm, tok)
    runner.cfg.methods = ("gradient",)
    rows = read_jsonl(runner.run())
    gens = read_jsonl(runner.paths["gens"])
    prompts = qa_prompts(tok, [r["question"] for r in rows])
    ref = score_sequences(tiny_lm, tok, prompts, [g["token_ids"] for g in gens])
    got = torch.tensor([r["scores"]["epistemic"] for r in rows])
    assert torch.allclose(got, ref.epistemic, rtol=1e-5)


def test_lexical_only_and_agreement(tmp_path, dataset, tiny_lm, tok):
    runner, loads = make_runner(tmp_path, dataset, tiny_lm, tok)
    runner.cfg.judge_model = None
    runner.cfg.methods = ("gradient", "naive_entropy")
    rows = read_jsonl(runner.run())
    assert all(r["label_source"] == "lexical" and r["judge"] is None for r in rows)
    assert agreement(rows) == {"n": 0}
    assert "tiny-judge" not in loads


def test_rows_feed_the_study(tmp_path, dataset, tiny_lm, tok):
    """The runner's rows are accepted by the evaluation code (schema contract)."""
    runner, _ = make_runner(tmp_path, dataset, tiny_lm, tok)
    rows = read_jsonl(runner.run())
    for i, r in enumerate(rows):  # force both classes so the study can run
        r["correct"] = bool(i % 2)
    tables = study_tables(rows, n_bootstrap=5, n_splits=2, n_paired_bootstrap=50)
    assert "auroc" in tables and tables["auroc"]


def test_bad_config():
    with pytest.raises(InputError, match="unknown method"):
        QAConfig(methods=("gradient", "magic")).check()
    with pytest.raises(InputError, match="k_p_true=5: P.True. shows 0..k=3"):
        QAConfig(k=3, k_p_true=5).check()
    QAConfig(k_p_true=0).check()  # P(True) without brainstormed answers, as in isouq ask
    with pytest.raises(InputError, match="temperature=0"):
        QAConfig(temperature=0).check()
    with pytest.raises(InputError, match="k_p_true=-1"):
        QAConfig(k_p_true=-1).check()
    with pytest.raises(InputError, match="limit=0: ask for at least 1"):
        QAConfig(limit=0).check()
    with pytest.raises(InputError, match="batch_size=0"):
        QAConfig(batch_size=0).check()
    with pytest.raises(InputError, match="max_new_tokens=-1"):
        QAConfig(max_new_tokens=-1).check()
    with pytest.raises(InputError, match="temperature=0"):
        QAConfig(temperature=0.0).check()


def test_unknown_dataset_fails_before_writing_or_loading(tmp_path, tiny_lm, tok):
    runner, loads = make_runner(tmp_path, tmp_path / "nope", tiny_lm, tok)
    runner.cfg.dataset = "no-such-dataset"
    with pytest.raises(DataError, match="unknown dataset .no-such-dataset."):
        runner.run()
    assert loads == [] and not (tmp_path / "out").exists()


def test_two_ranks_equal_one(tmp_path, dataset, tiny_lm, tok):
    """Sharded by rank (run here one rank after the other) and merged == a single process."""
    from isouq.distributed import DistEnv

    one, _ = make_runner(tmp_path / "a", dataset, tiny_lm, tok, methods=("gradient", "naive_entropy"))
    ref = read_jsonl(one.run())
    runners = []
    for rank in (1, 0):  # rank 0 merges, so it finishes last
        r, _ = make_runner(tmp_path / "b", dataset, tiny_lm, tok, env=DistEnv(rank=rank, world=2),
                           methods=("gradient", "naive_entropy"))
        runners.append(r)
        r.run()
    got = read_jsonl(runners[-1].paths["rows"])
    assert [x["key"] for x in got] == [x["key"] for x in ref]
    for a, b in zip(got, ref, strict=True):
        assert a["answer"] == b["answer"]
        assert a["scores"]["epistemic"] == pytest.approx(b["scores"]["epistemic"], rel=1e-5)
        assert a["scores"]["naive_entropy"] == pytest.approx(b["scores"]["naive_entropy"])


def test_nli_entailment_model_from_a_folder(tmp_path, dataset, tiny_lm, tiny_nli, tok):
    """--entailment-model naming an MNLI-style classifier: loaded as one (no injected loader,
    the path a hub id takes too) and used for semantic entropy, exactly as NLIEntailment."""
    from isouq.study.qa.baselines.semantic_entropy import NLIEntailment, semantic_entropy
    from isouq.study.qa.runner import _sampled_from

    lm_dir, nli_dir = tmp_path / "lm", tmp_path / "nli"
    for model, folder in ((tiny_lm, lm_dir), (tiny_nli, nli_dir)):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    cfg = QAConfig(dataset=str(dataset), model=str(lm_dir), limit=None, k=3,
                   max_new_tokens=6, batch_size=4, judge_model=None,
                   entailment_model=str(nli_dir), methods=("semantic_entropy",))
    runner = QARunner(cfg, tmp_path / "out", progress=False)
    rows = read_jsonl(runner.run())
    run = json.loads(runner.paths["run"].read_text())
    assert run["entailment"]["kind"] == "NLIEntailment"
    assert run["entailment"]["name"] == str(nli_dir)
    samples = {r["key"]: _sampled_from(r) for r in read_jsonl(runner.paths["samples"])}
    want = semantic_entropy([r["question"] for r in rows], [samples[r["key"]] for r in rows],
                            NLIEntailment(tiny_nli, tok))
    for r, w in zip(rows, want, strict=True):
        assert r["scores"]["semantic_entropy"] == pytest.approx(w.value, abs=1e-9)
        assert r["scores"]["semantic_entropy_discrete"] == pytest.approx(w.discrete, abs=1e-9)


def test_progress_names_each_step_and_counts_entailment_pairs(tmp_path, dataset, tiny_lm,
                                                              tiny_nli, tok):
    from isouq.llm.prompts import qa_prompts
    from isouq.study.qa.baselines.semantic_entropy import NLIEntailment
    from isouq.study.qa.runner import _step_reporter

    class Bar:
        def __init__(self):
            self.shown = []

        def set_postfix_str(self, text):
            self.shown.append(text)

    runner, _ = make_runner(tmp_path, dataset, tiny_lm, tok)
    chunk = runner.items()[:3]
    judge, _ = runner._judges()
    ent = NLIEntailment(tiny_nli, tok)
    bar = Bar()
    say = _step_reporter(bar, ent)
    runner._chunk(tiny_lm, tok, {}, chunk, qa_prompts(tok, [it.question for it in chunk]),
                  judge, ent, say=say)
    steps = [s for s in bar.shown if ":" not in s]
    assert steps == ["greedy answers", "gradient", "samples", "naive entropy",
                     "semantic entropy", "P(True)", "judge"]
    counts = [int(s.split(": ")[1].split()[0]) for s in bar.shown if ":" in s]
    assert counts and counts == sorted(counts) and counts[-1] == ent.calls > 0
    assert _step_reporter(None, ent)("anything") is None  # no bar: nothing shown


def test_a_smaller_limit_keeps_the_rows_of_a_larger_run(tmp_path, dataset, tiny_lm, tok):
    """Re-running into the same folder with a smaller --limit (a nested subset) finishes that
    subset and leaves every row of the earlier, larger run in place."""
    big, _ = make_runner(tmp_path, dataset, tiny_lm, tok, methods=("gradient",))
    rows = read_jsonl(big.run())

    def loader(name):
        return tiny_lm, tok, {"name": name}

    cfg = QAConfig(dataset=str(dataset), model="tiny", limit=3, k=3, k_p_true=2,
                   max_new_tokens=6, batch_size=4, judge_model="tiny-judge",
                   methods=("gradient", "naive_entropy"))
    small = QARunner(cfg, tmp_path / "out", loader=loader, progress=False)
    again = read_jsonl(small.run())
    picked = [it.key for it in small.items()]
    assert sorted(r["key"] for r in again) == sorted(r["key"] for r in rows)
    assert [r["key"] for r in again[:3]] == picked
    assert all("naive_entropy" in r["scores"] for r in again[:3])
    assert all("naive_entropy" not in r["scores"] for r in again[3:])
    doc = json.loads(small.paths["run"].read_text(encoding="utf-8"))
    assert doc["n_questions"] == 3 and doc["n_rows"] == len(rows)
    assert doc["rows_from_earlier_runs"]["n"] == len(rows) - 3 > 0


def test_a_judge_that_is_not_installed_fails_before_any_model_loads(tmp_path, dataset,
                                                                    tiny_lm, tok, monkeypatch):
    """No injected loader (the CLI's path): the judge is checked before the answering model
    loads, so a fresh machine without the 1.5B judge says so at once, not after the answers."""
    import isouq.models
    import tiny

    lm_dir = tmp_path / "lm"
    tiny_lm.save_pretrained(lm_dir)
    tok.save_pretrained(lm_dir)
    loaded = []
    monkeypatch.setattr(isouq.models, "load_model", lambda *a, **k: loaded.append(a))
    cfg = QAConfig(dataset=str(dataset), model=str(lm_dir), limit=None, max_new_tokens=4,
                   judge_model=tiny.absent_registry_model(monkeypatch))
    with pytest.raises(ModelError, match="'absent' is not installed.*--fetch absent"):
        QARunner(cfg, tmp_path / "out", progress=False).run()
    assert loaded == []


def test_an_edited_question_is_answered_again_and_a_respelled_path_resumes(
        tmp_path, dataset, tiny_lm, tok, monkeypatch):
    """Rows follow the dataset's content: an edited question gets a new row (not the stale
    one), and the same file under another spelling of its path is the same finished run."""
    runner, _ = make_runner(tmp_path, dataset, tiny_lm, tok)
    path = runner.run()
    before = {r["key"]: r for r in read_jsonl(path)}
    # another spelling of the same path: nothing to do, no model loads
    monkeypatch.chdir(tmp_path)
    respelled = f"./../{dataset.parent.name}/./{dataset.name}"
    runner2, loads2 = make_runner(tmp_path, respelled, tiny_lm, tok)
    assert runner2.run() == path and loads2 == []
    # the file edited in place: q2's question changes, the others stay
    lines = dataset.read_text().splitlines()
    row = json.loads(lines[2])
    row["question"] = "What colour is grass?"
    lines[2] = json.dumps(row)
    dataset.write_text("\n".join(lines) + "\n")
    runner3, loads3 = make_runner(tmp_path, dataset, tiny_lm, tok)
    runner3.run()
    after = {r["key"]: r for r in read_jsonl(path)}
    assert list(after) == list(before) and loads3
    assert after["q2"]["question"] == "What colour is grass?"
    assert after["q2"]["revision"] == int(before["q2"].get("revision", 0)) + 1
    for k in before:
        if k != "q2":
            assert after[k] == before[k]


def test_qa_run_takes_the_shared_model_options(tmp_path, monkeypatch, capsys):
    """Every command that loads a model takes --model --device --dtype --trust-remote-code
    --allow-pickle; qa run passes them to every model it loads, and checks --temperature and
    --k-p-true as isouq ask does."""
    from isouq import cli

    seen = {}
    monkeypatch.setattr(QARunner, "run", lambda self: seen.setdefault("cfg", self.cfg) and "x")
    assert cli.main(["qa", "run", "--out", str(tmp_path), "--model", "m", "--dtype", "bfloat16",
                     "--trust-remote-code", "--allow-pickle", "--k-p-true", "0"]) == 0
    cfg = seen["cfg"]
    assert (cfg.model, cfg.dtype, cfg.trust_remote_code, cfg.allow_pickle, cfg.k_p_true) == \
        ("m", "bfloat16", True, True, 0)
    for bad, problem in ((["--temperature", "0"], "0.0 must be > 0"),
                         (["--k-p-true", "-1"], "-1 must be ≥ 0")):
        with pytest.raises(SystemExit):
            cli.main(["qa", "run", "--out", str(tmp_path), *bad])
        assert problem in capsys.readouterr().err
