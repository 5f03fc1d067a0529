"""Crash-safe checkpoints of a segmented MCMC run: sampler state, RNG key, draws so far.

A run is cut into segments of iterations (:func:`segments`); after each one the checkpoint
directory receives

- ``part_<first>.npz``: the kept draws (C, k, D) and the per-iteration extra fields (C, n) of a
  sampling segment (warmup segments keep no draws);
- ``state_<done>.npz``: the whole sampler state after the segment (NumPyro's ``HMCState``:
  position, potential energy and gradient, the RNG key of every chain, the iteration counter,
  and the adaptation state: step size, dual-averaging state, inverse mass matrix and its
  Welford accumulator), one array per pytree leaf;
- ``meta.json``: the settings that made the run (``fingerprint``), the segment length,
  iterations done, the current state file, the part files and per-segment timings.

Every file is written to a temporary name, fsynced and renamed; ``meta.json`` is renamed last
and is the commit point, so a run killed at any moment leaves either the previous checkpoint
or the new one, never a mix (files the meta does not list are removed on the next open).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from ..errors import InputError

FORMAT = 1
META = "meta.json"


def segments(num_warmup: int, num_samples: int, every: int) -> list[tuple[int, int]]:
    """[start, stop) iteration ranges: warmup cut every ``every`` iterations, then sampling.

    No segment spans the end of warmup. Example: (5, 4, 3) → [(0,3), (3,5), (5,8), (8,9)].
    """
    if every < 1:
        raise InputError(f"checkpoint_every must be ≥ 1 iteration, got {every}")
    out = []
    for lo, hi in ((0, num_warmup), (num_warmup, num_warmup + num_samples)):
        out += [(a, min(a + every, hi)) for a in range(lo, hi, every)]
    return out


def kept_indices(start: int, stop: int, num_samples: int, thinning: int) -> np.ndarray:
    """Positions within a sampling segment [start, stop) (sampling-phase indices) that are kept.

    The kept draws of the whole run are sampling iterations s ≥ S % thinning with
    (S − 1 − s) % thinning == 0: the last of each whole block of ``thinning``, blocks counted
    from the end (what NumPyro's ``MCMC`` keeps), num_samples // thinning in all.
    """
    s = np.arange(start, stop)
    return np.flatnonzero(((num_samples - 1 - s) % thinning == 0) & (s >= num_samples % thinning))


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    _atomic_write(path, lambda f: np.savez(f, **arrays))


@dataclass
class Progress:
    """Where a checkpointed run stands: iterations done, segment length, timings."""

    done: int
    total: int
    every: int
    seconds: float = 0.0
    parts: list[str] = field(default_factory=list)
    state_file: str | None = None
    log: list[dict] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.done >= self.total


class Checkpoint:
    """The checkpoint directory of one MCMC run.

    Args:
        path: the directory (created on the first save).
        fingerprint: JSON-ready settings that determine the draws (kernel, sizes, seed, data
            hash, …); a checkpoint made with another fingerprint is refused, not resumed.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict):
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint))

    # ------------------------------------------------------------------ reading

    def load(self) -> Progress | None:
        """The saved progress, or None when there is no checkpoint yet.

        Raises:
            InputError: the checkpoint was made with other settings (names the differences).
        """
        meta_path = self.path / META
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise InputError(f"{meta_path} has format {meta.get('format')}, this isouq reads "
                             f"{FORMAT}; delete {self.path} to start the run again")
        got = meta["fingerprint"]
        if got != self.fingerprint:
            keys = sorted(set(got) | set(self.fingerprint))
            diff = {k: (got.get(k), self.fingerprint.get(k)) for k in keys
                    if got.get(k) != self.fingerprint.get(k)}
            raise InputError(
                f"the checkpoint in {self.path} was made with other settings (checkpoint, now: "
                f"{diff}); pass the same settings to resume, or delete {self.path} to start over")
        p = Progress(done=meta["done"], total=meta["total"], every=meta["every"],
                     seconds=meta["seconds"], parts=list(meta["parts"]),
                     state_file=meta["state"], log=list(meta.get("log", [])))
        self._remove_strays(p)
        return p

    def _remove_strays(self, p: Progress) -> None:
        """Delete files a run killed between two commits left behind."""
        keep = {META, *p.parts, p.state_file}
        for f in self.path.iterdir():
            if f.name not in keep and (f.suffix in (".npz", ".tmp") or f.name.endswith(".tmp")):
                f.unlink(missing_ok=True)

    def load_state(self, p: Progress, template):
        """The saved sampler state, as a pytree shaped like ``template`` (a fresh state)."""
        leaves, treedef = jax.tree.flatten(template)
        with np.load(self.path / p.state_file) as z:
            saved = [z[f"leaf_{i}"] for i in range(len(z.files))]
        if len(saved) != len(leaves) or any(
            np.shape(a) != np.shape(b) or np.asarray(a).dtype != b.dtype
            for a, b in zip(leaves, saved, strict=True)
        ):
            raise InputError(f"the sampler state in {self.path / p.state_file} does not match "
                             f"this run's sampler (other numpyro/jax version?); delete {self.path} "
                             "to start over")
        return jax.tree.unflatten(treedef, [jax.numpy.asarray(a) for a in saved])

    def load_parts(self, p: Progress) -> list[dict[str, np.ndarray]]:
        """Every saved sampling part, in order: {"draws": (C, k, D), field: (C, n), ...}."""
        out = []
        for name in p.parts:
            with np.load(self.path / name) as z:
                out.append({k: z[k] for k in z.files})
        return out

    # ------------------------------------------------------------------ writing

    def save(self, p: Progress, state, part: dict[str, np.ndarray] | None, first: int,
             seg_log: dict) -> None:
        """Commit one more segment: its part (if any), the state after it, then the meta.

        p: the progress after the segment (``done`` already advanced; updated in place).
        first: the segment's first iteration (names the part file).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        ignore = self.path.parent / ".gitignore"
        if not ignore.exists():  # checkpoints hold the draws: far too large for git
            ignore.write_text("*\n")
        old_state = p.state_file
        if part is not None:
            name = f"part_{first:07d}.npz"
            _save_npz(self.path / name, part)
            p.parts.append(name)
        leaves = jax.tree.leaves(jax.device_get(state))
        p.state_file = f"state_{p.done:07d}.npz"
        _save_npz(self.path / p.state_file,
                  {f"leaf_{i}": np.asarray(a) for i, a in enumerate(leaves)})
        p.log.append(seg_log)
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "done": p.done,
                "total": p.total, "every": p.every, "seconds": p.seconds,
                "state": p.state_file, "parts": p.parts,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "log": p.log}
        _atomic_write(self.path / META, lambda f: f.write(json.dumps(meta, indent=1).encode()))
        if old_state and old_state != p.state_file:
            (self.path / old_state).unlink(missing_ok=True)


def copy_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, tries: int = 5) -> int:
    """Copy a consistent snapshot of a checkpoint (of a run that may still be writing it).

    Copies the files ``src/meta.json`` names (its state file and parts) and then that meta,
    into ``dst`` (replaced); if the running sampler moved on meanwhile (the state file is
    gone), reads the meta again, up to ``tries`` times. Returns the bytes copied. A copy
    placed back as a run's checkpoint directory resumes it like the original.
    """
    import shutil

    src, dst = Path(src), Path(dst)
    for _ in range(tries):
        meta_bytes = (src / META).read_bytes()
        meta = json.loads(meta_bytes)
        names = [n for n in [meta["state"], *meta["parts"]] if n]
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            for n in names:
                shutil.copyfile(src / n, tmp / n)
        except FileNotFoundError:
            shutil.rmtree(tmp, ignore_errors=True)
            time.sleep(1.0)
            continue
        (tmp / META).write_bytes(meta_bytes)
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        return sum((dst / n).stat().st_size for n in [*names, META])
    raise InputError(f"{src} changed during every one of {tries} tries; copy it again")


def read_meta(path: str | os.PathLike) -> dict | None:
    """The ``meta.json`` of a checkpoint directory (progress, timings), or None if absent."""
    f = Path(path) / META
    return json.loads(f.read_text()) if f.exists() else None


def progress_summary(meta: dict, recent: int = 10) -> dict:
    """Where a checkpointed run stands, from its ``meta.json`` (:func:`read_meta`).

    Args:
        meta: the checkpoint's meta (``done``, ``total``, ``seconds``, ``log``, ``updated``).
        recent: how many of the last segments set the current rate.

    Returns:
        ``done``, ``total`` (iterations per chain), ``seconds`` (sampling wall seconds summed
        over every session that ran it), ``leapfrog_steps`` (summed over the segments),
        ``seconds_per_iteration`` and ``ms_per_leapfrog_step`` over the last ``recent``
        segments (None before the first), ``eta_seconds`` (the iterations left at that rate,
        on the machine that ran them; None without a rate) and ``updated`` (the last commit).
    """
    log = list(meta.get("log") or [])
    last = log[-recent:] if recent > 0 else []
    its = sum(s["stop"] - s["start"] for s in last)
    secs = sum(s["seconds"] for s in last)
    steps = sum(s.get("leapfrog_steps", 0) for s in last)
    per_it = secs / its if its else None
    done, total = int(meta["done"]), int(meta["total"])
    return {"done": done, "total": total, "seconds": float(meta.get("seconds", 0.0)),
            "leapfrog_steps": sum(s.get("leapfrog_steps", 0) for s in log),
            "seconds_per_iteration": per_it,
            "ms_per_leapfrog_step": 1e3 * secs / steps if steps else None,
            "eta_seconds": None if per_it is None else per_it * max(total - done, 0),
            "updated": meta.get("updated")}


__all__ = ["Checkpoint", "Progress", "copy_checkpoint", "kept_indices", "progress_summary",
           "read_meta", "segments"]
