"""scripts/polygraph/density.py: LM-Polygraph 0.7.0's train-split estimators (MD, RMD, RDE,
PPL-MD) cross-fitted over folds of saved embeddings, and the embeddings LM-Polygraph computes
for a (prompt, greedy answer) pair. Skipped where LM-Polygraph is not installed (CI's venv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lm_polygraph")
# LM-Polygraph compares float32 distances with its 1e100 / -1e100 min-max sentinels
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

from lm_polygraph.estimators import MahalanobisDistanceSeq  # noqa: E402
from lm_polygraph.stat_calculators.greedy_probs import GreedyProbsCalculator  # noqa: E402
from lm_polygraph.utils.generation_parameters import GenerationParameters  # noqa: E402
from lm_polygraph.utils.model import WhiteboxModel  # noqa: E402

import by_path  # noqa: E402
from isouq.errors import InputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def density():
    return by_path.module("scripts/polygraph/density.py", "polygraph_density")


def gaussian(n: int, d: int, seed: int, shift: float = 0.0) -> np.ndarray:
    """Correlated Gaussian rows (a random full-rank covariance), float32 like LM-Polygraph's."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) / np.sqrt(d) + np.eye(d)
    return (rng.normal(size=(n, d)) @ a.T + 3.0 + shift).astype(np.float32)


def md_numpy(train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Mahalanobis distance sqrt((x-mu)' S^-1 (x-mu)), S the unbiased covariance, in float64."""
    train, test = train.astype(np.float64), test.astype(np.float64)
    mu = train.mean(axis=0)
    inv = np.linalg.inv(np.cov(train, rowvar=False))
    diff = test - mu
    return np.sqrt(np.einsum("bi,ij,bj->b", diff, inv, diff))


def per_fold(folds: np.ndarray, fn) -> np.ndarray:
    out = np.full(len(folds), np.nan)
    for k in np.unique(folds):
        out[folds == k] = fn(folds != k, folds == k)
    return out


N, D, K = 300, 8, 5


@pytest.fixture(scope="module")
def data(density):
    emb = gaussian(N, D, seed=1)
    folds = density.assign_folds(N, K, seed=0)
    return emb, folds


# --- (a) exact against an independent computation ----------------------------------------


def test_md_equals_numpy_fitted_on_the_other_folds(density, data):
    emb, folds = data
    got = density.cross_fitted("MahalanobisDistanceSeq", emb, folds)
    want = per_fold(folds, lambda tr, te: md_numpy(emb[tr], emb[te]))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
    # a fit on all rows (each row in its own fit) gives other numbers: the folds matter here
    assert not np.allclose(md_numpy(emb, emb), want, rtol=1e-3)


def test_rmd_is_md_less_the_background_md(density, data):
    emb, folds = data
    bg = gaussian(500, D, seed=2, shift=1.0)
    got = density.cross_fitted("RelativeMahalanobisDistanceSeq", emb, folds, background=bg)
    md, md0 = per_fold(folds, lambda tr, te: md_numpy(emb[tr], emb[te])), md_numpy(bg, emb)
    # a difference of two float32 distances (LM-Polygraph's covariance and distances are
    # float32 for float32 embeddings: ~1e-5 of each here): the error scales with theirs
    assert np.all(np.abs(got - (md - md0)) <= 2e-5 * (md + md0))


def test_pplmd_is_the_mean_of_two_ranks_against_the_training_folds(density, data):
    from sklearn.model_selection import train_test_split

    emb, folds = data
    rng = np.random.default_rng(3)
    lls = [list(-rng.exponential(size=rng.integers(2, 9))) for _ in range(N)]
    got = density.cross_fitted("PPLMDSeq", emb, folds,
                               extra_stats={"greedy_log_likelihoods": lls})
    ppl = np.array([-np.mean(ll) for ll in lls])

    def fold(tr, te):
        fit, val = train_test_split(emb[tr], test_size=0.3, random_state=42)
        train_md = md_numpy(fit, val)
        md = md_numpy(emb[tr], emb[te])
        # LM-Polygraph's rank: the share of training values at or below the row's value
        rank = lambda x, ref: np.array([(v >= ref).sum() for v in x]) / len(ref)  # noqa: E731
        return (rank(ppl[te], ppl[tr]) + rank(md, train_md)) / 2

    want = per_fold(folds, fold)
    # ranks: equal except where float32 MD and float64 MD straddle a training value
    assert np.mean(np.abs(got - want) < 1e-9) > 0.97 and np.max(np.abs(got - want)) < 0.02


def test_pplmd_from_kept_perplexities_equals_token_level(density, data):
    """A kept Perplexity p as greedy_log_likelihoods [-p] gives PPL-MD's exact value."""
    emb, folds = data
    rng = np.random.default_rng(4)
    lls = [list(-rng.exponential(size=rng.integers(2, 9))) for _ in range(N)]
    ppl = [-float(np.mean(ll)) for ll in lls]
    a = density.cross_fitted("PPLMDSeq", emb, folds, extra_stats={"greedy_log_likelihoods": lls})
    b = density.cross_fitted("PPLMDSeq", emb, folds,
                             extra_stats={"greedy_log_likelihoods": [[-p] for p in ppl]})
    np.testing.assert_array_equal(a, b)


def test_rde_is_lm_polygraphs_recipe_fitted_on_the_other_folds(density):
    from sklearn.covariance import MinCovDet
    from sklearn.decomposition import KernelPCA

    # MinCovDet on LM-Polygraph's 100 kernel-PCA components takes ~20 s a fit: two folds,
    # the independent fit for one of them
    emb = gaussian(300, 16, seed=5)
    folds = density.assign_folds(300, 2, seed=0)
    got = density.cross_fitted("RDESeq", emb, folds)
    pca = KernelPCA(n_components=100, kernel="rbf", random_state=42, gamma=None)
    mcd = MinCovDet(random_state=42).fit(pca.fit_transform(emb[folds == 1]))
    want = mcd.mahalanobis(pca.transform(emb[folds == 0]))  # sklearn's: the squared distance
    np.testing.assert_allclose(got[folds == 0], want, rtol=1e-6)
    assert np.all(np.isfinite(got[folds == 1]))


# --- (b) a fold's rows do not depend on each other -----------------------------------------


@pytest.mark.parametrize("name", ["MahalanobisDistanceSeq", "RelativeMahalanobisDistanceSeq",
                                  "PPLMDSeq"])
def test_a_rows_score_ignores_its_own_folds_other_rows(density, data, name):
    emb, folds = data
    bg = gaussian(500, D, seed=2, shift=1.0)
    lls = {"greedy_log_likelihoods": [[-0.01 * i] for i in range(N)]}
    kw = dict(background=bg, extra_stats=lls)
    base = density.cross_fitted(name, emb, folds, **kw)
    k, other = 0, 1
    rows = np.flatnonzero(folds == k)
    # replace every other row of fold k: row rows[0]'s score must not move
    moved = emb.copy()
    moved[rows[1:]] = gaussian(len(rows) - 1, D, seed=9, shift=5.0)
    after = density.cross_fitted(name, moved, folds, **kw)
    assert after[rows[0]] == pytest.approx(base[rows[0]], rel=1e-6, abs=1e-9)
    # the same change does move the other folds' scores: their fits include fold k's rows
    assert not np.allclose(after[folds == other], base[folds == other], rtol=1e-3)
    # a row scored alone gets the score it gets with its fold
    est = density.make_estimator(name)
    alone = density.fold_stats(emb, folds, k, bg, lls)
    alone["embeddings_decoder"] = alone["embeddings_decoder"][:1]
    alone["greedy_log_likelihoods"] = alone["greedy_log_likelihoods"][:1]
    assert float(np.asarray(est(alone))[0]) == pytest.approx(base[rows[0]], rel=1e-6, abs=1e-9)


def test_an_estimator_object_keeps_its_first_fit(data):
    """Why every fold gets a new object: LM-Polygraph fits on its first call and never again."""
    emb, _ = data
    est = MahalanobisDistanceSeq()
    x = emb[:5]
    first = est({"embeddings_decoder": x, "train_embeddings_decoder": emb[100:200]})
    again = est({"embeddings_decoder": x, "train_embeddings_decoder": emb[200:300]})
    np.testing.assert_array_equal(first, again)
    fresh = MahalanobisDistanceSeq()({"embeddings_decoder": x,
                                      "train_embeddings_decoder": emb[200:300]})
    assert not np.allclose(fresh, first, rtol=1e-3)


def test_bad_input_is_refused_in_one_line(density, data):
    emb, folds = data
    with pytest.raises(InputError, match="background"):
        density.cross_fitted("RelativeMahalanobisDistanceSeq", emb, folds)
    with pytest.raises(InputError, match="greedy_log_likelihoods"):
        density.cross_fitted("PPLMDSeq", emb, folds)
    with pytest.raises(InputError, match="one of"):
        density.cross_fitted("SAPLMA", emb, folds)
    with pytest.raises(InputError, match="single fold"):
        density.cross_fitted("MahalanobisDistanceSeq", emb, np.zeros(N, dtype=int))
    with pytest.raises(InputError, match="parameters_path"):
        density.cross_fitted("MahalanobisDistanceSeq", emb, folds, parameters_path="/tmp/x")
    with pytest.raises(InputError, match="folds must be"):
        density.cross_fitted("MahalanobisDistanceSeq", emb, folds[:-1])


# --- (c) the embeddings equal LM-Polygraph's own calculator's ------------------------------

MAX_NEW = 4


def whitebox(family: str, instruct: bool) -> WhiteboxModel:
    import tiny

    tok = tiny.tokenizer()
    tok.padding_side = "left"
    return WhiteboxModel(tiny.causal_lm(family), tok, "tiny", "CausalLM",
                         GenerationParameters(max_new_tokens=MAX_NEW), instruct=instruct)


def polygraph_stats(model: WhiteboxModel, texts: list[str]) -> dict:
    calc = GreedyProbsCalculator(output_attentions=False, output_hidden_states=True)
    return calc({}, texts, model, MAX_NEW)


TEXTS = ["what is the capital of france", "who wrote hamlet answer", "why is the sky blue"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("instruct", [False, True])
def test_embeddings_equal_lm_polygraphs_for_a_batch_of_one(density, family, instruct):
    model = whitebox(family, instruct)
    prompts, answers, want = [], [], []
    for text in TEXTS:
        st = polygraph_stats(model, [text])
        assert st["input_tokens"][0] == density.prompt_token_ids(model.tokenizer, text, instruct)
        prompts.append(st["input_tokens"][0])
        answers.append(st["greedy_tokens"][0])
        want.append(st["embeddings_decoder"][0])
    want = np.stack(want)
    for batch_size in (1, 3):
        got = density.sequence_embeddings(model.model, prompts, answers, batch_size=batch_size)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # not the mean over the prompt alone, nor over every answer token: the positions matter
    alone = density.sequence_embeddings(model.model, prompts, [[]] * len(prompts))
    longer = density.sequence_embeddings(model.model, prompts, [a + [3] for a in answers])
    assert not np.allclose(alone, want, atol=1e-4) and not np.allclose(longer, want, atol=1e-4)


def test_layer_embeddings_are_each_layers_mean_state_from_one_forward(density):
    import torch

    model = whitebox("qwen2", True)
    n_layers = model.model.config.num_hidden_layers
    from isouq.hidden import probe_layers

    layers = probe_layers(n_layers)
    assert layers[-1] == -1 and all(1 <= k <= n_layers for k in layers[:-1])
    assert probe_layers(32) == [8, 16, 24, -1]
    prompts = [density.prompt_token_ids(model.tokenizer, t, True) for t in TEXTS]
    answers = [[5, 9, 11], [7], [4, 4]]
    got = density.layer_embeddings(model.model, prompts, answers, layers, batch_size=3)
    assert got.shape == (3, len(layers), model.model.config.hidden_size)
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        with torch.no_grad():  # by hand: one sequence, the last answer token not fed
            hs = model.model(input_ids=torch.tensor([p + a[:-1]]),
                             output_hidden_states=True).hidden_states
        for j, k in enumerate(layers):
            np.testing.assert_allclose(got[i, j], hs[k][0].mean(0).numpy(), rtol=1e-5,
                                       atol=1e-6)
    np.testing.assert_allclose(got[:, -1], density.sequence_embeddings(
        model.model, prompts, answers), rtol=1e-5, atol=1e-6)

def test_a_batched_lm_polygraph_embedding_averages_its_padding_too(density):
    """In a batch, LM-Polygraph averages over the batch's left padding as well: the row with
    the longest prompt gets the batch-of-one value, a shorter one does not."""
    model = whitebox("llama", False)
    texts = ["what is the capital of france", "why"]
    st = polygraph_stats(model, texts)
    assert all(len(t) == MAX_NEW for t in st["greedy_tokens"])  # no row stopped early
    lens = [len(density.prompt_token_ids(model.tokenizer, t, False)) for t in texts]
    assert lens[0] > lens[1]
    alone = density.sequence_embeddings(
        model.model, [density.prompt_token_ids(model.tokenizer, t, False) for t in texts],
        st["greedy_tokens"])
    np.testing.assert_allclose(st["embeddings_decoder"][0], alone[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(st["embeddings_decoder"][1], alone[1], atol=1e-3)


def test_kept_answers_are_trimmed_to_what_a_batch_of_one_generates(density):
    import tiny

    tok = tiny.tokenizer()  # pad [PAD]=0 differs from eos [EOS]=3
    cat, dog = tok.convert_tokens_to_ids(["cat", "dog"])
    assert density.answer_ids_for_embedding([cat, dog, 0, 0], tok) == [cat, dog]
    assert density.answer_ids_for_embedding([cat, dog, 3], tok) == [cat, dog, 3]
    # where pad == eos, an end token right after a stop string was padding
    tok.pad_token = tok.eos_token
    assert density.answer_ids_for_embedding([cat, dog, 3], tok, stop_strings=["dog"]) == [cat, dog]
    assert density.answer_ids_for_embedding([cat, dog, 3], tok, stop_strings=["\n"]) == [cat, dog, 3]
    assert density.answer_ids_from_text(tok, "cat dog", 3) == [cat, dog, 3]
    assert density.answer_ids_from_text(tok, "cat dog", 2) == [cat, dog]
    assert density.answer_ids_from_text(tok, "cat dog", 5) is None


def test_background_embeddings_are_the_prompts_mean(density):
    model = whitebox("llama", True)
    texts = ["the cat sat on the mat because the dog sat on the rock", "what is the moon made of"]
    bg = density.background_embeddings(model.model, model.tokenizer, texts, True,
                                       max_prompt_tokens=6)
    prompts = [density.prompt_token_ids(model.tokenizer, " ".join(t.split()[:6]), True)
               for t in texts]
    want = np.stack([model.model(input_ids=torch.tensor([p]), output_hidden_states=True)
                     .hidden_states[-1][0].mean(0).detach().numpy() for p in prompts])
    np.testing.assert_allclose(bg, want, rtol=1e-5, atol=1e-6)
