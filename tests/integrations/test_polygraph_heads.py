"""scripts/polygraph/heads.py: the heads file of one model × dataset from the kept results and
features, with the hidden-state probe (features.py's ``.probe.json``) copied per metric and the
stacked head fitted on its per-fold logits, and a probe of other answers or folds refused.
Needs no LM-Polygraph: the kept files are written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import by_path
from isouq.errors import DataError
from isouq.evaluation.features import HIDDEN
from isouq.study.analysis.learned_heads import PROBE, STACKED

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = ("model.layers.0", "model.layers.1")


def _script(name: str):
    return by_path.module(f"scripts/polygraph/{name}.py", f"polygraph_{name}")


@pytest.fixture
def heads(tmp_path, monkeypatch):
    mod = _script("heads")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    return mod


@pytest.fixture
def features():
    return _script("features")


def _kept(tmp_path: Path, heads, n: int = 60, seed: int = 0, ds: str = "triviaqa") -> dict:
    """A kept benchmark file, its features rows and a probe file (one answer without features;
    the probe's logits telling the correct answers)."""
    rng = np.random.default_rng(seed)
    acc = (rng.random(n) < 0.4).astype(float)
    keys = [f"{ds}-q{i}" for i in range(n)]
    kept = {"kind": "isouq-polygraph", "dataset": ds, "model": "tiny",
            "quality_metrics": ["Accuracy", "Rouge_rougeL"],
            "questions": [{"key": k, "quality": {"Accuracy": a, "Rouge_rougeL": 0.3 + 0.6 * a}}
                          for k, a in zip(keys, acc, strict=True)]}
    (tmp_path / f"polygraph__{ds}__tiny.json").write_text(json.dumps(kept))
    feats = tmp_path / "features"
    feats.mkdir(exist_ok=True)
    rows = [{"key": k, "scores": {"mean_prob": 0.3 + 0.4 * a + 0.1 * rng.random(),
                                  "seq_logprob": -5 * rng.random() - 1,
                                  "epistemic": float(np.exp(rng.normal())),
                                  "epistemic_log": float(np.exp(rng.normal())),
                                  "aleatoric": float(rng.uniform(0.05, 0.25))},
             "blocks": {b: float(np.exp(rng.normal())) for b in BLOCKS}}
            for k, a in zip(keys[1:], acc[1:], strict=True)]
    rows.insert(0, {"key": keys[0], "error": "its text does not tokenize into its kept length"})
    (feats / f"{ds}__tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    folds = heads.folds_of(kept, None, 5, 0)
    logits = [[None, *map(float, 3 * acc[1:] - 1.5 + rng.normal(size=n - 1))] for _ in range(5)]
    probe = {"keys": keys, "folds": [int(f) for f in folds],
             "metrics": {m: {"uncertainty": [None, *map(float, rng.random(n - 1))],
                             "chosen": ["fold 0: C=0.01"], "fold_logits": logits}
                         for m in kept["quality_metrics"]}}
    (feats / f"{ds}__tiny.probe.json").write_text(json.dumps(probe))
    return {**probe, "acc": acc}


def test_the_heads_file_holds_each_head_and_the_probe_per_metric(heads, tmp_path):
    probe = _kept(tmp_path, heads)
    doc = heads.heads_doc("tiny", ["triviaqa", "truthfulqa"], "triviaqa", seed=0, k=5)
    assert doc["rows_with_features"] == 59 and doc["folds"] == {"k": 5, "from": "seed"}
    acc = [q["quality"]["Accuracy"] for q in json.loads(
        (tmp_path / "polygraph__triviaqa__tiny.json").read_text())["questions"]]
    for metric in ("Accuracy", "Rouge_rougeL"):
        m = doc["metrics"][metric]
        assert m["anchors"][PROBE] == probe["metrics"][metric]["uncertainty"]
        stack = np.array(m["cross_fitted"][STACKED.name][1:])  # isouq's: calibrate fits it
        assert m["cross_fitted"][STACKED.name][0] is None and np.isfinite(stack).all()
        assert len(m["chosen"][STACKED.name]) == 5 and any(
            HIDDEN in c for c in m["chosen"][STACKED.name])
        assert np.corrcoef(stack, -np.array(acc[1:]))[0, 1] > 0.5
        block = m["cross_fitted"]["isouq block head"]
        assert block[0] is None and all(v is not None for v in block[1:])
        assert not m["transfer"]  # no features of the other dataset


def test_a_probe_of_other_answers_or_folds_is_refused(heads, tmp_path):
    _kept(tmp_path, heads)
    path = tmp_path / "features" / "triviaqa__tiny.probe.json"
    probe = json.loads(path.read_text())
    for other in ({"keys": probe["keys"][:-1]}, {"folds": probe["folds"][::-1]}):
        path.write_text(json.dumps({**probe, **other}))
        with pytest.raises(DataError, match="run scripts/polygraph/features.py again"):
            heads.heads_doc("tiny", ["triviaqa"], "triviaqa", seed=0, k=5)


def test_features_fits_the_probe_from_cached_states_and_again_when_answers_change(features,
                                                                                  tmp_path):
    rng = np.random.default_rng(1)
    n, d = 80, 6
    X = rng.normal(size=(n, 2, d))  # the label lives in the first layer's state
    acc = (X[:, 0, 0] + 0.3 * rng.normal(size=n) > 0).astype(float)
    kept = {"dataset": "triviaqa", "model": "tiny", "quality_metrics": ["Accuracy"],
            "questions": [{"key": f"q{i}", "quality": {"Accuracy": a}} for i, a in enumerate(acc)]}
    cache = tmp_path / "layers.jsonl"  # the first answer has no states (no features)
    cache.write_text("".join(json.dumps({"key": f"q{i}", "layers": [3, -1],
                                         "states": X[i].tolist()}) + "\n" for i in range(1, n)))
    out = tmp_path / "probe.json"
    features.cross_fit_probe(kept, cache, out, 5, 0)
    doc = json.loads(out.read_text())
    u, chosen = doc["metrics"]["Accuracy"]["uncertainty"], doc["metrics"]["Accuracy"]["chosen"]
    assert doc["keys"] == [q["key"] for q in kept["questions"]] and doc["rows"] == n - 1
    assert "hidden_states[3, -1]" in doc["states"] and u[0] is None and len(chosen) == 5
    assert all("hidden_states[3], C=" in c for c in chosen)  # the telling layer, every fold
    logits = np.array(doc["metrics"]["Accuracy"]["fold_logits"], dtype=float)  # None -> nan
    assert logits.shape == (5, n) and np.isnan(logits[:, 0]).all()
    assert np.isfinite(logits[:, 1:]).all()  # out of fold on training answers, else the probe's
    for i, k in enumerate(range(5)):
        mine = np.flatnonzero(np.array(doc["folds"]) == k)[1 if k == 0 else 0:]
        np.testing.assert_allclose(1 / (1 + np.exp(-logits[i, mine])),
                                   1 - np.array(u, dtype=float)[mine])
    assert np.corrcoef(np.array(u[1:]), -X[1:, 0, 0])[0, 1] > 0.5  # learns the direction
    out.write_text(json.dumps({**doc, "rows": -1}))  # the same answers: left as it is
    features.cross_fit_probe(kept, cache, out, 5, 0)
    assert json.loads(out.read_text())["rows"] == -1
    kept["questions"] = kept["questions"][:-1]  # other answers: made again
    features.cross_fit_probe(kept, cache, out, 5, 0)
    assert json.loads(out.read_text())["rows"] == n - 2


def test_the_stacked_head_moves_with_the_probe_of_the_other_dataset(heads, tmp_path):
    mine = _kept(tmp_path, heads)
    other = _kept(tmp_path, heads, n=80, seed=1, ds="truthfulqa")
    rng = np.random.default_rng(2)

    def telling(acc):
        return [float(v) for v in 3 * acc - 1.5 + rng.normal(size=len(acc))]

    moved = {"keys": mine["keys"], "train_keys": other["keys"],
             "metrics": {m: {"train_logits": telling(other["acc"]),
                             "logits": telling(mine["acc"]), "chosen": "hidden_states[3], C=1"}
                         for m in ("Accuracy", "Rouge_rougeL")}}
    path = tmp_path / "features" / "triviaqa__tiny.probe-from-truthfulqa.json"
    path.write_text(json.dumps(moved))
    doc = heads.heads_doc("tiny", ["triviaqa", "truthfulqa"], "triviaqa", seed=0, k=5)
    name = f"{STACKED.name} (trained on truthfulqa)"
    for metric in ("Accuracy", "Rouge_rougeL"):
        m = doc["metrics"][metric]
        assert "isouq block head (trained on truthfulqa)" in m["transfer"]
        u = m["transfer"][name]
        assert u[0] is None and all(v is not None for v in u[1:])  # answer 0 has no features
        assert np.corrcoef(np.array(u[1:]), -mine["acc"][1:])[0, 1] > 0.5
        assert HIDDEN in m["chosen"][name]
    path.write_text(json.dumps({**moved, "train_keys": other["keys"][:-1]}))
    with pytest.raises(DataError, match="trained on other answers of truthfulqa"):
        heads.heads_doc("tiny", ["triviaqa", "truthfulqa"], "triviaqa", seed=0, k=5)


def test_features_moves_the_probe_to_the_other_dataset_once_every_answer_has_states(features,
                                                                                   tmp_path):
    rng = np.random.default_rng(3)

    def run(ds: str, n: int) -> tuple[dict, Path, np.ndarray]:
        X = rng.normal(size=(n, 2, 6))  # the label lives in the last layer's state
        acc = (X[:, 1, 2] + 0.3 * rng.normal(size=n) > 0).astype(float)
        kept = {"dataset": ds, "model": "tiny", "quality_metrics": ["Accuracy"],
                "questions": [{"key": f"{ds}{i}", "quality": {"Accuracy": a}}
                              for i, a in enumerate(acc)]}
        cache = tmp_path / f"{ds}.layers.jsonl"
        cache.write_text("".join(json.dumps({"key": f"{ds}{i}", "layers": [3, -1],
                                             "states": X[i].tolist()}) + "\n"
                                 for i in range(n)))
        return kept, cache, X

    train, train_cache, _ = run("truthfulqa", 90)
    test, test_cache, X = run("triviaqa", 70)
    # the first test answer has no features (its text did not tokenize back): no states either
    test_cache.write_text("\n".join(test_cache.read_text().splitlines()[1:]) + "\n")
    need = {q["key"] for q in train["questions"] + test["questions"][1:]}
    out = tmp_path / "triviaqa__tiny.probe-from-truthfulqa.json"
    features.transfer_probe(train, test, train_cache, test_cache, out, 0, need)
    doc = json.loads(out.read_text())
    assert doc["keys"] == [q["key"] for q in test["questions"]]
    assert doc["train_keys"] == [q["key"] for q in train["questions"]]
    got = doc["metrics"]["Accuracy"]
    assert got["chosen"].startswith("hidden_states[-1], C=")
    assert len(got["train_logits"]) == 90 and len(got["logits"]) == 70
    assert got["logits"][0] is None and None not in got["logits"][1:] + got["train_logits"]
    assert np.corrcoef(got["logits"][1:], X[1:, 1, 2])[0, 1] > 0.8  # learned elsewhere
    out.write_text(json.dumps({**doc, "seed": -1}))  # the same answers: left as it is
    features.transfer_probe(train, test, train_cache, test_cache, out, 0, need)
    assert json.loads(out.read_text())["seed"] == -1
    out.unlink()
    need.add(test["questions"][0]["key"])  # an answer with features but no states yet
    features.transfer_probe(train, test, train_cache, test_cache, out, 0, need)
    assert not out.exists()  # nothing moved until the states are made again
