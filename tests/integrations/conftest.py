"""Shared pieces of the LM-Polygraph plugin's tests: pairs written for ``isouq score``."""

from __future__ import annotations

import json
from pathlib import Path

from isouq.cli import main
from isouq.runio import read_jsonl
from isouq.scores import SequenceScores

QUESTIONS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue",
             "what is the moon made of", "is the cat on the mat"]
SCORE_KEYS = SequenceScores.KEYS


def isouq_score(model_dir: Path, prompts: list, answers: list, tmp: Path) -> list[dict]:
    """``isouq score`` on (prompt, answer token ids) pairs: the rows' scores, in input order."""
    inp, out = tmp / "pairs.jsonl", tmp / "scores.jsonl"
    with open(inp, "w") as f:
        for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
            f.write(json.dumps({"key": f"k{i}", "prompt": p, "answer": [int(t) for t in a]}) + "\n")
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir),
                 "--batch-size", "2"]) == 0
    rows = read_jsonl(out)
    assert [r["key"] for r in rows] == [f"k{i}" for i in range(len(prompts))]
    return [r["scores"] for r in rows]
