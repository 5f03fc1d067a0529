"""Read (prompt, answer) rows for ``isouq score`` from JSONL or CSV, strictly and as a stream.

Each row needs an ``answer`` (a non-empty string, or in JSONL a list of token ids) and either a
``prompt`` (a string, or in JSONL chat messages ``[{"role": str, "content": str}, ...]``) or a
``question`` (turned into the documented QA prompt). An optional ``key`` or ``id`` (a string or
a whole number) names the row; without one the key is derived from the row's content
(``c-<12 hex digits>``, ``~2``, ``~3``, … for repeats), so inserting or removing rows never
shifts another row's key. Keys must be unique: re-runs skip rows already scored. An optional
``spans`` (JSONL: ``[[start, end], ...]``, character ranges of the answer's text) names the
parts of the answer to score on their own (claims); it is kept as given here and checked by
the caller (``isouq.spans.check_ranges``, through :func:`scan_pairs`' ``check``).

Files are read as UTF-8 (a byte-order mark is accepted), optionally gzip-compressed
(``.gz``). Every problem is a :class:`~isouq.errors.DataError` naming the file, the line or
row, and the fix: a malformed line (a torn last line too), a wrong encoding, a folder.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from ..errors import DataError

Prompt = str | list[dict]
Answer = str | list[int]


#: the fields of an input row that ``isouq score`` reads or writes itself; any other field (a
#: label, a dataset, …) travels unchanged to the row's answer row
OWN_FIELDS: frozenset[str] = frozenset({
    "key", "id", "answer", "prompt", "question", "spans", "scores", "seconds",
    "n_answer_tokens", "n_params", "params", "method", "input_sha", "settings_sha", "blocks",
    "hidden", "error", "reason", "p_correct", "withheld", "model"})


@dataclass(frozen=True)
class PairRow:
    """One validated row: ``answer`` and ``prompt`` or ``question``; ``line``: where it was read
    (1-based line of a JSONL file, 1-based data row of a CSV file); ``spans``: the row's own
    character ranges of its answer to score as spans, as given (None: none given); ``extra``:
    the row's other fields (a label, a dataset name, …), which travel to its answer row."""

    key: str
    answer: Answer
    prompt: Prompt | None = None
    question: str | None = None
    line: int = 0
    spans: list | None = None
    extra: dict = field(default_factory=dict)

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of the row as given: prompt, question, answer and, only when
        present (so that a row without them keeps the digest it always had), its own spans and
        its other fields (a changed label writes its row again)."""
        content = {"prompt": self.prompt, "question": self.question, "answer": self.answer}
        if self.spans is not None:
            content["spans"] = self.spans
        if self.extra:
            content["extra"] = self.extra
        return content_sha(content)


def content_sha(obj) -> str:
    """Short SHA-256 of ``obj``'s canonical JSON (sorted keys): equal content, equal digest."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class PairIndex:
    """What a validating pass over a file found: keys in file order and each key's content
    fingerprint (for resume), without holding the rows."""

    keys: list[str] = field(default_factory=list)
    fingerprints: dict[str, str] = field(default_factory=dict)
    #: the largest token id of the answers given as ids, and the key of its row (None: none)
    max_token_id: tuple[int, str] | None = None
    #: the key of the first row that gives its own ``spans`` (None: no row does)
    spans_key: str | None = None

    def __len__(self) -> int:
        return len(self.keys)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise DataError(f"input file {path} does not exist")
    if path.is_dir():
        raise DataError(f"{path} is a folder; give a .jsonl or .csv file")
    if not _stem(path).endswith((".csv", ".jsonl", ".json", ".ndjson")):
        raise DataError(f"{path}: use a .jsonl or .csv file (optionally .gz)")


def _stem(path: Path) -> str:
    return path.name[:-3] if path.suffix == ".gz" else path.name


def _lines(path: Path) -> Iterator[str]:
    """Text lines of a UTF-8 file (BOM accepted), a clear error on another encoding."""
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            for n, line in enumerate(f, 1):  # noqa: B007 - n names the line in the error
                yield line
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 (undecodable byte {e.object[e.start:e.start + 1]!r} after "
            f"line {n}); re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path} cannot be read: {e}") from None


def iter_raw(path: str | Path) -> Iterator[tuple[int, object]]:
    """(line number, raw row) from a .jsonl/.csv file, one at a time. JSONL blank lines are
    skipped; any other line that is not one JSON value is an error (a torn last line too)."""
    path = Path(path)
    _check_path(path)
    if _stem(path).endswith(".csv"):
        reader = csv.DictReader(_lines(path))
        try:
            for i, r in enumerate(reader, 1):
                if None in r:
                    raise DataError(f"{path} row {i} has more fields than the header; quote "
                                    "fields that contain commas")
                yield i, r
        except csv.Error as e:
            raise DataError(f"{path} is not valid CSV ({e}); fix the quoting") from None
        return
    for i, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            torn = "" if line.endswith("\n") else " (the last line is cut off)"
            raise DataError(f"{path} line {i} is not valid JSON{torn}: {e.msg}; fix or remove "
                            "that line") from None


def _present(v) -> bool:
    return v is not None and v != ""


def _check_prompt(v, where: str) -> Prompt:
    if isinstance(v, str):
        if not v.strip():
            raise DataError(f"{where}: 'prompt' is blank; give the prompt text")
        return v
    if isinstance(v, list) and v and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in v):
        return [{"role": m["role"], "content": m["content"]} for m in v]
    raise DataError(f"{where}: 'prompt' must be a string or a non-empty list of "
                    f"{{\"role\": str, \"content\": str}} messages, got {_show(v)}")


def _check_answer(v, where: str) -> Answer:
    if isinstance(v, str):
        if not v.strip():
            raise DataError(f"{where}: 'answer' is blank; every row needs an answer")
        return v
    if isinstance(v, list) and v:
        if all(type(t) is int and t >= 0 for t in v):
            return list(v)
        raise DataError(f"{where}: 'answer' as token ids must be whole numbers ≥ 0, got "
                        f"{_show(v)}; pass text as a string")
    raise DataError(f"{where}: 'answer' must be a string or a list of token ids, got "
                    f"{_show(v)}; quote text answers (\"4\", not 4)")


def _show(v) -> str:
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def validate_row(raw, line: int, path: str | Path) -> PairRow:
    """A :class:`PairRow` from a raw row, or a DataError naming the file, line and the fix.
    The key is the row's own (``key``, else ``id``) or ``""`` (derived later from content)."""
    where = f"{path} line {line}"
    if not isinstance(raw, dict):
        raise DataError(f"{where} is not a JSON object; write one {{...}} per line")
    key = raw.get("key", raw.get("id"))
    if _present(key):
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise DataError(f"{where}: 'key' must be a string or a whole number, got {_show(key)}")
        key = str(key)
        where = f"{path} line {line} (key {key!r})"
    else:
        key = ""
    if not _present(raw.get("answer")):
        raise DataError(f"{where} has no 'answer'; every row needs one")
    answer = _check_answer(raw["answer"], where)
    prompt = question = None
    if _present(raw.get("prompt")):
        prompt = _check_prompt(raw["prompt"], where)
    elif _present(raw.get("question")):
        question = raw["question"]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: 'question' must be non-blank text, got {_show(question)}")
    else:
        raise DataError(f"{where} needs a 'prompt' or a 'question' "
                        f"(columns found: {', '.join(map(str, raw)) or 'none'})")
    spans = raw.get("spans") if _present(raw.get("spans")) else None
    extra = {k: v for k, v in raw.items() if k not in OWN_FIELDS}
    return PairRow(key=key, answer=answer, prompt=prompt, question=question, line=line,
                   spans=spans, extra=extra)


def iter_pairs(path: str | Path, limit: int | None = None) -> Iterator[PairRow]:
    """Validated rows of ``path`` one at a time (keys assigned, uniqueness checked): memory does
    not grow with the file. ``limit``: only the first N rows."""
    seen: dict[str, int] = {}
    n = 0
    for line, raw in iter_raw(path):
        if limit is not None and n >= limit:
            return
        row = validate_row(raw, line, path)
        key = row.key
        if not key:
            base = "c-" + row.fingerprint[:12]
            seen[base] = seen.get(base, 0) + 1
            key = base if seen[base] == 1 else f"{base}~{seen[base]}"
        if key in seen and row.key:
            raise DataError(f"{path} line {line}: key {key!r} repeats (first on line "
                            f"{seen[key]}); keys must be unique")
        if row.key:
            seen[key] = line
        n += 1
        yield replace(row, key=key)
    if n == 0:
        raise DataError(f"{path} has no rows")


def scan_pairs(path: str | Path, limit: int | None = None,
               check: Callable[[PairRow], None] | None = None) -> PairIndex:
    """Validate the whole file before any model loads; keys and fingerprints in file order.

    Args:
        path: the .jsonl/.csv file (optionally .gz).
        limit: only the first N rows.
        check: also called on each row (the caller's checks of fields it reads, e.g. the
            ``spans`` ranges); raises to refuse the file.
    """
    index = PairIndex()
    for r in iter_pairs(path, limit):
        if check is not None:
            check(r)
        if r.spans is not None and index.spans_key is None:
            index.spans_key = r.key
        index.keys.append(r.key)
        index.fingerprints[r.key] = r.fingerprint
        if isinstance(r.answer, list) and r.answer and (
                index.max_token_id is None or max(r.answer) > index.max_token_id[0]):
            index.max_token_id = (max(r.answer), r.key)
    return index


def read_pairs(path: str | Path, limit: int | None = None) -> list[PairRow]:
    """All validated rows as a list (small files; :func:`iter_pairs` streams)."""
    return list(iter_pairs(path, limit))
