"""Report fixtures: synthetic QA rows split over a .jsonl and a .jsonl.gz file (plus a cache
file that is not QA rows), and a small fake experiment results.json with a table, the paper's
tables and a PNG; the report built from them once per session (fast study options)."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from isouq.runio import write_results  # noqa: E402
from isouq.study.report import build_report  # noqa: E402
from qa_rows import synth_rows as shared_synth_rows  # noqa: E402

FAST = {"n_bootstrap": 10, "n_splits": 4, "n_paired_bootstrap": 200, "seed": 0}
OUR_BINARY = [{"problem": "linear", "GN r": 0.93, "GN ρ": 0.98},
              {"problem": "xor", "GN r": 0.61, "GN ρ": 0.70}]
PAPER_BINARY = [{"problem": "linear", "GN r": 0.95, "GN ρ": 0.99},
                {"problem": "xor", "GN r": 0.65, "GN ρ": 0.68}]
PAPER_ONLY = [{"problem": "linear", "r": 0.98, "r ±": 0.01}]


def synth_rows(**kw) -> list[dict]:
    """``qa_rows.synth_rows`` with 40 rows per (dataset, model) and both classes in each."""
    return shared_synth_rows(**{"n": 40, "both_classes": True, **kw})


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def gold_rows(rows: list[dict]) -> list[dict]:
    """Hand labels for model m1's rows: its 'correct' with every 5th one flipped."""
    return [{"key": r["key"], "dataset": r["dataset"], "model": r["model"],
             "gold_correct": bool(r["correct"]) != (i % 5 == 0), "note": ""}
            for i, r in enumerate(r for r in rows if r["model"] == "m1")]


def make_qa_dir(root: Path, rows: list[dict]) -> Path:
    """root/qa/{m1_m2.jsonl, nested/m3.jsonl.gz, cache.jsonl (not QA rows),
    gold/m1.gold.jsonl (hand labels)}."""
    qa = root / "qa"
    (qa / "nested").mkdir(parents=True)
    write_jsonl(qa / "m1_m2.jsonl", [r for r in rows if r["model"] != "m3"])
    write_jsonl(qa / "nested" / "m3.jsonl.gz", [r for r in rows if r["model"] == "m3"])
    write_jsonl(qa / "cache.jsonl", [{"prompt": "p", "completion": "c"}])
    (qa / "gold").mkdir()
    write_jsonl(qa / "gold" / "m1.gold.jsonl", gold_rows(rows))
    return qa


def make_experiment_dir(root: Path) -> Path:
    """root/exp with results.json (table 'binary', paper 'binary' and 'regression'), a PNG."""
    exp = root / "exp"
    exp.mkdir(parents=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(exp / "map.png", dpi=60)
    plt.close(fig)
    write_results(exp, "validation", settings={"quick": True, "grid": 50}, seed=3,
                  started=time.time(), tables={"binary": OUR_BINARY},
                  paper={"binary": PAPER_BINARY, "regression": PAPER_ONLY},
                  figures=["map.png"], extra={"budget": "2 CPU cores"})
    return exp


@pytest.fixture(scope="session")
def qa_rows() -> list[dict]:
    return synth_rows()


@pytest.fixture(scope="session")
def inputs_root(tmp_path_factory, qa_rows) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    make_qa_dir(root, qa_rows)
    make_experiment_dir(root)
    return root


@pytest.fixture(scope="session")
def report_dir(tmp_path_factory, inputs_root) -> Path:
    """The report of the fake experiment and the QA rows, built once."""
    out = tmp_path_factory.mktemp("report")
    build_report([inputs_root / "exp", inputs_root / "qa"], out, **FAST)
    return out
