"""The per-method correctness model: standardize the feature(s), fit a logistic regression.

Learning the mapping from score(s) to correctness makes the sign of a score irrelevant (an
uncertainty and a confidence such as P(True) are treated alike) and lets two scores combine.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler


def complete_rows(X: np.ndarray) -> np.ndarray:
    """(n, d) -> (n,) bool: rows with every feature finite."""
    return np.isfinite(np.asarray(X, dtype=float)).all(axis=1)


def fit_predict(
    X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray, *, C: float = 1.0
) -> np.ndarray:
    """P(correct) for ``X_test`` from a logistic regression fitted on the training rows.

    X_train: (n_train, d), y_train: (n_train,) 0/1, X_test: (n_test, d) -> (n_test,).
    Features are standardized with the training mean and std (std 0 -> 1); ``C`` is
    scikit-learn's inverse L2 strength (solver newton-cholesky: exact and fast for few
    features). All NaN when the training rows hold one class only.
    """
    X_train = np.asarray(X_train, dtype=float)
    X_test = np.asarray(X_test, dtype=float)
    y_train = np.asarray(y_train).astype(int)
    if np.unique(y_train).size < 2:
        return np.full(X_test.shape[0], np.nan)
    mu = X_train.mean(axis=0)
    sd = X_train.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    clf = LogisticRegression(C=C, solver="newton-cholesky")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit((X_train - mu) / sd, y_train)
    return clf.predict_proba((X_test - mu) / sd)[:, 1]


def correctness_model(C: float = 1.0) -> Pipeline:
    """The same model as :func:`fit_predict`, as an unfitted scikit-learn estimator (for
    ``cross_val_predict`` and ``CalibratedClassifierCV``): ``StandardScaler`` (population std;
    a constant feature is left unscaled) then ``LogisticRegression(C, solver="newton-cholesky")``.
    Fitted on (n, d) features and (n,) 0/1 correctness, ``predict_proba(X)[:, 1]`` is P(correct).
    """
    return Pipeline([("scale", StandardScaler()),
                     ("logistic", LogisticRegression(C=C, solver="newton-cholesky"))])
