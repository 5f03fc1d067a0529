"""Report section of ``isouq qa long`` (long answers, every sentence labelled by alias match):
its ``results.json`` (``study.analysis.long_spans`` tables and verdict) as one section with the
AUROC figure, and that figure (:func:`auroc_figure`, also written by the run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from .document import Block, Section, unique_slug  # noqa: E402
from .inputs import Experiment  # noqa: E402
from .sections import copy_figures  # noqa: E402
from .tables import format_p, format_value, make_table  # noqa: E402

EXPERIMENT = "qa-long"  # qa.long.EXPERIMENT (the application layer is above this one)
TITLE = "Long answers, every sentence labelled (qa long): do span scores find the wrong ones?"
FAMILY_COLOR = {"span score": "#2a7ab9", "span baseline": "0.35", "whole answer": "#d9622b"}
MARKERS = ("o", "s", "^", "D", "v")


def is_long(exp: Experiment) -> bool:
    """Whether an experiment's results.json is a ``qa long`` run's."""
    return exp.name == EXPERIMENT


def auroc_figure(rows: Sequence[Mapping], path: str | Path) -> Path:
    """AUROC for the wrong sentences of each score with its 95% interval (bootstrap over
    answers): one panel per setting, one marker per model; span scores blue, span baselines
    grey, whole-answer scores orange; right of the dashed 0.5 = higher on wrong sentences."""
    path = Path(path)
    settings = list(dict.fromkeys(str(r["setting"]) for r in rows))
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    scores = list(dict.fromkeys(str(r["score"]) for r in rows))
    y = {s: len(scores) - 1 - i for i, s in enumerate(scores)}
    step = 0.6 / max(len(models), 1)
    fig, axes = plt.subplots(1, len(settings), squeeze=False, sharey=True,
                             figsize=(3.6 * len(settings) + 1.8, 0.42 * len(scores) + 1.6))
    for ax, st in zip(axes[0], settings, strict=True):
        for mi, m in enumerate(models):
            for r in (r for r in rows if r["setting"] == st and r["model"] == m):
                a, lo, hi = r["auroc"], r["ci_low"], r["ci_high"]
                if a is None:
                    continue
                err = [[a - lo], [hi - a]] if lo is not None and hi is not None else None
                ax.errorbar(a, y[str(r["score"])] + 0.3 - step * (mi + 0.5), xerr=err,
                            fmt=MARKERS[mi % len(MARKERS)], ms=4, capsize=2, lw=1,
                            color=FAMILY_COLOR.get(str(r["family"]), "black"),
                            label=m if r["score"] == scores[0] else None)
        ax.axvline(0.5, color="0.4", lw=0.8, ls="--")
        ax.set_title(f"{st} answers", fontsize=9)
        ax.set_xlabel("AUROC for wrong sentences", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks([y[s] for s in scores], scores)
    handles = [plt.Line2D([], [], ls="", marker=MARKERS[i % len(MARKERS)], color="0.2",
                          label=m) for i, m in enumerate(models)]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def interval_cell(r: Mapping) -> str:
    """``auroc [ci_low, ci_high]`` of a ``long_spans`` AUROC row; ``–`` without an AUROC."""
    if r.get("auroc") is None:
        return "–"
    return (f"{format_value(r['auroc'])} [{format_value(r.get('ci_low'))}, "
            f"{format_value(r.get('ci_high'))}]")


def wide_auroc(rows: Sequence[Mapping]) -> list[dict]:
    """One row per (setting, score), one column per model: AUROC [95% interval]."""
    out: dict[tuple, dict] = {}
    for r in rows:
        row = out.setdefault((r["setting"], r["score"]), {"setting": r["setting"],
                                                          "score": r["score"],
                                                          "family": r["family"]})
        row[str(r["model"])] = interval_cell(r)
    return list(out.values())


def long_section(exp: Experiment, out_dir: Path, taken: set[str]) -> Section:
    """The section of a ``qa long`` results.json; its figure copied to
    ``out_dir/<section id>/``."""
    doc = exp.doc
    tables = doc.get("tables") or {}
    sid = unique_slug("qa-long", taken)
    figures, fig_notes = copy_figures(exp, out_dir / sid, Path(sid))
    partial = list(doc.get("partial") or [])
    notes = [
        "Each prompt lists 5 TriviaQA questions; each answer line is one sentence, labelled by "
        "alias match (composed: the model's own short answers, labels of the kept qa short "
        "rows; generated: the model's own answer to the prompt, its lines aligned by number).",
        "Every score is read as an uncertainty fixed in advance (gradient and aleatoric scores "
        "as they are, probabilities as 1 − p): AUROC above 0.5 = higher on the wrong "
        "sentences, below = pointing the wrong way. Intervals: 95% bootstrap over answers.",
        *(f"Partial: {p} (re-run the same command to continue)." for p in partial),
        *doc.get("verdict", []),
        *fig_notes,
    ]
    blocks = [Block(ours=make_table("long_progress", tables.get("progress", []),
                                    title="Answers planned, written and scored"))]
    if tables.get("counts"):
        blocks.append(Block(ours=make_table("long_counts", tables["counts"],
                                            title="Labelled sentences")))
    if tables.get("auroc"):
        blocks.append(Block(ours=make_table(
            "long_auroc", wide_auroc(tables["auroc"]),
            title="AUROC for the wrong sentences [95% interval, bootstrap over answers]")))
    if tables.get("auroc_no_echo"):
        blocks.append(Block(ours=make_table(
            "long_auroc_no_echo", wide_auroc(tables["auroc_no_echo"]),
            title="The same with the sentences that only echo the question (an alias the "
                  "question itself contains) counted wrong")))
    p_values = {"p": format_p, "p_bh": format_p}
    for key, title, formatters in (
            ("paired", "Span scores vs baselines: ΔAUROC [95% interval], BH-adjusted", p_values),
            ("pooled", "Pooled over the models (each weighing the same): mean AUROC for the "
                       "wrong sentences [95% interval]", None),
            ("paired_pooled", "Pooled over the models: span scores vs baselines, mean ΔAUROC, "
                              "BH-adjusted", p_values),
            ("within", "Within answers with wrong and correct sentences: share whose "
                       "top-scored sentence is wrong (chance: the share of wrong sentences)",
             None)):
        if tables.get(key):
            blocks.append(Block(ours=make_table(f"long_{key}", tables[key], title=title,
                                                formatters=formatters)))
    meta = {k: str(doc[k]) for k in ("started", "elapsed_s") if k in doc}
    return Section(id=sid, title=TITLE, source=str(exp.path), meta=meta,
                   details={"settings": {str(k): str(v)
                                         for k, v in (doc.get("settings") or {}).items()}},
                   notes=tuple(notes), blocks=tuple(blocks), figures=tuple(figures),
                   raw=tuple(make_table(name, t) for name, t in tables.items()))


__all__ = ["auroc_figure", "interval_cell", "is_long", "long_section", "wide_auroc"]
