"""The proxy-bias-text experiment's settings (``isouq experiment proxy-bias-text``): the
encoder's default, the presets (the CPU budget, ``--quick`` and ``--paper``) and the
command-line options, torch-free."""

from __future__ import annotations

import argparse

#: the wheel's all-MiniLM-L6-v2 (``proxy_bias_text.encoder.resolve_encoder``)
DEFAULT_ENCODER = "minilm"

#: Presets; an option given explicitly wins. FULL is the CPU budget (2 cores): 128 tokens,
#: 1 epoch, embeddings + the lower 3 of MiniLM's 6 layers frozen, lr 1e-4 (head 1e-3).
#: PAPER_SETTINGS (``--paper``) is the paper's recipe: all layers, 3 epochs, 512 tokens, 2e-5.
FULL = {"max_train_docs": None, "max_test_docs": None, "max_length": 128, "epochs": 1.0,
        "lr": 1e-4, "head_lr": 1e-3, "freeze_layers": 3, "n_proxy": 200, "n_test": 200}
QUICK = {**FULL, "max_train_docs": 200, "max_test_docs": 100, "max_length": 64,
         "lr": 5e-4, "head_lr": 5e-3, "n_proxy": 40, "n_test": 60}
PAPER_SETTINGS = {**FULL, "max_length": 512, "epochs": 3.0, "lr": 2e-5, "head_lr": None,
                  "freeze_layers": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options beyond the shared --out/--quick/--seed/--device.

    Args:
        parser: the parser of ``isouq experiment proxy-bias-text``.
    """
    a = parser.add_argument
    full, paper = FULL, PAPER_SETTINGS
    a("--encoder", default=DEFAULT_ENCODER,
      help="HF encoder hub id or local folder; 'minilm' = the wheel's all-MiniLM-L6-v2")
    a("--pooling", choices=["mean", "cls"], default="mean", help="sentence vector for the head")
    a("--data", default=None, help="folder with 20 Newsgroups {train,test}.jsonl.gz")
    a("--strip", nargs="*", default=[], choices=["headers", "footers", "quotes"],
      help="sklearn's remove= parts to strip from the texts (default: raw texts)")
    a("--paper", action="store_true",
      help=f"the paper's fine-tuning recipe: --epochs {paper['epochs']:g} --max-length "
           f"{paper['max_length']} --lr {paper['lr']:g}, head at the same lr, no frozen layers "
           "(hours on CPU; minutes on a GPU)")
    a("--epochs", type=float, default=None,
      help=f"fine-tuning epochs (default {full['epochs']:g}; paper {paper['epochs']:g})")
    a("--max-length", type=int, default=None,
      help=f"tokens per document (default {full['max_length']}; paper {paper['max_length']})")
    a("--lr", type=float, default=None,
      help=f"AdamW learning rate (default {full['lr']:g}; paper {paper['lr']:g})")
    a("--head-lr", type=float, default=None,
      help=f"learning rate of the new head (default {full['head_lr']:g}; with --paper: the "
           "same as --lr)")
    a("--weight-decay", type=float, default=0.01, help="AdamW weight decay (paper 1e-2)")
    a("--batch-size", type=int, default=16, help="fine-tuning batch size")
    a("--warmup-ratio", type=float, default=0.0, help="linear warmup fraction of the steps")
    a("--freeze-layers", type=int, default=None,
      help=f"freeze the embeddings and the first k encoder layers (default "
           f"{full['freeze_layers']}; 0: train all)")
    a("--max-train-docs", type=int, default=None,
      help="class-stratified subsample of the train split (default: all 11,314)")
    a("--max-test-docs", type=int, default=None,
      help="class-stratified subsample of the test split for accuracy (default: all 7,532)")
    a("--n-proxy", type=int, default=None,
      help=f"proxy documents per covariance (default {full['n_proxy']})")
    a("--n-test", type=int, default=None,
      help=f"shared test documents scored (default {full['n_test']})")
    a("--prior-precision", type=float, default=1.0, help="λ added to each empirical Fisher")
    a("--reference", choices=["train", "pooled"], default="train",
      help="full Hessian: EF of all training docs, or of the union of all proxy samples")
    a("--representative", choices=["all-classes", "four-groups"], default="all-classes",
      help="representative proxy: stratified over all 20 classes, or equal over the 4 groups")
    a("--solver", choices=["auto", "dense", "lowrank"], default="auto",
      help="(EF+λI)⁻¹: P×P Cholesky (dense), Woodbury (lowrank), lowrank when n < P (auto)")
    a("--checkpoint-every", type=int, default=100, help="fine-tuning steps between checkpoints")
    a("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


__all__ = ["DEFAULT_ENCODER", "FULL", "PAPER_SETTINGS", "QUICK", "add_arguments"]
