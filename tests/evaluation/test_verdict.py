"""The paired verdict (``isouq.evaluation.verdict``): bootstrap intervals against DeLong's closed
form, refit noise inside the interval, Holm's correction by hand, and the verdict's words."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from isouq.errors import InputError
from isouq.evaluation import verdict as V


def _delong_auroc_diff(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """DeLong's (1988) paired AUROC difference and its standard error, written out here
    independently of the package (structural components of each side's Mann-Whitney U)."""
    pos, neg = y == 1, y == 0

    def components(s):
        x, z = s[pos], s[neg]
        psi = (x[:, None] > z[None, :]) + 0.5 * (x[:, None] == z[None, :])
        return psi.mean(), psi.mean(axis=1), psi.mean(axis=0)

    ta, va10, va01 = components(a)
    tb, vb10, vb01 = components(b)
    s10 = np.cov(np.stack([va10, vb10]))
    s01 = np.cov(np.stack([va01, vb01]))
    var = ((s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / pos.sum()
           + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / neg.sum())
    return ta - tb, float(np.sqrt(var))


def _scores(n=400, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(float)
    strong = 1 / (1 + np.exp(-(2.0 * (y - 0.5) + rng.normal(0, 1.0, n))))
    weak = 1 / (1 + np.exp(-(0.8 * (y - 0.5) + rng.normal(0, 1.0, n))))
    return y, strong, weak


def test_auroc_interval_matches_delong():
    """The bootstrap's AUROC difference and 95% interval agree with DeLong's normal interval
    (the point exactly, the bounds within 0.02)."""
    y, strong, weak = _scores()
    got = V.paired_difference(strong, weak, y, "AUROC", n_bootstrap=3000, seed=1)
    d, se = _delong_auroc_diff(strong, weak, y)
    z = norm.ppf(0.975)
    assert got.delta == pytest.approx(d, abs=1e-12)
    assert got.ci_low == pytest.approx(d - z * se, abs=0.02)
    assert got.ci_high == pytest.approx(d + z * se, abs=0.02)
    assert got.p < 0.01 and got.repeats == 1 and got.n == len(y)


def test_same_predictor_is_within_noise():
    y, strong, _ = _scores()
    got = V.paired_difference(strong, strong, y, "PRR", n_bootstrap=200)
    assert got.delta == 0 and got.ci_low == 0 == got.ci_high and got.p == 1.0
    assert V.verdict(got.delta, got.p) == V.WITHIN


def test_refit_noise_widens_the_interval():
    """Fold seeds whose maps differ (here: refits that alternate between a strong and a weak
    map) give a wider interval than one seed's, and the point estimate is their mean
    difference."""
    y, strong, weak = _scores()
    rng = np.random.default_rng(3)
    other = np.clip(weak + rng.normal(0, 0.05, y.size), 0, 1)
    refits = np.stack([strong, other, strong, other, strong])
    one = V.paired_difference(strong, weak, y, "PRR", n_bootstrap=1500, seed=2)
    five = V.paired_difference(refits, weak, y, "PRR", n_bootstrap=1500, seed=2)
    assert five.repeats == 5
    assert five.ci_high - five.ci_low > 1.3 * (one.ci_high - one.ci_low)
    each = [V.prr(r, y) - V.prr(weak, y) for r in refits]
    assert five.delta == pytest.approx(np.mean(each))


def test_paired_by_seed_when_both_sides_repeat():
    """Sides with the same repeats are paired by seed: b equal to a row by row gives exactly
    zero in every resample."""
    y, strong, _ = _scores()
    rows = np.stack([strong, strong[::-1]])
    got = V.paired_difference(rows, rows.copy(), y, "AUROC", n_bootstrap=100)
    assert got.ci_low == got.ci_high == 0


def test_fractional_quality_and_nan_answers():
    """PRR on a fractional quality; answers without a quality are left out of both sides."""
    rng = np.random.default_rng(0)
    q = rng.random(300)
    p = np.clip(q + rng.normal(0, 0.1, 300), 0, 1)
    q_nan = q.copy()
    q_nan[:10] = np.nan
    got = V.paired_difference(p, rng.random(300), q_nan, "PRR", n_bootstrap=300)
    assert got.n == 290 and got.delta > 0.15 and got.ci_low > 0


def test_holm_by_hand():
    """Holm: sorted p times (m − rank), running maximum, capped at 1; NaN not counted."""
    got = V.holm([0.01, 0.04, np.nan, 0.03])
    assert np.allclose(got[[0, 1, 3]], [0.03, 0.06, 0.06]) and np.isnan(got[2])


def test_judge_leaves_unrankable_rows_out_of_the_family():
    rows = V.judge([{"delta": 0.1, "p": 0.01}, {"delta": -0.2, "p": 0.02},
                    {"delta": 0.3, "p": 0.001, "rankable": False}])
    assert [r["family"] for r in rows] == [2, 2, 2]
    assert rows[0]["p_holm"] == pytest.approx(0.02) and rows[0]["verdict"] == V.AHEAD
    assert rows[1]["p_holm"] == pytest.approx(0.02) and rows[1]["verdict"] == V.BELOW
    assert rows[2]["verdict"] is None and rows[2]["p_holm"] is None
    assert V.counts(rows) == {V.AHEAD: 1, V.WITHIN: 0, V.BELOW: 1}


def test_holm_turns_a_marginal_win_into_noise():
    rows = V.judge([{"delta": 0.05, "p": 0.03}, {"delta": 0.01, "p": 0.5}])
    assert rows[0]["p_holm"] == pytest.approx(0.06) and rows[0]["verdict"] == V.WITHIN


def test_class_counts_and_rankable():
    q = np.r_[np.ones(30), np.zeros(29), [0.7, 0.2, np.nan]]
    assert V.class_counts(q) == (31, 30) and V.rankable(q)
    assert not V.rankable(q[:58])


def test_bad_input_names_the_fix():
    with pytest.raises(InputError, match="choose from"):
        V.paired_difference(np.ones(3), np.ones(3), np.ones(3), "F1")
    with pytest.raises(InputError, match="answers"):
        V.paired_difference(np.ones(4), np.ones(3), np.ones(3))
