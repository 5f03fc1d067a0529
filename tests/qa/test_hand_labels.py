"""Hand labelling: sampling, reply parsing, resumable gold rows, the CLI on stdin."""

from __future__ import annotations

import io
import json
import random

import pytest

from isouq.cli import main
from isouq.errors import InputError
from isouq.evaluation.labels import gold_index, is_gold_row
from isouq.runio import read_jsonl
from isouq.study.qa.hand_labels import describe, label_rows, parse_verdict, sample_rows


def _rows(n=5, dataset="truthfulqa"):
    return [{"key": f"{dataset}-{i}", "dataset": dataset, "model": "m", "question": f"q{i}?",
             "answer": f"a{i}", "references": [f"r{i}", "other"], "correct": 1, "scores": {}}
            for i in range(n)]


def test_sample_is_seeded_random_sample_in_file_order():
    rows = _rows(20)
    random.seed(7)
    want = [rows[i] for i in sorted(random.sample(range(20), 6))]
    assert sample_rows(rows, 6, seed=7) == want
    assert sample_rows(rows, None) == rows and sample_rows(rows, 50) == rows
    with pytest.raises(InputError, match="positive"):
        sample_rows(rows, 0)


def test_parse_verdict():
    assert parse_verdict(" y ") == ("y", "")
    assert parse_verdict("N restates the question") == ("n", "restates the question")
    assert parse_verdict("yes") == ("y", "") and parse_verdict("skip") == ("s", "")
    assert parse_verdict("maybe") == ("", "") and parse_verdict("") == ("", "")


def test_label_rows_writes_gold_rows_and_resumes(tmp_path):
    rows, out = _rows(4), tmp_path / "g.jsonl"
    replies = iter(["y", "what?", "n wrong year", "s", "q"])
    shown: list[str] = []
    n = label_rows(rows, out, labeler="tester", ask=lambda _: next(replies), show=shown.append,
                   incorrect_of=lambda r: ["bad"] if r["key"].endswith("1") else [])
    assert n == 2
    gold = read_jsonl(out)
    assert [(g["key"], g["gold_correct"], g["note"]) for g in gold] == [
        ("truthfulqa-0", True, ""), ("truthfulqa-1", False, "wrong year")]
    assert all(is_gold_row(g) and g["labeler"] == "tester" for g in gold)
    assert gold[1]["incorrect_references"] == ["bad"]
    assert any("answer y or n" in s for s in shown)  # the unclear reply was asked again
    assert "[2/4]" in shown[1] and "incorrect: bad" in shown[1]
    # resume: rows 0 and 1 are done; row 2 was skipped and is asked again; EOF stops cleanly
    replies = iter(["n", "y"])
    assert label_rows(rows, out, labeler="t", ask=lambda _: next(replies), show=lambda s: None) == 2
    assert [g["key"] for g in read_jsonl(out)] == [f"truthfulqa-{i}" for i in range(4)]

    def eof(_):
        raise EOFError

    assert label_rows(_rows(6), out, labeler="t", ask=eof, show=lambda s: None) == 0
    assert gold_index(read_jsonl(out))[("truthfulqa", "m", "truthfulqa-2")] is False


def test_describe_caps_references():
    row = {**_rows(1)[0], "references": [f"r{i}" for i in range(9)]}
    text = describe(row)
    assert "r5" in text and "r6" not in text and "(+3 more)" in text


def test_cli_label_from_stdin(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in _rows(3, dataset="mydata")))
    out = tmp_path / "gold" / "g.jsonl"
    monkeypatch.setattr("sys.stdin", io.StringIO("y\nn\n"))
    assert main(["qa", "label", str(rows), "--out", str(out), "--labeler", "me"]) == 0
    assert "2 verdicts written" in capsys.readouterr().out
    assert [g["gold_correct"] for g in read_jsonl(out)] == [True, False]
    assert main(["qa", "label", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
