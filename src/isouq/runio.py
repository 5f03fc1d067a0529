"""Files every command shares: resumable JSONL rows and the experiment ``results.json``.

Conventions (docs/architecture.md):
- per-item runs append one JSON row per item, each with a stable ``key``; a row is written whole
  (one ``write`` of a full line, flushed and fsync'ed) or not at all; a re-run skips done keys;
  a torn last line from a crash is ignored on read and overwritten on the next append.
- experiments write ``DIR/results.json`` with the fields listed in :func:`write_results`.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import DataError, InputError


def _json_default(o: Any):
    try:
        import numpy as np
        import torch

        if isinstance(o, torch.Tensor):
            return o.detach().cpu().tolist()
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def dumps(obj: Any, **kw) -> str:
    """json.dumps that understands tensors, numpy scalars/arrays and paths."""
    return json.dumps(obj, default=_json_default, **kw)


def read_jsonl(path: str | os.PathLike, *, missing_ok: bool = True) -> list[dict]:
    """All complete rows (JSON objects) of a ``.jsonl`` or ``.jsonl.gz`` file.

    An unterminated last line is kept when it is a complete JSON object (a file written without
    a final newline) and skipped when it is not (an interrupted append leaves a torn prefix);
    a missing file is empty unless ``missing_ok=False``. DataError names the line of bad JSON.
    """
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return []
        raise DataError(f"{path} does not exist")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path} ({e}); check the file is intact") from e
    rows = []
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # torn tail of an interrupted append
                break
            raise DataError(f"{path}:{lineno} is not valid JSON ({e}); fix or delete that line") from e
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno} is a JSON {type(row).__name__}, not an object")
        rows.append(row)
    return rows


class JsonlWriter:
    """Append-only, crash-safe JSONL writer that remembers which keys are done.

    >>> w = JsonlWriter("out.jsonl")        # reads keys already written
    >>> if not w.done("q1"): w.write({"key": "q1", "score": 0.3})
    """

    def __init__(self, path: str | os.PathLike, key: str = "key"):
        self.path = Path(path)
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self.keys = {str(r[key]) for r in read_jsonl(self.path) if key in r}

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)

    def done(self, key: Any) -> bool:
        return str(key) in self.keys

    def write(self, row: dict) -> None:
        if self.key not in row:
            raise KeyError(f"row has no {self.key!r} field")
        line = dumps(row, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.keys.add(str(row[self.key]))

    def write_many(self, rows: Iterable[dict]) -> None:
        for r in rows:
            self.write(r)


def latest_by_key(rows: Iterable[dict], fields: tuple[str, ...] = ("key",)) -> list[dict]:
    """One row per identity (the values of ``fields``), the one with the highest integer
    ``revision`` (default 0; among equals the last), in the order identities first appear. Rows
    lacking a field are kept as they are. A file a run is still revising holds old and new rows
    of a key; readers want the newest."""
    best: dict[tuple, dict] = {}
    order: list = []
    for r in rows:
        if any(f not in r for f in fields):
            order.append(r)
            continue
        k = tuple(str(r[f]) for f in fields)
        if k not in best:
            order.append(k)
        elif int(r.get("revision", 0)) < int(best[k].get("revision", 0)):
            continue
        best[k] = r
    return [best[x] if isinstance(x, tuple) else x for x in order]


@contextmanager
def exclusive(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (via ``<path>.lock``) while a run appends to it.

    A second process resuming the same output at the same time would duplicate rows; it gets an
    InputError instead. The lock file is removed when the run ends (and dies with its process).
    POSIX only (elsewhere: no lock).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock = Path(str(path) + ".lock")
    busy = InputError(f"another process is writing {path} (it holds {lock.name}); wait for it "
                      "to finish, or give this run another --out")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock, "a")  # closed by the with below, after the unlock
    except OSError as e:
        raise InputError(f"cannot create the lock file {lock} ({e.strerror}); choose a writable "
                         "--out") from None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        try:  # the file we locked must still be the one at that path (a finished run unlinks it)
            if os.stat(lock).st_ino != os.fstat(f.fileno()).st_ino:
                raise busy
        except FileNotFoundError:
            raise busy from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def check_resume(rows: list[dict], expected: Callable[[dict], dict | None], filename: str) -> None:
    """InputError if a finished row was made with other settings than this run's.

    rows: finished rows, each with ``key`` and ``settings``; expected(row): the settings this run
    would use for that row, or None when this run does not touch it.
    """
    for r in rows:
        want = expected(r)
        if want is not None and r.get("settings") != want:
            got = r.get("settings") or {}
            diff = {k: (got.get(k), want.get(k)) for k in dict.fromkeys([*got, *want])
                    if got.get(k) != want.get(k)}  # a setting only one side has: None there
            raise InputError(
                f"{r['key']} in {filename} was made with other settings (row, now: {diff}); "
                "use another --out, or pass the same settings to resume"
            )


def machine_label(device: str = "cpu") -> str:
    """Where timings are taken, in words: 'AMD EPYC (family 23 model 1), 2 cores, 2 threads,
    cpu, boot 25f1fce6'.

    Seconds measured on different machines do not compare; QA rows record this beside their
    timings so a cost table can tell. The kernel's boot id tells apart machines that share a
    CPU name and host name (cloud VMs): the same label means the same machine since one boot.
    """
    import torch

    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for ln in f:
                key, _, val = ln.partition(":")
                info.setdefault(key.strip(), val.strip())
    except OSError:
        pass
    cpu = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info and "model" in info:
        cpu += f" (family {info['cpu family']} model {info['model']})"
    dev = str(device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        dev = torch.cuda.get_device_name(torch.device(dev))
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            boot = f"boot {f.read().strip()[:8]}"
    except OSError:
        boot = f"host {platform.node()}"
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, {dev}, {boot}"


def versions() -> dict[str, str]:
    """Versions of Python and the libraries results depend on."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("isouq", "torch", "numpy", "scipy", "sklearn", "transformers", "jax", "numpyro"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001 - optional libraries
            continue
    return out


def write_results(
    out_dir: str | os.PathLike,
    experiment: str,
    *,
    settings: dict,
    seed: int | None,
    started: float,
    tables: dict[str, list[dict]],
    paper: dict[str, list[dict]] | None = None,
    figures: Iterable[str] = (),
    extra: dict | None = None,
) -> Path:
    """Write ``out_dir/results.json`` (atomically) and ``out_dir/tables.md``; return the json path.

    results.json = {"experiment", "settings", "seed", "versions", "started", "elapsed_s",
    "tables": {name: [row, ...]}, "paper": {name: [row, ...]}, "figures": [file, ...], ...extra}.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "experiment": experiment,
        "settings": settings,
        "seed": seed,
        "versions": versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "elapsed_s": round(time.time() - started, 2),
        "tables": tables,
        "paper": paper or {},
        "figures": [str(f) for f in figures],
    }
    if extra:
        doc.update(extra)
    tmp = out / "results.json.tmp"
    tmp.write_text(dumps(doc, indent=2), encoding="utf-8")
    os.replace(tmp, out / "results.json")
    (out / "tables.md").write_text(tables_markdown(doc), encoding="utf-8")
    return out / "results.json"


def update_tables(out_dir: str | os.PathLike, tables: dict[str, list[dict]]) -> Path:
    """Replace (or add) some tables of an existing ``out_dir/results.json`` atomically and
    rebuild ``tables.md``; every other field is kept. An empty table is removed.

    Raises:
        InputError: there is no results.json in ``out_dir`` yet.
    """
    path = Path(out_dir) / "results.json"
    if not path.exists():
        raise InputError(f"no results.json in {out_dir}; run the experiment there first")
    doc = json.loads(path.read_text(encoding="utf-8"))
    for name, rows in tables.items():
        if rows:
            doc.setdefault("tables", {})[name] = rows
        else:
            doc.get("tables", {}).pop(name, None)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(dumps(doc, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    (path.parent / "tables.md").write_text(tables_markdown(doc), encoding="utf-8")
    return path


def slug(text: str, *, lower: bool = False) -> str:
    """A piece of a file name or an anchor: runs of other characters become '-' (letters,
    digits and dots kept: 'qwen2.5-coder-0.5b'); ``lower``: lowercase letters and digits only
    ('Proxy bias (2D)' -> 'proxy-bias-2d'). At most 80 characters."""
    if lower:
        return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:80]
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(text)).strip("-")[:80]


def markdown_grid(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table of string cells ('|' escaped, newlines flattened)."""
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_table(rows: list[dict], floatfmt: str = ".3g") -> str:
    """A GitHub-flavoured Markdown table from a list of dict rows (union of keys, in order)."""
    if not rows:
        return "_(empty)_\n"
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]

    def fmt(v):
        if isinstance(v, float):
            return format(v, floatfmt)
        return "" if v is None else str(v)

    return markdown_grid(cols, ([fmt(r.get(c)) for c in cols] for r in rows))


def tables_markdown(doc: dict) -> str:
    parts = [f"# {doc['experiment']}\n"]
    for name, rows in doc.get("tables", {}).items():
        parts.append(f"\n## {name}\n\n" + markdown_table(rows))
        if name in doc.get("paper", {}):
            parts.append("\nPaper:\n\n" + markdown_table(doc["paper"][name]))
    return "".join(parts)


