import numpy as np
import pytest
from scipy.stats import spearmanr

from isouq.study.analysis import correlation_table, spearman


def test_spearman_matches_scipy_and_drops_nan():
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    y = -0.3 * x + rng.normal(size=100)
    ref = spearmanr(x, y)
    r = spearman(x, y)
    assert r["n"] == 100
    assert r["rho"] == pytest.approx(ref.statistic) and r["p"] == pytest.approx(ref.pvalue)
    x[:5] = np.nan
    assert spearman(x, y)["rho"] == pytest.approx(spearmanr(x[5:], y[5:]).statistic)
    assert spearman(x, y)["n"] == 95
    assert np.isnan(spearman([1.0, 2.0], [2.0, 1.0])["rho"])


def test_correlation_table_per_model_and_pooled(rows):
    table = correlation_table(rows)
    assert len(table) == 8  # 3 models + pooled, 2 datasets
    pooled = [r for r in table if r["model"] == "Pooled"]
    assert [r["n"] for r in pooled] == [240, 240]
    ds_rows = [r for r in rows if r["dataset"] == "TriviaQA"]
    x = [r["scores"]["epistemic"] for r in ds_rows]
    y = [r["scores"]["p_true"] for r in ds_rows]
    assert pooled[1]["rho"] == pytest.approx(spearmanr(x, y).statistic)
