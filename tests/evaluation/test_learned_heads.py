"""Learned heads judged in LM-Polygraph's harness (study.analysis.learned_heads): cross-fitted
(no answer scored by a head that saw its label), the paper's head is the study's logistic
regression, and a head learns a signal the block profile carries."""

from __future__ import annotations

import numpy as np
import pytest

from isouq.evaluation.auroc import auroc
from isouq.evaluation.classifier import fit_predict
from isouq.evaluation.features import HIDDEN
from isouq.probe import PROBE_C, fit_probe
from isouq.study.analysis.learned_heads import (
    CONTROL,
    HEADS,
    LABEL_THRESHOLD,
    STACKED,
    binary_labels,
    cross_fitted,
    probe_cross_fitted,
    probe_transferred,
    stacked_cross_fitted,
    stacked_transferred,
    transferred,
)

BLOCKS = ("model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head")


def rows_and_labels(n=160, seed=0):
    rng = np.random.default_rng(seed)
    rows, y = [], []
    for _ in range(n):
        z = rng.normal(size=len(BLOCKS))
        p = float(rng.uniform(0.2, 0.9))
        rows.append({"scores": {"mean_prob": p, "seq_logprob": 5 * np.log(p),
                                "epistemic": float(np.exp(rng.normal())),
                                "epistemic_log": float(np.exp(rng.normal())),
                                "aleatoric": float(rng.uniform(0.05, 0.25))},
                     "blocks": {b: float(np.exp(v)) for b, v in zip(BLOCKS, z, strict=True)}})
        y.append(float(z[2] + 0.5 * rng.normal() > 0))
    return rows, np.array(y), np.arange(n) % 4


def test_labels_from_lm_polygraphs_quality():
    q = np.array([0.0, 0.49, 0.5, 1.0, np.nan])
    np.testing.assert_array_equal(binary_labels(q, "Rouge_rougeL"), [0, 0, 1, 1, np.nan])
    assert LABEL_THRESHOLD == 0.5
    np.testing.assert_array_equal(binary_labels(np.array([0.0, 1.0]), "Accuracy"), [0, 1])


def test_the_block_head_learns_the_profile_and_never_sees_a_rows_label():
    rows, y, folds = rows_and_labels()
    u, chosen = cross_fitted(HEADS["isouq block head"], rows, y, folds)
    assert len(chosen) == 4 and np.isfinite(u).all()
    assert auroc(y, -u) > 0.8  # the signal lives in one block
    flipped = y.copy()
    flipped[folds == 0] = 1 - flipped[folds == 0]  # fold 0's own labels: its scores stay
    u2, _ = cross_fitted(HEADS["isouq block head"], rows, flipped, folds)
    np.testing.assert_allclose(u2[folds == 0], u[folds == 0])
    assert not np.allclose(u2[folds != 0], u[folds != 0])


def test_the_papers_head_is_the_studys_logistic_regression_on_other_folds():
    rows, y, folds = rows_and_labels(seed=1)
    u, chosen = cross_fitted(HEADS["isouq combined (paper)"], rows, y, folds)
    assert all("platt on epistemic & aleatoric" in c for c in chosen)
    X = np.array([[np.log(r["scores"]["epistemic"]), r["scores"]["aleatoric"]] for r in rows])
    for k in range(4):
        te = folds == k
        ref = fit_predict(X[~te], y[~te], X[te])
        np.testing.assert_allclose(1 - u[te], ref, rtol=1e-6)


def test_transfer_and_a_fold_too_small_to_fit():
    rows, y, folds = rows_and_labels(seed=2)
    t, how = transferred(HEADS["isouq scores + MSP"], rows[:100], y[:100], rows[100:])
    assert t.shape == (60,) and np.isfinite(t).all() and " on " in how
    y_few = np.zeros_like(y)
    y_few[:3] = 1  # three correct answers: no fold can be fitted
    u, chosen = cross_fitted(HEADS["isouq scores + MSP"], rows, y_few, folds)
    assert np.isnan(u).all() and all("too few" in c for c in chosen)
    with pytest.raises(Exception, match="no block profile"):
        cross_fitted(HEADS["isouq block head"], [{"scores": r["scores"]} for r in rows], y, folds)


def test_fractional_labels_fit_the_expected_quality():
    """ROUGE-L as a fractional label: the head estimates E[quality | x] (weighted log-loss on
    each row as 1 with weight q and 0 with weight 1 − q), checked against scikit-learn's
    logistic regression fitted on those weighted rows directly."""
    from sklearn.linear_model import LogisticRegression

    from isouq.calibration import fit_map
    from isouq.evaluation.features import values
    from isouq.evaluation.fractional import is_soft, soft_log_loss, soft_rows
    from isouq.study.analysis.learned_heads import labels_for

    rows, y, folds = rows_and_labels(seed=3)
    q = np.clip(0.5 * y + 0.3 * np.random.default_rng(0).random(len(y)), 0, 1)
    assert is_soft(labels_for(q, "Rouge_rougeL")) and not is_soft(labels_for(q, "Accuracy"))
    cols = values(rows, ("mean_prob", "block:model.layers.1"))
    m = fit_map(cols, q, "x", "platt", sets={"x": tuple(cols)})
    X = np.c_[cols["mean_prob"], np.log(cols["block:model.layers.1"])]
    Z = (X - X.mean(0)) / X.std(0)
    Z2, y2, w = soft_rows(Z, q)
    ref = LogisticRegression(C=1.0, solver="newton-cholesky").fit(Z2, y2, sample_weight=w)
    np.testing.assert_allclose(m.predict(cols), ref.predict_proba(Z)[:, 1], rtol=1e-5)
    assert soft_log_loss(np.array([1.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(np.log(2))
    u, chosen = cross_fitted(HEADS["isouq scores + MSP"], rows, q, folds)
    assert np.isfinite(u).all() and not any("isotonic" in c for c in chosen)


def test_a_span_head_is_cross_fitted_by_answer_and_judged_against_the_default():
    """long_spans.span_head_rows: no sentence scored by a head fitted on its answer, and a head
    that can read the signal (min_prob) beats a default that cannot (aleatoric: noise)."""
    from isouq.study.analysis.long_spans import span_head_rows

    rng = np.random.default_rng(5)
    rows = []
    for a in range(120):
        for k in range(5):
            wrong = int(rng.random() < 0.6)
            rows.append({"setting": "composed", "model": "m", "answer": f"a{a}", "index": k,
                         "wrong": wrong, "whole": {},
                         "span": {"mean_prob": float(rng.uniform(0.3, 0.9)),
                                  "aleatoric": float(rng.uniform(0.05, 0.2)),
                                  "epistemic": float(np.exp(rng.normal())),
                                  "epistemic_log": float(np.exp(rng.normal())),
                                  "min_prob": float(np.clip(0.6 - 0.4 * wrong
                                                            + 0.15 * rng.normal(), 0.01, 1))}})
    (r,) = span_head_rows(rows, default="aleatoric", n_bootstrap=50)
    assert r["sentences"] == 600 and len(r["maps"]) == 5
    assert r["head"] > 0.8 and abs(r["default_auroc"] - 0.5) < 0.1
    assert r["verdict"] == "the head is better beyond noise" and r["delta_ci_low"] > 0


def test_the_control_ranks_each_fold_as_msp_and_pooled_folds_need_not():
    """The control (Platt on nll alone) orders the answers of each fold exactly as
    −seq_logprob does; pooled over folds, each scored by another map, it need not."""
    from scipy.stats import spearmanr

    rows, y, folds = rows_and_labels(n=200, seed=3)
    rng = np.random.default_rng(4)
    for r in rows:  # MSP's own quantity, with a signal in it
        r["scores"]["seq_logprob"] = float(-np.exp(rng.normal(1.5, 1.0)))
    nll = np.array([-r["scores"]["seq_logprob"] for r in rows])
    y = (np.log(nll) + rng.normal(0, 1.0, nll.size) < 1.5).astype(float)
    u, chosen = cross_fitted(CONTROL, rows, y, folds)
    assert all("platt on nll" in c for c in chosen)
    for k in np.unique(folds):
        assert spearmanr(u[folds == k], nll[folds == k])[0] == pytest.approx(1.0)
    assert spearmanr(u, nll)[0] < 1.0


def test_the_hidden_state_probe_learns_a_direction_and_never_sees_a_rows_label():
    rng = np.random.default_rng(3)
    n, d = 240, 64
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = (X @ w + rng.normal(size=n) > 0).astype(float)
    folds = np.arange(n) % 4
    noise = rng.normal(size=(n, d))
    states = {"layer 2": noise, "layer 4": X}  # the label lives in one layer's state
    u, chosen, _ = probe_cross_fitted(states, y, folds)
    assert len(chosen) == 4 and all(c.split(": ")[1].startswith("layer 4, C=") for c in chosen)
    assert np.isfinite(u).all() and auroc(y, -u) > 0.75  # the label is linear in the state
    flipped = y.copy()
    flipped[folds == 0] = 1 - flipped[folds == 0]  # fold 0's own labels: its scores stay
    u2, _, _ = probe_cross_fitted(states, flipped, folds)
    np.testing.assert_allclose(u2[folds == 0], u[folds == 0])
    assert not np.allclose(u2[folds != 0], u[folds != 0])
    # pure noise: the inner folds pick the strongest penalty, P(correct) near the base rate
    u3, chosen3, _ = probe_cross_fitted({"layer 2": noise}, y, folds)
    assert all(c.endswith(f"C={PROBE_C[0]:g}") for c in chosen3)
    assert np.ptp(u3[folds == 1]) < 0.05


def test_the_probe_fits_fractional_labels_and_skips_a_fold_too_small():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(120, 8))
    q = 1 / (1 + np.exp(-2 * X[:, 0]))  # a fractional quality rising with the first coordinate
    folds = np.arange(120) % 3
    u, _, _ = probe_cross_fitted({"last": X}, q, folds)
    assert np.corrcoef(u, -X[:, 0])[0, 1] > 0.9
    y = np.zeros(120)
    y[:3] = 1  # three correct answers: no fold can be fitted
    u, chosen, _ = probe_cross_fitted({"last": X}, y, folds)
    assert np.isnan(u).all() and all("too few" in c for c in chosen)


def test_the_stacked_head_reads_the_probe_where_the_state_tells_and_never_sees_a_rows_label():
    rows, _, folds = rows_and_labels(n=160, seed=5)  # the scores say nothing of these labels
    rng = np.random.default_rng(5)
    X = rng.normal(size=(160, 12))
    y = (X[:, 0] + 0.3 * rng.normal(size=160) > 0).astype(float)
    fit = probe_cross_fitted({"layer": X}, y, folds)
    # a fold's own answers carry the logit of the probe that scored them
    for i, k in enumerate(np.unique(folds)):
        np.testing.assert_allclose(1 / (1 + np.exp(-fit.fold_logits[i][folds == k])),
                                   1 - fit.uncertainty[folds == k], rtol=1e-6)
    u, chosen = stacked_cross_fitted(STACKED, rows, y, folds, fit.fold_logits)
    assert len(chosen) == 4 and all(c.endswith(f"& {HIDDEN}") or c.endswith(f" {HIDDEN}") for c in chosen)
    plain, _ = cross_fitted(HEADS["isouq scores + MSP"], rows, y, folds)
    assert auroc(y, -u) > 0.85 > 0.65 > auroc(y, -plain)
    flipped = y.copy()
    flipped[folds == 0] = 1 - flipped[folds == 0]  # fold 0's own labels: its values stay
    fit2 = probe_cross_fitted({"layer": X}, flipped, folds)
    u2, _ = stacked_cross_fitted(STACKED, rows, flipped, folds, fit2.fold_logits)
    np.testing.assert_allclose(u2[folds == 0], u[folds == 0])
    assert not np.allclose(u2[folds != 0], u[folds != 0])


def test_the_stacked_head_moves_to_another_dataset_with_the_probe_of_the_first():
    rows, _, _ = rows_and_labels(n=160, seed=6)  # the scores say nothing of these labels
    test_rows, _, _ = rows_and_labels(n=120, seed=7)
    rng = np.random.default_rng(6)
    X, X_test = rng.normal(size=(160, 8)), rng.normal(size=(120, 8))
    y = (X[:, 1] + 0.3 * rng.normal(size=160) > 0).astype(float)
    y_test = (X_test[:, 1] + 0.3 * rng.normal(size=120) > 0).astype(float)
    y[5] = np.nan  # an unlabelled training answer takes no part
    got = probe_transferred({"mid": X, "last": rng.normal(size=(160, 8))}, y,
                            {"mid": X_test, "last": rng.normal(size=(120, 8))})
    assert got.chosen.startswith("mid, C=") and np.isnan(got.train_logits[5])
    assert np.isfinite(np.delete(got.train_logits, 5)).all()
    # the test logits are the probe refitted on every labelled training answer (isouq.probe)
    C = float(got.chosen.split("C=")[1])
    ok = ~np.isnan(y)
    probe = fit_probe("mid", X[ok], y[ok], C)
    np.testing.assert_allclose(got.test_logits, probe.logit(X_test), rtol=1e-6, atol=1e-8)
    assert auroc(y_test, got.test_logits) > 0.9
    u, how = stacked_transferred(STACKED, rows, y, got.train_logits, test_rows,
                                 got.test_logits)
    assert HIDDEN in how and np.isfinite(u).all() and auroc(y_test, -u) > 0.9
    plain, _ = transferred(HEADS["isouq scores + MSP"], rows, y, test_rows)
    assert auroc(y_test, -plain) < 0.65
    few = np.zeros(160)
    few[:3] = 1  # three correct answers: nothing can be fitted
    assert "too few" in probe_transferred({"mid": X}, few, {"mid": X_test}).chosen
    u, how = stacked_transferred(STACKED, rows, few, got.train_logits, test_rows,
                                 got.test_logits)
    assert np.isnan(u).all() and "too few" in how
