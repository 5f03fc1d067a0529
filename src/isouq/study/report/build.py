"""``build_report``: inputs (experiment results, QA rows) -> report.html, tables.md, tables.tex,
report.json and the PNGs, all in one directory (the page links the PNGs beside it)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from ...evaluation import label_tables
from ...evaluation.rows import usable_rows
from ...runio import dumps, versions
from ..analysis import common_rows_tables, study_tables
from .document import Section
from .evidence_section import evidence_section, split_evidence_rows
from .html import render_html
from .inputs import REPORT_HTML, REPORT_JSON, Inputs, collect
from .long_section import is_long, long_section
from .paper_qa import paper_qa_tables
from .polygraph import polygraph_section
from .preview import qa_preview_section
from .sections import experiment_section, portable, qa_section
from .spans_section import MAX_ANSWERS, SECTION_ID, check_max_answers, spans_section
from .tables import sections_latex, sections_markdown


def _write(path: Path, text: str) -> None:
    """Write atomically (temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def report_json(
    inputs: Inputs, sections: list[Section], study: dict | None, options: dict, header: dict,
    left_out: list[str] | None = None, evidence: dict[str, dict] | None = None,
) -> dict:
    """The machine-readable report: every table (raw rows, ours and the paper's) per section."""
    doc: dict = {
        **header, "options": options,
        "inputs": {"experiments": [str(e.path) for e in inputs.experiments],
                   "qa_files": [str(f) for f in inputs.qa_files],
                   "gold_files": [str(f) for f in inputs.gold_files],
                   "span_files": [str(f) for f, _ in inputs.spans],
                   "skipped": list(inputs.skipped), "reports_skipped": list(inputs.reports)},
        "sections": [],
    }
    for exp, sec in zip(inputs.experiments, sections, strict=False):
        doc["sections"].append({
            "id": sec.id, "kind": "experiment", "title": sec.title, "source": str(exp.path),
            "settings": portable(exp.doc.get("settings")), "seed": exp.doc.get("seed"),
            "tables": exp.doc.get("tables") or {}, "paper": exp.doc.get("paper") or {},
            "figures": [f.path.as_posix() for f in sec.figures],
        })
    for sec in sections[len(inputs.experiments):]:
        if sec.id.startswith("qa-run"):  # a QA run not yet evaluable: its tables as shown
            doc["sections"].append({
                "id": sec.id, "kind": "qa_preview", "title": sec.title,
                "source": [str(f) for f in inputs.qa_files], "notes": list(sec.notes),
                "tables": {t.name: [dict(zip(t.columns, r, strict=True)) for r in t.rows]
                           for t in sec.raw},
            })
    if study is not None:
        sec = next(s for s in sections if s.id.startswith("qa-study"))
        doc["sections"].append({
            "id": sec.id, "kind": "qa", "title": sec.title,
            "source": [str(f) for f in inputs.qa_files], "left_out": list(left_out or []),
            "tables": study,
            "paper": paper_qa_tables(), "figures": [f.path.as_posix() for f in sec.figures],
        })
    for sec in sections:  # MC1 and short answers (issue 25), LM-Polygraph, span rows
        if sec.id in (evidence or {}):
            kind = ("polygraph" if sec.id.startswith("lm-polygraph") else
                    "spans" if sec.id.startswith(SECTION_ID) else "qa_evidence")
            doc["sections"].append({"id": sec.id, "kind": kind, "title": sec.title,
                                    "notes": list(sec.notes), "tables": evidence[sec.id],
                                    "figures": [f.path.as_posix() for f in sec.figures]})
    return doc


def build_report(
    inputs: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    title: str = "isouq report",
    n_bootstrap: int = 300,
    n_splits: int = 10,
    n_paired_bootstrap: int = 10_000,
    seed: int = 0,
    log_epistemic: bool = True,
    embed: bool = False,
    say: Callable[[str], None] | None = None,
    max_span_answers: int = MAX_ANSWERS,
) -> Path:
    """Build the report of ``inputs`` into ``out_dir``; return the path of ``report.html``.

    ``inputs``: any mix of experiment directories / ``results.json`` files and QA result
    directories / ``*.jsonl(.gz)`` files (directories are searched recursively; QA rows of
    all files are pooled into one study). The study options are passed to
    :func:`isouq.evaluation.study_tables`. The HTML links the PNGs beside it by relative path
    (a small page; copy the folder as a whole); ``embed`` puts them into the page as data URIs
    instead (one file that opens alone, a few MB with many figures). An input that is a
    report's output (``report.html`` and ``report.json``, e.g. ``results/report`` reached by
    ``results/*/``) is skipped with one line to ``say`` (default: standard error). Answers
    scored span by span (``isouq score --spans``) get the section "Long answers, sentence by
    sentence" (:mod:`.spans_section`), at most ``max_span_answers`` of them shaded.

    Writes ``report.html``, ``tables.md``, ``tables.tex``, ``report.json`` and the figures
    (``<section id>/*.png``). Raises :class:`isouq.errors.DataError` when an input holds
    neither a results.json nor QA rows, or the rows are malformed, and
    :class:`isouq.errors.InputError` when ``max_span_answers`` is not a count ≥ 0 — before
    writing anything.
    """
    started = time.time()
    check_max_answers(max_span_answers)
    found = collect(inputs)
    for line in found.reports:
        (say or (lambda text: print(text, file=sys.stderr)))(line)
    rest, evidence_rows = split_evidence_rows(found.qa_rows)  # MC1 / short: their own sections
    found = dataclasses.replace(found, qa_rows=tuple(rest))
    options = {"n_bootstrap": n_bootstrap, "n_splits": n_splits,
               "n_paired_bootstrap": n_paired_bootstrap, "seed": seed,
               "log_epistemic": log_epistemic}
    qa_rows, left_out = usable_rows(found.qa_rows) if found.qa_rows else ([], [])
    preview = bool(found.qa_rows) and not qa_rows  # a run too small to evaluate: shown as it is
    study = study_tables(qa_rows, **options) if qa_rows else None
    if study is not None:
        common = common_rows_tables(found.qa_rows, n_bootstrap=n_bootstrap, seed=seed,
                                    log_epistemic=log_epistemic)
        study.update({k: t for k, t in common.items() if t})  # only while a run is in progress
    if study is not None and found.gold_rows:
        study.update(label_tables(qa_rows, found.gold_rows, n_bootstrap=n_bootstrap,
                                  seed=seed, log_epistemic=log_epistemic))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    names = Counter(e.name for e in found.experiments)
    sections = [long_section(e, out, taken) if is_long(e)  # qa long: its own section
                else experiment_section(e, out, taken, names) for e in found.experiments]
    if preview:
        sections.append(qa_preview_section(found.qa_rows, found.qa_files, taken,
                                           left_out=left_out))
    if study is not None:
        sections.append(qa_section(qa_rows, study, found.qa_files, out, taken,
                                   options=options, skipped=found.skipped, left_out=left_out,
                                   gold_files=found.gold_files))
    evidence: dict[str, dict] = {}
    for kind, ev_rows in evidence_rows.items():
        if ev_rows:
            sec, tables = evidence_section(kind, ev_rows, taken, n_bootstrap=n_bootstrap,
                                           seed=seed, gold_rows=found.gold_rows, out_dir=out)
            sections.append(sec)
            evidence[sec.id] = tables
    if found.spans:  # answers scored span by span (isouq score --spans)
        sec, tables = spans_section(found.spans, taken, max_answers=max_span_answers,
                                    n_bootstrap=n_bootstrap, seed=seed)
        sections.append(sec)
        evidence[sec.id] = tables
    if found.polygraph:  # LM-Polygraph benchmark (results/polygraph, docs/polygraph.md)
        sec, tables = polygraph_section(found.polygraph, taken, n_bootstrap=n_bootstrap,
                                        seed=seed)
        sections.append(sec)
        evidence[sec.id] = tables
    header = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": versions()}
    _write(out / "tables.md", sections_markdown(sections, title))
    _write(out / "tables.tex", sections_latex(sections, title))
    _write(out / REPORT_JSON, dumps(report_json(found, sections, study, options, header,
                                                      left_out, evidence),
                                      indent=2, ensure_ascii=False))
    shown = {"created": header["created"], "isouq": header["versions"].get("isouq", "?"),
             "sections": str(len(sections)), "built in": f"{time.time() - started:.1f} s"}
    _write(out / REPORT_HTML, render_html(sections, out, title=title, header=shown,
                                          embed=embed))
    return out / REPORT_HTML
