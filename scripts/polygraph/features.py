"""What the learned heads and LM-Polygraph's train-split estimators read, for every kept answer
of the LM-Polygraph benchmark: one pass over the kept rows, resumable.

    .venv-polygraph/bin/python scripts/polygraph/features.py [--models smollm2 ...] \
        [--datasets triviaqa truthfulqa] [--folds 5] [--background 256] [--rows-only]

For each kept results file ``results/polygraph/polygraph__<dataset>__<model>.json`` and each of
its questions (the answer LM-Polygraph generated, scored as the plugin scores it):

1. isouq's scores of the answer with its block profile (``score_generations(blocks=True)``, the
   prompt as LM-Polygraph fed it): ``scores`` (``SequenceScores.KEYS``) and ``blocks``. The
   answer's tokens are the kept ``answer_ids`` (runs that archive them) or its text tokenized
   again with its kept length (``density.answer_ids_from_text``); ``tokens`` says which, and
   ``matches_kept`` whether the recomputed epistemic equals the kept ``IsouqEpistemic`` (so the
   tokens are those LM-Polygraph generated);
2. LM-Polygraph's ``embeddings_decoder`` of the pair, and from the same forward the pair's mean
   hidden states at ``isouq.hidden.probe_layers`` (``density.layer_embeddings``, whose last layer is
   the embedding), kept in the git-ignored cache ``.cache/polygraph_features/``
   (``<dataset>__<model>.embeddings.jsonl``, ``.layers.jsonl``).

Written, one row per question (``results/polygraph/features/<dataset>__<model>.jsonl``, the
kept order), then, once every row is in: the folds (``density.assign_folds``, K folds seeded by
``--seed`` over the kept order; the learned heads use the same folds) and LM-Polygraph's own
train-split estimators cross-fitted on them (``density.cross_fitted``: MD, RMD against a
20 Newsgroups background of ``--background`` documents, RDE, and PPL-MD from the kept
perplexities) in ``<dataset>__<model>.density.json``. And, on the rows written so far (the
partial runs too), the supervised anchor the learned heads are measured against
(``learned_heads.probe_cross_fitted``: a logistic probe on the answer's mean hidden state at
the layer its inner folds pick of ``isouq.hidden.probe_layers``, per quality metric, on the folds
the heads use) in ``<dataset>__<model>.probe.json``, with each fold's probe logits for the
stacked head (``ProbeFit.fold_logits``), made again when the kept answers change.
Rows already written are skipped. Runs in .venv-polygraph (needs LM-Polygraph); the models are
the exported folders of ``export_models.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import density  # noqa: E402  (scripts/polygraph/density.py)
import prepare_data  # noqa: E402  (scripts/polygraph/prepare_data.py)

RESULTS = Path("results/polygraph")
MODELDIR = Path(".cache/polygraph_models")
CACHE = Path(".cache/polygraph_features")
DENSITY = ("MahalanobisDistanceSeq", "RelativeMahalanobisDistanceSeq", "RDESeq", "PPLMDSeq")


def load(model: str):
    """(model, tokenizer, instruct) of an exported folder, loaded as polygraph_eval loads it."""
    sys.path.insert(0, str(Path("configs/polygraph").resolve()))
    import load_local  # configs/polygraph/load_local.py

    folder = MODELDIR / model
    if not (folder / "isouq_export.json").exists():
        import export_models

        export_models.export(model, MODELDIR)
    lm, tok = load_local.load_model(str(folder)), load_local.load_tokenizer(str(folder))
    return lm, tok, bool(getattr(tok, "chat_template", None))


def answer_ids(q: dict, tok) -> tuple[list[int] | None, str]:
    """The answer's generated tokens and where they come from: ``kept`` or ``text``."""
    if q.get("answer_ids") is not None:
        return [int(t) for t in q["answer_ids"]], "kept"
    return density.answer_ids_from_text(tok, q["answer"], int(q["n_tokens"])), "text"


def score_rows(kept: dict, model, tok, instruct: bool, out: Path, emb_out: Path,
               layers_out: Path, batch: int, refill: bool = True) -> None:
    """Step 1 and 2 for the questions not yet written, and from the same forward the answer's
    mean hidden states at ``isouq.hidden.probe_layers`` for the probe (``layers_out``); a row is
    written after its cached states, so a written row has them."""
    from isouq.hidden import probe_layers
    from isouq.integrations.polygraph import score_generations
    from isouq.runio import JsonlWriter, read_jsonl

    written = {r["key"]: r for r in read_jsonl(out)}
    done = set(written)
    style = "chat" if instruct else "plain"
    todo = [q for q in kept["questions"] if q["key"] not in done]
    cfg = model.config
    n_layers = getattr(cfg, "num_hidden_layers", None) or cfg.get_text_config().num_hidden_layers
    layers = probe_layers(n_layers)  # ends with -1: LM-Polygraph's embedding
    w, e, lw = JsonlWriter(out), JsonlWriter(emb_out), JsonlWriter(layers_out)
    # the cache is git-ignored: on a fresh checkout the written rows' states are made again
    # (``refill``), before the fits that read them
    cached = {r["key"] for r in read_jsonl(layers_out)} & {r["key"] for r in read_jsonl(emb_out)}
    lost = [q for q in kept["questions"] if refill and q["key"] in done
            and q["key"] not in cached and "error" not in written[q["key"]]]
    for s in range(0, len(lost), batch):
        part = lost[s:s + batch]
        ids = [answer_ids(q, tok)[0] for q in part]
        prompts = [density.prompt_token_ids(tok, prepare_data.prompt_text(q["question"], style),
                                            instruct) for q in part]
        states = density.layer_embeddings(
            model, prompts, [density.answer_ids_for_embedding(a, tok) for a in ids], layers,
            batch_size=len(part))
        for q, st in zip(part, states, strict=True):
            e.write({"key": q["key"], "embedding": [float(x) for x in st[-1]]})
            lw.write({"key": q["key"], "layers": layers,
                      "states": [[float(x) for x in v] for v in st]})
        print(f"  states of written rows: {s + len(part)} of {len(lost)}", flush=True)
    for s in range(0, len(todo), batch):
        part = todo[s:s + batch]
        inputs = [prepare_data.prompt_text(q["question"], style) for q in part]
        ids = [answer_ids(q, tok) for q in part]
        ok = [i for i, (a, _) in enumerate(ids) if a]
        t0 = time.perf_counter()
        got = score_generations(model, tok, [inputs[i] for i in ok], [ids[i][0] for i in ok],
                                instruct=instruct, blocks=True) if ok else {}
        sec = (time.perf_counter() - t0) / max(len(ok), 1)
        prompts = [density.prompt_token_ids(tok, inputs[i], instruct) for i in ok]
        states = density.layer_embeddings(
            model, prompts, [density.answer_ids_for_embedding(ids[i][0], tok) for i in ok],
            layers, batch_size=len(ok)) if ok else []
        for j, q in enumerate(part):
            row = {"key": q["key"], "tokens": ids[j][1]}
            if j not in ok:
                w.write({**row, "error": "its text does not tokenize into its kept length"})
                continue
            r = ok.index(j)
            scores = {k: float(v[r]) for k, v in got.items()
                      if k not in ("blocks", "block_names", "seconds", "n_tokens")}
            kept_epi = q["ue"].get("IsouqEpistemic")
            row |= {"scores": scores, "n_tokens": int(got["n_tokens"][r]),
                    "blocks": dict(zip(got["block_names"][r], map(float, got["blocks"][r]),
                                       strict=True)),
                    "matches_kept": kept_epi is not None and abs(
                        scores["epistemic"] - kept_epi) <= 1e-3 * abs(kept_epi),
                    "seconds": round(sec, 4)}
            e.write({"key": q["key"], "embedding": [float(x) for x in states[r][-1]]})
            lw.write({"key": q["key"], "layers": layers,
                      "states": [[float(x) for x in st] for st in states[r]]})
            w.write(row)
        print(f"  {len(done) + s + len(part)} of {len(kept['questions'])}", flush=True)


def cross_fit_density(kept: dict, rows_path: Path, emb_path: Path, bg: np.ndarray,
                      out: Path, folds_k: int, seed: int) -> None:
    """LM-Polygraph's train-split estimators, each row scored by fits on the other folds."""
    from isouq.runio import dumps, read_jsonl

    keys = [q["key"] for q in kept["questions"]]
    emb = {r["key"]: r["embedding"] for r in read_jsonl(emb_path)}
    folds = density.assign_folds(len(keys), folds_k, seed)
    have = [i for i, k in enumerate(keys) if k in emb]
    X = np.asarray([emb[keys[i]] for i in have], dtype=np.float32)
    f = folds[have]
    ppl = [[-float(kept["questions"][i]["ue"]["Perplexity"])] for i in have]
    scores = {}
    for est in DENSITY:
        t0 = time.perf_counter()
        v = density.cross_fitted(
            est, X, f, background=bg if est == "RelativeMahalanobisDistanceSeq" else None,
            extra_stats={"greedy_log_likelihoods": ppl} if est == "PPLMDSeq" else None)
        scores[est] = {keys[i]: float(x) for i, x in zip(have, v, strict=True)}
        print(f"  {est}: {time.perf_counter() - t0:.1f} s", flush=True)
    doc = {"dataset": kept["dataset"], "model": kept["model"], "k": folds_k, "seed": seed,
           "folds": {k: int(folds[i]) for i, k in enumerate(keys)},
           "background": {"texts": "20 Newsgroups train (density.background_texts)",
                          "documents": int(bg.shape[0])},
           "rows": len(have), "estimators": scores}
    out.write_text(dumps(doc, indent=1) + "\n", encoding="utf-8")


def _nulls(x: np.ndarray) -> list:
    return [None if np.isnan(v) else float(v) for v in x]


def cross_fit_probe(kept: dict, layers_path: Path, out: Path, folds_k: int, seed: int) -> None:
    """The hidden-state probe, per quality metric, cross-fitted on the heads' folds (an answer
    without hidden states gets null); skipped when ``out`` holds these answers already."""
    from isouq.runio import dumps
    from isouq.study.analysis.learned_heads import PROBE, labels_for, probe_cross_fitted

    keys = [q["key"] for q in kept["questions"]]
    states, have, what = _states(kept, layers_path)
    if not have.any():
        return
    what = what.replace("on the training dataset", "per fold")
    if out.exists():
        old = json.loads(out.read_text(encoding="utf-8"))
        if (old.get("keys") == keys and old.get("states") == what
                and "folds" in old):
            return
    all_folds = density.assign_folds(len(keys), folds_k, seed)
    folds = all_folds[have]
    doc = {"kind": "isouq-polygraph-probe", "dataset": kept["dataset"], "model": kept["model"],
           "estimator": PROBE, "k": folds_k, "seed": seed, "states": what,
           "keys": keys, "folds": [int(f) for f in all_folds],
           "rows": int(have.sum()), "metrics": {}}
    for metric in kept["quality_metrics"]:
        t0 = time.perf_counter()
        q = np.array([kept["questions"][i]["quality"].get(metric, np.nan)
                      for i in np.flatnonzero(have)], dtype=float)
        u = np.full(len(keys), np.nan)
        logits = np.full((len(np.unique(folds)), len(keys)), np.nan)
        u[have], chosen, logits[:, have] = probe_cross_fitted(states, labels_for(q, metric),
                                                              folds, seed=seed)
        doc["metrics"][metric] = {"uncertainty": _nulls(u), "chosen": chosen,
                                  "fold_logits": [_nulls(row) for row in logits]}
        print(f"  probe, {metric}: {time.perf_counter() - t0:.1f} s", flush=True)
    out.write_text(dumps(doc) + "\n", encoding="utf-8")


def _states(kept: dict, layers_path: Path) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    """(layer name -> (n_with, d) states, (n,) which kept answers have them, the states' words)
    from the cache of :func:`score_rows`."""
    from isouq.runio import read_jsonl

    got = {r["key"]: r for r in read_jsonl(layers_path)}
    keys = [q["key"] for q in kept["questions"]]
    have = np.array([k in got for k in keys])
    layers = next(iter(got.values()))["layers"] if got else []
    return ({f"hidden_states[{k}]": np.asarray([got[key]["states"][j] for key in keys
                                                if key in got], dtype=np.float32)
             for j, k in enumerate(layers)}, have,
            f"the answer's mean hidden state at hidden_states{layers} "
            "(density.layer_embeddings), the layer chosen on the training dataset")


def transfer_probe(train: dict, test: dict, train_layers: Path, test_layers: Path, out: Path,
                   seed: int, need: set[str]) -> None:
    """The probe fitted on every answer of ``train`` (the model's other dataset) and its logits
    on ``test``'s answers, per quality metric both share (``learned_heads.probe_transferred``),
    what the stacked head transferred between datasets reads (``heads.py``); an answer without
    states (its features could not be rebuilt) takes no part and gets null. Skipped when ``out``
    holds these answers already, or while an answer of ``need`` (those with features) lacks its
    states."""
    from isouq.runio import dumps
    from isouq.study.analysis.learned_heads import labels_for, probe_transferred

    keys = [q["key"] for q in test["questions"]]
    train_keys = [q["key"] for q in train["questions"]]
    if out.exists():
        old = json.loads(out.read_text(encoding="utf-8"))
        if old.get("keys") == keys and old.get("train_keys") == train_keys:
            return
    tr_states, tr_have, what = _states(train, train_layers)
    te_states, te_have, _ = _states(test, test_layers)
    have = {k for k, h in zip(train_keys, tr_have, strict=True) if h} | {
        k for k, h in zip(keys, te_have, strict=True) if h}
    if not te_have.any() or need - have:
        print(f"  probe transfer to {out.name}: states missing, skipped", flush=True)
        return
    doc = {"kind": "isouq-polygraph-probe-transfer", "dataset": test["dataset"],
           "trained_on": train["dataset"], "model": test["model"], "seed": seed,
           "states": what, "keys": keys, "train_keys": train_keys, "metrics": {}}
    for metric in [m for m in test["quality_metrics"] if m in train["quality_metrics"]]:
        t0 = time.perf_counter()
        q = np.array([r["quality"].get(metric, np.nan) for r in train["questions"]], dtype=float)
        got = probe_transferred(tr_states, labels_for(q, metric)[tr_have], te_states, seed=seed)
        train_logits, logits = np.full(len(train_keys), np.nan), np.full(len(keys), np.nan)
        train_logits[tr_have], logits[te_have] = got.train_logits, got.test_logits
        doc["metrics"][metric] = {"train_logits": _nulls(train_logits), "logits": _nulls(logits),
                                  "chosen": got.chosen}
        print(f"  probe from {train['dataset']}, {metric}: {time.perf_counter() - t0:.1f} s",
              flush=True)
    out.write_text(dumps(doc) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--datasets", nargs="+", default=["triviaqa", "truthfulqa"])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--background", type=int, default=256,
                    help="20 Newsgroups documents for RMD's background (LM-Polygraph: 1,000 C4)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows-only", action="store_true",
                    help="only the new rows and their cached states (beside a running "
                         "benchmark); the probe, the train-split estimators and the states of "
                         "rows whose cache was lost wait for a run without it")
    ap.add_argument("--results", default=str(RESULTS),
                    help="the kept benchmark files' folder (results/polygraph_prereg: the "
                         "pre-registered fresh questions; their cached states are kept apart, "
                         "named after it)")
    ap.add_argument("--out", default=None, help="default: RESULTS/features")
    a = ap.parse_args(argv)
    results = Path(a.results)
    out = Path(a.out) if a.out else results / "features"
    # the cache of another folder's answers is named after it (the same dataset × model)
    tag = "" if results == RESULTS else f"{results.name}__"
    out.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    for model in a.models:
        files = [(ds, results / f"polygraph__{ds}__{model}.json") for ds in a.datasets]
        files = [(ds, f) for ds, f in files if f.exists()]
        if not files:
            print(f"{model}: no kept results, skipped")
            continue
        lm, tok, instruct = load(model)
        bg = None
        for ds, path in files:
            kept = json.loads(path.read_text(encoding="utf-8"))
            name = f"{ds}__{model}"
            rows, emb = out / f"{name}.jsonl", CACHE / f"{tag}{name}.embeddings.jsonl"
            print(f"{name}: scores, blocks and embeddings ({kept['n_questions']} questions)")
            layers = CACHE / f"{tag}{name}.layers.jsonl"
            score_rows(kept, lm, tok, instruct, rows, emb, layers, a.batch,
                       refill=not a.rows_only)
            if a.rows_only:
                continue
            cross_fit_probe(kept, layers, out / f"{name}.probe.json", a.folds, a.seed)
            dens = out / f"{name}.density.json"
            if not kept.get("complete"):
                print(f"{name}: partial run; the train-split estimators wait for all rows")
                continue
            if dens.exists():
                continue
            if bg is None:
                bg_path = CACHE / f"{model}.background-{a.background}.npy"
                if bg_path.exists():
                    bg = np.load(bg_path)
                else:
                    t0 = time.perf_counter()
                    bg = density.background_embeddings(
                        lm, tok, density.background_texts(a.background, seed=a.seed),
                        instruct, max_prompt_tokens=128)
                    np.save(bg_path, bg)
                    print(f"{model}: background of {a.background} in "
                          f"{time.perf_counter() - t0:.0f} s")
            print(f"{name}: train-split estimators, {a.folds} folds")
            cross_fit_density(kept, rows, emb, bg, dens, a.folds, a.seed)
        if a.rows_only:
            continue
        from isouq.runio import read_jsonl

        runs = {ds: json.loads(path.read_text(encoding="utf-8")) for ds, path in files}
        need = {r["key"] for ds in runs for r in read_jsonl(out / f"{ds}__{model}.jsonl")
                if "error" not in r}
        for test, train in itertools.permutations(runs, 2):
            transfer_probe(runs[train], runs[test], CACHE / f"{tag}{train}__{model}.layers.jsonl",
                           CACHE / f"{tag}{test}__{model}.layers.jsonl",
                           out / f"{test}__{model}.probe-from-{train}.json", a.seed, need)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
