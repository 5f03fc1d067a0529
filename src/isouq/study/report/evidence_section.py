"""Report sections of the QA evidence settings (issue 25): TruthfulQA MC1 rows (``qa mc``) and
TriviaQA short-answer rows (``qa short``), kept apart from the open-question QA study."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ...answer_row import is_short_row
from ...errors import DataError
from ..analysis.evidence import (
    MC_BASELINES,
    OURS,
    RAW_SCORES,
    SHORT_BASELINES,
    SUBSET_BASELINES,
    evidence_tables,
    subset_rows,
    verdict,
)
from .document import Block, Figure, Section, unique_slug
from .figures import raw_auroc_forest
from .tables import format_p, format_value, make_table

MC_DATASET = "truthfulqa_mc1"
TITLES = {"mc": "TruthfulQA MC1: exact labels (qa mc)",
          "short": "TriviaQA short answers: alias-match labels (qa short)"}


def split_evidence_rows(rows: Iterable[Mapping]) -> tuple[list[dict], dict[str, list[dict]]]:
    """(rows of the open-question study, {"mc": MC1 rows, "short": short-answer rows})."""
    rest, ev = [], {"mc": [], "short": []}
    for r in rows:
        if r.get("dataset") == MC_DATASET and "option_mean_prob" in r:
            ev["mc"].append(dict(r))
        elif is_short_row(r):
            ev["short"].append(dict(r))
        else:
            rest.append(r)
    return rest, ev


def _interval(v, lo, hi) -> str:
    if v is None:
        return "–"
    return f"{format_value(v)} [{format_value(lo)}, {format_value(hi)}]"


def _wide(metrics: Sequence[Mapping], metric: str) -> list[dict]:
    out: dict[tuple, dict] = {}
    for m in metrics:
        row = out.setdefault((m["dataset"], m["model"]), {"model": m["model"], "n": m["n"]})
        row[m["method"]] = _interval(m[metric], m[f"{metric}_low"], m[f"{metric}_high"])
    return list(out.values())


def label_quality(rows: Sequence[Mapping], gold_rows: Sequence[Mapping]) -> list[dict]:
    """The short answers' alias-match labels (and the F1 ≥ 0.5 lexical label) against hand
    labels: n, κ, accuracy, false yes (labelled correct, gold wrong), false no."""
    from ...evaluation.labels import label_agreement

    out = []
    for r in label_agreement(rows, gold_rows):
        name = {"judge": "alias match", "lexical": "token F1 ≥ 0.5"}.get(r["labels"], r["labels"])
        out.append({"dataset": r["dataset"], "model": r["model"], "labels": name, "n": r["n"],
                    "gold correct": r["gold correct"], "kappa": r["kappa"],
                    "accuracy": r["accuracy"], "false yes": r["false positive"],
                    "false no": r["gold correct"] - r["true positive"]})
    return out


def _subset_part(name: str, scores: tuple[str, ...], rows: Sequence[Mapping], *,
                 n_bootstrap: int, seed: int) -> tuple[list[Block], list[str], dict[str, list[dict]]]:
    """Blocks, notes and tables (keys prefixed ``subset_``) of a baseline run on the first
    questions only: every method refitted on the rows that carry its first score; ([], [], {})
    when no row does."""
    score = scores[0]
    sub = subset_rows(rows, score)
    if not sub:
        return [], [], {}
    head = f"On the {len(sub)} answers with {name} ({score})"
    try:
        t = evidence_tables(sub, {name: scores}, n_bootstrap=n_bootstrap, seed=seed,
                            raw_scores=(*RAW_SCORES, *scores))
    except DataError as e:
        return [], [f"{head}: not yet evaluable: {e}"], {}
    cols = ["model", "n", *OURS, name]
    blocks = [
        Block(ours=make_table("subset_counts", t["counts"], title=f"{head}: questions")),
        Block(ours=make_table("subset_auroc", _wide(t["metrics"], "auroc"),
                              title=f"{head}: AUROC [95% interval]", columns=cols)),
        Block(ours=make_table("subset_raw_auroc", t["raw_auroc"],
                              title=f"{head}: raw AUROC of each score (direction)")),
        Block(ours=make_table("subset_paired", t["paired"],
                              title=f"{head}: ours vs {name}, ΔAUROC, BH-adjusted",
                              formatters={"p": format_p, "p_bh": format_p})),
    ]
    if t["paired_pooled"]:
        blocks.append(Block(ours=make_table(
            "subset_paired_pooled", t["paired_pooled"],
            title=f"{head}: ours vs {name} pooled over the models, BH-adjusted",
            formatters={"p": format_p, "p_bh": format_p})))
    notes = [f"{head} (a nested subset; every method refitted there): {line}"
             for line in verdict(t)]
    return blocks, notes, {f"subset_{k}": v for k, v in t.items()}


def evidence_section(kind: str, rows: Sequence[Mapping], taken: set[str], *,
                     n_bootstrap: int = 300, seed: int = 0,
                     gold_rows: Sequence[Mapping] = (),
                     out_dir: Path | None = None) -> tuple[Section, dict]:
    """(Section, tables) of one setting ("mc" or "short"); DataError when no model has two
    correct and two incorrect answers (the section then says so instead of tables).
    ``gold_rows``: hand labels (``isouq qa label``); for short answers, the label quality.
    ``out_dir``: the report folder; the raw-AUROC figure goes to ``out_dir/<section id>/``."""
    baselines = MC_BASELINES if kind == "mc" else SHORT_BASELINES
    sid = unique_slug(f"qa-evidence-{kind}", taken)
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    meta = {"rows": str(len(rows)), "models": ", ".join(models)}
    quality = label_quality(rows, gold_rows) if kind == "short" and gold_rows else []
    try:
        tables = evidence_tables(rows, baselines, n_bootstrap=n_bootstrap, seed=seed)
    except DataError as e:
        blocks = (Block(ours=make_table("label_quality", quality,
                                        title="Labels against hand labels")),) if quality else ()
        return Section(id=sid, title=TITLES[kind], source="", meta=meta, blocks=blocks,
                       notes=(f"Not yet evaluable: {e}",)), {"label_quality": quality}
    if quality:
        tables["label_quality"] = quality
    notes = [
        "Methods are fitted as in the QA study (a logistic regression on each method's "
        "score(s), out-of-bag bootstrap runs); AUROC/PRR/AURAC are the mean over runs with the "
        "2.5–97.5 percentiles of the runs. p̄ is a baseline: ‖∇θ p̄‖² = p̄²‖∇θ log p̄‖².",
        "Raw AUROC: the score used as it is, oriented as a confidence (uncertainties negated); "
        "below 0.5 means the score ranks correct answers as less trustworthy.",
        *verdict(tables),
    ]
    present = {m["method"] for m in tables["metrics"]}
    cols = ["model", "n", *(c for c in (*OURS, *baselines) if c in present)]
    blocks = [
        Block(ours=make_table("evidence_counts", tables["counts"],
                              title="Questions and correct answers")),
        Block(ours=make_table("evidence_auroc", _wide(tables["metrics"], "auroc"),
                              title="AUROC [95% interval] per model and method", columns=cols)),
        Block(ours=make_table("evidence_prr", _wide(tables["metrics"], "prr"),
                              title="PRR [95% interval]", columns=cols)),
        Block(ours=make_table("evidence_aurac", _wide(tables["metrics"], "aurac"),
                              title="AURAC [95% interval]", columns=cols)),
        Block(ours=make_table("evidence_raw_auroc", tables["raw_auroc"],
                              title="Raw AUROC of each score (direction)")),
        Block(ours=make_table("evidence_paired", tables["paired"],
                              title="Ours vs baselines: ΔAUROC over paired runs, BH-adjusted",
                              formatters={"p": format_p, "p_bh": format_p})),
    ]
    if tables["paired_pooled"]:
        blocks += [
            Block(ours=make_table("evidence_raw_pooled", tables["raw_pooled"],
                                  title="Raw AUROC pooled over the models (mean over models)")),
            Block(ours=make_table("evidence_paired_pooled", tables["paired_pooled"],
                                  title="Ours vs baselines pooled over the models: mean "
                                        "ΔAUROC, BH-adjusted",
                                  formatters={"p": format_p, "p_bh": format_p})),
        ]
    if quality:
        blocks.insert(1, Block(ours=make_table("label_quality", quality,
                                               title="Labels against hand labels")))
    for name, scores in SUBSET_BASELINES.items():
        sub_blocks, sub_notes, sub_tables = _subset_part(name, scores, rows,
                                                         n_bootstrap=n_bootstrap, seed=seed)
        blocks += sub_blocks
        notes += sub_notes
        tables.update(sub_tables)
    figures: tuple[Figure, ...] = ()
    if out_dir is not None:
        (out_dir / sid).mkdir(parents=True, exist_ok=True)
        raw_auroc_forest(tables["raw_auroc"], tables["raw_pooled"],
                         out_dir / sid / "raw_auroc.png")
        figures = (Figure(Path(sid) / "raw_auroc.png",
                          "Raw AUROC of each score (oriented as a confidence) with its 95% "
                          "bootstrap interval, per model and pooled: right of 0.5 = the score "
                          "ranks correct answers as more trustworthy; ours blue, the "
                          "critique's orange, baselines grey"),)
    sec = Section(id=sid, title=TITLES[kind], source=", ".join(models), meta=meta,
                  details={"options": {"n_bootstrap": str(n_bootstrap), "seed": str(seed)}},
                  notes=tuple(notes), blocks=tuple(blocks), figures=figures,
                  raw=tuple(make_table(name, t) for name, t in tables.items()))
    return sec, tables
