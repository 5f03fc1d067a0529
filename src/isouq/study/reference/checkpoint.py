"""Crash-safe checkpoints of a segmented MCMC run: sampler state, RNG key, draws so far.

Two layouts. ``"draws"`` (the default) keeps every kept draw; ``"compact"`` keeps no draw, only
the sampler state and running sums of the predictive statistics (:class:`RunningPredictive`),
about 40 MB at a million parameters (see the end of this docstring). Neither layout belongs in
git: the first save writes a ``.gitignore`` (``*``) into the checkpoint's parent directory when
it has none (:func:`ignore_in_git`); what a repository keeps of a run is its summary
(:func:`progress_summary`).

A run is cut into segments of iterations (:func:`segments`); after each one the checkpoint
directory of the ``"draws"`` layout receives

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

The ``"compact"`` layout (:meth:`Checkpoint.save_compact`) writes, instead of state and parts,
a few compressed groups of named arrays (``<group>_<content digest>.npz``, e.g. the sampler
state, the mass matrix, the running sums), listed under ``files`` in ``meta.json``. A group is
named by its content, so one that did not change since the last segment (the mass matrix after
warmup) is not rewritten, and a copy of the folder (rsync) moves it once. float64 arrays whose
values are all exact float32 numbers are stored as float32 (lossless; read back as float64).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from ...errors import InputError

FORMAT = 1
META = "meta.json"
LAYOUTS = ("draws", "compact")
#: A compact group's file: ``<group>_<16 hex digits of its content's SHA-256>.npz``.
_GROUP_FILE = re.compile(r"^([a-z]+)_([0-9a-f]{16})\.npz$")


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


def ignore_in_git(path: Path) -> None:
    """Write ``path.parent/.gitignore`` (``*``: everything beside ``path``, itself included)
    unless it exists: a checkpoint is tens of MB to GB and changes after every segment."""
    ignore = path.parent / ".gitignore"
    if not ignore.exists():
        ignore.parent.mkdir(parents=True, exist_ok=True)
        ignore.write_text("*\n")


def _save_npz(path: Path, arrays: dict[str, np.ndarray], compressed: bool = False) -> None:
    save = np.savez_compressed if compressed else np.savez
    _atomic_write(path, lambda f: save(f, **arrays))


def pack_lossless(a) -> np.ndarray:
    """``a`` as float32 when it is float64 and every value is an exact float32 number (zeros,
    ones, values rounded to float32), else unchanged: half the bytes, nothing lost."""
    a = np.asarray(a)
    if a.dtype == np.float64 and a.size:
        b = a.astype(np.float32)
        if np.array_equal(b.astype(np.float64), a, equal_nan=True):
            return b
    return a


def _content_digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


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
    #: the compact layout's group files (empty for the draws layout)
    files: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.done >= self.total


class Checkpoint:
    """The checkpoint directory of one MCMC run.

    Args:
        path: the directory (created on the first save).
        fingerprint: JSON-ready settings that determine the draws (kernel, sizes, seed, data
            hash, …); a checkpoint made with another fingerprint is refused, not resumed.
        layout: ``"draws"`` (:meth:`save`: state and kept draws) or ``"compact"``
            (:meth:`save_compact`: groups of named arrays, no draws); a checkpoint of the other
            layout is refused.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict, layout: str = "draws"):
        if layout not in LAYOUTS:
            raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint))
        self.layout = layout

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
        layout = meta.get("layout", "draws")
        if layout != self.layout:
            raise InputError(f"the checkpoint in {self.path} has the {layout!r} layout, this run "
                             f"writes {self.layout!r}; delete {self.path} to start over")
        p = Progress(done=meta["done"], total=meta["total"], every=meta["every"],
                     seconds=meta["seconds"], parts=list(meta["parts"]),
                     state_file=meta["state"], log=list(meta.get("log", [])),
                     files=list(meta.get("files", [])))
        missing = [f for f in [*p.parts, *p.files, p.state_file]
                   if f and not (self.path / f).exists()]
        if missing:
            raise InputError(f"the checkpoint in {self.path} lists files that are not there "
                             f"({', '.join(missing)}): an incomplete copy; copy it again "
                             f"(copy_checkpoint) or delete {self.path} to start over")
        self._remove_strays(p)
        return p

    def _remove_strays(self, p: Progress) -> None:
        """Delete files a run killed between two commits left behind."""
        keep = {META, *p.parts, *p.files, p.state_file}
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

    def load_arrays(self, p: Progress) -> dict[str, dict[str, np.ndarray]]:
        """The compact layout's groups: {group: {name: array}}, as stored (float32 where the
        float64 values were exact float32 numbers: cast back with ``.astype``)."""
        out = {}
        for name in p.files:
            with np.load(self.path / name) as z:
                out[_GROUP_FILE.match(name).group(1)] = {k: z[k] for k in z.files}
        return out

    # ------------------------------------------------------------------ writing

    def _write_meta(self, p: Progress) -> None:
        meta = {"format": FORMAT, "layout": self.layout, "fingerprint": self.fingerprint,
                "done": p.done, "total": p.total, "every": p.every, "seconds": p.seconds,
                "state": p.state_file, "parts": p.parts, "files": p.files,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "log": p.log}
        _atomic_write(self.path / META, lambda f: f.write(json.dumps(meta, indent=1).encode()))

    def save_compact(self, p: Progress, groups: dict[str, dict[str, np.ndarray]],
                     seg_log: dict) -> None:
        """Commit one more segment of a compact run: each group of arrays, then the meta.

        groups: {group name (lower-case letters): {array name: array}}; float64 arrays of exact
        float32 values are stored as float32 (:func:`pack_lossless`), each group compressed in
        ``<group>_<digest>.npz``; a file that already holds the same content is kept as it is.
        Files of the previous commit that the new one does not list are removed after the meta.
        """
        if self.layout != "compact":
            raise InputError("save_compact needs a Checkpoint(layout='compact')")
        self.path.mkdir(parents=True, exist_ok=True)
        ignore_in_git(self.path)
        old = set(p.files)
        files = []
        for group, arrays in groups.items():
            if not re.fullmatch(r"[a-z]+", group):
                raise InputError(f"group names are lower-case letters, got {group!r}")
            packed = {k: pack_lossless(v) for k, v in arrays.items()}
            name = f"{group}_{_content_digest(packed)}.npz"
            if not (self.path / name).exists():
                _save_npz(self.path / name, packed, compressed=True)
            files.append(name)
        p.files = files
        p.log.append(seg_log)
        self._write_meta(p)
        for name in old - set(files):
            (self.path / name).unlink(missing_ok=True)

    def size_bytes(self, p: Progress | None = None) -> int:
        """Bytes of the committed checkpoint: the files its meta lists, and the meta."""
        p = p or self.load()
        if p is None:
            return 0
        names = [META, *p.parts, *p.files, *([p.state_file] if p.state_file else [])]
        return sum((self.path / n).stat().st_size for n in names)

    def save(self, p: Progress, state, part: dict[str, np.ndarray] | None, first: int,
             seg_log: dict) -> None:
        """Commit one more segment: its part (if any), the state after it, then the meta.

        p: the progress after the segment (``done`` already advanced; updated in place).
        first: the segment's first iteration (names the part file).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        ignore_in_git(self.path)
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
        self._write_meta(p)
        if old_state and old_state != p.state_file:
            (self.path / old_state).unlink(missing_ok=True)


def _merge(a: tuple, b: tuple) -> tuple:
    """Chan et al.'s merge of two Welford summaries (count, mean, M2) of disjoint draws."""
    na, ma, Ma = a
    nb, mb, Mb = b
    n = na + nb
    if na == 0 or nb == 0:
        return (n, mb, Mb) if na == 0 else (n, ma, Ma)
    d = mb - ma
    return n, ma + d * (nb / n), Ma + Mb + d * d * (na * nb / n)


class RunningPredictive:
    """Running sums of a predictive quantity q over the kept draws of several chains: what
    :func:`~isouq.study.reference.predictive.predictive_moments` computes from stored draws (mean,
    variance over all draws, E[q(1 − q)], split R-hat and ESS per point), without the draws.

    Per chain and point (the quantity's values, ``shape``, flattened), for the chain's
    ``num_draws`` kept draws:

    - Welford count, mean and M2 of three blocks: the first ``num_draws // 2`` draws, the middle
      one (odd ``num_draws``), the last ``num_draws // 2``. Split R-hat needs the halves; the
      chain's mean and variance, and the pooled ones, merge from the blocks (Chan et al.).
    - Σ q(1 − q), for the aleatoric part.
    - For the ESS, the autocovariances of y = q − q₀ (q₀ the chain's first draw: a shift leaves
      them unchanged and keeps the sums free of cancellation) up to lag ``max_lag``: the lag
      products Σₜ yₜ yₜ₊ₖ (k ≤ max_lag), Σ y, the first ``max_lag`` values and a ring buffer of
      the last ``max_lag``. NumPyro's ESS (Geyer's initial monotone sequence) sums the pairs of
      autocorrelations up to the first pair ≤ 0; where that pair lies within ``max_lag`` the ESS
      here is NumPyro's on the same draws (to rounding), else it is an upper bound, and the point
      is counted in ``ess_truncated``.

    Memory: (3·max_lag + 10)·K·P float64 (K chains, P points); state as arrays
    (:meth:`to_arrays`, :meth:`from_arrays`) for a checkpoint.
    """

    def __init__(self, num_chains: int, num_draws: int, shape: tuple[int, ...],
                 max_lag: int = 32):
        if num_chains < 1 or num_draws < 1 or max_lag < 1:
            raise InputError("need num_chains ≥ 1, num_draws ≥ 1 and max_lag ≥ 1")
        self.K, self.N, self.shape = int(num_chains), int(num_draws), tuple(int(x) for x in shape)
        self.P = int(np.prod(self.shape))
        self.L = max(1, min(int(max_lag), self.N - 1))
        K, P, L = self.K, self.P, self.L
        z = np.zeros
        self.a = {"n": z((), np.int64), "count": z(3, np.int64), "mean": z((K, 3, P)),
                  "m2": z((K, 3, P)), "pq": z((K, P)), "shift": z((K, P)), "ysum": z((K, P)),
                  "lag": z((K, L + 1, P)), "head": z((K, L, P)), "tail": z((K, L, P))}

    @property
    def n(self) -> int:
        """Draws per chain so far."""
        return int(self.a["n"])

    def _block(self, t: int) -> int:
        half = self.N // 2
        return 0 if t < half else (1 if t < self.N - half else 2)

    def update(self, values: np.ndarray) -> None:
        """Add the next k draws of every chain: ``values`` (K, k, *shape), in draw order."""
        v = np.asarray(values, dtype=np.float64)
        if v.shape[0] != self.K or v.shape[2:] != self.shape:
            raise InputError(f"values must be ({self.K}, k, {', '.join(map(str, self.shape))}), "
                             f"got {v.shape}")
        v = v.reshape(self.K, v.shape[1], self.P)
        a, L = self.a, self.L
        for j in range(v.shape[1]):
            t = self.n
            if t >= self.N:
                raise InputError(f"more than the {self.N} draws per chain this sum was made for")
            x = v[:, j]
            if t == 0:
                a["shift"][:] = x
            b = self._block(t)
            a["count"][b] += 1
            d = x - a["mean"][:, b]
            a["mean"][:, b] += d / a["count"][b]
            a["m2"][:, b] += d * (x - a["mean"][:, b])
            a["pq"] += x * (1.0 - x)
            y = x - a["shift"]
            a["ysum"] += y
            a["lag"][:, 0] += y * y
            ks = np.arange(1, min(L, t) + 1)
            if ks.size:
                a["lag"][:, ks] += a["tail"][:, (t - ks) % L] * y[:, None]
            if t < L:
                a["head"][:, t] = y
            a["tail"][:, t % L] = y
            a["n"] = np.int64(t + 1)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The running state as named arrays (with the sizes it was made for)."""
        return {**{k: np.array(v) for k, v in self.a.items()},
                "config": np.array([self.K, self.N, self.L, *self.shape], np.int64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], num_chains: int, num_draws: int,
                    shape: tuple[int, ...], max_lag: int = 32) -> RunningPredictive:
        """The sums :meth:`to_arrays` saved; InputError if they were made for other sizes."""
        out = cls(num_chains, num_draws, shape, max_lag)
        want = out.to_arrays()
        if not np.array_equal(arrays.get("config"), want["config"]) or set(arrays) != set(want):
            raise InputError("the saved running sums were made for other sizes "
                             f"({arrays.get('config')}, now {want['config']})")
        for k in out.a:
            out.a[k] = np.asarray(arrays[k]).astype(want[k].dtype).reshape(want[k].shape)
        return out

    def _chains(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-chain mean and M2 over all its draws, (K, P) each."""
        a, c = self.a, self.a["count"]
        blocks = [(int(c[b]), a["mean"][:, b], a["m2"][:, b]) for b in range(3)]
        _, m, M = _merge(_merge(blocks[0], blocks[1]), blocks[2])
        return m, M

    def moments(self, task: str, noise_std: float | None = None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, epistemic, aleatoric) over every draw so far, each of ``shape``."""
        n = self.n
        if n == 0:
            raise InputError("no draws yet")
        m, M = self._chains()
        tot = (n, m[0], M[0])
        for k in range(1, self.K):
            tot = _merge(tot, (n, m[k], M[k]))
        var = tot[2] / (self.K * n)
        if task == "regression":
            alea = np.full(self.P, (noise_std or 0.0) ** 2)
        else:
            alea = self.a["pq"].sum(0) / (self.K * n)
        return tuple(x.reshape(self.shape) for x in (tot[1], var, alea))

    def split_r_hat(self) -> np.ndarray:
        """Split R-hat per point (P,) as ``numpyro.diagnostics.split_gelman_rubin``."""
        h = self.N // 2
        means = np.concatenate([self.a["mean"][:, 0], self.a["mean"][:, 2]])
        vars_ = np.concatenate([self.a["m2"][:, 0], self.a["m2"][:, 2]]) / (h - 1)
        with np.errstate(all="ignore"):
            within = vars_.mean(0)
            est = within * (h - 1) / h + means.var(0, ddof=1)
            return np.sqrt(est / within)

    def ess(self) -> tuple[np.ndarray, np.ndarray]:
        """(ESS (P,), truncated (P,) bool) as ``numpyro.diagnostics.effective_sample_size``.

        truncated: no pair of autocorrelations ≤ 0 within ``max_lag`` (and the draws have more
        lags than that): the ESS there is an upper bound of NumPyro's.
        """
        a, K, N, L = self.a, self.K, self.N, self.L
        m, M = self._chains()
        with np.errstate(all="ignore"):
            within = (M / (N - 1)).mean(0)
            est = within * (N - 1) / N
            if K > 1:
                est = est + m.var(0, ddof=1)
            else:
                within = est
            ybar = a["ysum"] / N
            zero = np.zeros((K, 1, self.P))
            heads = np.concatenate([zero, np.cumsum(a["head"], axis=1)], axis=1)
            last = [(N - i) % L for i in range(1, L + 1)]
            tails = np.concatenate([zero, np.cumsum(a["tail"][:, last], axis=1)], axis=1)
            ks = np.arange(L + 1)[None, :, None]
            yb = ybar[:, None]
            gamma = (a["lag"] - yb * (2 * a["ysum"][:, None] - tails - heads)
                     + (N - ks) * yb * yb) / N
            rho = 1.0 - (within - gamma.mean(0)) / est
            rho[0] = 1.0
            J = min((L + 1) // 2, N // 2)
            pairs = rho[0 : 2 * J : 2] + rho[1 : 2 * J : 2]
            mono = np.concatenate(
                [pairs[:1], np.minimum.accumulate(np.clip(pairs[1:], 0, None), axis=0)])
            tau = -1.0 + 2.0 * mono.sum(0)
            truncated = (J < N // 2) & np.all(pairs[1:] > 0, axis=0)
            return K * N / tau, truncated

    def finalize(self, task: str, noise_std: float | None = None,
                 diagnostics: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """(mean, epistemic, aleatoric, diag) as ``predictive_moments`` on the same draws.

        diag: ``n_draws``, ``n_chains`` and, with ≥ 2 chains and ≥ 4 draws each, the summaries
        ``r_hat_*`` and ``ess_*`` (binary: of p₁ only) and ``ess_truncated`` (points whose ESS is
        an upper bound, see :meth:`ess`). Needs every draw (``num_draws`` per chain).
        """
        from .predictive import _summarise

        if self.n != self.N:
            raise InputError(f"{self.n} of {self.N} draws per chain so far")
        mean, var, alea = self.moments(task, noise_std)
        diag: dict = {"n_draws": self.K * self.N, "n_chains": self.K}
        if diagnostics and self.K >= 2 and self.N >= 4:
            rhat, (ess, trunc) = self.split_r_hat(), self.ess()
            if task == "binary":  # p0 = 1 − p1: p1 only, as predictive_moments
                rhat, ess, trunc = (x.reshape(self.shape)[..., 1] for x in (rhat, ess, trunc))
            diag.update(_summarise(rhat, "r_hat"))
            diag.update(_summarise(ess, "ess"))
            diag["ess_truncated"] = int(np.count_nonzero(trunc))
        return mean, var, alea, diag


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
        names = [n for n in [meta["state"], *meta["parts"], *meta.get("files", [])] if n]
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
        on the machine that ran them; None without a rate) and ``updated`` (the last commit);
        ``cpu_seconds`` (the process's CPU time, all threads, summed over the segments that
        recorded it), ``cpu_seconds_per_iteration`` over the last ``recent`` segments that
        recorded it and ``eta_cpu_seconds`` at that rate: unlike wall seconds, CPU seconds do not
        grow while the run is stopped (``kill -STOP``) or starved by other work.
    """
    log = list(meta.get("log") or [])
    last = log[-recent:] if recent > 0 else []
    its = sum(s["stop"] - s["start"] for s in last)
    secs = sum(s["seconds"] for s in last)
    steps = sum(s.get("leapfrog_steps", 0) for s in last)
    per_it = secs / its if its else None
    timed = [s for s in last if "cpu_seconds" in s]
    cpu_its = sum(s["stop"] - s["start"] for s in timed)
    cpu_per_it = sum(s["cpu_seconds"] for s in timed) / cpu_its if cpu_its else None
    done, total = int(meta["done"]), int(meta["total"])
    left = max(total - done, 0)
    return {"done": done, "total": total, "seconds": float(meta.get("seconds", 0.0)),
            "cpu_seconds": float(sum(s.get("cpu_seconds", 0.0) for s in log)),
            "leapfrog_steps": sum(s.get("leapfrog_steps", 0) for s in log),
            "seconds_per_iteration": per_it,
            "cpu_seconds_per_iteration": cpu_per_it,
            "ms_per_leapfrog_step": 1e3 * secs / steps if steps else None,
            "eta_seconds": None if per_it is None else per_it * left,
            "eta_cpu_seconds": None if cpu_per_it is None else cpu_per_it * left,
            "updated": meta.get("updated")}


__all__ = ["Checkpoint", "Progress", "RunningPredictive", "copy_checkpoint", "ignore_in_git",
           "kept_indices", "pack_lossless", "progress_summary", "read_meta", "segments"]
