"""Proxy-covariance bias experiments (paper §3.1, App. A): Fisher/Laplace pieces against dense
references, the statistics against scipy, the 20 Newsgroups loader, and quick end-to-end runs."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from isouq.covariance import Dense
from isouq.data import newsgroups as ng
from isouq.errors import DataError, InputError
from isouq.models import toy as tm
from isouq.study.experiments import proxy_bias_2d as p2
from isouq.study.experiments import proxy_bias_text as pt
from isouq.study.experiments.proxy_bias_text import training as pt_training


def _head(H: int = 5, C: int = 4, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    head = nn.Linear(H, C).double()
    with torch.no_grad():
        head.weight.mul_(3.0)
    return head


def _flat_grad(out: torch.Tensor, params) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(out, list(params))])


# --------------------------------------------------------------------------- linear head


def test_head_empirical_fisher_matches_hand_written_sum():
    head = _head()
    X = torch.randn(9, 5, dtype=torch.float64)
    y = torch.randint(0, 4, (9,))
    ref = torch.zeros(24, 24, dtype=torch.float64)
    for x, t in zip(X, y, strict=True):
        loss = nn.functional.cross_entropy(head(x[None]), t[None], reduction="sum")
        g = _flat_grad(loss, [head.weight, head.bias])
        ref += torch.outer(g, g)
    H = pt.head_fisher(head, X, y)
    torch.testing.assert_close(H, ref, rtol=1e-10, atol=1e-10)
    G = pt.nll_gradients(head, X, y)  # closed form, same order
    torch.testing.assert_close(G.T @ G, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [3, 40])  # n < P (Woodbury) and n > P (dense)
def test_laplace_quadratic_against_explicit_inverse(n):
    head = _head()
    X, y = torch.randn(n, 5, dtype=torch.float64), torch.randint(0, 4, (n,))
    J = torch.randn(7, 24, dtype=torch.float64)
    lam = 0.7
    H = pt.head_fisher(head, X, y)
    ref = torch.einsum("np,pq,nq->n", J, torch.linalg.inv(H + lam * torch.eye(24, dtype=H.dtype)), J)
    for solver in ("dense", "lowrank", "auto"):
        cov = pt.laplace_covariance(head, X, y, lam, solver)
        torch.testing.assert_close(cov.quadratic(J), ref, rtol=1e-8, atol=1e-12)
    low = pt.LowRankLaplace(pt.nll_gradients(head, X, y), lam)
    torch.testing.assert_close(low.quadratic(J), Dense(H, lam).quadratic(J), rtol=1e-8, atol=1e-12)
    with pytest.raises(InputError):
        pt.laplace_covariance(head, X, y, lam, "cholesky")


def test_predicted_class_gradients_match_autograd():
    head = _head()
    X = torch.randn(6, 5, dtype=torch.float64)
    G, pred = pt.predicted_class_gradients(head, X)
    assert G.shape == (6, 24)
    for i, x in enumerate(X):
        p = torch.softmax(head(x[None]), -1)[0]
        assert int(pred[i]) == int(p.argmax())
        torch.testing.assert_close(G[i], _flat_grad(p[p.argmax()], [head.weight, head.bias]))
    u = pt.epistemic_under(pt.Identity(), G)
    np.testing.assert_allclose(u, (G**2).sum(1).numpy())


# --------------------------------------------------------------------------- 2D pieces


def test_half_fishers_and_maps_against_dense_reference():
    torch.manual_seed(0)
    model = tm.build(tm.mlp2(2, 4, 1), seed=1).double()
    X = torch.randn(12, 2, dtype=torch.float64)
    y = (X[:, 0] * X[:, 1] > 0).long()
    top = X[:, 1] > 0
    H_A, H_B = p2.half_fishers(model, X, y, top)
    params = list(model.parameters())
    P = sum(p.numel() for p in params)

    def ef(mask):
        out = torch.zeros(P, P, dtype=torch.float64)
        for x, t in zip(X[mask], y[mask], strict=True):
            loss = nn.functional.binary_cross_entropy_with_logits(model(x[None])[:, 0],
                                                                  t[None].double())
            g = _flat_grad(loss, params)
            out += torch.outer(g, g)
        return out

    torch.testing.assert_close(H_A, ef(top), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(H_B, ef(~top), rtol=1e-9, atol=1e-10)
    pts = torch.randn(5, 2, dtype=torch.float64)
    maps = p2.uncertainty_maps(model, pts, H_A, H_B, prior_precision=1.0)
    eye = torch.eye(P, dtype=torch.float64)
    for i, x in enumerate(pts):
        g = _flat_grad(torch.sigmoid(model(x[None]))[0, 0], params)
        assert maps["identity"][i] == pytest.approx(float(g @ g), rel=1e-6)
        assert maps["U_A"][i] == pytest.approx(float(g @ torch.linalg.inv(H_A + eye) @ g), rel=1e-6)
        assert maps["U_B"][i] == pytest.approx(float(g @ torch.linalg.inv(H_B + eye) @ g), rel=1e-6)


# --------------------------------------------------------------------------- statistics


def test_welch_and_cohens_d_against_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 40), rng.normal(0.8, 2, 55)
    w = p2.welch_test(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert w["t"] == pytest.approx(ref.statistic) and w["p"] == pytest.approx(ref.pvalue)
    assert w["log10_p"] == pytest.approx(math.log10(ref.pvalue))
    far = p2.welch_test(np.r_[a, a, a] - 500, np.r_[b, b, b])
    assert far["p"] == 0.0 and far["log10_p"] < -300  # p itself underflows to 0
    sp = math.sqrt((39 * a.var(ddof=1) + 54 * b.var(ddof=1)) / 93)
    assert w["cohens_d"] == pytest.approx((a.mean() - b.mean()) / sp)
    assert p2.cohens_d(np.array([1.0, 2, 3]), np.array([2.0, 3, 4])) == pytest.approx(-1.0)


def test_ratios_normalization_and_symmetry_stats():
    assert np.allclose(p2.normalize01(np.array([2.0, 4, 6])), [0, 0.5, 1])
    assert np.allclose(p2.normalize01(np.ones(3)), 0)
    pts = torch.tensor([[0.0, 1.0], [1.0, 2.0], [0.0, -1.0], [1.0, -2.0], [5.0, 0.0]])
    top, bottom = p2.half_masks(pts)
    assert top.tolist() == [True, True, False, False, False]
    assert bottom.tolist() == [False, False, True, True, False]
    u = np.array([1.0, 3.0, 2.0, 2.0, 100.0])
    assert p2.top_bottom_ratio(u, top, bottom) == pytest.approx(1.0)
    # a map symmetric under x2 -> -x2: r = 1 everywhere; U_A a mirror of U_B: t < 0
    rng = np.random.default_rng(1)
    base = rng.uniform(1, 2, 4)
    sym = np.concatenate([base, base, [1.5]])
    pts = torch.tensor([[i, 1.0 + i] for i in range(4)] + [[i, -1.0 - i] for i in range(4)]
                       + [[0.0, 0.0]])
    UA = np.concatenate([base, 5 * base, [1.5]])
    UB = np.concatenate([5 * base, base, [1.5]])
    s = p2.symmetry_stats({"identity": sym, "U_A": UA + rng.uniform(0, .1, 9), "U_B": UB}, pts)
    assert s["r_id"] == pytest.approx(1.0)
    assert s["r_A"] < 1 < s["r_B"] and s["t"] < 0 and s["cohens_d"] < 0
    assert s["n_top"] == s["n_bottom"] == 4


def test_seed_summary():
    rows = [{"r_id": 1.0, "r_A": 0.1, "r_B": 9.0, "t": -10.0, "cohens_d": -2.0},
            {"r_id": 1.2, "r_A": 0.3, "r_B": 7.0, "t": -20.0, "cohens_d": -3.0}]
    s = p2.seed_summary("xor", rows)
    assert s["n_seeds"] == 2 and s["r_id_mean"] == pytest.approx(1.1)
    assert s["cohens_d_sd"] == pytest.approx(np.std([-2.0, -3.0], ddof=1))


def test_cv_row_normalization_and_domain_ratios():
    # the paper's representative row (table in §3.1): CV 0.13 with ddof 0
    assert pt.cv([0.99, 1.05, 1.16, 0.80]) == pytest.approx(0.13, abs=0.005)
    assert pt.cv([0.83, 1.25, 0.75, 1.17]) == pytest.approx(0.21, abs=0.005)
    r = pt.row_normalize({"a": 1.0, "b": 3.0})
    assert r == {"a": 0.5, "b": 1.5}
    doms = np.array(["sci", "sci", "comp", "rec", "talk", ""])
    ref = np.array([1.0, 3.0, 2.0, 4.0, 1.0, 9.0])
    u = 2 * ref
    u[2] = 8.0
    got = pt.domain_ratios(u, ref, doms)
    assert got == pytest.approx({"sci": 2.0, "comp": 4.0, "rec": 2.0, "talk": 2.0})
    c = pt.correlations(u, ref)
    assert c["spearman"] == pytest.approx(stats.spearmanr(u, ref).statistic)
    assert c["pearson"] == pytest.approx(stats.pearsonr(u, ref).statistic)


def test_combinations_and_proxy_sampling():
    combos = pt.combinations()
    assert len(combos) == 14
    assert [len(c) for c in combos].count(1) == 4
    assert [len(c) for c in combos].count(2) == 6 and [len(c) for c in combos].count(3) == 4
    labels = np.repeat(np.arange(20), 30)
    groups = np.array([ng.group_of(ng.CATEGORIES[c]) for c in labels], dtype=object)
    sets = pt.proxy_sets(groups, labels, 60, seed=0)
    assert len(sets) == 15
    for name, idx in sets.items():
        assert len(idx) == 60 and len(np.unique(idx)) == 60
        if name != "representative":
            parts = name.split("+")
            counts = [int((groups[idx] == g).sum()) for g in parts]
            assert set(groups[idx]) == set(parts) and max(counts) - min(counts) <= 1
    rep = sets["representative"]
    assert np.bincount(labels[rep], minlength=20).tolist() == [3] * 20
    four = pt.proxy_sets(groups, labels, 60, 0, representative="four-groups")["representative"]
    assert sorted(set(groups[four])) == sorted(ng.GROUPS)


def test_build_tables_fields():
    rng = np.random.default_rng(0)
    doms = np.array(list(ng.GROUPS) * 5 + [""] * 2, dtype=object)
    ref = rng.uniform(1, 2, doms.size)
    U = {"identity": ref * rng.uniform(0.9, 1.1, doms.size), "representative": ref * 1.0}
    for c in pt.combinations():
        U["+".join(c)] = ref * np.where(np.isin(doms, c), 0.5, 1.0)
    t = pt.build_tables(U, ref, doms)
    assert [r["covariance"] for r in t["correlation_vs_full"]][:6] == [
        "representative", "identity", "sci", "comp", "rec", "talk"]
    singles = [r for r in t["domain_ratios"] if r["n_domains"] == 1]
    assert all(r["lowest_domain"] == r["covariance"] for r in singles)
    assert t["summary"][0]["singles_lowest_on_own_domain"] == 4
    assert t["summary"][0]["combinations"] == 14
    assert [r["n"] for r in t["combination_cv"]] == [1, 4, 6, 4, 1]
    rep = next(r for r in t["domain_ratios"] if r["covariance"] == "representative")
    assert rep["cv"] == pytest.approx(0.0) and rep["sci"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- 20 Newsgroups


def _write_corpus(folder: Path, per_class: dict[str, int], seed: int = 0) -> None:
    """Tiny fake 20NG: class c's documents use the words w{c}_*, plus shared filler."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, k in per_class.items():
        with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for c, name in enumerate(ng.CATEGORIES):
                for j in range(k):
                    words = [f"w{c}x{rng.integers(4)}" for _ in range(12)]
                    words += [f"filler{rng.integers(10)}" for _ in range(8)]
                    rng.shuffle(words)
                    row = {"id": f"{name}/{j}", "split": split, "label": c,
                           "label_name": name, "text": " ".join(words)}
                    f.write(json.dumps(row) + "\n")


def test_newsgroups_loader_paths(tmp_path, monkeypatch):
    _write_corpus(tmp_path / "a", {"train": 2, "test": 1})
    d = ng.load_newsgroups("train", path=tmp_path / "a")
    assert len(d) == 40 and d.labels.tolist()[:3] == [0, 0, 1]
    assert d.groups()[1] == "" and d.groups()[2] == "comp"
    assert len(ng.load_newsgroups("test", path=tmp_path / "a" / "test.jsonl.gz")) == 20
    monkeypatch.setenv("ISOUQ_DATA", str(tmp_path / "a"))
    assert ng.find_local("test") == tmp_path / "a" / "test.jsonl.gz"
    with pytest.raises(DataError):
        ng.load_newsgroups("train", path=tmp_path / "missing")
    monkeypatch.setattr(ng, "candidate_dirs", lambda path=None: [tmp_path / "empty"])
    with pytest.raises(DataError, match="not found"):
        ng.load_newsgroups("train", online=False)
    with pytest.raises(InputError):
        ng.load_newsgroups("dev", online=False)
    assert ng.group_labels("rec") == [7, 8, 9, 10]
    assert ng.strip_texts(["Subject: x\n\nbody"], ["headers"]) == ["body"]


# --------------------------------------------------------------------------- end to end


def test_proxy_bias_2d_quick_run(tmp_path):
    path = p2.run(tmp_path, quick=True, seed=0, problems=["xor"])
    doc = json.loads(path.read_text())
    assert doc["experiment"] == p2.NAME
    row = doc["tables"]["symmetry"][0]
    assert {"r_id", "r_A", "r_B", "t", "p", "cohens_d"} <= set(row)
    assert row["r_A"] < 1 < row["r_B"] and row["t"] < 0 and row["cohens_d"] < 0
    assert doc["paper"]["symmetry"][1]["t"] == -19.6
    assert (tmp_path / "proxy_bias_2d_xor.png").is_file() and (tmp_path / "tables.md").is_file()
    assert doc["tables"]["models"][0]["n_params"] == 1185


def _tiny_encoder(folder: Path, corpus: Path) -> Path:
    """A random 2-layer BERT (hidden 16) and a WordPiece tokenizer trained on the corpus."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    texts = [json.loads(line)["text"] for line in gzip.open(corpus / "train.jsonl.gz", "rt")]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300,
                                                             special_tokens=special))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(folder)
    return folder


def test_proxy_bias_text_quick_run_and_cache(tmp_path):
    corpus = tmp_path / "ng"
    _write_corpus(corpus, {"train": 4, "test": 2})
    enc = _tiny_encoder(tmp_path / "enc", corpus)
    opts = dict(encoder=str(enc), data=str(corpus), n_proxy=8, n_test=40, max_length=24,
                lr=3e-3, epochs=2, max_train_docs=None, max_test_docs=None)
    out = tmp_path / "run"
    doc = json.loads(pt.run(out, quick=True, seed=0, **opts).read_text())
    assert doc["experiment"] == pt.NAME
    s = doc["settings"]
    assert s["hidden_size"] == 16 and s["head_params"] == 20 * 17
    assert s["n_train_docs"] == 80 and s["n_test"] == 40 and s["epochs"] == 2
    t = doc["tables"]
    corr = {r["covariance"]: r for r in t["correlation_vs_full"]}
    assert {"identity", "representative", *ng.GROUPS, "sci+comp+rec"} <= set(corr)
    assert len(corr) == 16 and all(-1 <= r["spearman"] <= 1 for r in corr.values())
    assert len(t["domain_ratios"]) == 16
    assert all(r["cv"] >= 0 for r in t["domain_ratios"])
    assert [r["n"] for r in t["combination_cv"]] == [1, 4, 6, 4, 1]
    assert t["summary"][0]["combinations"] == 14
    assert 0 <= t["accuracy"][0]["test_accuracy"] <= 1
    assert t["timing"][0]["model_from_cache"] is False
    assert set(doc["paper"]) >= {"correlation_vs_full", "domain_ratios", "combination_cv"}
    assert (out / "proxy_bias_text.png").is_file() and (out / "test_scores.csv").is_file()
    assert (out / "cache" / "model" / "head.pt").is_file()
    # a re-run reuses the fine-tuned model and the features, and gives the same numbers
    again = json.loads(pt.run(out, quick=True, seed=0, **opts).read_text())
    assert again["tables"]["timing"][0]["model_from_cache"] is True
    assert again["tables"]["correlation_vs_full"] == t["correlation_vs_full"]


def test_fine_tune_resumes_from_checkpoint(tmp_path, monkeypatch):
    corpus = tmp_path / "ng"
    _write_corpus(corpus, {"train": 1})
    enc_dir = _tiny_encoder(tmp_path / "enc", corpus)
    data = ng.load_newsgroups("train", path=corpus)
    cfg = pt.TrainConfig(encoder=str(enc_dir), max_length=16, epochs=1, lr=1e-3, batch_size=4)
    _, tok = pt.load_encoder(str(enc_dir))
    ids = pt.tokenize(tok, data.texts, 16)

    def fresh():
        torch.manual_seed(0)
        m = pt.EncoderClassifier(pt.load_encoder(str(enc_dir))[0], 20, "cls")
        for mod in m.modules():  # no dropout: the runs must agree exactly
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
        return m

    full = fresh()
    assert pt.fine_tune(full, ids, data.labels, cfg, pad_id=tok.pad_token_id)["steps"] == 5
    state, real, calls = tmp_path / "state.pt", pt.collate, []

    def interrupted(*a, **k):  # the 4th batch never comes: the run dies after step 3
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(pt_training, "collate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pt.fine_tune(fresh(), ids, data.labels, cfg, pad_id=tok.pad_token_id, state_file=state,
                     checkpoint_every=2)
    monkeypatch.setattr(pt_training, "collate", real)
    resumed = fresh()
    info = pt.fine_tune(resumed, ids, data.labels, cfg, pad_id=tok.pad_token_id,
                        state_file=state, checkpoint_every=2)
    assert info["resumed_at"] == 2
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)
