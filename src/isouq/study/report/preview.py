"""The QA section of a run that cannot be evaluated yet: what there is, and what is missing.

A run with fewer than two correct and two incorrect labelled answers per (dataset, model) has no
AUROC to show; the report still shows its answers, scores, costs and label counts, and says what
is needed before the study's tables can be computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median

from .document import Block, Section, Table, unique_slug
from .tables import format_value

SHOWN_SCORES = ("mean_prob", "aleatoric", "epistemic", "epistemic_log")
MAX_ANSWERS = 20


def _cut(text, n: int) -> str:
    s = " ".join(str(text if text is not None else "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


def group_table(rows: Sequence[Mapping]) -> Table:
    """One line per (dataset, model): label counts, median scores and seconds per method."""
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((str(r.get("dataset")), str(r.get("model"))), []).append(r)
    methods = sorted({m for r in rows for m in (r.get("seconds") or {})})
    cols = ("dataset", "model", "answers", "correct", "incorrect", "unlabelled",
            *(f"median {s}" for s in SHOWN_SCORES), *(f"s/answer {m}" for m in methods))
    out = []
    for (ds, model), g in groups.items():
        labels = [r.get("correct") for r in g]
        known = [bool(v) for v in labels if v is not None]
        line = [ds, model, str(len(g)), str(sum(known)), str(len(known) - sum(known)),
                str(len(labels) - len(known))]
        for s in SHOWN_SCORES:
            vals = [float(r["scores"][s]) for r in g if s in (r.get("scores") or {})]
            if s == "epistemic_log" and not vals:  # older rows: ‖∇ log p̄‖² = ‖∇ p̄‖² / p̄²
                vals = [float(r["scores"]["epistemic"]) / float(r["scores"]["mean_prob"]) ** 2
                        for r in g if {"epistemic", "mean_prob"} <= set(r.get("scores") or {})
                        and float(r["scores"]["mean_prob"]) > 0]
            line.append(format_value(median(vals), 3) if vals else "—")
        for m in methods:
            vals = [float(r["seconds"][m]) for r in g if m in (r.get("seconds") or {})]
            line.append(format_value(median(vals), 3) if vals else "—")
        out.append(tuple(line))
    return Table("qa_preview_groups", "Answers, labels, scores and costs per group", cols,
                 tuple(out))


def answers_table(rows: Sequence[Mapping], limit: int = MAX_ANSWERS) -> Table:
    """The first ``limit`` answers with their label and scores."""
    cols = ("key", "model", "question", "answer", "correct", *SHOWN_SCORES[:3])
    out = []
    for r in rows[:limit]:
        sc = r.get("scores") or {}
        out.append((str(r.get("key")), str(r.get("model")), _cut(r.get("question"), 60),
                    _cut(r.get("answer"), 40), str(r.get("correct")),
                    *(format_value(sc[s], 3) if s in sc else "—" for s in SHOWN_SCORES[:3])))
    return Table("qa_preview_answers", f"The first {min(limit, len(rows))} answers", cols,
                 tuple(out))


def qa_preview_section(rows: Sequence[Mapping], files: Sequence[Path], taken: set[str], *,
                       left_out: Sequence[str] = ()) -> Section:
    """A QA section for rows no group of which can be evaluated yet (see module doc)."""
    sid = unique_slug("qa-run", taken)
    notes = ["Not yet evaluable: the study's tables (AUROC, PRR, AURAC) need at least 2 correct "
             "and 2 incorrect labelled answers per dataset and model; run more questions "
             "(isouq qa run --limit N resumes and adds them).",
             *(f"{w[:1].upper()}{w[1:]}." for w in left_out)]
    groups, answers = group_table(rows), answers_table(rows)
    return Section(
        id=sid, title="Question answering: the run so far (not yet evaluable)",
        source=", ".join(str(f) for f in files),
        meta={"files": ", ".join(str(f) for f in files), "rows": str(len(rows))},
        notes=tuple(notes), blocks=(Block(groups), Block(answers)), raw=(groups, answers),
    )
