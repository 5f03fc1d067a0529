"""Gradient uncertainty of a small CNN on real images: scikit-learn's bundled digits (offline).

1. Split the 1,797 8×8 digits (10 classes) into train / test (stratified), train a small CNN
   (conv–BatchNorm–ReLU, conv–ReLU, dropout, linear) with Adam and weight decay.
2. Test sets: the clean test images, and a shifted copy (each image rotated by ±``rotate``
   degrees and given Gaussian pixel noise), the same labels.
3. Scores, each "higher = less trust", for the predicted class c of each image:
   epistemic ‖∇θ p_c‖² and epistemic_log ‖∇θ log p_c‖² (``score_classifier(classes=
   "predicted")``, one backward pass per batch), aleatoric p_c(1 − p_c), their combination
   (a logistic regression on log epistemic, log epistemic_log, aleatoric, out-of-fold
   predictions over 5 folds of the evaluated set), against 1 − max softmax probability (MSP),
   predictive entropy, a 5-member deep ensemble (entropy of the mean), MC dropout (entropy
   of the mean of ``mc_samples`` dropout passes) and laplace-torch's last-layer Laplace (KFAC,
   prior precision by marginal likelihood, GLM predictive with the probit link; entropy).
4. Tasks: misclassification detection on the clean test set and on the shifted one (positive:
   the prediction is wrong), and shift detection (positive: the image is from the shifted set,
   over clean ∪ shifted). AUROC with a 95% percentile bootstrap interval, and seconds per
   method (scoring only; the ensemble's and Laplace's extra training/fitting reported apart).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import InputError
from ...estimators import score_classifier
from ...runio import write_results
from .settings.classifiers import QUICK, Settings

NAME = "classifiers"


class DigitsCNN(nn.Module):
    """conv(1→16)–BN–ReLU, conv(16→32, stride 2)–ReLU, dropout, linear(32·4·4 → 10)."""

    def __init__(self, dropout: float = 0.25):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.body(x))


def load_digits_split(test_fraction: float, seed: int):
    """(X_train, y_train, X_test, y_test): float32 (n, 1, 8, 8) scaled to [0, 1], int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    X = (d.images / 16.0).astype(np.float32)[:, None]
    Xtr, Xte, ytr, yte = train_test_split(X, d.target, test_size=test_fraction, random_state=seed,
                                          stratify=d.target)
    return (torch.from_numpy(Xtr), torch.from_numpy(ytr).long(), torch.from_numpy(Xte),
            torch.from_numpy(yte).long())


def shifted(X: torch.Tensor, rotate: float, noise: float, seed: int) -> torch.Tensor:
    """Each image rotated by ±``rotate`` degrees (random sign) plus N(0, (noise/16)²) pixel noise."""
    from scipy.ndimage import rotate as rot

    rng = np.random.default_rng(seed)
    out = np.empty_like(X.numpy())
    for i, img in enumerate(X.numpy()[:, 0]):
        r = rot(img, rotate * rng.choice([-1.0, 1.0]), reshape=False, order=1, mode="constant")
        out[i, 0] = r + rng.normal(0, noise / 16.0, size=r.shape)
    return torch.from_numpy(np.clip(out, 0.0, 1.0).astype(np.float32))


def train(X: torch.Tensor, y: torch.Tensor, s: Settings, seed: int) -> DigitsCNN:
    """Adam with weight decay on the cross-entropy; returns the model in eval mode."""
    torch.manual_seed(seed)
    m = DigitsCNN(s.dropout)
    opt = torch.optim.Adam(m.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    g = torch.Generator().manual_seed(seed)
    m.train()
    for _ in range(s.epochs):
        for idx in torch.randperm(len(X), generator=g).split(s.batch):
            opt.zero_grad()
            nn.functional.cross_entropy(m(X[idx]), y[idx]).backward()
            opt.step()
    return m.eval()


def entropy(p: np.ndarray) -> np.ndarray:
    """Predictive entropy (nats) of rows of probabilities (n, C)."""
    return -(p * np.log(np.clip(p, 1e-30, None))).sum(1)


def probs_of(m: nn.Module, X: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(m(X), 1).numpy()


def mc_dropout(m: nn.Module, X: torch.Tensor, samples: int, seed: int) -> np.ndarray:
    """Mean softmax over ``samples`` passes with dropout on (BatchNorm stays in eval mode)."""
    torch.manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.Dropout):
            mod.train()
    try:
        with torch.no_grad():
            return np.mean([torch.softmax(m(X), 1).numpy() for _ in range(samples)], axis=0)
    finally:
        m.eval()


def laplace_last_layer(m: nn.Module, Xtr, ytr, batch: int):
    """laplace-torch last-layer KFAC Laplace, prior precision by marginal likelihood; returns
    predict(X) -> (n, C) GLM predictive probabilities (probit), or None without laplace-torch."""
    try:
        from laplace import Laplace
    except ImportError:
        return None
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xtr, ytr), batch_size=batch)
    la = Laplace(m, "classification", subset_of_weights="last_layer", hessian_structure="kron")
    la.fit(loader)
    la.optimize_prior_precision(method="marglik")

    def predict(X):
        with torch.no_grad():
            return la(X, pred_type="glm", link_approx="probit").numpy()

    return predict


def auroc_ci(pos: np.ndarray, score: np.ndarray, n_bootstrap: int, seed: int) -> dict:
    """AUROC of ``score`` for the positives ``pos`` (bool), with a 95% percentile bootstrap CI."""
    from sklearn.metrics import roc_auc_score

    pos = np.asarray(pos, bool)
    if pos.all() or not pos.any():
        return {"auroc": None, "lo": None, "hi": None, "n": int(len(pos)), "n_pos": int(pos.sum())}
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_bootstrap):
        i = rng.integers(0, len(pos), len(pos))
        if pos[i].any() and not pos[i].all():
            boots.append(roc_auc_score(pos[i], score[i]))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"auroc": float(roc_auc_score(pos, score)), "lo": float(lo), "hi": float(hi),
            "n": int(len(pos)), "n_pos": int(pos.sum())}


def combined(features: np.ndarray, pos: np.ndarray, seed: int) -> np.ndarray:
    """Out-of-fold P(positive) from a logistic regression on the features (5 stratified folds)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    k = int(min(5, pos.sum(), (~pos).sum()))
    if k < 2:
        return np.zeros(len(pos))
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    cv = StratifiedKFold(k, shuffle=True, random_state=seed)
    return cross_val_predict(clf, features, pos, cv=cv, method="predict_proba")[:, 1]


def method_scores(m, ensemble, la_predict, X: torch.Tensor, s: Settings, seed: int):
    """{method: (n,) score, higher = less trust}, seconds per method, and the predictions."""
    scores, secs = {}, {}
    t = time.perf_counter()
    g = score_classifier(m, X, classes="predicted")
    secs["gradient (epistemic, epistemic_log, aleatoric)"] = time.perf_counter() - t
    scores["epistemic"] = g.epistemic.numpy()
    scores["epistemic_log"] = g.epistemic_log.numpy()
    scores["aleatoric"] = g.aleatoric.numpy()
    p = g.probs.numpy()
    scores["msp"] = 1 - p.max(1)
    scores["entropy"] = entropy(p)
    t = time.perf_counter()
    pe = np.mean([probs_of(e, X) for e in ensemble], axis=0)
    secs["ensemble"] = time.perf_counter() - t
    scores["ensemble"] = entropy(pe)
    t = time.perf_counter()
    scores["mc_dropout"] = entropy(mc_dropout(m, X, s.mc_samples, seed))
    secs["mc_dropout"] = time.perf_counter() - t
    if la_predict is not None:
        t = time.perf_counter()
        scores["laplace_ll"] = entropy(la_predict(X))
        secs["laplace_ll"] = time.perf_counter() - t
    return scores, secs, p.argmax(1)


def _features(sc: dict) -> np.ndarray:
    tiny = 1e-45
    return np.stack([np.log(sc["epistemic"] + tiny), np.log(sc["epistemic_log"] + tiny),
                     sc["aleatoric"]], 1)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), sharey=True)
    for ax, task in zip(np.atleast_1d(axes), tasks, strict=True):
        rs = {r["method"]: r for r in rows if r["task"] == task and r["auroc"] is not None}
        ms = [k for k in methods if k in rs]
        v = np.array([rs[k]["auroc"] for k in ms])
        err = np.array([[rs[k]["auroc"] - rs[k]["lo"], rs[k]["hi"] - rs[k]["auroc"]] for k in ms]).T
        ax.barh(range(len(ms)), v, xerr=err, color=["C0" if k in ("epistemic", "epistemic_log",
                "aleatoric", "combined") else "C7" for k in ms])
        ax.set_yticks(range(len(ms)), ms)
        ax.axvline(0.5, color="k", lw=0.8, ls=":")
        ax.set_xlim(0.3, 1.0)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("AUROC (95% bootstrap CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run(out: Path, *, quick: bool = False, seed: int = 0, device: str = "cpu", **options) -> Path:
    """Train, score, evaluate; write ``out/results.json``, ``tables.md`` and a PNG."""
    started = time.time()
    base = QUICK if quick else Settings()
    known = {f.name for f in fields(Settings)}
    unknown = {k for k, v in options.items() if v is not None} - known
    if unknown:
        raise InputError(f"unknown option(s) for the classifiers experiment: {sorted(unknown)}")
    s = Settings(**{**asdict(base), **{k: v for k, v in options.items() if v is not None}})
    if s.ensemble < 1 or s.mc_samples < 1 or not 0 < s.test_fraction < 1:
        raise InputError("need --ensemble ≥ 1, --mc-samples ≥ 1 and 0 < --test-fraction < 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    Xtr, ytr, Xte, yte = load_digits_split(s.test_fraction, seed)
    Xsh = shifted(Xte, s.rotate, s.noise, seed)
    t = time.perf_counter()
    model = train(Xtr, ytr, s, seed)
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    ensemble = [model] + [train(Xtr, ytr, s, seed + 1000 * k) for k in range(1, s.ensemble)]
    ensemble_train_s = time.perf_counter() - t
    t = time.perf_counter()
    la_predict = laplace_last_layer(copy.deepcopy(model), Xtr, ytr, s.batch)
    laplace_fit_s = time.perf_counter() - t

    rows, seconds, accuracy = [], [], {}
    per_set = {}
    for name, X in (("clean", Xte), ("shifted", Xsh)):
        sc, secs, pred = method_scores(model, ensemble, la_predict, X, s, seed)
        wrong = pred != yte.numpy()
        accuracy[name] = float(1 - wrong.mean())
        per_set[name] = (sc, wrong)
        seconds += [{"test_set": name, "method": k, "seconds": round(v, 4), "n": len(X)}
                    for k, v in secs.items()]
    tasks = {f"misclassification ({n})": (per_set[n][0], per_set[n][1]) for n in per_set}
    both = {k: np.concatenate([per_set["clean"][0][k], per_set["shifted"][0][k]])
            for k in per_set["clean"][0]}
    tasks["shift detection (clean vs shifted)"] = (
        both, np.r_[np.zeros(len(Xte), bool), np.ones(len(Xsh), bool)])
    for task, (sc, pos) in tasks.items():
        sc = {**sc, "combined": combined(_features(sc), pos, seed)}
        for k, v in sc.items():
            rows.append({"task": task, "method": k, **auroc_ci(pos, v, s.n_bootstrap, seed)})
    fig = out / "classifiers_auroc.png"
    plot(rows, fig)
    settings = {**asdict(s), "quick": quick, "device": "cpu", "requested_device": device,
                "model": "DigitsCNN: conv(1→16)-BN-ReLU, conv(16→32, s2)-ReLU, dropout, linear(512→10)",
                "n_params": sum(p.numel() for p in model.parameters()),
                "n_train": len(Xtr), "n_test": len(Xte),
                "combined": "logistic regression on [log epistemic, log epistemic_log, aleatoric], "
                            "out-of-fold (5 stratified folds) on the evaluated set",
                "laplace": "laplace-torch last_layer kron, marglik prior precision, glm probit"
                           if la_predict is not None else "skipped: laplace-torch not installed"}
    info = [{"accuracy_clean": accuracy["clean"], "accuracy_shifted": accuracy["shifted"],
             "train_s": round(train_s, 2), "ensemble_extra_train_s": round(ensemble_train_s, 2),
             "laplace_fit_s": round(laplace_fit_s, 2)}]
    return write_results(out, NAME, settings=settings, seed=seed, started=started,
                         tables={"auroc": rows, "seconds": seconds, "model": info},
                         figures=[fig.name])
