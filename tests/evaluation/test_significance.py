import numpy as np
import pytest
from scipy.stats import ttest_rel
from statsmodels.stats.multitest import multipletests

from isouq.evaluation import (
    bh_adjust,
    paired_bootstrap,
    paired_bootstrap_table,
    paired_ttest,
    random_splits,
    significance_table,
)


def test_paired_ttest_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.6, 0.05, 10), rng.normal(0.55, 0.05, 10)
    r, ref = paired_ttest(a, b), ttest_rel(a, b)
    assert r["t"] == pytest.approx(ref.statistic)
    assert r["p"] == pytest.approx(ref.pvalue)
    assert r["diff"] == pytest.approx((a - b).mean())
    a[3] = np.nan  # pairs with a NaN are dropped
    ref = ttest_rel(np.delete(a, 3), np.delete(b, 3))
    assert paired_ttest(a, b)["p"] == pytest.approx(ref.pvalue)


def test_bh_known_values_and_statsmodels():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # hand BH: sorted 0.005,0.01,0.03,0.04 -> *4/rank = 0.02,0.02,0.04,0.04 (monotone)
    reject, adj = bh_adjust(p)
    assert np.allclose(adj, [0.02, 0.04, 0.04, 0.02])
    assert reject.all()
    rng = np.random.default_rng(1)
    q = rng.random(18) ** 3
    r2, a2 = bh_adjust(q, alpha=0.05)
    ref = multipletests(q, alpha=0.05, method="fdr_bh")
    assert np.array_equal(r2, ref[0]) and np.allclose(a2, ref[1])
    r3, a3 = bh_adjust([0.01, np.nan, 0.02])
    assert np.isnan(a3[1]) and not r3[1] and np.allclose(a3[[0, 2]], [0.02, 0.02])


def test_paired_bootstrap_shift_and_null():
    rng = np.random.default_rng(2)
    base = rng.normal(0.6, 0.05, 40)
    r = paired_bootstrap(base + 0.03 + rng.normal(0, 0.005, 40), base, n_resamples=2000)
    assert r["delta"] == pytest.approx(0.03, abs=0.005)
    assert r["ci_low"] > 0 and r["ci_low"] < r["delta"] < r["ci_high"]
    assert r["p"] == pytest.approx(2 / 2001)
    null = paired_bootstrap(base + rng.normal(0, 0.01, 40), base, n_resamples=2000, seed=1)
    assert null["ci_low"] < 0 < null["ci_high"] and null["p"] > 0.05
    assert null["n"] == 40
    assert paired_bootstrap(base, base + 1, n_resamples=10)["p"] == pytest.approx(2 / 11)


def test_random_splits_stratified_80_20():
    y = np.r_[np.ones(30), np.zeros(20)].astype(int)
    for tr, te in random_splits(y, 10, np.random.default_rng(3)):
        assert np.intersect1d(tr, te).size == 0 and tr.size + te.size == 50
        assert (y[te] == 1).sum() == 6 and (y[te] == 0).sum() == 4


def test_significance_table_finds_informative_method(rows):
    table = significance_table(rows, n_splits=5)
    assert len(table) == 32  # 4 gradient methods x 4 baselines (p̄ among them) x 2 datasets
    ref = multipletests([r["p"] for r in table], method="fdr_bh")[1]
    assert np.allclose([r["p_bh"] for r in table], ref)
    alea = [r for r in table if r["method"] == "Alea."]
    assert all(r["direction"] == "↑" and r["significant"] for r in alea)


def test_paired_bootstrap_table(rows):
    table = paired_bootstrap_table(rows, n_splits=4, n_resamples=500)
    assert [r["dataset"] for r in table] == ["TruthfulQA", "TriviaQA"]
    assert all(r["n_cells"] == 12 and r["ci_low"] <= r["delta_auroc"] <= r["ci_high"]
               for r in table)


def test_baseline_on_fewer_models_is_compared_on_those_models(rows):
    from isouq.evaluation.rows import group_rows
    from isouq.evaluation.significance import split_aurocs, ttests_from_splits

    rows = [dict(r, scores=dict(r["scores"])) for r in rows if r["dataset"] == "TriviaQA"]
    for r in rows:
        if r["model"] != "m2":
            del r["scores"]["semantic_entropy"]
    split_auc = split_aurocs(group_rows(rows), n_splits=4)
    table = {(r["method"], r["baseline"]): r for r in ttests_from_splits(split_auc)}
    se, pt = table[("Alea.", "Sem. Ent.")], table[("Alea.", "P(True)")]
    assert se["n_models"] == 1 and pt["n_models"] == 3
    only_m2 = ttest_rel(split_auc[("TriviaQA", "m2", "Alea.")],
                        split_auc[("TriviaQA", "m2", "Sem. Ent.")])
    assert se["auroc_method"] == pytest.approx(split_auc[("TriviaQA", "m2", "Alea.")].mean())
    assert se["p"] == pytest.approx(only_m2.pvalue)
    from isouq.evaluation.significance import significance_wide

    wide = {r["method"]: r for r in significance_wide(table.values())}
    assert wide["Alea."]["vs Sem. Ent."].endswith(" (1 of 3 models)")
    assert "models" not in wide["Alea."]["vs P(True)"]
