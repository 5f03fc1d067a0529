"""Calibrated P(correct) and withholding with a guarantee (isouq.calibration, risk_control).

Fitted maps are compared with scikit-learn fitted directly, ECE and Brier with hand
computation, the Learn-then-Test guarantee with a simulation of a known error model.
"""

import json
import math

import numpy as np
import pytest
from scipy.stats import beta, binom, binomtest
from sklearn.calibration import CalibratedClassifierCV, calibration_curve
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from isouq import Calibrator
from isouq.calibration import (
    FORMAT_VERSION,
    CalibrationError,
    fit_map,
    score_columns,
    select_map,
)
from isouq.cli import main
from isouq.errors import InputError, IsouqError
from isouq.evaluation.classifier import correctness_model, fit_predict
from isouq.evaluation.probability import ece, probability_metrics, reliability_bins
from isouq.evaluation.risk_control import (
    binomial_p_values,
    fixed_sequence,
    learn_then_test,
    threshold_grid,
)


def synth_rows(n=120, seed=0, model="m", dataset="d"):
    """QA-shaped rows whose correctness depends on log epistemic and p̄."""
    rng = np.random.default_rng(seed)
    mean_prob = rng.uniform(0.2, 0.95, n)
    epi = np.exp(rng.normal(2.0, 1.0, n))
    alea = rng.uniform(0.05, 0.25, n)
    logit = -1.0 + 3.0 * (mean_prob - 0.5) + 0.6 * (np.log(epi) - 2.0)
    correct = rng.random(n) < 1 / (1 + np.exp(-logit))
    return [{"key": f"k{i}", "model": model, "dataset": dataset, "question": "q", "answer": "a",
             "correct": bool(correct[i]), "lexical_correct": bool(correct[i] ^ (i % 7 == 0)),
             "scores": {"epistemic": float(epi[i]), "aleatoric": float(alea[i]),
                        "mean_prob": float(mean_prob[i])}} for i in range(n)]


@pytest.fixture(scope="module")
def data():
    rows = synth_rows()
    y = np.array([int(r["correct"]) for r in rows])
    return rows, score_columns(rows), y


# ---------------------------------------------------------------- fitted maps vs scikit-learn
def test_platt_map_is_sklearns_logistic_regression_and_the_studys(data):
    rows, cols, y = data
    m = fit_map(cols, y, "Epi. & Alea.", "platt")
    X = np.c_[np.log(cols["epistemic"]), cols["aleatoric"]]
    Z = (X - X.mean(0)) / X.std(0)
    ref = LogisticRegression(C=1.0, solver="newton-cholesky").fit(Z, y).predict_proba(Z)[:, 1]
    np.testing.assert_allclose(m.predict(cols), ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(m.predict(cols), fit_predict(X, y, X), rtol=1e-6, atol=1e-9)


def test_isotonic_map_is_sklearns_calibrated_classifier(data):
    rows, cols, y = data
    m = fit_map(cols, y, "p̄", "isotonic", seed=3)
    X = cols["mean_prob"][:, None]
    cc = CalibratedClassifierCV(correctness_model(), method="isotonic", ensemble=False,
                                cv=StratifiedKFold(3, shuffle=True, random_state=3)).fit(X, y)
    lo = 1 / (len(y) + 1)
    ref = np.clip(cc.predict_proba(X)[:, 1], lo, 1 - lo)
    np.testing.assert_allclose(m.predict(cols), ref, rtol=1e-9, atol=1e-12)
    grid = {"mean_prob": np.linspace(0, 1, 57)}  # between and beyond the knots too
    np.testing.assert_allclose(m.predict(grid),
                               np.clip(cc.predict_proba(grid["mean_prob"][:, None])[:, 1],
                                       lo, 1 - lo), rtol=1e-9, atol=1e-12)


def test_selection_takes_the_smallest_cross_validated_log_loss(data):
    rows, cols, y = data
    fitted, table = select_map(cols, y, seed=0)
    best = min(table, key=lambda r: r["cv_log_loss"])
    assert [r["selected"] for r in table].count(True) == 1 and best["selected"]
    assert (fitted.name, fitted.kind) == (best["features"], best["map"])
    one = next(r for r in table if r["features"] == "Epi." and r["map"] == "platt")
    X = np.log(cols["epistemic"])[:, None]
    p = cross_val_predict(correctness_model(), X, y, method="predict_proba",
                          cv=StratifiedKFold(5, shuffle=True, random_state=0))[:, 1]
    assert one["cv_log_loss"] == pytest.approx(log_loss(y, p), rel=1e-9)


def test_epistemic_log_is_derived_or_taken_from_the_rows():
    rows = [{"scores": {"epistemic": 8.0, "mean_prob": 0.5, "aleatoric": 0.1}},
            {"epistemic": 2.0, "mean_prob": 0.25, "aleatoric": 0.1, "epistemic_log": 5.0}]
    assert list(score_columns(rows)["epistemic_log"]) == [32.0, 5.0]


# ---------------------------------------------------------------- metrics by hand
def test_ece_and_brier_by_hand():
    p = np.array([0.05, 0.15, 0.18, 0.95, 1.0, 0.1])
    y = np.array([0, 1, 0, 1, 1, 0])
    # bins [0, .1] {.05, .1}, (.1, .2] {.15, .18}, (.9, 1] {.95, 1}
    assert ece(p, y) == pytest.approx((2 * 0.075 + 2 * 0.335 + 2 * 0.025) / 6)
    m = probability_metrics(p, y)
    assert m["brier"] == pytest.approx((0.05**2 + 0.85**2 + 0.18**2 + 0.05**2 + 0 + 0.1**2) / 6)
    assert m["log_loss"] == pytest.approx(
        -np.mean(np.where(y == 1, np.log(np.clip(p, 1e-15, 1)), np.log(np.clip(1 - p, 1e-15, 1)))),
        rel=1e-6)
    assert m["auroc"] == pytest.approx(8 / 9)  # of 3×3 pairs only (0.15 correct, 0.18 wrong) is misordered


def test_reliability_bins_are_sklearns_calibration_curve():
    rng = np.random.default_rng(1)
    p = rng.random(300)
    y = (rng.random(300) < p**2).astype(int)
    bins = reliability_bins(p, y, n_bins=10)
    acc, mean_p = calibration_curve(y, p, n_bins=10, strategy="uniform")
    np.testing.assert_allclose([b["accuracy"] for b in bins], acc)
    np.testing.assert_allclose([b["mean_p"] for b in bins], mean_p)
    assert sum(b["n"] for b in bins) == 300


# ---------------------------------------------------------------- Learn then Test
def test_binomial_p_values_are_scipys_one_sided_binomial_test():
    for e, k in [(0, 10), (3, 9), (7, 20), (0, 0)]:
        got = binomial_p_values(np.array([e]), np.array([k]), 0.3)[0]
        want = 1.0 if k == 0 else binomtest(e, k, 0.3, alternative="less").pvalue
        assert got == pytest.approx(want)
    assert fixed_sequence(np.array([0.01, 0.05, 0.2, 0.01]), 0.1) == 2
    assert fixed_sequence(np.array([0.2, 0.01]), 0.1) == 0


def _risk(lam, calibrated):
    """Error rate among answers with P(correct) ≥ λ in the simulated worlds: s ~ U(0, 1);
    "calibrated": P(correct) = s², truly correct with probability s²; "overconfident":
    P(correct) = s, truly correct with probability s² (E[s² | s ≥ t] = (1 + t + t²) / 3)."""
    t = np.sqrt(lam) if calibrated else lam
    return 1.0 - (1.0 + t + t**2) / 3.0


@pytest.mark.parametrize("calibrated", [True, False], ids=["calibrated", "overconfident"])
def test_learn_then_test_keeps_its_guarantee_in_simulation(calibrated):
    alpha, delta, n, draws = 0.2, 0.1, 300, 1500
    rng = np.random.default_rng(0)
    fails = naive_fails = 0
    coverage = []
    for _ in range(draws):
        s_fit, s = rng.random(n), rng.random(n)
        y = (rng.random(n) < s**2).astype(int)
        p_fit, p = (s_fit**2, s**2) if calibrated else (s_fit, s)
        grid = threshold_grid(p_fit, n, alpha=alpha, delta=delta)  # fixed without the labels
        rc = learn_then_test(p, y, grid, alpha=alpha, delta=delta)
        fails += rc.certified and _risk(rc.threshold, calibrated) > alpha
        coverage.append(rc.coverage)
        # the plug-in rule (lowest threshold whose empirical error among kept is ≤ α)
        keep = p[:, None] >= grid[None, :]
        kept, err = keep.sum(0), ((1 - y)[:, None] * keep).sum(0)
        ok = (kept > 0) & (err <= alpha * kept)
        naive = grid[np.flatnonzero(ok)[-1]] if ok.any() else math.inf
        naive_fails += math.isfinite(naive) and _risk(naive, calibrated) > alpha
    # one-sided 99.9% Clopper-Pearson lower bound on the failure rate must not exceed δ
    lower = beta.ppf(0.001, fails, draws - fails + 1) if fails else 0.0
    assert lower <= delta, (fails, draws)
    # the simulation can see a violation: the uncorrected rule fails far more often than δ
    assert beta.ppf(0.001, naive_fails, draws - naive_fails + 1) > delta, naive_fails
    if calibrated:  # and with a calibrated map the guarantee is not bought by keeping nothing:
        # compare with an oracle that knows the truth and tests one threshold t² (keeps 1 − t
        # of the answers when the binomial test at level δ certifies it): its expected coverage
        t = np.linspace(0.5, 0.99, 99)
        m = np.rint(n * (1 - t)).astype(int)
        e_max = np.array([max((e for e in range(k + 1) if binom.cdf(e, k, alpha) <= delta),
                              default=-1) for k in m])
        oracle = np.max(np.where(e_max >= 0, binom.cdf(e_max, m, _risk(t**2, True)), 0) * (1 - t))
        assert np.mean(coverage) >= 0.5 * oracle, (np.mean(coverage), oracle)


def test_no_certified_threshold_withholds_everything():
    p = np.linspace(0.1, 0.9, 50)
    rc = learn_then_test(p, np.zeros(50, dtype=int), np.array([0.5, 0.2]), alpha=0.1, delta=0.1)
    assert not rc.certified and rc.coverage == 0 and rc.to_dict()["threshold"] is None


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("mutate, problem", [
    (lambda rs: [{k: v for k, v in r.items() if k != "correct"} for r in rs], "no 'correct'"),
    (lambda rs: [{**r, "correct": True} for r in rs], "one label class"),
    (lambda rs: rs[:15], "at least 20"),
    (lambda rs: [{**r, "scores": {**r["scores"], "aleatoric": float("nan")}} if i == 3 else r
                 for i, r in enumerate(rs)], "missing or NaN"),
    (lambda rs: [{**r, "scores": {"epistemic": 1.0, "mean_prob": 0.5}} for r in rs],
     "lack ['aleatoric']"),
])
def test_bad_rows_are_clear_errors(mutate, problem):
    with pytest.raises(IsouqError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        Calibrator.fit(mutate(synth_rows(60)))


def test_an_older_or_foreign_file_is_refused(tmp_path, data):
    cal = Calibrator.fit(data[0])
    path = cal.save(tmp_path / "c.json")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "format_version": 0}))
    with pytest.raises(CalibrationError, match="re-run `isouq calibrate`"):
        Calibrator.load(path)
    path.write_text(json.dumps({**doc, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(CalibrationError, match="upgrade isouq"):
        Calibrator.load(path)
    # version 1 (maps on the scores only) is read as it is
    path.write_text(json.dumps({**doc, "format_version": 1}))
    np.testing.assert_array_equal(Calibrator.load(path).predict(data[0]), cal.predict(data[0]))
    path.write_text(json.dumps({"tables": {}}))
    with pytest.raises(CalibrationError, match="not an isouq calibration"):
        Calibrator.load(path)
    path.write_text(json.dumps({**doc, "map": {**doc["map"], "coef": []}}))
    with pytest.raises(CalibrationError, match="is damaged"):
        Calibrator.load(path)


# ---------------------------------------------------------------- files and models
def test_save_load_round_trip(tmp_path, data):
    rows, cols, y = data
    cal = Calibrator.fit(rows, max_risk=0.4, delta=0.2, model_files={"/x/model.safetensors": "ab"})
    back = Calibrator.load(cal.save(tmp_path / "cal.json"))
    np.testing.assert_array_equal(back.predict(rows), cal.predict(rows))
    assert back.threshold == cal.threshold and back.doc["model"] == cal.doc["model"]
    assert cal.doc["split"]["fit_rows"] + cal.doc["split"]["risk_rows"] == len(rows)
    flat = [{**r["scores"]} for r in rows[:5]]  # rows of `isouq score`/`ask` carry them flat
    back.annotate(flat)
    assert [r["p_correct"] for r in flat] == pytest.approx(list(cal.predict(rows[:5])))
    assert all(r["withheld"] == (not r["p_correct"] >= cal.threshold) for r in flat)


def test_a_calibration_of_another_model_is_refused_naming_both(data):
    cal = Calibrator.fit(data[0], model_files={"/c/model.safetensors": "a" * 64})
    with pytest.raises(CalibrationError, match=r"made for model 'm' \(weights model.safetensors "
                                               r"aaaaaaaaaaaa….*not for 'other'"):
        cal.check_model("other", {"/d/model.safetensors": "b" * 64})
    cal.check_model("a/path/to/m", {"/e/model.safetensors": "a" * 64})  # same weights
    plain = Calibrator.fit(data[0])
    with pytest.raises(CalibrationError, match="made for model 'm', not for 'other'"):
        plain.check_model("other")


# ---------------------------------------------------------------- the command
def _write_run(tmp_path, rows, name="qa_d__m"):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{name}.run.json").write_text(json.dumps(
        {"model": {"name": "m", "files": {"/cache/model.safetensors": "c" * 64}}}))
    return path


FAST = ["--repeats", "1", "--bootstrap", "1000", "--no-curve"]


def test_cli_calibrate_writes_every_file(tmp_path, capsys):
    """80 hand-labelled answers, 23 correct: under the floor of 30 of each class no head is
    fitted; p̄'s map (the rows carry no sequence log-probability) is saved, and the output
    says how many more correct answers a head would need. Every file is written and `isouq
    report` shows the run."""
    rows = synth_rows(80)
    path = _write_run(tmp_path, rows)
    gold = tmp_path / "gold"
    gold.mkdir()
    (gold / "d__m.gold.jsonl").write_text("".join(json.dumps(
        {"key": r["key"], "dataset": "d", "model": "m", "gold_correct": r["correct"] ^ (i < 5)})
        + "\n" for i, r in enumerate(rows)))
    gold_of = {r["key"]: r["correct"] ^ (i < 5) for i, r in enumerate(rows)}
    right = sum(gold_of.values())
    assert right < 30
    out = tmp_path / "cal"
    assert main(["calibrate", str(path), "--out", str(out), "--labels", "hand",
                 "--max-risk", "0.4", "--delta", "0.2"]) == 0
    printed = capsys.readouterr().out
    assert "saved: p̄" in printed and f"label {30 - right} more correct" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["saved"] == "p̄" and doc["tables"]["decision"][0]["short_of_floor"] == {
        "correct": 30 - right}
    assert "verdict" not in doc["tables"]  # no comparison below the floor
    preds = [r["predictor"] for r in doc["tables"]["metrics"]]
    assert preds == ["p̄", "base rate (constant)"] and doc["labels"] == "hand"
    cross = [json.loads(line) for line in (out / "crossfit.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in cross) == sorted(r["key"] for r in rows)
    assert all(r["correct"] == gold_of[r["key"]] for r in cross)  # hand labels were used
    y = np.array([r["correct"] for r in cross], dtype=int)
    p = np.array([r["p_correct"] for r in cross])
    assert doc["tables"]["metrics"][0]["brier"] == pytest.approx(np.mean((p - y) ** 2))
    cal = Calibrator.load(out / "calibration.json")
    assert cal.doc["model"]["sha256"] == {"model.safetensors": "c" * 64}
    assert cal.map.features == ("mean_prob",) and cal.map.kind == "platt"
    assert not cal.needs_backward and cal.doc["verdict"]["saved"] == "p̄"
    assert cal.doc["labels"]["source"] == "hand" and "risk_control" in doc["tables"]
    assert all((out / f).is_file() for f in ("reliability.png", "risk_coverage.png"))
    # `isouq report` shows it: a section with the tables and both figures
    from isouq.study.report import build_report

    build_report([out], tmp_path / "report")
    md = (tmp_path / "report" / "tables.md").read_text(encoding="utf-8")
    assert "## calibration" in md and "| p̄ |" in md
    assert "### Risk control" in md and "### Metrics" in md
    assert (tmp_path / "report" / "calibration" / "risk_coverage.png").is_file()


def strong_rows(n=240, seed=5):
    """Answers whose correctness the epistemic score tells and p̄ and MSP barely do: the
    isouq head must come out ahead of MSP's map, the forward-only head not."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        e = rng.normal()
        right = bool(e + 0.35 * rng.normal() > 0)
        mp = float(rng.uniform(0.3, 0.9))
        rows.append({"key": f"s{i}", "model": "m", "dataset": "d", "correct": right,
                     "scores": {"epistemic": float(np.exp(1.5 * e)), "mean_prob": mp,
                                "aleatoric": float(rng.uniform(0.05, 0.2)),
                                "seq_logprob": float(5 * np.log(mp) + rng.normal())}})
    return rows


def test_cli_calibrate_verdict_saves_the_head_that_beats_msp(tmp_path, capsys):
    """Enough of each class: every predictor is cross-fitted, judged against MSP's map with
    Holm's correction, and the isouq head (it reads the gradient score that carries the
    signal) is saved with its nested numbers, the verdict table printed and kept."""
    rows = strong_rows(160)
    path = _write_run(tmp_path, rows)
    out = tmp_path / "cal"
    assert main(["calibrate", str(path), "--out", str(out), "--repeats", "2",
                 "--bootstrap", "1000", "--features", "mean_prob", "seq_logprob",
                 "epistemic"]) == 0
    printed = capsys.readouterr().out
    assert "verdict (PRR" in printed and "Holm over 5 comparisons" in printed
    assert "learning curve" in printed
    doc = json.loads((out / "results.json").read_text())
    table = {(r["predictor"], r["against"]): r for r in doc["tables"]["verdict"]}
    assert set(table) == {("MSP", "MSP's map"), ("p̄", "MSP's map"),
                          ("forward-only head", "MSP's map"), ("isouq head", "MSP's map"),
                          ("isouq head", "forward-only head")}
    head = table["isouq head", "MSP's map"]
    assert head["verdict"] == "ahead" and head["ci_low"] > 0 and head["p_holm"] < 0.05
    assert table["isouq head", "forward-only head"]["verdict"] == "ahead"
    assert table["MSP", "MSP's map"]["verdict"] == "within noise"
    assert all(r["family"] == 5 for r in table.values())
    d = doc["tables"]["decision"][0]
    assert d["saved"] == "isouq head" and d["backward"] and d["AUROC"] > 0.8
    assert d["PRR"] == pytest.approx(head["PRR"])  # the nested value, not the winner's own
    assert doc["needs_backward"] and "needs the backward pass: yes" in printed
    curve = doc["tables"]["learning_curve"]
    assert {r["fraction"] for r in curve} == {0.25, 0.5, 1.0}
    assert {r["predictor"] for r in curve} == {"MSP's map", "forward-only head", "isouq head"}
    cal = Calibrator.load(out / "calibration.json")
    assert "epistemic" in cal.map.features and cal.needs_backward
    assert [c["predictor"] for c in cal.doc["verdict"]["comparisons"]][-1] == "isouq head"
    assert (out / "verdict.png").is_file()


def test_cli_calibrate_keeps_msps_map_when_no_head_beats_it(tmp_path, capsys):
    """Labels that nothing predicts: no head is ahead of MSP's map beyond noise, so MSP's map
    is saved, needing no backward pass."""
    rows = strong_rows()
    rng = np.random.default_rng(1)
    for i, r in enumerate(rows):
        r["correct"] = bool(rng.random() < 0.4)
        r["seconds"] = {"gradient": 0.5 + 0.1 * (i % 3)}   # as isouq score times its rows
    path = _write_run(tmp_path, rows)
    out = tmp_path / "cal"
    assert main(["calibrate", str(path), "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    assert doc["saved"] == "MSP's map" and "no head is ahead" in doc["reason"]
    assert doc["gradient_seconds"] == pytest.approx(0.6)
    assert "a median 0.6 s per answer" in printed
    assert all(r["verdict"] != "ahead" for r in doc["tables"]["verdict"])
    cal = Calibrator.load(out / "calibration.json")
    assert cal.map.features == ("seq_logprob",) and not cal.needs_backward
    assert "needs the backward pass: no" in printed


def test_cli_calibrate_fractional_labels(tmp_path, capsys):
    """A quality in [0, 1] per answer (here in another field, --label-field): the maps fit it
    as the harness does, PRR judges against it, AUROC and the floor count ≥ 0.5 as correct; the
    output names the field the labels came from."""
    rows = strong_rows()
    rng = np.random.default_rng(2)
    for r in rows:
        e = np.log(r["scores"]["epistemic"]) / 1.5
        r["rougeL"] = float(np.clip(0.5 + 0.3 * e + 0.1 * rng.normal(), 0, 1))
        del r["correct"]
    path = _write_run(tmp_path, rows)
    out = tmp_path / "cal"
    assert main(["calibrate", str(path), "--out", str(out), "--label-field", "rougeL",
                 *FAST]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert "fractional labels" in doc["answers"] and doc["saved"] == "isouq head"
    cal = Calibrator.load(out / "calibration.json")
    assert cal.doc["label_field"] == "rougeL" and cal.map.kind in ("platt", "mlp")
    assert "labels from the field 'rougeL'" in capsys.readouterr().out
    assert "labels from the field 'rougeL'" in cal.describe()
    cross = [json.loads(line) for line in (out / "crossfit.jsonl").read_text().splitlines()]
    assert {type(r["correct"]) for r in cross} == {float}


@pytest.mark.parametrize("label, problem", [
    (1.5, "a quality in [0, 1]"), (-0.1, "a quality in [0, 1]"), ("yes", "true/false"),
])
def test_cli_calibrate_bad_labels_are_one_line(tmp_path, capsys, label, problem):
    rows = synth_rows(40)
    rows[3]["correct"] = label
    path = _write_run(tmp_path, rows)
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and problem in err and "'k3'" in err
    assert not (tmp_path / "o").exists()  # refused before any fitting


def test_cli_calibrate_bad_input_is_one_line(tmp_path, capsys):
    path = _write_run(tmp_path, [{**r, "correct": True} for r in synth_rows(40)])
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "one label class" in err
    path = _write_run(tmp_path, synth_rows(40))
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o"), "--max-risk", "2"]) == 2
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o"), "--bootstrap", "10"]) == 2


def test_few_labelled_answers_are_not_an_error(tmp_path, capsys):
    """15 answers: not an error; the reference map is saved and the output names what a head
    would need."""
    path = _write_run(tmp_path, synth_rows(15))
    assert main(["calibrate", str(path), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "fewer than 30 answers of a class" in printed and "more wrong" in printed


# ---------------------------------------------------------------- where answers are made
@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def test_ask_and_score_add_p_correct_and_withheld(model_dir, tmp_path, capsys):
    cal = Calibrator.fit(synth_rows(), model=None, max_risk=0.5, delta=0.2)
    cal.doc["model"] = {"name": str(model_dir), "sha256": {}}
    path = cal.save(tmp_path / "cal.json")
    qs = ["what is the capital of france", "who wrote hamlet"]
    base = ["ask", "--model", str(model_dir), "--max-new-tokens", "4", "--calibration", str(path)]
    assert main([*base, "--json", *qs]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{")]
    want = cal.predict(got)  # from each row's own scores
    assert [r["p_correct"] for r in got] == pytest.approx(list(want), nan_ok=True)
    assert [r["withheld"] for r in got] == [not p >= cal.threshold for p in want]
    assert main([*base, *qs]) == 0
    out = capsys.readouterr().out
    assert "P(ok)" in out and "withheld" in out and cal.describe() in out
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": "paris"}) + "\n"
                           for i, q in enumerate(qs)))
    scores = tmp_path / "scores.jsonl"
    assert main(["score", str(inp), "--out", str(scores), "--model", str(model_dir),
                 "--calibration", str(path)]) == 0
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert [r["p_correct"] for r in rows] == pytest.approx(list(cal.predict(rows)))
    assert all("withheld" in r for r in rows)


def test_ask_refuses_another_models_calibration_naming_both(model_dir, tmp_path, capsys):
    cal = Calibrator.fit(synth_rows(), model_files={"/c/model.safetensors": "a" * 64})
    path = cal.save(tmp_path / "cal.json")
    assert main(["ask", "--model", str(model_dir), "--calibration", str(path),
                 "who wrote hamlet"]) == 2
    err = capsys.readouterr().err
    assert "made for model 'm' (weights model.safetensors aaaaaaaaaaaa…)" in err
    assert f"not for '{model_dir}' (weights model.safetensors" in err


def test_label_sources_and_missing_hand_labels():
    from isouq.calibration import labels_of

    rows = synth_rows(40)
    _, y = labels_of(rows, "lexical")
    assert list(y) == [int(r["lexical_correct"]) for r in rows]
    gold = [{"key": r["key"], "dataset": "d", "model": "m", "gold_correct": i % 3 == 0}
            for i, r in enumerate(rows[:30])]
    kept, y = labels_of(rows, "hand", gold)
    assert [r["key"] for r in kept] == [r["key"] for r in rows[:30]]
    assert list(y) == [int(i % 3 == 0) for i in range(30)]
    with pytest.raises(CalibrationError, match="needs hand labels"):
        labels_of(rows, "hand", [])


def test_rows_of_isouq_score_with_their_meta_file(tmp_path, monkeypatch):
    import isouq.calibration as calibration
    from isouq.calibrate_run import run_calibration

    monkeypatch.setattr(calibration, "FEATURE_SETS", {"p̄": ("mean_prob",)})
    rows = [{"key": r["key"], "correct": r["correct"], **r["scores"]} for r in synth_rows(60)]
    path = tmp_path / "scores.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "scores.jsonl.meta.json").write_text(json.dumps(
        {"model": {"name": "tiny", "files": {"/w/model.safetensors": "d" * 64}}}))
    run_calibration([path], tmp_path / "cal")
    cal = Calibrator.load(tmp_path / "cal" / "calibration.json")
    assert cal.model == "tiny" and cal.doc["model"]["sha256"] == {"model.safetensors": "d" * 64}
    assert cal.doc["sources"][0]["rows"] == 60


# ---------------------------------------------------------------- features and the nonlinear map
def block_rows(n=150, seed=1, blocks=("model.embed_tokens", "model.layers.0", "model.layers.1")):
    """Rows with a block profile whose last block carries the signal (log scale)."""
    rng = np.random.default_rng(seed)
    rows = synth_rows(n, seed=seed)
    for r in rows:
        z = rng.normal(size=len(blocks))
        r["blocks"] = {b: float(np.exp(v)) for b, v in zip(blocks, z, strict=True)}
        r["scores"]["seq_logprob"] = float(np.log(r["scores"]["mean_prob"]) * 5)
        r["correct"] = bool(z[-1] + 0.3 * rng.normal() > 0)
    return rows


def test_mlp_map_is_sklearns_network():
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    rows = block_rows()
    y = np.array([int(r["correct"]) for r in rows])
    from isouq.evaluation.features import values

    sets = {"both": ("mean_prob", "block:model.layers.1")}
    cols = values(rows, sets["both"])
    m = fit_map(cols, y, "both", "mlp", sets=sets, seed=2)
    X = np.c_[cols["mean_prob"], np.log(cols["block:model.layers.1"])]
    sc = StandardScaler().fit(X)
    ref = MLPClassifier(hidden_layer_sizes=(16,), alpha=1.0, solver="lbfgs", max_iter=200,
                        random_state=2).fit(sc.transform(X), y)
    np.testing.assert_allclose(m.predict(cols), ref.predict_proba(sc.transform(X))[:, 1],
                               rtol=1e-6, atol=1e-9)
    assert m.hidden and len(m.hidden[0][1]) == 16


def test_a_head_on_the_block_profile_learns_it_and_guards_its_model(tmp_path):
    rows = block_rows()
    cal = Calibrator.fit(rows, features=["mean_prob", "seq_logprob", "blocks"])
    names = {r["features"] for r in cal.doc["selection"]}
    assert {"mean_prob", "seq_logprob", "mean_prob & seq_logprob & blocks",
            "mean_prob & seq_logprob"} == names
    assert {r["map"] for r in cal.doc["selection"]} == {"platt", "isotonic", "mlp"}
    assert cal.needs_blocks and cal.doc["blocks"] == list(cal.block_names)
    y = np.array([int(r["correct"]) for r in rows])
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(y, cal.predict(rows)) > 0.8  # the profile carries the signal
    back = Calibrator.load(cal.save(tmp_path / "c.json"))
    np.testing.assert_array_equal(back.predict(rows), cal.predict(rows))
    other = [{**r, "blocks": {"transformer.h.0": 1.0}} for r in rows[:3]]
    with pytest.raises(CalibrationError, match="this model's blocks are 1"):
        back.predict(other)
    with pytest.raises(InputError, match="no block profile.*--blocks"):
        back.predict([{k: v for k, v in r.items() if k != "blocks"} for r in rows[:3]])
    with pytest.raises(InputError, match="unknown feature"):
        Calibrator.fit(rows, features=["mean_prob", "p_true"])
    with pytest.raises(InputError, match="no block profile"):
        Calibrator.fit(synth_rows(60), features=["mean_prob", "blocks"])


def hidden_rows(n=160, seed=4, d=12):
    """Rows with hidden states at two depths; the label lives in the deeper one's direction."""
    rng = np.random.default_rng(seed)
    rows = synth_rows(n, seed=seed)
    for r in rows:
        h = rng.normal(size=(2, d))
        r["hidden"] = {"hidden_states[2]": list(h[0]), "hidden_states[4]": list(h[1])}
        r["scores"]["seq_logprob"] = float(np.log(r["scores"]["mean_prob"]) * 5)
        r["correct"] = bool(h[1, 0] - h[1, 1] + 0.3 * rng.normal() > 0)
    return rows


def test_a_head_with_the_hidden_state_probe_stacks_it_and_guards_its_states(tmp_path):
    """``--features ... hidden``: each set with and without the probe's logit (out of fold on
    the rows it is fitted on), the probe on the telling depth, kept as numbers in the file; the
    same P(correct) after a reload; with a threshold, the held-out rows scored by the probe
    fitted on the others; rows without (or with other) states are one line naming the fix."""
    from sklearn.metrics import roc_auc_score

    from isouq.evaluation.features import PROBE_COLUMN

    rows = hidden_rows()
    y = np.array([int(r["correct"]) for r in rows])
    cal = Calibrator.fit(rows, features=["mean_prob", "nll", "hidden"])
    names = {r["features"] for r in cal.doc["selection"]}
    assert names == {"mean_prob", "nll", "mean_prob & nll", "mean_prob & hidden",
                     "nll & hidden", "mean_prob & nll & hidden", "hidden"}
    assert PROBE_COLUMN in cal.map.features and cal.needs_hidden
    assert cal.hidden_state == "hidden_states[4]" and "a probe on hidden_states[4]" in (
        cal.describe())
    assert roc_auc_score(y, cal.predict(rows)) > 0.85  # the state carries the signal
    back = Calibrator.load(cal.save(tmp_path / "c.json"))
    assert back.doc["format_version"] == 3 and back.doc["hidden_probe"]["state"] == (
        "hidden_states[4]")
    np.testing.assert_allclose(back.predict(rows), cal.predict(rows), rtol=1e-12)
    fresh = hidden_rows(seed=9)  # other answers: the probe generalizes
    assert roc_auc_score([int(r["correct"]) for r in fresh], back.predict(fresh)) > 0.85
    with pytest.raises(CalibrationError, match="probe reads hidden_states\\[4\\].*--hidden"):
        back.predict([{**r, "hidden": {"hidden_states[7]": r["hidden"]["hidden_states[4]"]}}
                      for r in rows[:3]])
    with pytest.raises(InputError, match="no hidden states.*--hidden"):
        back.predict([{k: v for k, v in r.items() if k != "hidden"} for r in rows[:3]])
    with pytest.raises(InputError, match="width"):
        back.predict([{**r, "hidden": {k: v[:5] for k, v in r["hidden"].items()}}
                      for r in rows[:3]])
    with pytest.raises(InputError, match="no hidden states"):
        Calibrator.fit(synth_rows(60), features=["mean_prob", "hidden"])
    risky = Calibrator.fit(rows, features=["nll", "hidden"], max_risk=0.3)
    assert risky.doc["split"]["fit_rows"] == 80 and risky.needs_hidden
    assert risky.threshold is not None and risky.doc["risk_control"]["alpha"] == 0.3


def test_cli_calibrate_with_the_hidden_state_probe_crossfits_it_too(tmp_path, capsys):
    """``isouq calibrate --features ... hidden`` end to end: the file keeps the probe, and the
    out-of-fold P(correct) of crossfit.jsonl comes from a probe stacked on each training part
    (it tells the answers the states tell); rows without states are one line."""
    from sklearn.metrics import roc_auc_score

    rows = [{**r, "model": "m"} for r in hidden_rows()]
    path = _write_run(tmp_path, rows)
    out = tmp_path / "cal"
    assert main(["calibrate", str(path), "--out", str(out), "--features", "mean_prob", "nll",
                 "hidden", *FAST]) == 0
    cal = Calibrator.load(out / "calibration.json")
    assert cal.needs_hidden and cal.hidden_state == "hidden_states[4]"
    crossed = [json.loads(line) for line in (out / "crossfit.jsonl").read_text().splitlines()]
    assert roc_auc_score([int(r["correct"]) for r in crossed],
                         [r["p_correct"] for r in crossed]) > 0.85
    plain = _write_run(tmp_path, synth_rows(60), name="qa_d__plain")
    capsys.readouterr()
    assert main(["calibrate", str(plain), "--out", str(tmp_path / "c2"), "--features",
                 "mean_prob", "hidden"]) == 2
    err = capsys.readouterr().err
    assert "no hidden states" in err and "--hidden" in err and "Traceback" not in err


def test_nll_is_the_negated_log_probability_on_a_log_scale(tmp_path):
    """``nll`` = −seq_logprob, entering the map as log(−Σ log pₜ): the Platt map on it is
    scikit-learn's logistic regression on that column; a calibration on it predicts the same
    from rows and from columns, and rows without seq_logprob are one line naming it."""
    from isouq.evaluation.features import is_log, rows_of_columns, values

    rows = block_rows()
    y = np.array([int(r["correct"]) for r in rows])
    cols = values(rows, ["nll"])
    lp = np.array([r["scores"]["seq_logprob"] for r in rows])
    np.testing.assert_array_equal(cols["nll"], -lp)
    assert is_log("nll") and not is_log("seq_logprob")
    m = fit_map(cols, y, "nll", "platt", sets={"nll": ("nll",)})
    ref = correctness_model().fit(np.log(-lp)[:, None], y)
    np.testing.assert_allclose(m.predict(cols), ref.predict_proba(np.log(-lp)[:, None])[:, 1],
                               rtol=1e-6, atol=1e-9)
    cal = Calibrator.load(Calibrator.fit(rows, features=["nll", "blocks"]).save(
        tmp_path / "c.json"))
    by_cols = {"seq_logprob": lp, **{f"block:{b}": [r["blocks"][b] for r in rows]
                                     for b in rows[0]["blocks"]}}
    np.testing.assert_allclose(cal.predict(by_cols), cal.predict(rows), rtol=1e-12)
    assert rows_of_columns({"a": [1, 2], "block:x": [3, 4]})[1] == {"scores": {"a": 2.0},
                                                                    "blocks": {"x": 4.0}}
    with pytest.raises(InputError, match="seq_logprob"):
        values([{"scores": {"mean_prob": 0.5}}], ["nll"])
    with pytest.raises(InputError, match="one value per answer"):
        rows_of_columns({"a": [1, 2], "b": [1]})


def test_cli_calibrate_features_the_rows_lack_is_one_line(tmp_path, capsys):
    path = _write_run(tmp_path, synth_rows(60))
    assert main(["calibrate", str(path), "--out", str(tmp_path / "c"), "--features",
                 "mean_prob", "blocks"]) == 2
    err = capsys.readouterr().err
    assert "no block profile" in err and "--blocks" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "calibration.json").exists()


QUESTIONS = ["what is the capital of france", "who wrote hamlet"]


def _questions(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": "paris"}) + "\n"
                           for i, q in enumerate(QUESTIONS)))
    return inp


def _score(inp, out, model_dir, *flags) -> tuple[int, list[dict]]:
    """``isouq score`` of the questions file: (exit code, the rows written)."""
    code = main(["score", str(inp), "--out", str(out), "--model", str(model_dir), *flags])
    rows = ([json.loads(line) for line in out.read_text().splitlines()] if out.exists()
            else [])
    return code, rows


def _for(cal, model_dir, path):
    """The calibration saved as one of ``model_dir``'s."""
    cal.doc["model"] = {"name": str(model_dir), "sha256": {}}
    return cal.save(path)


def _ask(model_dir, path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["ask", "--model", str(model_dir), "--max-new-tokens", "4", "--calibration",
                 str(path), "--json", *QUESTIONS]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]


def test_score_blocks_and_a_block_head_in_score_and_ask(model_dir, tmp_path, capsys):
    """``isouq score --blocks`` writes each answer's profile (summing to its epistemic); a
    calibration that reads the profile makes ``score`` and ``ask`` score it and use it; a head
    trained on other blocks is refused in one line."""
    inp = _questions(tmp_path)
    code, scored = _score(inp, tmp_path / "plain.jsonl", model_dir, "--blocks")
    assert code == 0
    for r in scored:
        assert sum(r["blocks"].values()) == pytest.approx(r["scores"]["epistemic"], rel=1e-5)
    names = tuple(scored[0]["blocks"])
    assert names[0] == "model.embed_tokens" and "model.layers.0" in names
    cal = Calibrator.fit(block_rows(blocks=names), features=["mean_prob", "blocks"])
    path = _for(cal, model_dir, tmp_path / "cal.json")
    code, got = _score(inp, tmp_path / "scores.jsonl", model_dir, "--calibration", str(path))
    assert code == 0 and all(tuple(r["blocks"]) == names for r in got)
    assert [r["p_correct"] for r in got] == pytest.approx(list(cal.predict(got)))
    asked = _ask(model_dir, path, capsys)
    assert [r["p_correct"] for r in asked] == pytest.approx(list(cal.predict(asked)),
                                                            nan_ok=True)
    other = Calibrator.fit(block_rows(blocks=("transformer.wte", "transformer.h.0")),
                           features=["blocks"])
    bad = _for(other, model_dir, tmp_path / "other.json")
    assert _score(inp, tmp_path / "o.jsonl", model_dir, "--calibration", str(bad))[0] == 2
    err = capsys.readouterr().err
    assert "this model's blocks" in err and "Traceback" not in err


def test_score_hidden_and_a_probe_head_in_score_and_ask(model_dir, tmp_path, capsys):
    """``isouq score --hidden`` writes each answer's mean hidden states; a calibration whose
    probe reads them makes ``score`` and ``ask`` compute them (not shown by ask) and use them;
    a probe on states this model does not have is refused in one line before any scoring."""
    inp = _questions(tmp_path)
    code, scored = _score(inp, tmp_path / "plain.jsonl", model_dir, "--hidden")
    assert code == 0
    names = list(scored[0]["hidden"])
    assert names[-1] == "hidden_states[-1]" and all(list(r["hidden"]) == names for r in scored)
    width = len(scored[0]["hidden"][names[-1]])
    rng = np.random.default_rng(0)
    rows = synth_rows(120)
    for r in rows:  # the label in one coordinate of the deepest state before the final norm
        r["hidden"] = {n: list(rng.normal(size=width)) for n in names}
        r["correct"] = bool(r["hidden"][names[-2]][0] > 0)
    cal = Calibrator.fit(rows, features=["mean_prob", "hidden"])
    assert cal.needs_hidden
    path = _for(cal, model_dir, tmp_path / "cal.json")
    code, got = _score(inp, tmp_path / "scores.jsonl", model_dir, "--calibration", str(path))
    assert code == 0 and all(list(r["hidden"]) == names for r in got)
    assert [r["p_correct"] for r in got] == pytest.approx(list(cal.predict(got)))
    asked = _ask(model_dir, path, capsys)
    assert len(asked) == 2 and all("hidden" not in r and 0 <= r["p_correct"] <= 1
                                   for r in asked)
    for r in rows:
        r["hidden"] = {"hidden_states[40]": r["hidden"][names[-2]]}
    bad = _for(Calibrator.fit(rows, features=["hidden"]), model_dir, tmp_path / "other.json")
    assert _score(inp, tmp_path / "o.jsonl", model_dir, "--calibration", str(bad))[0] == 2
    err = capsys.readouterr().err
    assert "probe reads hidden_states[40]" in err and "Traceback" not in err
    assert "--hidden" in err and not (tmp_path / "o.jsonl").exists()  # refused before scoring


def test_a_calibration_that_reads_no_gradient_scores_without_a_backward(model_dir, tmp_path,
                                                                        capsys):
    """A map on the forward's scores (p̄ and the aleatoric score): `isouq score --calibration`
    scores with the forward pass only and says so; its P(correct) equals the one computed from
    the full scores; an explicit --method ghost still computes the gradient scores."""
    rows = synth_rows(120)
    cal = Calibrator.fit(rows, features=["mean_prob", "aleatoric"])
    assert not cal.needs_backward
    assert Calibrator.fit(rows, features=["mean_prob", "epistemic"]).needs_backward
    path = _for(cal, model_dir, tmp_path / "cal.json")
    inp = _questions(tmp_path)
    capsys.readouterr()
    code, got = _score(inp, tmp_path / "fwd.jsonl", model_dir, "--calibration", str(path))
    assert code == 0 and "forward pass only" in capsys.readouterr().out
    assert all(r["scores"]["epistemic"] is None and r["method"] == "forward" for r in got)
    code, full = _score(inp, tmp_path / "ghost.jsonl", model_dir, "--calibration", str(path),
                        "--method", "ghost")
    assert code == 0 and all(r["scores"]["epistemic"] > 0 for r in full)
    assert [r["p_correct"] for r in got] == pytest.approx([r["p_correct"] for r in full],
                                                          rel=1e-5)


def test_the_server_skips_the_backward_for_a_calibration_that_reads_no_gradient():
    from isouq.serve.engine import Engine

    class Cal:
        needs_backward = False

    eng = Engine.__new__(Engine)  # only the choice of engine is asked here
    eng.calibration = Cal()
    assert eng.method(blocks=False, spans=False) == "forward"
    assert eng.method(blocks=True, spans=False) == "ghost"  # a request shows its profile
    assert eng.method(blocks=False, spans=True) == "ghost"
    Cal.needs_backward = True
    assert eng.method(blocks=False, spans=False) == "ghost"
    eng.calibration = None
    assert eng.method(blocks=False, spans=False) == "ghost"
