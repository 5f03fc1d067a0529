"""Inputs -> report :class:`Section` s: one per experiment results.json (tables, the paper's
tables beside them, figures copied next to the report) and one for the QA study."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from .document import Block, Figure, Section, unique_slug
from .figures import metric_bars, score_distributions
from .inputs import Experiment
from .paper_qa import paper_qa_tables
from .tables import format_value, make_table, qa_blocks

IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")
SKIP_META: tuple[str, ...] = ("tables", "paper", "figures", "settings", "versions", "experiment")


def portable(v):
    """``v`` with every absolute path of this machine shown without it: relative to the working
    directory when inside it, else as ``…/<folder>/<name>`` (a report travels)."""
    if isinstance(v, str):
        if v.startswith("/") and "/" in v[1:] and "\n" not in v:
            path = Path(v)
            try:
                return path.relative_to(Path.cwd()).as_posix()
            except ValueError:
                return "…/" + "/".join(path.parts[-2:])
        return v
    if isinstance(v, Mapping):
        return {k: portable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [portable(x) for x in v]
    return v


def _scalar(v) -> str:
    v = portable(v)
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


def _flat(d: Mapping | None) -> dict[str, str]:
    return {str(k): _scalar(v) for k, v in (d or {}).items()}


def experiment_blocks(tables: Mapping[str, list], paper: Mapping[str, list]) -> list[Block]:
    """Each of our tables beside the paper's table of the same name; paper-only tables last."""
    blocks = [
        Block(ours=make_table(name, rows),
              paper=make_table(name, paper[name]) if name in paper else None)
        for name, rows in tables.items()
    ]
    blocks += [Block(ours=None, paper=make_table(name, rows))
               for name, rows in paper.items() if name not in tables]
    return blocks


def copy_figures(exp: Experiment, dest: Path, rel: Path) -> tuple[list[Figure], list[str]]:
    """Copy the images an experiment lists (or, listing none, every image in its directory)
    into ``dest``; return (figures with paths ``rel/name``, notes about missing files)."""
    names = exp.doc.get("figures") or sorted(
        p.name for p in exp.dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    figures, notes = [], []
    for name in names:
        src = exp.dir / name
        if not src.is_file():
            notes.append(f"Figure {name} is listed in {exp.path} but missing.")
            continue
        if src.suffix.lower() not in IMAGE_SUFFIXES:
            notes.append(f"Figure {name} is not an image the report can show.")
            continue
        target = dest / Path(name).name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        figures.append(Figure(path=rel / target.name, caption=Path(name).stem.replace("_", " ")))
    return figures, notes


def section_title(experiment: str, folder: str, runs: int = 1) -> str:
    """The experiment's name; with ``runs`` > 1 runs of it in one report, its folder's too
    when that differs (``scaling`` and ``scaling — scaling_vi_fan_in``)."""
    if runs <= 1 or folder.replace("_", "-") == experiment.replace("_", "-"):
        return experiment
    return f"{experiment} — {folder}"


def experiment_section(exp: Experiment, out_dir: Path, taken: set[str],
                       runs: Mapping[str, int] | None = None) -> Section:
    """A section for one experiment; its figures are copied to ``out_dir/<section id>/``.
    runs: experiment name -> how many of the report's inputs are runs of it."""
    doc = exp.doc
    title = section_title(exp.name, exp.dir.name, (runs or {}).get(exp.name, 1))
    sid = unique_slug(title, taken)
    figures, notes = copy_figures(exp, out_dir / sid, Path(sid))
    meta = {k: _scalar(v) for k, v in doc.items() if k not in SKIP_META}
    details = {k: _flat(doc.get(k)) for k in ("settings", "versions") if doc.get(k)}
    return Section(
        id=sid, title=title, source=str(exp.path), meta=meta, details=details,
        notes=tuple(notes), blocks=tuple(experiment_blocks(doc.get("tables") or {},
                                                           doc.get("paper") or {})),
        figures=tuple(figures),
    )


#: judge-vs-hand-label κ below which the QA section warns (Landis & Koch: "fair" or worse)
WEAK_KAPPA = 0.4


UNEVEN_TIMINGS = ("different machines", "machine not recorded")
"""``cost_table`` ``compared`` values whose speed-up may mix machines (a note says so)."""


def qa_section(
    rows: Sequence[Mapping],
    study: Mapping[str, list[dict]],
    files: Sequence[Path],
    out_dir: Path,
    taken: set[str],
    *,
    options: Mapping[str, object],
    skipped: Sequence[str] = (),
    gold_files: Sequence[Path] = (),
    left_out: Sequence[str] = (),
) -> Section:
    """The QA study section: paper-shaped tables beside the paper's, AUROC bars and score
    distributions (PNGs written to ``out_dir/<section id>/``), all raw tables."""
    sid = unique_slug("qa-study", taken)
    fig_dir = out_dir / sid
    fig_dir.mkdir(parents=True, exist_ok=True)
    paper = paper_qa_tables()
    metric_bars(study["auroc"], fig_dir / "auroc_bars.png", paper_rows=paper["auroc"])
    score_distributions(rows, fig_dir / "score_distributions.png")
    judged = [r for r in rows if r.get("correct") is not None]
    meta = {
        "files": ", ".join(str(f) for f in files),
        "rows": str(len(rows)),
        "judged rows": str(len(judged)),
        "datasets": ", ".join(dict.fromkeys(str(r["dataset"]) for r in judged)),
        "models": ", ".join(dict.fromkeys(str(r["model"]) for r in judged)),
    }
    if gold_files:
        meta["hand labels"] = ", ".join(str(f) for f in gold_files)
    notes = [
        "The paper's numbers are for four LLMs (Llama 2 AWQ, Llama 3.2 3B, OLMo 1B, Phi-4 "
        "4-bit) on an H100; compare the shape of the results, not the exact values.",
        *(f"Skipped {s}." for s in skipped),
        *(f"{w[:1].upper()}{w[1:]}." for w in left_out),
    ]
    weak = [r for r in study.get("label_agreement", [])
            if r.get("labels") == "judge" and (r.get("kappa") is None or r["kappa"] < WEAK_KAPPA)]
    if weak:
        where = ", ".join(f"{r['model']} on {r['dataset']} (κ {format_value(r.get('kappa'), 2)}, "
                          f"n {r['n']})" for r in weak)
        notes.append(f"The judge's labels agree poorly with hand labels for {where}: read the "
                     "AUROCs of those groups with the label-quality tables at the end.")
    uneven: dict[str, list[str]] = {}
    for r in study.get("cost", []):
        if r.get("compared") in UNEVEN_TIMINGS:
            uneven.setdefault(str(r["compared"]), []).append(f"{r['model']} on {r['dataset']}")
    if uneven:
        where = "; ".join(f"{kind}: {', '.join(dict.fromkeys(groups))}"
                          for kind, groups in uneven.items())
        notes.append(f"Speed-ups that may mix machines ({where}): a method added to the rows "
                     "in a later session can have been timed on another machine; rows record "
                     "it since 'timed_on' was added.")
    if not study.get("lomo"):
        notes.append("Leave-one-model-out transfer needs 3 or more models on a dataset.")
    return Section(
        id=sid, title="Question answering: predicting answer correctness", source=meta["files"],
        meta=meta, details={"study options": _flat(options)}, notes=tuple(notes),
        blocks=tuple(qa_blocks(study, paper)),
        figures=(
            Figure(Path(sid) / "auroc_bars.png",
                   "AUROC per method and dataset (mean ± std; ◆ the paper's value)"),
            Figure(Path(sid) / "score_distributions.png",
                   "Scores of correct vs incorrect answers per model (epistemic on log10)"),
        ),
        raw=tuple(make_table(name, t) for name, t in study.items()),
    )
