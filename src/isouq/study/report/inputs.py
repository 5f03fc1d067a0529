"""Find and read what a report is built from: experiment ``results.json`` files, QA rows and
answers scored span by span (``*.jsonl`` / ``*.jsonl.gz``), given as any mix of files and
directories (searched recursively). A directory that is a report's output (it holds ``report.html`` and
``report.json``) is skipped, so ``isouq report results/*/`` can name every kept folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...answer_row import check_keys
from ...errors import DataError
from ...evaluation.labels import is_gold_row
from ...evaluation.rows import REQUIRED_FIELDS
from ...runio import latest_by_key, read_jsonl
from .polygraph import load_polygraph, polygraph_files
from .span_rows import check_span_rows, is_span_file

RESULTS_NAME = "results.json"
QA_SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz")
#: what ``build_report`` writes into its folder: a folder holding both is a report's output
REPORT_HTML = "report.html"
REPORT_JSON = "report.json"


@dataclass(frozen=True)
class Experiment:
    """One experiment's ``results.json`` (``doc``) and the directory its figures live in."""

    path: Path
    doc: dict

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def name(self) -> str:
        """The experiment's name (its ``experiment`` field, else its directory's name)."""
        return str(self.doc.get("experiment") or self.dir.name)


@dataclass(frozen=True)
class Inputs:
    """Everything found: experiments, QA rows pooled over ``qa_files``, hand labels pooled over
    ``gold_files`` (:mod:`isouq.evaluation.labels`), answers scored span by span per file
    (``spans``), the JSONL files skipped because their rows are none of these (with the
    reason), and the inputs skipped because they are report folders (``reports``: one line
    each, with the reason)."""

    experiments: tuple[Experiment, ...]
    qa_files: tuple[Path, ...]
    qa_rows: tuple[dict, ...]
    skipped: tuple[str, ...]
    gold_files: tuple[Path, ...] = ()
    gold_rows: tuple[dict, ...] = ()
    reports: tuple[str, ...] = ()
    #: LM-Polygraph benchmark files (``report.polygraph``): (shown path, document) pairs
    polygraph: tuple[tuple[Path, dict], ...] = ()
    #: answer rows with a ``spans`` list (``isouq score --spans``; ``report.spans_section``):
    #: (shown path, rows) pairs, one per file
    spans: tuple[tuple[Path, tuple[dict, ...]], ...] = ()


def is_report_dir(path: Path) -> bool:
    """Whether ``path`` is a folder ``build_report`` wrote (``report.html`` and
    ``report.json``): a report's output, not results."""
    return path.is_dir() and all((path / n).is_file() for n in (REPORT_HTML, REPORT_JSON))


def shown(path: Path) -> Path:
    """``path`` as a report shows it: relative to the working directory when it lies inside
    it (no machine path in a report built from a checkout), else as given."""
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd())
        except ValueError:
            pass
    return path


def is_qa_file(path: Path) -> bool:
    """Whether ``path`` is named like a QA rows file (``.jsonl`` or ``.jsonl.gz``)."""
    return path.name.endswith(QA_SUFFIXES)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """All complete JSON rows of a ``.jsonl`` or ``.jsonl.gz`` file (see runio.read_jsonl), the
    newest revision of each (model, dataset, key) only (a run may still be adding methods or
    labels)."""
    return latest_by_key(read_jsonl(path, missing_ok=False), ("model", "dataset", "key"))


def is_qa_row(row: Mapping) -> bool:
    """Whether a row has every field a QA study row needs."""
    return all(f in row for f in REQUIRED_FIELDS)


def load_results(path: str | os.PathLike) -> dict:
    """Read an experiment ``results.json``; DataError unless it is an object whose ``tables``
    and ``paper`` (when present) map names to lists of row objects."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {path} as JSON ({e}); re-run the experiment") from e
    if not isinstance(doc, dict) or not ("tables" in doc or "experiment" in doc):
        raise DataError(f"{path} is not an experiment results.json (no 'experiment'/'tables')")
    for key in ("tables", "paper"):
        tables = doc.get(key) or {}
        if not isinstance(tables, dict) or not all(
            isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
            for rows in tables.values()
        ):
            raise DataError(f"{path}: '{key}' must map table names to lists of row objects")
    figures = doc.get("figures") or []
    if not isinstance(figures, list) or not all(isinstance(f, str) for f in figures):
        raise DataError(f"{path}: 'figures' must be a list of file names")
    return doc


def _scan(path: Path) -> tuple[list[Path], list[Path]]:
    """(results.json files, QA-named files) at or under ``path``, sorted."""
    if path.is_file():
        if is_qa_file(path):
            return [], [path]
        if path.suffix == ".json":
            return [path], []
        raise DataError(
            f"{path} is neither a results.json nor a .jsonl/.jsonl.gz file of QA rows; "
            "pass an experiment directory, its results.json, or QA result files"
        )
    if path.is_dir():
        results = sorted(p for p in path.rglob(RESULTS_NAME) if p.is_file())
        # a run's cache/ (greedy answers, samples, checkpoints) is not results
        qa = sorted(p for p in path.rglob("*") if p.is_file() and is_qa_file(p)
                    and "cache" not in p.relative_to(path).parts[:-1])
        return results, qa
    raise DataError(f"input {path} does not exist; check the path")


def collect(paths: Iterable[str | os.PathLike]) -> Inputs:
    """Find the experiments and QA rows under ``paths`` (files or directories).

    A JSONL file given by name must hold QA rows, hand labels (gold rows) or answers scored
    span by span (rows with a ``spans`` list, ``isouq score --spans``; QA rows are recognized
    first, so a QA row is never taken for one); one found inside a directory is skipped (and
    listed in ``skipped``) when its rows are none of these, e.g. a cache.
    A directory given that is a report's output (``is_report_dir``) is skipped and listed in
    ``reports``. Each file is read once however often it is reached, and named as first reached
    (``shown``). DataError when an input holds neither a results.json nor QA rows, when no
    paths (but report folders) are given, or when rows of ``isouq qa short`` predate its key
    prefix (``answer_row.check_keys``: the error names the fix), or when a span lacks its scores
    (``span_rows.check_span_rows``).
    """
    paths = [Path(p) for p in paths]
    reports = [f"skipped {p}: a report's output ({REPORT_HTML}, {REPORT_JSON}), not results"
               for p in paths if is_report_dir(p)]
    paths = [p for p in paths if not is_report_dir(p)]
    if not paths:
        raise DataError("no inputs: pass experiment result directories and/or QA JSONL files"
                        + (f" (skipped {len(reports)} report folder(s))" if reports else ""))
    experiments: dict[Path, Experiment] = {}
    qa: dict[Path, tuple[Path, list[dict]]] = {}
    gold: dict[Path, tuple[Path, list[dict]]] = {}
    skipped: list[str] = []
    polygraph: dict[Path, tuple[Path, dict]] = {}
    spans: dict[Path, tuple[Path, list[dict]]] = {}
    for p in paths:
        pg = polygraph_files(p)
        results, qa_files = ([], []) if p.is_file() and pg else _scan(p)
        found = bool(pg)
        for f in pg:
            polygraph.setdefault(f.resolve(), (shown(f), load_polygraph(f)))
        for r in results:
            experiments.setdefault(r.resolve(), Experiment(shown(r), load_results(r)))
            found = True
        for f in qa_files:
            key = f.resolve()
            if key in qa or key in gold or key in spans:
                found = True
                continue
            rows = read_rows(f)
            bad = next((r for r in rows if not is_qa_row(r)), None)
            if rows and bad is None:
                check_keys(rows, shown(f))
                qa[key] = (shown(f), rows)
                found = True
            elif rows and all(is_gold_row(r) for r in rows):
                gold[key] = (shown(f), rows)
                found = True
            elif rows and is_span_file(rows):
                check_span_rows(rows, shown(f))
                spans[key] = (shown(f), rows)
                found = True
            elif f == p:
                what = "no rows" if not rows else f"a row without {list(REQUIRED_FIELDS)}"
                raise DataError(f"{f} has {what}; it is not a file of QA result rows (nor of "
                                "answers scored span by span: `isouq score --spans sentences`)")
            else:
                skipped.append(f"{shown(f)}: {'empty' if not rows else 'not QA rows'}")
        if not found:
            raise DataError(
                f"{p} holds neither a {RESULTS_NAME} nor JSONL files of QA rows "
                f"(fields {list(REQUIRED_FIELDS)}) or of answers scored span by span; run an "
                "experiment, `isouq qa run` or `isouq score --spans sentences` with --out there "
                "first"
            )
    return Inputs(
        experiments=tuple(experiments.values()),
        qa_files=tuple(f for f, _ in qa.values()),
        qa_rows=tuple(r for _, rows in qa.values() for r in rows),
        skipped=tuple(skipped),
        gold_files=tuple(f for f, _ in gold.values()),
        gold_rows=tuple(r for _, rows in gold.values() for r in rows),
        reports=tuple(reports),
        polygraph=tuple(polygraph.values()),
        spans=tuple((f, tuple(rows)) for f, rows in spans.values()),
    )
