"""Fine-tuning the encoder classifier (AdamW, linear decay, resumable checkpoints) and features."""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ....runio import dumps
from .encoder import DEFAULT_ENCODER, EncoderClassifier, collate


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning settings (what the cached model depends on).

    lr: AdamW learning rate of the encoder; head_lr: of the new head (None: same as lr).
    freeze_layers: freeze the embeddings and the first k transformer layers (0: train all).
    max_train_docs: a class-stratified subsample of the train split (None: all of it).
    """

    encoder: str = DEFAULT_ENCODER
    pooling: str = "mean"
    max_length: int = 128
    epochs: float = 1.0
    lr: float = 1e-4
    head_lr: float | None = None
    weight_decay: float = 0.01
    batch_size: int = 16
    warmup_ratio: float = 0.0
    freeze_layers: int = 0
    max_train_docs: int | None = None
    strip: tuple[str, ...] = ()
    seed: int = 0

    def key(self) -> str:
        """A short hash of the settings (cache key)."""
        return hashlib.sha256(dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def optimizer_for(model: EncoderClassifier, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on weights only (not biases / norm weights), head at head_lr."""
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lr = (cfg.head_lr or cfg.lr) if name.startswith("head.") else cfg.lr
        decay = 0.0 if (name.endswith("bias") or "norm" in name.lower()) else cfg.weight_decay
        groups.setdefault((lr, decay), []).append(p)
    return torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd}
                              for (lr, wd), ps in groups.items()])


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then linear decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def batch_order(n: int, cfg: TrainConfig) -> list[np.ndarray]:
    """Deterministic list of minibatch index arrays for all epochs (a fractional last epoch)."""
    rng = np.random.default_rng(cfg.seed)
    batches: list[np.ndarray] = []
    for _ in range(math.ceil(cfg.epochs)):
        perm = rng.permutation(n)
        batches += [perm[s : s + cfg.batch_size] for s in range(0, n, cfg.batch_size)]
    per_epoch = math.ceil(n / cfg.batch_size)
    return batches[: max(1, round(cfg.epochs * per_epoch))]


def fine_tune(
    model: EncoderClassifier,
    ids: list[list[int]],
    labels: np.ndarray,
    cfg: TrainConfig,
    *,
    pad_id: int,
    device: str = "cpu",
    state_file: Path | None = None,
    checkpoint_every: int = 100,
) -> dict:
    """Train ``model`` in place with cross-entropy; resumable from ``state_file``.

    ids: N token-id lists; labels (N,) in 0..19. Returns {"steps", "seconds", "docs_per_s",
    "final_loss" (mean of the last 50 steps), "resumed_at"}.
    """
    batches = batch_order(len(ids), cfg)
    total = len(batches)
    warmup = int(cfg.warmup_ratio * total)
    opt = optimizer_for(model, cfg)
    base = [g["lr"] for g in opt.param_groups]
    start, losses, seconds = 0, [], 0.0
    if state_file is not None and state_file.is_file():
        st = torch.load(state_file, map_location=device, weights_only=True)
        if st.get("key") == cfg.key():
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["optimizer"])
            start, losses, seconds = st["step"], st["losses"], st["seconds"]
    y = torch.as_tensor(labels, dtype=torch.long)
    from tqdm.auto import tqdm

    model.train()
    t0, done_docs = time.perf_counter(), 0
    bar = tqdm(total=total, initial=start, desc="fine-tune", unit="step")
    for step in range(start, total):
        for g, lr in zip(opt.param_groups, base, strict=True):
            g["lr"] = lr * lr_factor(step, total, warmup)
        idx = batches[step]
        input_ids, mask = collate([ids[i] for i in idx], pad_id)
        logits = model(input_ids.to(device), mask.to(device))
        loss = nn.functional.cross_entropy(logits, y[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        done_docs += len(idx)
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        last = step + 1 == total
        if state_file is not None and (last or (step + 1) % checkpoint_every == 0):
            elapsed = seconds + time.perf_counter() - t0
            tmp = state_file.with_suffix(".tmp")
            torch.save({"key": cfg.key(), "model": model.state_dict(),
                        "optimizer": opt.state_dict(), "step": step + 1, "losses": losses,
                        "seconds": elapsed}, tmp)
            os.replace(tmp, state_file)
    bar.close()
    model.eval()
    run_s = time.perf_counter() - t0
    return {"steps": total, "resumed_at": start, "seconds": seconds + run_s,
            "docs_per_s": done_docs / run_s if run_s > 0 and done_docs else None,
            "final_loss": float(np.mean(losses[-50:])) if losses else None}


@torch.no_grad()
def extract_features(
    model: EncoderClassifier, ids: list[list[int]], *, pad_id: int, batch_size: int = 64,
    device: str = "cpu", desc: str = "features",
) -> torch.Tensor:
    """(N, H) float32 pooled features of N documents (eval mode, length-sorted batches)."""
    from tqdm.auto import tqdm

    model.eval()
    order = np.argsort([len(x) for x in ids], kind="stable")
    out = torch.empty(len(ids), model.head.in_features)
    for s in tqdm(range(0, len(ids), batch_size), desc=desc, unit="batch"):
        idx = order[s : s + batch_size]
        input_ids, mask = collate([ids[i] for i in idx], pad_id)
        out[torch.as_tensor(idx)] = model.features(input_ids.to(device), mask.to(device)).float().cpu()
    return out
