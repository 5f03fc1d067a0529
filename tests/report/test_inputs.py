import gzip
import json

import pytest

from isouq.errors import DataError
from isouq.report.inputs import collect, load_results, read_rows

from .conftest import make_experiment_dir, make_qa_dir, synth_rows, write_jsonl


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
