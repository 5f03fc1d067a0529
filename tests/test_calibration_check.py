"""`isouq calibrate ROWS --check CALIBRATION`: a saved map judged on answers it did not see,
against MSP and p̄ (numbers recomputed here from the map and the rows)."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from isouq.answer_row import answer_id
from isouq.calibration import Calibrator
from isouq.cli import main
from isouq.evaluation import verdict as V

FAST = ["--repeats", "1", "--bootstrap", "1000", "--no-curve"]


def rows_of(n=300, seed=5, model="m"):
    """Answers whose correctness the epistemic score tells and p̄ and MSP barely do."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        e = rng.normal()
        mp = float(rng.uniform(0.3, 0.9))
        rows.append({"key": f"s{i}", "model": model, "question": f"q{i}", "answer": "a",
                     "correct": bool(e + 0.35 * rng.normal() > 0),
                     "scores": {"epistemic": float(np.exp(1.5 * e)), "mean_prob": mp,
                                "aleatoric": float(rng.uniform(0.05, 0.2)),
                                "seq_logprob": float(5 * np.log(mp) + rng.normal())}})
    return rows


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A calibration fitted on the first 200 of 300 answers (the isouq head is saved)."""
    d = tmp_path_factory.mktemp("check")
    rows = rows_of()
    write(d / "all.jsonl", rows)
    assert main(["calibrate", str(write(d / "fit.jsonl", rows[:200])), "--out",
                 str(d / "cal"), *FAST, "--features", "mean_prob", "seq_logprob",
                 "epistemic"]) == 0
    return d, rows


def test_the_saved_map_is_judged_on_the_answers_it_did_not_see(fitted, tmp_path, capsys):
    """All 300 rows passed: the 200 fitted on are left out and said so; Δ PRR and Δ AUROC
    against MSP and p̄ are the map's own on the other 100, recomputed here."""
    from isouq.calibrate_run import summary

    d, rows = fitted
    assert "isouq calibrate NEW.jsonl --check" in summary(d / "cal" / "results.json")  # next step
    capsys.readouterr()
    assert main(["calibrate", str(d / "all.jsonl"), "--check", str(d / "cal" / "calibration.json"),
                 "--out", str(tmp_path / "check")]) == 0
    printed = capsys.readouterr().out
    assert "200 left out (the map was fitted on them)" in printed and "100 answers" in printed
    doc = json.loads((tmp_path / "check" / "results.json").read_text())
    assert doc["fitted_on"] == 200 and doc["saved"] == "isouq head"
    new = rows[200:]
    y = np.array([r["correct"] for r in new], dtype=float)
    p = Calibrator.load(d / "cal" / "calibration.json").predict(new)
    msp = np.exp([r["scores"]["seq_logprob"] for r in new])
    pbar = np.array([r["scores"]["mean_prob"] for r in new])
    table = {r["against"]: r for r in doc["tables"]["verdict"]}
    assert set(table) == {"MSP", "p̄"} and all(r["family"] == 2 for r in table.values())
    for name, ref in (("MSP", msp), ("p̄", pbar)):
        r = table[name]
        assert r["delta"] == pytest.approx(V.prr(p, y) - V.prr(ref, y), abs=1e-12)
        assert r["delta_auroc"] == pytest.approx(roc_auc_score(y, p) - roc_auc_score(y, ref),
                                                 abs=1e-12)
        assert r["ci_low"] <= r["delta"] <= r["ci_high"]
    assert table["MSP"]["verdict"] == "ahead" and table["MSP"]["ci_low"] > 0
    assert doc["tables"]["metrics"][0]["n"] == 100
    assert (tmp_path / "check" / "risk_coverage.png").is_file()


def test_with_a_threshold_the_check_says_what_it_kept(tmp_path, capsys):
    rows = rows_of(seed=7)
    assert main(["calibrate", str(write(tmp_path / "fit.jsonl", rows[:200])), "--out",
                 str(tmp_path / "cal"), *FAST, "--max-risk", "0.3", "--delta", "0.2"]) == 0
    assert main(["calibrate", str(write(tmp_path / "new.jsonl", rows[200:])), "--check",
                 str(tmp_path / "cal" / "calibration.json"), "--out",
                 str(tmp_path / "check")]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "check" / "results.json").read_text())
    cal = Calibrator.load(tmp_path / "cal" / "calibration.json")
    y = np.array([r["correct"] for r in rows[200:]], dtype=float)
    kept = cal.predict(rows[200:]) >= cal.threshold
    w = doc["tables"]["withholding"][0]
    assert doc["fitted_on"] == 0 and w["kept"] == int(kept.sum()) and w["alpha"] == 0.3
    assert doc["fitted_known"] and "does not list the answers" not in printed
    assert w["error_rate_kept"] == pytest.approx(1 - y[kept].mean())
    assert f"withholding: kept {w['kept']} of 100" in printed


@pytest.mark.parametrize("case, problem", [
    ("fitted", "all 200 labelled answers were used to fit the calibration"),
    ("other model", "was made for model 'm', not for 'other'"),
    ("max-risk", "--check judges a saved calibration and fits nothing; drop --max-risk"),
])
def test_bad_checks_are_one_line(fitted, tmp_path, capsys, case, problem):
    d, rows = fitted
    path = d / "fit.jsonl"
    extra = []
    if case == "other model":
        path = write(tmp_path / "other.jsonl", rows_of(40, model="other"))
    if case == "max-risk":
        extra = ["--max-risk", "0.2"]
    assert main(["calibrate", str(path), "--check", str(d / "cal" / "calibration.json"),
                 "--out", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


def test_answer_id_is_the_answer_not_the_file_or_the_key_alone():
    a = {"key": "0", "question": "who wrote hamlet", "answer": "Shakespeare", "scores": {}}
    assert answer_id(a) == answer_id({**a, "scores": {"epistemic": 1.0}, "model": "m"})
    assert answer_id(a) != answer_id({**a, "answer": "Marlowe"})
    assert answer_id(a) != answer_id({**a, "question": "who wrote faust"})
    assert answer_id({"key": "0", "prompt": "p", "answer": "x"}) != answer_id(
        {"key": "0", "prompt": "q", "answer": "x"})


def test_fractional_labels_are_checked_by_the_field_the_calibration_read(tmp_path, capsys):
    """A calibration fitted on a ROUGE-like quality in [0, 1] (--label-field rouge) is checked
    on the same field without naming it again; Δ PRR is against that quality."""
    rows = rows_of(seed=11)
    rng = np.random.default_rng(0)
    for r in rows:
        r["rouge"] = float(np.clip(0.6 * r.pop("correct") + 0.4 * rng.random(), 0, 1))
    assert main(["calibrate", str(write(tmp_path / "fit.jsonl", rows[:200])), "--out",
                 str(tmp_path / "cal"), *FAST, "--label-field", "rouge"]) == 0
    assert main(["calibrate", str(write(tmp_path / "new.jsonl", rows[200:])), "--check",
                 str(tmp_path / "cal" / "calibration.json"), "--out",
                 str(tmp_path / "check")]) == 0
    doc = json.loads((tmp_path / "check" / "results.json").read_text())
    assert doc["settings"]["label_field"] == "rouge" and "fractional labels" in doc["answers"]
    q = np.array([r["rouge"] for r in rows[200:]])
    p = Calibrator.load(tmp_path / "cal" / "calibration.json").predict(rows[200:])
    msp = np.exp([r["scores"]["seq_logprob"] for r in rows[200:]])
    r = next(r for r in doc["tables"]["verdict"] if r["against"] == "MSP")
    assert r["delta"] == pytest.approx(V.prr(p, q) - V.prr(msp, q), abs=1e-12)


def test_a_calibration_of_an_older_isouq_is_checked_with_a_caution(fitted, tmp_path, capsys):
    """A calibration file without the ids of its answers (written before they were kept): it
    cannot leave them out, so the check says to pass only new answers."""
    d, rows = fitted
    doc = json.loads((d / "cal" / "calibration.json").read_text())
    del doc["fitted_answers"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert main(["calibrate", str(write(tmp_path / "new.jsonl", rows[200:])), "--check",
                 str(tmp_path / "old.json"), "--out", str(tmp_path / "check")]) == 0
    assert "does not list the answers it was fitted on" in capsys.readouterr().out
