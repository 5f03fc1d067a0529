"""scripts/polygraph/collect.py's archive of a finished polygraph_eval chunk: what it keeps under
results/ (answers, scores, per-batch seconds), and the chunks whose seconds must not count
(stopped mid-chunk by scripts/quiet.sh). Needs no LM-Polygraph: the chunk is written here as
polygraph_eval writes it (a torch-saved UEManager dict and its log)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import by_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collect():
    return by_path.module("scripts/polygraph/collect.py", "polygraph_collect")


ROWS = {"key": ["q1", "q2", "q3"],
        "input": [f"Answer briefly.\nQuestion: {q}?" for q in ("who", "what", "where")],
        "output": [["Ann", "Anne"], ["cat"], ["Paris"]]}


def _chunk(folder: Path, seconds: dict[str, list[float]], started: float | None = None,
           threads: str = "1") -> Path:
    """A finished chunk as polygraph_eval and scripts/polygraph_benchmark.sh leave it."""
    folder.mkdir(parents=True)
    man = {"state": "done",
           "stats": {"input_texts": ROWS["input"], "greedy_texts": ["Ann", "dog", "Rome"],
                     "greedy_tokens": [[5], [7, 8], [9]], "isouq_mean_prob": [0.9, 0.2, 0.4]},
           "estimations": {("sequence", "IsouqEpistemic"): [0.1, 0.5, float("nan")],
                           ("sequence", "Perplexity"): [1.0, 3.0, 2.0]},
           "gen_metrics": {("sequence", "Accuracy"): [1.0, 0.0, 0.0]}}
    torch.save(man, folder / "ue_manager_seed1")
    lines = []
    for name, per_batch in seconds.items():
        for s in per_batch:
            lines.append(f"[2026-11-26 14:05:20,667][lm_polygraph][INFO] - Done calculating "
                         f"{name} in {s} secs")
    (folder / "polygraph_eval.log").write_text("\n".join(lines) + "\n")
    if started is not None:
        (folder / "started").write_text(f"{int(started)} {threads}\n")
    (folder / "done").write_text("name\n")
    return folder


def test_a_chunk_is_archived_with_its_answers_scores_and_seconds_per_batch(collect, tmp_path):
    now = time.time()
    chunk = _chunk(tmp_path / "run" / "chunk-003", {"GreedyProbsCalculator": [4.0, 2.0],
                                                    "IsouqScoresCalculator": [1.5, 0.5]},
                   started=now - 60)
    out = tmp_path / "kept" / "chunk-003.json"
    doc = collect.archive_chunk(chunk, ROWS, 2, out, pauses=tmp_path / "no-pauses.log")
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    assert [q["key"] for q in doc["questions"]] == ROWS["key"]
    assert [q["question"] for q in doc["questions"]] == ["who?", "what?", "where?"]
    assert [q["answer"] for q in doc["questions"]] == ["Ann", "dog", "Rome"]
    assert [q["n_tokens"] for q in doc["questions"]] == [1, 2, 1]
    assert doc["questions"][1]["ue"] == {"IsouqEpistemic": 0.5, "Perplexity": 3.0}
    assert doc["questions"][2]["ue"]["IsouqEpistemic"] is None  # NaN is kept as null
    assert doc["questions"][0]["quality"] == {"Accuracy": 1.0}
    assert doc["questions"][2]["isouq_mean_prob"] == pytest.approx(0.4)
    # 3 answers in batches of 2: (2, first line of each calculator), (1, second line)
    assert doc["batches"] == [[2, {"GreedyProbsCalculator": 4.0, "IsouqScoresCalculator": 1.5}],
                              [1, {"GreedyProbsCalculator": 2.0, "IsouqScoresCalculator": 0.5}]]
    assert doc["seconds"] == {"GreedyProbsCalculator": 6.0, "IsouqScoresCalculator": 2.0}
    assert doc["threads"] == "1" and "note" not in doc


def test_a_chunk_stopped_mid_run_keeps_its_answers_but_not_its_seconds(collect, tmp_path):
    now = time.time()
    chunk = _chunk(tmp_path / "chunk-000", {"GreedyProbsCalculator": [4.0, 2.0]},
                   started=now - 100)
    pauses = tmp_path / "pauses.log"
    pauses.write_text(f"{now - 500:.0f} {now - 400:.0f}\n")  # before the chunk: it counts
    doc = collect.archive_chunk(chunk, ROWS, 2, tmp_path / "a.json", pauses=pauses)
    assert doc["batches"] and "note" not in doc
    pauses.write_text(pauses.read_text() + f"{now - 50:.0f} {now - 40:.0f}\n")  # during it
    doc = collect.archive_chunk(chunk, ROWS, 2, tmp_path / "b.json", pauses=pauses)
    assert doc["batches"] == [] and doc["seconds"] == {}
    assert "stopped" in doc["note"] and len(doc["questions"]) == 3
    pauses.write_text(f"{now - 60:.0f} {now - 30:.0f} shared\n")  # other work beside it
    doc = collect.archive_chunk(chunk, ROWS, 2, tmp_path / "s.json", pauses=pauses)
    assert doc["seconds"] == {} and "shared the machine" in doc["note"]
    doc = collect.archive_chunk(chunk, ROWS, 2, tmp_path / "c.json", untimed="by hand")
    assert doc["note"] == "seconds not kept: by hand"


def test_a_chunk_whose_inputs_are_not_its_prepared_rows_is_refused(collect, tmp_path):
    chunk = _chunk(tmp_path / "chunk-001", {"GreedyProbsCalculator": [1.0, 1.0]})
    other = {**ROWS, "input": list(reversed(ROWS["input"]))}
    with pytest.raises(SystemExit, match="not those of its prepared chunk"):
        collect.archive_chunk(chunk, other, 2, tmp_path / "x.json")


def test_a_chunk_without_a_start_mark_is_placed_by_its_first_log_line(collect, tmp_path):
    chunk = _chunk(tmp_path / "chunk-002", {"GreedyProbsCalculator": [1.0]})
    first = time.mktime(time.strptime("2026-11-26 14:05:20", "%Y-%m-%d %H:%M:%S"))
    pauses = tmp_path / "pauses.log"
    pauses.write_text(f"{first - 300:.0f} {first - 200:.0f}\n")  # within the 10 minutes before
    assert collect.paused_during(chunk, pauses, ["2026-11-26 14:05:20,667"])
    pauses.write_text(f"{first - 2000:.0f} {first - 1900:.0f}\n")
    assert collect.paused_during(chunk, pauses, ["2026-11-26 14:05:20,667"]) is None
    assert collect.paused_during(chunk, None, ["2026-11-26 14:05:20,667"]) is None


def _kept(tmp_path: Path, complete: bool = True) -> tuple[Path, Path, list[dict]]:
    """Two archived chunks and the kept file gathered from them."""
    chunks = tmp_path / "chunks" / "truthfulqa__smollm2"
    chunks.mkdir(parents=True)
    rows = [{"key": f"q{i}", "answer": "Ann", "ue": {"Perplexity": float("nan") if i == 1
                                                     else 1.0 + i}} for i in range(4)]
    for k in range(2):
        (chunks / f"chunk-00{k}.json").write_text(json.dumps(
            {"chunk": f"chunk-00{k}", "questions": rows[2 * k: 2 * k + 2],
             "batches": [[2, {"GreedyProbsCalculator": 1.5}]], "seconds": {"x": 1.5}}))
    kept = tmp_path / "polygraph__truthfulqa__smollm2.json"
    kept.write_text(json.dumps({"complete": complete, "questions": rows}))
    return chunks, kept, rows


def test_a_complete_kept_file_takes_its_chunks_answers_and_gives_them_back(collect, tmp_path):
    """compact(): the chunks keep their seconds and keys, the rows live in the kept file alone;
    chunk_rows() reads them back from it, in the chunk's order (NaN scores included)."""
    chunks, kept, rows = _kept(tmp_path)
    before = {p.name: p.stat().st_size for p in chunks.iterdir()}
    assert collect.compact(chunks, kept) == 2
    assert collect.compact(chunks, kept) == 0   # done once
    for k, path in enumerate(sorted(chunks.iterdir())):
        doc = json.loads(path.read_text())
        assert doc["questions"] is None and doc["questions_in"] == kept.name
        assert doc["question_keys"] == [f"q{2 * k}", f"q{2 * k + 1}"]
        assert doc["batches"] == [[2, {"GreedyProbsCalculator": 1.5}]]
        assert path.stat().st_size < before[path.name]
        got = collect.chunk_rows(doc, kept)
        assert json.dumps(got) == json.dumps(rows[2 * k: 2 * k + 2])
    kept.unlink()
    with pytest.raises(SystemExit, match="missing; restore it from git"):
        collect.chunk_rows(doc, kept)


def test_a_partial_or_different_kept_file_leaves_the_chunks_alone(collect, tmp_path):
    chunks, kept, rows = _kept(tmp_path, complete=False)
    with pytest.raises(SystemExit, match="not complete"):
        collect.compact(chunks, kept)
    rows[3]["answer"] = "Bob"
    kept.write_text(json.dumps({"complete": True, "questions": rows}))
    with pytest.raises(SystemExit, match="differ"):
        collect.compact(chunks, kept)
    assert json.loads((chunks / "chunk-000.json").read_text())["questions"] is not None
    # the command line: --compact needs only --chunks and --out; without it the rest is asked
    with pytest.raises(SystemExit):
        collect.main(["--chunks", str(chunks), "--out", str(kept)])
