"""Data-parallel runs under ``torchrun`` (or ``accelerate launch``): shard, resume, merge.

Rank r of W takes the items at input positions r, r + W, r + 2W, ... (deterministic), writes
its own resumable shard ``OUT.rank{r}-of-{W}.jsonl``, and once every rank is done, rank 0
merges the shards into OUT in input order. A rank that dies loses only its unwritten rows;
re-launching with the same arguments resumes every shard and then merges. ``isouq merge``
does the merge by hand.

Sharded weights (``isouq score --shard fsdp``, :func:`shard_model`): FSDP2 splits every
decoder layer's weights over the W ranks, so that each holds 1/W of the model; a layer's weights
are all-gathered just before its forward (and its backward) and freed after. Each rank still
scores its own rows, and the per-example norms need no reduction (the ghost factors are
activations and output gradients, which are not sharded); but every forward and backward is a
collective, so the ranks score in lockstep: the same number of batches, a rank short of rows
scoring a filler batch (:func:`lockstep_steps`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError, InputError
from .runio import dumps, read_jsonl


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_env() -> DistEnv:
    """Rank, world size and local rank from torchrun's / accelerate's environment."""
    return DistEnv(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))


def init_process_group(env: DistEnv, device: str = "cpu") -> None:
    """Join the process group (gloo on CPU, NCCL on CUDA) when running several processes."""
    if env.world <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")


def barrier(env: DistEnv) -> None:
    if env.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()


def device_for(env: DistEnv, device: str) -> str:
    """``cuda`` under W > 1 processes means this process's GPU, cuda:LOCAL_RANK."""
    if env.world > 1 and device in ("cuda", "auto"):
        return f"cuda:{env.local_rank}"
    return device


#: how ``isouq score`` may shard the model's weights over the ranks (None: each rank holds all)
SHARD_MODES = ("fsdp",)


def shard_model(model, env: DistEnv, device: str = "cpu"):
    """Shard ``model``'s weights over the W ranks with FSDP2 (``fully_shard``): each decoder
    layer (the classes a transformers model lists in ``_no_split_modules``; else its
    ``ModuleList`` entries) is its own unit, the root holds the rest (embeddings, final norm,
    head; tied weights stay tied). gloo on CPU, NCCL on CUDA (``device`` is this rank's,
    ``cuda:LOCAL_RANK``): the shards move there. The model's requires_grad flags are kept.

    Raises:
        InputError: a single process (nothing to shard over).
    """
    if env.world <= 1:
        raise InputError("--shard fsdp splits the weights over the ranks of a torchrun run: "
                         "launch with torchrun --nproc-per-node W (W ≥ 2), or drop --shard")
    return fully_shard_blocks(model, env.world, device)


def fully_shard_blocks(model, world: int, device: str = "cpu"):
    """:func:`shard_model`'s sharding over a mesh of ``world`` ranks (the process group must be
    initialized), with no check of ``world``: one rank is allowed (its collectives are the
    same calls; a machine with one GPU checks the NCCL path that way)."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(torch.device(device))
    mesh = init_device_mesh(kind, (world,))
    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names]
    if not units:  # a model that does not name its blocks: the entries of its ModuleLists
        units = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    for m in units:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def lockstep_steps(n: int, env: DistEnv) -> int:
    """The number of batches every rank runs when the weights are sharded: the largest ``n``
    over the ranks (one all-reduce); a rank with fewer runs fillers up to it."""
    if env.world <= 1:
        return n
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    dev = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    t = torch.tensor([n], dtype=torch.long, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def shard(items: list, env: DistEnv) -> list:
    return items[env.rank :: env.world]


def shard_path(out: str | Path, rank: int, world: int) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.rank{rank}-of-{world}{out.suffix}")


def write_ordered(out: str | Path, rows: list[dict], keys: list[str], *,
                  latest: str = "revision", prune: bool = False) -> Path:
    """Write ``rows`` to ``out`` in the order of ``keys``, atomically; exactly one row per key.

    latest="revision": a row with a higher integer ``revision`` (default 0) replaces its key's
    earlier rows (a QA row to which a later run added methods); two different rows of one
    revision are an error. latest="last": the last row of a key wins (``isouq score`` appends a
    row again when its input changed). Rows of keys outside ``keys`` (written by a run over a
    larger ``--limit``, say) are kept after them, in first-seen order, unless ``prune``.
    """
    by_key: dict[str, dict] = {}
    for r in rows:
        k = str(r["key"])
        if k in by_key and latest == "revision":
            rev, old_rev = int(r.get("revision", 0)), int(by_key[k].get("revision", 0))
            if rev < old_rev:
                continue
            if rev == old_rev and by_key[k] != r:
                raise DataError(f"key {k!r} appears twice with different contents")
        by_key[k] = r
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(keys)} rows are not scored yet (first: {missing[0]!r}); "
            "re-run the same command to finish them"
        )
    wanted = set(keys)
    others = [] if prune else [k for k in by_key if k not in wanted]
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for k in [*keys, *others]:
            f.write(dumps(by_key[k], ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return out


def merge_shards(out: str | Path, world: int, keys: list[str], *, remove: bool = False,
                 prune: bool = False) -> Path:
    """Merge ``world`` shards of ``out`` in input order (``keys``); optionally delete them.
    Within a shard the last row of a key wins (see :func:`write_ordered`)."""
    rows: list[dict] = []
    shards = [shard_path(out, r, world) for r in range(world)]
    for p in shards:
        rows += read_jsonl(p)
    path = write_ordered(out, rows, keys, latest="last", prune=prune)
    if remove:
        for p in shards:
            p.unlink(missing_ok=True)
    return path
