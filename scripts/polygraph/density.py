"""LM-Polygraph 0.7.0's train-split ("density-based") estimators, cross-fitted on saved embeddings.

LM-Polygraph fits ``MahalanobisDistanceSeq`` (MD), ``RelativeMahalanobisDistanceSeq`` (RMD),
``RDESeq`` (RDE) and ``PPLMDSeq`` on the hidden states of a separate training split (and, for
RMD, of a C4 background corpus) that its ``TrainingStatisticExtractionCalculator`` generates.
Here the training split is the other folds of the same kept rows: :func:`cross_fitted` scores
fold k with a FRESH estimator object of LM-Polygraph's own class whose training stats are the
rows of the other folds, so no row is scored by a fit that saw it.

The embeddings are those LM-Polygraph computes for a (prompt, greedy answer) pair
(``stat_calculators/embeddings.py`` ``get_embeddings_from_output``, called by
``GreedyProbsCalculator`` with ``output_hidden_states=True``): the final hidden state
(``hidden_states[-1]``: the last decoder layer after the model's final norm) averaged over
every position the generation fed the model, i.e. the prompt tokens and the answer tokens but
the last (the last generated token is never fed back). :func:`sequence_embeddings` recomputes
them in one forward pass per pair with ``output_hidden_states=True``; it equals LM-Polygraph's
value for a question generated alone (a batch of one). In LM-Polygraph's batched generation the
mean also runs over the batch's left padding and the padding fed after a row has stopped, so
its value depends on the batch's other questions; that is not reproduced
(:func:`answer_ids_for_embedding` trims such padding from a kept answer's tokens).

Background for RMD (LM-Polygraph: 1,000 C4 documents, a download): :func:`background_texts`
gives documents of the shipped 20 Newsgroups (train split; headers, footers and quotes
stripped, as generic prose), embedded by :func:`background_embeddings` as LM-Polygraph embeds
a background document: the document as the prompt (through the chat template for an instruct
model), here truncated and without the greedy continuation unless asked for.

Runs in .venv-polygraph (LM-Polygraph 0.7.0, torch, transformers, scikit-learn)::

    from density import cross_fitted, sequence_embeddings
    emb = sequence_embeddings(model, prompt_ids, answer_ids)          # (n, d) float32
    md = cross_fitted("MahalanobisDistanceSeq", emb, folds)           # (n,)
    rmd = cross_fitted("RelativeMahalanobisDistanceSeq", emb, folds, background=bg)
    pplmd = cross_fitted("PPLMDSeq", emb, folds,
                         extra_stats={"greedy_log_likelihoods": [[-ppl] for ppl in ppls]})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from isouq.errors import InputError

#: LM-Polygraph 0.7.0's estimators fitted on a training split (all that it ships): their
#: stats beyond the scored rows' ``embeddings_decoder`` and the training rows'
#: ``train_embeddings_decoder``.
ESTIMATORS: dict[str, tuple[str, ...]] = {
    "MahalanobisDistanceSeq": (),
    "RelativeMahalanobisDistanceSeq": ("background_train_embeddings_decoder",),
    "RDESeq": (),
    # md_type="MD" (default) or "RMD" (then it needs the background too)
    "PPLMDSeq": ("greedy_log_likelihoods", "train_greedy_log_likelihoods"),
}
#: LM-Polygraph's default background size (``subsample_background_train_dataset: 1000``).
BACKGROUND_SIZE = 1000
#: The stop strings of the kept benchmark (configs/polygraph/polygraph_eval.yaml).
STOP_STRINGS = ("\n", "Question:")


def _needs_background(estimator: str, kwargs: Mapping) -> bool:
    return estimator == "RelativeMahalanobisDistanceSeq" or (
        estimator == "PPLMDSeq" and kwargs.get("md_type", "MD") == "RMD")


def make_estimator(estimator: str, **kwargs):
    """A new, unfitted LM-Polygraph estimator of that class (fitted state lives on the object).

    Args:
        estimator: one of :data:`ESTIMATORS`.
        **kwargs: the class's own arguments (e.g. ``md_type="RMD"`` for ``PPLMDSeq``), except
            ``parameters_path`` (a fit cached on disk would be reused by the next fold) and
            ``normalize`` (it rescales by the min and max over the rows scored so far, so one
            row's score would depend on the others).

    Returns:
        The estimator object, ``embeddings_type="decoder"`` (a causal LM's only embeddings).
    """
    import lm_polygraph.estimators as est

    if estimator not in ESTIMATORS:
        raise InputError(f"estimator {estimator!r} is not one of LM-Polygraph 0.7.0's train-split "
                         f"estimators; use one of {', '.join(ESTIMATORS)}")
    for bad, why in (("parameters_path", "a fit cached on disk would leak into the next fold"),
                     ("normalize", "it makes a row's score depend on the other rows scored")):
        if kwargs.get(bad):
            raise InputError(f"{bad}={kwargs[bad]!r}: {why}; leave it out")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("parameters_path", "normalize")}
    return getattr(est, estimator)(embeddings_type="decoder", parameters_path=None,
                                   normalize=False, **kwargs)


def _rows(values, idx: np.ndarray):
    if isinstance(values, np.ndarray):
        return values[idx]
    return [values[i] for i in idx]


def fold_stats(embeddings: np.ndarray, folds: np.ndarray, k, background: np.ndarray | None,
               extra_stats: Mapping[str, Sequence] | None) -> dict:
    """The ``stats`` an estimator sees when scoring fold ``k``: LM-Polygraph's names.

    Args:
        embeddings: (n, d) every row's ``embeddings_decoder``.
        folds: (n,) each row's fold.
        k: the fold to score.
        background: (m, d) ``background_train_embeddings_decoder`` or None.
        extra_stats: per-row stats (each of length n), e.g. ``greedy_log_likelihoods``; fold k's
            rows go in under the name, the other folds' rows under ``train_`` + the name.

    Returns:
        ``{"embeddings_decoder": fold k's rows, "train_embeddings_decoder": the others', ...}``.
    """
    test, train = np.flatnonzero(folds == k), np.flatnonzero(folds != k)
    stats = {"embeddings_decoder": embeddings[test], "train_embeddings_decoder": embeddings[train]}
    if background is not None:
        stats["background_train_embeddings_decoder"] = background
    for name, values in (extra_stats or {}).items():
        stats[name] = _rows(values, test)
        stats["train_" + name] = _rows(values, train)
    return stats


def _check(estimator: str, embeddings, folds, background, extra_stats, kwargs):
    if estimator not in ESTIMATORS:
        raise InputError(f"estimator {estimator!r} is not one of LM-Polygraph 0.7.0's train-split "
                         f"estimators; use one of {', '.join(ESTIMATORS)}")
    if not isinstance(embeddings, np.ndarray) or embeddings.ndim != 2:
        raise InputError("embeddings must be a 2-D numpy array (rows, hidden size); "
                         "stack the rows' embeddings_decoder")
    n, d = embeddings.shape
    folds = np.asarray(folds)
    if folds.shape != (n,) or not np.issubdtype(folds.dtype, np.integer):
        raise InputError(f"folds must be {n} integers, one per embedding row; got shape "
                         f"{folds.shape} of {folds.dtype}")
    if len(np.unique(folds)) < 2:
        raise InputError("folds has a single fold: nothing would be left to fit on; "
                         "give the rows at least two folds")
    if _needs_background(estimator, kwargs):
        if background is None:
            raise InputError(f"{estimator} needs background embeddings (LM-Polygraph's "
                             "background_train_embeddings, C4 by default); pass background= "
                             "(m, d), e.g. from background_embeddings(background_texts())")
        if background.ndim != 2 or background.shape[1] != d:
            raise InputError(f"background must be (m, {d}) like the embeddings; got "
                             f"{background.shape}")
    if estimator == "PPLMDSeq" and "greedy_log_likelihoods" not in (extra_stats or {}):
        raise InputError("PPLMDSeq needs each row's greedy_log_likelihoods (its perplexity); pass "
                         "extra_stats={'greedy_log_likelihoods': per-row lists} (a kept "
                         "Perplexity p gives [-p])")
    for name, values in (extra_stats or {}).items():
        if len(values) != n:
            raise InputError(f"extra_stats[{name!r}] has {len(values)} rows, embeddings {n}; "
                             "give one value per row")
    return folds


def cross_fitted(estimator: str, embeddings: np.ndarray, folds: np.ndarray,
                 background: np.ndarray | None = None,
                 extra_stats: Mapping[str, Sequence] | None = None,
                 **estimator_kwargs) -> np.ndarray:
    """An LM-Polygraph train-split estimator's score of every row, each fitted without it.

    For each fold k a new estimator object (:func:`make_estimator`) is fitted on the other
    folds' rows (its ``train_*`` stats) and scores fold k's rows in one call; the fit is cached
    on that object only, so no fold's fit reaches another's.

    Args:
        estimator: a name in :data:`ESTIMATORS`.
        embeddings: (n, d) every row's ``embeddings_decoder`` (:func:`sequence_embeddings`);
            passed as given (LM-Polygraph's are float32 for a float32 model; MD's covariance
            regularization depends on the dtype).
        folds: (n,) int, each row's fold (at least two folds).
        background: (m, d) background embeddings, shared by every fold (RMD, and PPLMDSeq with
            ``md_type="RMD"``); ignored by the others.
        extra_stats: per-row stats, each of length n (``PPLMDSeq``: ``greedy_log_likelihoods``).
        **estimator_kwargs: the class's own arguments (:func:`make_estimator`).

    Returns:
        (n,) float64 scores in the rows' order (higher = more uncertain, LM-Polygraph's
        convention; NaN where LM-Polygraph's own computation gives NaN).
    """
    folds = _check(estimator, embeddings, folds, background, extra_stats, estimator_kwargs)
    out = np.full(len(embeddings), np.nan)
    for k in np.unique(folds):
        est = make_estimator(estimator, **estimator_kwargs)
        stats = fold_stats(embeddings, folds, k, background, extra_stats)
        scores = np.asarray(est(stats), dtype=np.float64).reshape(-1)
        out[folds == k] = scores
    return out


def assign_folds(n: int, k: int, seed: int = 0) -> np.ndarray:
    """Seeded fold labels 0..k-1 for n rows, the sizes differing by at most one.

    Args:
        n: number of rows. k: number of folds (2 <= k <= n). seed: the permutation's seed.

    Returns:
        (n,) int64.
    """
    if not 2 <= k <= n:
        raise InputError(f"k={k} folds for {n} rows; use 2 <= k <= n")
    folds = np.empty(n, dtype=np.int64)
    folds[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    return folds


# --- the embeddings LM-Polygraph computes -------------------------------------------------


def prompt_token_ids(tokenizer, text: str, instruct: bool) -> list[int]:
    """The prompt tokens LM-Polygraph's ``WhiteboxModel.tokenize`` feeds the model for one text.

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        text: the prompt (the benchmark's ``input`` column).
        instruct: LM-Polygraph's ``instruct`` (chat template with a generation prompt, no added
            special tokens) or not (the tokenizer's special tokens added).

    Returns:
        The token ids.
    """
    from lm_polygraph.utils.model import WhiteboxModel

    batch = WhiteboxModel(None, tokenizer, instruct=instruct).tokenize([text])
    return [int(t) for t in batch["input_ids"][0]]


def answer_ids_for_embedding(answer_ids: Sequence[int], tokenizer,
                             stop_strings: Sequence[str] = STOP_STRINGS) -> list[int]:
    """A kept answer's tokens as the model would have generated them alone (a batch of one).

    LM-Polygraph's ``greedy_tokens`` of a batched run keep, after a row stopped on a stop
    string, the padding generated for it while the batch went on: pad tokens where the pad
    differs from the end-of-sequence token (Gemma 3: ``<pad>``), or one end-of-sequence token
    where they are the same (it cuts there). Both are trimmed; an end-of-sequence token the
    model produced itself stays.

    Args:
        answer_ids: the kept ``answer_ids`` (LM-Polygraph's ``greedy_tokens`` of the row).
        tokenizer: the model's tokenizer (its pad and end-of-sequence ids).
        stop_strings: the run's stop strings.

    Returns:
        The trimmed ids.
    """
    ids = [int(t) for t in answer_ids]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is not None and pad != eos:
        while ids and ids[-1] == pad:
            ids.pop()
    if ids and ids[-1] == eos and len(ids) > 1:
        before = tokenizer.decode(ids[:-1])
        if any(before.endswith(s) for s in stop_strings if s):
            ids.pop()  # generation had stopped on the stop string: this end token was padding
    return ids


def answer_ids_from_text(tokenizer, answer: str, n_tokens: int) -> list[int] | None:
    """Rebuild a kept answer's ``greedy_tokens`` from its text and length (rows kept before
    ``answer_ids`` were archived).

    LM-Polygraph's ``greedy_texts`` decode the tokens before the first end-of-sequence token
    (special tokens kept, e.g. Gemma's ``<pad>``); ``n_tokens`` counts that end token too.

    Args:
        tokenizer: the model's tokenizer.
        answer: the kept answer text.
        n_tokens: the kept token count.

    Returns:
        The ids (re-tokenized, plus the end-of-sequence token when ``n_tokens`` counts one more),
        or None when re-tokenizing does not give ``n_tokens`` (the tokenization is not the one
        generated: do not use the row's embedding as exact).
    """
    ids = [int(t) for t in tokenizer(answer, add_special_tokens=False)["input_ids"]]
    if len(ids) == n_tokens:
        return ids
    if len(ids) + 1 == n_tokens:
        return ids + [int(tokenizer.eos_token_id)]
    return None


def sequence_embeddings(model, prompt_ids: Sequence[Sequence[int]],
                        answer_ids: Sequence[Sequence[int]], *, hidden_layer: int = -1,
                        batch_size: int = 1):
    """LM-Polygraph's ``embeddings_decoder`` of (prompt, greedy answer) pairs, as a batch of one.

    Per pair: one forward over the prompt tokens and the answer tokens but the last, with
    ``output_hidden_states=True``; the embedding is ``hidden_states[hidden_layer]`` averaged
    over those positions (LM-Polygraph's ``get_embeddings_from_output``, ``level="sequence"``:
    the prompt pass's states and each generation step's state, concatenated and averaged; the
    last generated token is never fed). An empty answer gives the prompt's mean (LM-Polygraph's
    one-step case).

    Args:
        model: a Hugging Face causal LM (eval mode; load it as the benchmark did, e.g. float32
            and eager attention, for the same numbers).
        prompt_ids: per pair the prompt token ids (:func:`prompt_token_ids`).
        answer_ids: per pair the answer token ids (:func:`answer_ids_for_embedding`).
        hidden_layer: index into ``hidden_states`` (LM-Polygraph: -1, the final-norm output).
        batch_size: pairs per forward (right padding, masked; a batch of one is the exact case).

    Returns:
        (n, d) float32 numpy array.
    """
    return layer_embeddings(model, prompt_ids, answer_ids, [hidden_layer],
                            batch_size=batch_size)[:, 0]


def layer_embeddings(model, prompt_ids: Sequence[Sequence[int]],
                     answer_ids: Sequence[Sequence[int]], layers: Sequence[int], *,
                     batch_size: int = 1):
    """:func:`sequence_embeddings` at several layers from one forward per batch: isouq's own
    ``isouq.hidden.mean_hidden_states`` (what ``isouq score --hidden`` writes and a
    calibration's probe reads), on the pairs' token ids.

    Args:
        model, prompt_ids, answer_ids, batch_size: as :func:`sequence_embeddings`.
        layers: indices into ``hidden_states`` (0: the token embeddings; -1: the final-norm
            output); the probe's are ``isouq.hidden.probe_layers``.

    Returns:
        (n, len(layers), d) float32 numpy array.
    """
    from isouq.hidden import mean_hidden_states, state_name
    from isouq.tokens import Encoded

    if len(prompt_ids) != len(answer_ids):
        raise InputError(f"{len(prompt_ids)} prompts but {len(answer_ids)} answers; give one "
                         "answer per prompt")
    enc = [Encoded(prompt=[int(t) for t in p], answer=[int(t) for t in a])
           for p, a in zip(prompt_ids, answer_ids, strict=True)]
    got = mean_hidden_states(model, enc, pad=0, batch_size=batch_size, layers=layers)
    return np.stack([got[state_name(k)] for k in layers], axis=1)


def background_texts(n: int = BACKGROUND_SIZE, seed: int = 0, min_chars: int = 200) -> list[str]:
    """An offline stand-in for LM-Polygraph's C4 background: 20 Newsgroups documents.

    The shipped 20 Newsgroups train split (isouq.data.newsgroups; no download), with sklearn's
    header, footer and quote stripping, documents of at least ``min_chars`` characters, ``n``
    of them drawn with a seeded permutation (LM-Polygraph draws 1,000 C4 documents).

    Args:
        n: number of documents. seed: the draw's seed. min_chars: shortest document kept.

    Returns:
        The texts.
    """
    from isouq.data.newsgroups import load_newsgroups

    texts = load_newsgroups("train", online=False, strip=("headers", "footers", "quotes")).texts
    texts = [t.strip() for t in texts if len(t.strip()) >= min_chars]
    if n > len(texts):
        raise InputError(f"n={n} background documents but 20 Newsgroups has {len(texts)} of at "
                         f"least {min_chars} characters; ask for fewer")
    order = np.random.default_rng(seed).permutation(len(texts))[:n]
    return [texts[i] for i in order]


def background_embeddings(model, tokenizer, texts: Sequence[str], instruct: bool, *,
                          max_prompt_tokens: int = 256, max_new_tokens: int = 0,
                          hidden_layer: int = -1) -> np.ndarray:
    """Background embeddings as LM-Polygraph embeds its background documents.

    LM-Polygraph feeds each background document as a prompt (``WhiteboxModel.tokenize``: the
    chat template for an instruct model), generates greedily and averages as for any answer.
    Here each document is first cut to ``max_prompt_tokens`` tokens; with ``max_new_tokens=0``
    (the default, for time) no continuation is generated and the embedding is the mean over the
    prompt (LM-Polygraph's formula when one step is generated); otherwise a greedy
    continuation of up to ``max_new_tokens`` is generated alone and included.

    Args:
        model: the causal LM. tokenizer: its tokenizer. texts: the documents
            (:func:`background_texts`). instruct: as the benchmark ran the model.
        max_prompt_tokens: tokens kept of each document. max_new_tokens: greedy continuation.
        hidden_layer: as :func:`sequence_embeddings`.

    Returns:
        (m, d) numpy array.
    """
    import torch

    prompts, answers = [], []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_prompt_tokens]
        prompt = prompt_token_ids(tokenizer, tokenizer.decode(ids), instruct)
        answer: list[int] = []
        if max_new_tokens > 0:
            device = next(model.parameters()).device
            with torch.no_grad():
                gen = model.generate(input_ids=torch.tensor([prompt], device=device),
                                     attention_mask=torch.ones((1, len(prompt)), dtype=torch.long,
                                                               device=device),
                                     do_sample=False, max_new_tokens=max_new_tokens,
                                     min_new_tokens=min(2, max_new_tokens),
                                     pad_token_id=tokenizer.pad_token_id)
            answer = [int(t) for t in gen[0, len(prompt):]]
            if tokenizer.eos_token_id in answer:
                answer = answer[:answer.index(tokenizer.eos_token_id) + 1]
        prompts.append(prompt)
        answers.append(answer)
    return sequence_embeddings(model, prompts, answers, hidden_layer=hidden_layer)
