"""scripts/calibrate_check.py's table of kept walks: one row per walk, its numbers as kept."""

from __future__ import annotations

import json
from pathlib import Path

import by_path

ROOT = Path(__file__).resolve().parents[1]


def _row(predictor, against, delta, low, high, verdict="within noise"):
    return {"predictor": predictor, "against": against, "delta": delta, "ci_low": low,
            "ci_high": high, "delta_auroc": delta / 2, "ci_low_auroc": low / 2,
            "ci_high_auroc": high / 2, "verdict": verdict}


def test_walks_table_reads_every_kept_walk(tmp_path):
    script = by_path.module(ROOT / "scripts" / "calibrate_check.py", "calibrate_check")
    held = [_row("saved map", "MSP", 0.0, 0.0, 0.0), _row("saved map", "p̄", 0.2, 0.1, 0.3, "ahead")]
    walks = {
        "add__m-s7": {"task": "add", "model": "m", "seed": 7, "calibrated": "300 answers, 90 correct",
                      "saved": "MSP's map", "verdict": [
                          _row("forward-only head", "MSP's map", 0.5, 0.4, 0.6),
                          _row("isouq head", "MSP's map", -0.012, -0.05, 0.02),
                          _row("isouq head", "forward-only head", 0.3, 0.2, 0.4)],
                      "held_out": {"answers": "150 answers, 45 correct", "verdict": held}},
        "few__m-s7": {"task": "few", "model": "m", "seed": 7, "saved": "MSP's map", "verdict": [],
                      "held_out": {"answers": "150 answers, 5 correct", "verdict": held}},
    }
    for name, doc in walks.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "check.json").write_text(json.dumps(doc), encoding="utf-8")
    lines = script.walks_table(tmp_path).splitlines()
    assert len(lines) == 4 and lines[1].count("---") == lines[0].count("|") - 1
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert cells[0] == ["add × m, 7", "300 answers, 90 correct", "−0.012 [−0.050, +0.020]",
                        "within noise", "MSP's map", "150 answers, 45 correct",
                        "+0.100 [+0.050, +0.150]"]
    assert cells[1][:4] == ["few × m, 7", "–", "no head fitted", "–"]
