"""The resumable runner behind ``isouq score``: rows in, one JSONL row out per input.

- Resumable: rows already in the output (by key) are skipped; each batch's rows are appended
  whole (fsync'ed) as soon as it is scored, so a killed run loses at most the batch in flight.
- Length-bucketed: rows are scored in order of token count (less padding) in batches of at
  most ``batch_size`` rows and ``max_tokens_per_batch`` padded tokens; the finished output is
  rewritten in input order.
- Data-parallel under torchrun: see :mod:`isouq.distributed`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from .data.pairs import PairRow
from .distributed import DistEnv, barrier, merge_shards, shard, shard_path, write_ordered
from .errors import InputError
from .runio import JsonlWriter, dumps, exclusive, read_jsonl
from .sequences import encode, score_sequences


def prompt_of(row: PairRow, tokenizer) -> str | list:
    """The row's prompt, or the documented QA prompt built from its question."""
    if row.prompt is not None:
        return row.prompt
    from .qa.prompts import qa_prompt

    return qa_prompt(tokenizer, row.question)


def plan_batches(lengths: list[int], batch_size: int, max_tokens: int | None,
                 bucket: bool = True) -> list[list[int]]:
    """Group item indices into batches: sorted by length when ``bucket``, each batch at most
    ``batch_size`` items and (max length × items) ≤ ``max_tokens`` padded tokens."""
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if bucket \
        else list(range(len(lengths)))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        full = len(cur) >= batch_size or (max_tokens is not None and cur
                                          and grown * (len(cur) + 1) > max_tokens)
        if full:
            batches.append(cur)
            cur, grown = [], lengths[i]
        cur.append(i)
        longest = grown
    if cur:
        batches.append(cur)
    return batches


def score_rows(
    model,
    tokenizer,
    rows: list[PairRow],
    out: str | Path,
    *,
    batch_size: int = 16,
    max_tokens_per_batch: int | None = None,
    bucket: bool = True,
    method: str = "ghost",
    params=None,
    meta: dict | None = None,
    progress: bool = True,
    env: DistEnv | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict:
    """Score this process's rows not yet written; returns {"written", "skipped", "seconds"}.

    Writes ``out`` (JSONL, input order) and ``<out>.meta.json`` (model, parameters that took
    part). Under W > 1 processes each rank writes its shard and rank 0 merges.
    """
    env = env or DistEnv()
    mine = shard(rows, env)
    path = shard_path(out, env.rank, env.world) if env.world > 1 else Path(out)
    with exclusive(path):  # one process per output file
        writer = JsonlWriter(path)
        todo = [r for r in mine if not writer.done(r.key)]
        skipped = len(mine) - len(todo)
        t0 = time.perf_counter()
        prompts = [prompt_of(r, tokenizer) for r in todo]
        lengths = [len(e.prompt) + len(e.answer)
                   for e in (encode(tokenizer, prompts, [r.answer for r in todo]) if todo else [])]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(mine), initial=skipped, unit="answer",
                       desc="scoring" if env.world == 1 else f"scoring (rank {env.rank})")
        info = None
        for idx in plan_batches(lengths, batch_size, max_tokens_per_batch, bucket):
            tb = time.perf_counter()
            res = score_sequences(model, tokenizer, [prompts[i] for i in idx],
                                  [todo[i].answer for i in idx], batch_size=len(idx),
                                  method=method, params=params)
            per = (time.perf_counter() - tb) / len(idx)
            info = res.params
            for j, i in enumerate(idx):
                r = todo[i]
                writer.write({
                    "key": r.key, "prompt": r.prompt, "question": r.question, "answer": r.answer,
                    "epistemic": float(res.epistemic[j]),
                    "aleatoric": float(res.aleatoric[j]),
                    "normalized_epistemic": float(res.normalized_epistemic[j]),
                    "mean_prob": float(res.mean_prob[j]),
                    "n_tokens": int(res.n_tokens[j]),
                    "n_params": res.params.n_params,
                    "method": method,
                    "seconds": round(per, 5),
                })
            if bar is not None:
                bar.update(len(idx))
            if on_batch is not None:
                on_batch(len(idx))
        if bar is not None:
            bar.close()
        keys = [r.key for r in rows]
        barrier(env)
        if env.world > 1:
            if env.is_main:
                merge_shards(out, env.world, keys)
        else:
            write_ordered(out, read_jsonl(out), keys)
        if env.is_main and (info is not None or meta):
            side = Path(str(out) + ".meta.json")
            doc = {**(meta or {}), "method": method, "world_size": env.world}
            if info is not None:
                doc["params"] = info.to_dict()
            side.write_text(dumps(doc, indent=2), encoding="utf-8")
        return {"written": len(todo), "skipped": skipped, "seconds": time.perf_counter() - t0}


def load_meta(out: str | Path) -> dict:
    p = Path(str(out) + ".meta.json")
    return json.loads(p.read_text()) if p.exists() else {}
