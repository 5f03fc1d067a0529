"""The experiment's pipeline: cached stages (fine-tuned model, features), the CLI options and
``run`` (see the package docstring)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ....covariance import Identity
from ....data.newsgroups import GROUPS, Newsgroups, load_newsgroups
from ....errors import InputError
from ....runio import dumps, write_results
from ..settings.proxy_bias_text import FULL, PAPER_SETTINGS, QUICK, add_arguments
from .encoder import (
    DEFAULT_ENCODER,
    N_CLASSES,
    EncoderClassifier,
    freeze_lower,
    load_encoder,
    resolve_encoder,
    tokenize,
)
from .laplace import (
    epistemic_under,
    laplace_epistemic,
    predicted_class_gradients,
)
from .proxies import proxy_sets, stratified_sample, stratified_subset
from .tables import build_tables, plot_summary, write_scores_csv
from .training import TrainConfig, extract_features, fine_tune

NAME = "proxy-bias-text"

#: The paper's tables (App. A.1), DistilBERT (768×20+20 head parameters), 79.5% test accuracy.
PAPER: dict[str, list[dict]] = {
    "accuracy": [{"encoder": "distilbert-base-uncased", "epochs": 3, "test_accuracy": 0.795}],
    "correlation_vs_full": [
        {"covariance": "representative", "spearman": 0.984, "pearson": 0.940},
        {"covariance": "identity", "spearman": 0.979, "pearson": 0.889},
        {"covariance": "sci", "spearman": 0.962, "pearson": 0.830},
        {"covariance": "comp", "spearman": 0.928, "pearson": 0.751},
        {"covariance": "rec", "spearman": 0.946, "pearson": 0.833},
        {"covariance": "talk", "spearman": 0.920, "pearson": 0.763},
    ],
    "domain_ratios": [
        {"covariance": "representative", "sci": 0.99, "comp": 1.05, "rec": 1.16, "talk": 0.80,
         "cv": 0.13},
        {"covariance": "identity", "sci": 0.83, "comp": 1.25, "rec": 0.75, "talk": 1.17,
         "cv": 0.21},
        {"covariance": "sci", "sci": 0.66, "comp": 1.15, "rec": 0.72, "talk": 1.46, "cv": 0.33},
        {"covariance": "rec", "sci": 0.84, "comp": 1.54, "rec": 0.47, "talk": 1.15, "cv": 0.40},
        {"covariance": "talk", "sci": 1.01, "comp": 1.88, "rec": 0.78, "talk": 0.32, "cv": 0.57},
        {"covariance": "comp", "sci": 0.65, "comp": 0.28, "rec": 1.18, "talk": 1.88, "cv": 0.60},
    ],
    "combination_cv": [
        {"domains_in_proxy": "identity (none)", "cv_sorted": "0.21"},
        {"domains_in_proxy": "1 (single domain)", "cv_sorted": "0.33, 0.40, 0.57, 0.60"},
        {"domains_in_proxy": "2 (pairs)", "cv_sorted": "0.22, 0.31, 0.35, 0.37, 0.54, 0.61"},
        {"domains_in_proxy": "3 (triples)", "cv_sorted": "0.17, 0.19, 0.35, 0.54"},
        {"domains_in_proxy": "4 (representative)", "cv_sorted": "0.13"},
    ],
}


# =========================================================================== stages


def _load_or_train(cache: Path, cfg: TrainConfig, train: Newsgroups, device: str,
                   checkpoint_every: int) -> tuple[EncoderClassifier, object, dict]:
    """The fine-tuned model from ``cache/model`` if its settings match, else train it."""
    model_dir = cache / "model"
    meta_file = model_dir / "meta.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        docs = docs_digest(train)
        if meta.get("key") == cfg.key() and meta.get("docs", docs) == docs:
            enc, tok = load_encoder(str(model_dir))
            model = EncoderClassifier(enc, N_CLASSES, cfg.pooling)
            model.head.load_state_dict(torch.load(model_dir / "head.pt", weights_only=True))
            return model.to(device).eval(), tok, {**meta["train"], "from_cache": True}
    enc, tok = load_encoder(resolve_encoder(cfg.encoder))
    torch.manual_seed(cfg.seed)
    model = EncoderClassifier(enc, N_CLASSES, cfg.pooling).to(device)
    frozen = freeze_lower(model, cfg.freeze_layers)
    ids = tokenize(tok, train.texts, cfg.max_length)
    info = fine_tune(model, ids, train.labels, cfg, pad_id=tok.pad_token_id, device=device,
                     state_file=cache / "train_state.pt", checkpoint_every=checkpoint_every)
    info.update(frozen_params=frozen,
                trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
                encoder_params=sum(p.numel() for p in model.encoder.parameters()),
                mean_tokens=float(np.mean([len(x) for x in ids])),
                truncated_frac=float(np.mean([len(x) >= cfg.max_length for x in ids])))
    model_dir.mkdir(parents=True, exist_ok=True)
    model.encoder.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    torch.save(model.head.state_dict(), model_dir / "head.pt")
    meta_file.write_text(dumps({"key": cfg.key(), "docs": docs_digest(train),
                                "config": asdict(cfg), "train": info}, indent=2))
    (cache / "train_state.pt").unlink(missing_ok=True)
    return model.eval(), tok, {**info, "from_cache": False}


def docs_digest(data: Newsgroups) -> str:
    """A short hash of the document ids of a split (what a cache was built on)."""
    return hashlib.sha256("\n".join(data.ids).encode()).hexdigest()[:16]


def _features(cache: Path, cfg: TrainConfig, model: EncoderClassifier, tok,
              split: Newsgroups, device: str) -> torch.Tensor:
    """Cached (N, H) features of one split (recomputed if the model or documents changed)."""
    digest = docs_digest(split)
    file = cache / f"features_{split.split}.pt"
    if file.is_file():
        st = torch.load(file, weights_only=True)
        if st.get("key") == cfg.key() and st.get("docs") == digest:
            return st["features"]
    ids = tokenize(tok, split.texts, cfg.max_length)
    feats = extract_features(model, ids, pad_id=tok.pad_token_id, device=device,
                             desc=f"features ({split.split})")
    torch.save({"key": cfg.key(), "docs": digest, "features": feats}, file)
    return feats


# =========================================================================== CLI convention


def _opt(options: dict, key: str, quick: bool):
    """An explicit option, else the preset's value (--quick, --paper or the CPU budget)."""
    v = options.get(key)
    if v is not None:
        return v
    preset = QUICK if quick else PAPER_SETTINGS if options.get("paper") else FULL
    return preset[key]


def _given(options: dict, key: str, default):
    """``options[key]`` unless it is missing or None (so 0, 0.0 and "" are honoured)."""
    v = options.get(key)
    return default if v is None else v


def _check_options(options: dict) -> None:
    """InputError naming any option that is not one of :func:`add_arguments`' (or
    ``budget_note``, a line for results.json given from Python)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    unknown = sorted(set(options) - set(vars(p.parse_args([]))) - {"budget_note"})
    if unknown:
        raise InputError(f"unknown option(s) {unknown} for {NAME}; see "
                         f"isouq experiment {NAME} --help")


def run(out: Path, *, quick: bool = False, seed: int = 0, device: str = "cpu",
        **options) -> Path:
    """Run the experiment into ``out``; returns ``out/results.json``. See the module docstring."""
    _check_options(options)
    started = time.time()
    out = Path(out)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text("cache/\n", encoding="utf-8")
    if _given(options, "threads", None):
        torch.set_num_threads(int(options["threads"]))
    cfg = TrainConfig(
        encoder=str(_given(options, "encoder", DEFAULT_ENCODER)),
        pooling=_given(options, "pooling", "mean"),
        max_length=int(_opt(options, "max_length", quick)),
        epochs=float(_opt(options, "epochs", quick)),
        lr=float(_opt(options, "lr", quick)),
        head_lr=_opt(options, "head_lr", quick),
        weight_decay=float(_given(options, "weight_decay", 0.01)),
        batch_size=int(_given(options, "batch_size", 16)),
        warmup_ratio=float(_given(options, "warmup_ratio", 0.0)),
        freeze_layers=int(_opt(options, "freeze_layers", quick)),
        max_train_docs=_opt(options, "max_train_docs", quick),
        strip=tuple(_given(options, "strip", ())),
        seed=seed,
    )
    n_proxy, n_test = int(_opt(options, "n_proxy", quick)), int(_opt(options, "n_test", quick))
    lam = float(_given(options, "prior_precision", 1.0))
    reference = _given(options, "reference", "train")
    solver = _given(options, "solver", "auto")
    representative = _given(options, "representative", "all-classes")
    data = options.get("data")
    # -- data (fails fast, before any model work)
    train = stratified_subset(load_newsgroups("train", path=data, strip=cfg.strip),
                              cfg.max_train_docs, seed)
    test = stratified_subset(load_newsgroups("test", path=data, strip=cfg.strip),
                             _opt(options, "max_test_docs", quick), seed)
    # -- stage 1-2: fine-tuned model and features
    t_train = time.time()
    model, tok, train_info = _load_or_train(cache, cfg, train, device,
                                            int(_given(options, "checkpoint_every", 100)))
    train_s = time.time() - t_train
    t_feat = time.time()
    f_train = _features(cache, cfg, model, tok, train, device)
    f_test = _features(cache, cfg, model, tok, test, device)
    feat_s = time.time() - t_feat
    head = nn.Linear(model.head.in_features, N_CLASSES).double()
    head.load_state_dict({k: v.double().cpu() for k, v in model.head.state_dict().items()})
    with torch.no_grad():
        test_pred = head(f_test.double()).argmax(-1).numpy()
        train_pred = head(f_train.double()).argmax(-1).numpy()
    acc = [{"encoder": cfg.encoder, "epochs": cfg.epochs, "max_length": cfg.max_length,
            "test_accuracy": float((test_pred == test.labels).mean()),
            "train_accuracy": float((train_pred == train.labels).mean()),
            "n_test_docs": len(test), "n_train_docs": len(train)}]
    # -- stage 3-4: last-layer Laplace on the head
    t_lap = time.time()
    train_groups = train.groups()
    proxies = proxy_sets(train_groups, train.labels, n_proxy, seed, representative)
    eval_idx = stratified_sample(test.labels, n_test, np.random.default_rng([seed, 11]))
    evald = test.subset(eval_idx)
    domains = evald.groups()
    G, pred = predicted_class_gradients(head, f_test[eval_idx])
    y_train = torch.as_tensor(train.labels)
    from tqdm.auto import tqdm

    U: dict[str, np.ndarray] = {"identity": epistemic_under(Identity(), G)}
    for name, idx in tqdm(proxies.items(), desc="laplace", unit="cov"):
        U[name] = laplace_epistemic(head, f_train[idx], y_train[idx], G, lam, solver)
    ref_idx = (np.arange(len(train)) if reference == "train"
               else np.unique(np.concatenate(list(proxies.values()))))
    U_full = laplace_epistemic(head, f_train[ref_idx], y_train[ref_idx], G, lam, solver)
    laplace_s = time.time() - t_lap
    # -- stage 5: tables, figure, files
    tables = build_tables(U, U_full, domains)
    tables["accuracy"] = acc
    tables["proxies"] = [{"covariance": n, "n_docs": len(i),
                          **{g: int((train_groups[i] == g).sum()) for g in GROUPS},
                          "other": int((train_groups[i] == "").sum())}
                         for n, i in proxies.items()]
    tables["timing"] = [{"fine_tune_s": train_s, "features_s": feat_s, "laplace_s": laplace_s,
                         "train_docs_per_s": train_info.get("docs_per_s"),
                         "model_from_cache": train_info.get("from_cache")}]
    figures = [plot_summary(tables, U, U_full, out / "proxy_bias_text.png").name]
    write_scores_csv(out / "test_scores.csv", evald, domains, pred.numpy(),
                     {**U, "full": U_full})
    settings = {
        **asdict(cfg), "encoder_path": resolve_encoder(cfg.encoder),
        "hidden_size": model.head.in_features,
        "head_params": N_CLASSES * (model.head.in_features + 1),
        "n_proxy": n_proxy, "n_test": n_test, "prior_precision": lam, "reference": reference,
        "solver": solver,
        "representative": representative, "quick": quick, "device": device,
        "preset": "quick" if quick else "paper" if options.get("paper") else "cpu-budget",
        "threads": torch.get_num_threads(), "data_source": train.source,
        "n_train_docs": len(train), "n_test_docs": len(test),
        "curvature": "empirical Fisher of the summed categorical NLL of the head (EF + λI)⁻¹",
        "gradient": "g = d p(predicted class | x) / d head (W then b)",
        "ratios": "mean over test docs of group D of U / of U_full, divided by the row mean",
        "cv": "SD/mean with ddof 0 over the four domains (before row-normalization)",
        "optimizer": "AdamW, wd on weights only, linear decay, grad clip 1.0",
        "budget_note": _given(options, "budget_note", ""),
        "fine_tune": train_info,
    }
    return write_results(out, NAME, settings=settings, seed=seed, started=started,
                         tables=tables, paper=PAPER, figures=figures,
                         extra={"scores_file": "test_scores.csv"})
