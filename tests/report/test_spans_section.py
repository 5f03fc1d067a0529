"""isouq report on answers scored span by span (``isouq score --spans``): the input is recognized
beside QA rows, the section "Long answers, sentence by sentence" shades each answer with the
report's span shading, and its tables agree with numbers computed here from the rows."""

from __future__ import annotations

import json
import re
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from isouq.defaults import SPAN_SCORE
from isouq.errors import DataError, InputError
from isouq.runio import read_jsonl
from isouq.study.report import build_report
from isouq.study.report.inputs import collect
from isouq.study.report.span_rows import is_span_file
from isouq.study.report.spans_section import MAX_ANSWERS, SECTION_ID, TITLE

from .conftest import write_jsonl

ANSWERS = [
    ("what is the capital of france", "paris is the capital. the cat sat on the mat! why no"),
    ("who wrote hamlet", "shakespeare wrote hamlet.\nthe moon is made of cheese? yes because"),
    ("why is the sky blue", "because the sky is blue. a dog sat. no"),
    ("what is the moon made of", "the moon is made of rock. no cheese. yes the rock is blue"),
    ("who sat on the mat", "the cat sat on the mat. a dog sat on the cat"),
    ("what is blue", "the sky"),
]


@pytest.fixture(scope="module")
def scored(tiny_llama_dir, tmp_path_factory) -> Path:
    """The rows of ``isouq score --spans sentences`` on a tiny random Llama."""
    from isouq.cli import main

    d = tmp_path_factory.mktemp("spans")
    inp = d / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p, "answer": a}) + "\n"
                           for i, (p, a) in enumerate(ANSWERS)))
    out = d / "runs" / "scored.jsonl"
    out.parent.mkdir()
    assert main(["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir),
                 "--spans", "sentences"]) == 0
    return out


@pytest.fixture
def qa_rows_file(tmp_path, qa_rows) -> Path:
    (tmp_path / "qa").mkdir()
    return write_jsonl(tmp_path / "qa" / "qa.jsonl", qa_rows)


def labelled(scored: Path, dest: Path) -> Path:
    """The scored rows with a label on every span (wrong: the span's place is odd, or the
    answer's last span), written to ``dest``."""
    rows = read_jsonl(scored)
    for r in rows:
        for k, s in enumerate(r["spans"]):
            s["correct"] = int(k % 2 == 0 and k != len(r["spans"]) - 1)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def section_of(report_dir: Path) -> dict:
    doc = json.loads((report_dir / "report.json").read_text())
    return next(s for s in doc["sections"] if s["id"].startswith(SECTION_ID))


def mann_whitney(wrong: list[int], score: list[float]) -> float:
    """AUROC for the wrong spans by counting every (wrong, right) pair, ties ½."""
    w = [s for s, y in zip(score, wrong, strict=True) if y]
    r = [s for s, y in zip(score, wrong, strict=True) if not y]
    return sum((a > b) + 0.5 * (a == b) for a, b in product(w, r)) / (len(w) * len(r))


def test_score_rows_are_span_rows_not_qa_rows(scored, qa_rows_file):
    rows = read_jsonl(scored)
    assert is_span_file(rows) and all(len(r["spans"]) >= 1 for r in rows)
    found = collect([scored.parent, qa_rows_file])
    assert [f for f, _ in found.spans] == [scored]
    assert [r["key"] for r in found.spans[0][1]] == [f"q{i}" for i in range(len(ANSWERS))]
    assert found.qa_files == (qa_rows_file,)  # QA rows stay QA rows
    assert not any(str(scored) in s for s in found.skipped)


def test_an_input_file_naming_its_own_span_ranges_is_not_taken_for_scored_rows(scored,
                                                                               tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    (d / "scored.jsonl").write_text(scored.read_text())
    (d / "pairs.jsonl").write_text(json.dumps({"id": "k", "prompt": "who", "answer": "yes. no.",
                                               "spans": [[0, 4], [5, 8]]}) + "\n")
    found = collect([d])
    assert [f.name for f, _ in found.spans] == ["scored.jsonl"]
    assert any("pairs.jsonl" in s for s in found.skipped)
    with pytest.raises(DataError, match="isouq score --spans sentences"):
        collect([d / "pairs.jsonl"])


def test_a_qa_row_with_spans_is_still_a_qa_row(qa_rows_file, tmp_path):
    rows = read_jsonl(qa_rows_file)
    for r in rows:
        r["spans"] = []
    f = tmp_path / "qa_with_spans.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = collect([f])
    assert found.qa_files == (f,) and found.spans == ()


def test_the_section_shades_every_answer_and_its_table_is_the_rows(scored, tmp_path):
    out = tmp_path / "report"
    build_report([scored.parent], out, n_bootstrap=20)
    rows = read_jsonl(scored)
    page = (out / "report.html").read_text()
    assert TITLE in page and "<script" not in page
    answers = page[page.index('<div class="answers">'):]
    n_spans = sum(len(r["spans"]) for r in rows)
    assert answers.count('<span class="s') == n_spans
    multi = [r for r in rows if len(r["spans"]) > 1]
    assert answers.count('class="s worst"') == len(multi)  # one outlined span per answer
    assert "paris is the capital.</span> <span" in answers
    assert ".worst {" in page  # the shading's style travels with the report

    sec = section_of(out)
    assert sec["kind"] == "spans" and "auroc" not in sec["tables"]  # no labels: no AUROC
    (t,) = sec["tables"]["files"]
    logs = [s["scores"]["epistemic_log"] for r in rows for s in r["spans"]]
    not_first = [int(np.argmax([s["scores"][SPAN_SCORE] for s in r["spans"]])) != 0
                 for r in multi]
    assert t["answers"] == len(rows) and t["spans"] == n_spans and t["error rows"] == 0
    assert t["median span epistemic_log"] == pytest.approx(float(np.median(logs)))
    assert t["answers with ≥ 2 spans"] == len(multi) == 5
    assert t["least trusted not the first (share)"] == pytest.approx(np.mean(not_first))
    assert t["shaded below"] == len(rows)
    md = (out / "tables.md").read_text()
    assert f"## {TITLE}" in md and "Per file: answers, spans and the least-trusted span" in md
    assert f"| {scored} | " in md


def test_the_model_is_read_from_the_score_runs_settings(scored, tiny_llama_dir, tmp_path):
    build_report([scored], tmp_path / "r", n_bootstrap=10)
    assert section_of(tmp_path / "r")["tables"]["files"][0]["model"] == str(tiny_llama_dir)


def test_span_labels_give_the_auroc_of_each_span_score(scored, tmp_path):
    f = labelled(scored, tmp_path / "labelled" / "rows.jsonl")
    out = tmp_path / "report"
    build_report([f], out, n_bootstrap=50)
    sec = section_of(out)
    rows = read_jsonl(f)
    spans = [s for r in rows for s in r["spans"]]
    wrong = [1 - s["correct"] for s in spans]
    (c,) = sec["tables"]["counts"]
    assert (c["sentences"], c["wrong"], c["answers"]) == (len(spans), sum(wrong), len(rows))
    got = {r["score"]: r for r in sec["tables"]["auroc"]}
    assert set(got) == {"span epistemic", "span epistemic_log", "span aleatoric", "span 1 − p̄"}
    for name, key, sign in (("span epistemic", "epistemic", 1),
                            ("span epistemic_log", "epistemic_log", 1),
                            ("span aleatoric", "aleatoric", 1), ("span 1 − p̄", "mean_prob", -1)):
        want = mann_whitney(wrong, [sign * s["scores"][key] for s in spans])
        assert got[name]["auroc"] == pytest.approx(want)
        assert got[name]["ci_low"] <= got[name]["ci_high"] and got[name]["n"] == len(spans)
    page = (out / "report.html").read_text()
    assert page.count('class="s wrong"') + page.count('class="s worst wrong"') == sum(wrong)
    assert "labelled wrong" in page
    md = (out / "tables.md").read_text()
    assert "AUROC for the wrong spans" in md and "span epistemic_log" in md


def test_at_most_n_answers_are_shaded_and_the_rest_counted(scored, tmp_path):
    from isouq.cli import main

    out = tmp_path / "report"
    assert main(["report", str(scored), "--out", str(out), "--n-bootstrap", "10",
                 "--max-span-answers", "2"]) == 0
    page = (out / "report.html").read_text()
    answers = page[page.index('<div class="answers">'):]
    assert answers.count('<div class="q">') == 2
    assert f"{len(ANSWERS) - 2} more answer(s) not shown" in answers
    assert f"Shaded below: 2 of {len(ANSWERS)} answer(s)" in page
    assert section_of(out)["tables"]["files"][0]["answers"] == len(ANSWERS)  # all counted
    assert MAX_ANSWERS == 50


def test_error_rows_are_counted_not_shown(scored, tmp_path):
    f = tmp_path / "with_error.jsonl"
    f.write_text(scored.read_text() + json.dumps(
        {"key": "bad", "prompt": "x", "answer": "y", "error": "RuntimeError: out of memory"})
        + "\n")
    build_report([f], tmp_path / "r", n_bootstrap=10)
    t = section_of(tmp_path / "r")["tables"]["files"][0]
    assert (t["answers"], t["error rows"]) == (len(ANSWERS), 1)
    assert "out of memory" not in (tmp_path / "r" / "report.html").read_text()


def test_bad_span_rows_and_options_are_one_line_errors(scored, tmp_path):
    rows = read_jsonl(scored)
    del rows[1]["spans"][0]["scores"]["epistemic_log"]
    f = tmp_path / "broken.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 'q1', span 0 lacks \['epistemic_log'\].*"
                                        r"isouq score INPUT --out FILE --spans sentences"):
        collect([f])
    rows[1]["spans"][0]["scores"]["epistemic_log"] = 1.0
    rows[1]["spans"][0]["correct"] = "yes"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="'correct' is 'yes'; label a span 1"):
        collect([f])
    other = tmp_path / "other.jsonl"
    other.write_text('{"key": "k", "answer": "a"}\n')
    with pytest.raises(DataError, match="isouq score --spans sentences"):
        collect([other])
    with pytest.raises(InputError, match="max_span_answers=-1"):
        build_report([tmp_path / "does-not-matter"], tmp_path / "r", max_span_answers=-1)
    assert not (tmp_path / "r").exists()  # refused before anything was read or written


def test_html_of_the_section_is_escaped(scored, tmp_path):
    rows = read_jsonl(scored)
    rows[0]["prompt"] = rows[0]["question"] = "<b>bold</b> & co"
    f = tmp_path / "esc.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report([f], tmp_path / "r", n_bootstrap=10)
    page = (tmp_path / "r" / "report.html").read_text()
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in page and "<b>bold</b>" not in page
    assert re.search(r'<span class="s[^"]*" style="background: rgba', page)
