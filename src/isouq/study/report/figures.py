"""QA figures (matplotlib, Agg): AUROC bars with error bars, and score distributions of correct
vs incorrect answers per method and model (epistemic scores on a log10 axis). Each is written
by :func:`save_png`: a lossless PNG without the alpha channel an opaque figure does not need,
compressed harder than matplotlib's own (the figures sit beside ``report.html`` and in git)."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from ...evaluation.rows import LOG_FEATURES, group_rows  # noqa: E402

#: score name -> panel label; the order of the distribution panels.
SCORE_LABELS: dict[str, str] = {
    "aleatoric": "Alea. (1/T Σ p(1−p))",
    "epistemic": "Epi. ‖g‖²",
    "normalized_epistemic": "Epi. ‖g‖²/‖θ*‖²",
    "p_true": "P(True)",
    "naive_entropy": "Naive Ent.",
    "semantic_entropy": "Sem. Ent.",
}
CORRECT_COLOR, WRONG_COLOR, PAPER_COLOR = "#2a7ab9", "#d9622b", "black"
DPI = 100
PANEL_COLUMNS = 3


def save_png(fig, path: str | Path, dpi: int = DPI) -> Path:
    """Write ``fig`` to ``path`` as a lossless PNG, smaller than ``fig.savefig``'s.

    The pixels are matplotlib's own (Agg at ``dpi``); an image whose every pixel is opaque is
    stored as RGB instead of RGBA, and Pillow's ``optimize`` picks the deflate settings. The
    file holds no date, so the same figure gives the same bytes (git stores it once).

    Args:
        fig: a matplotlib figure.
        path: where to write (the name should end in ``.png``).
        dpi: dots per inch.

    Returns:
        ``path``.
    """
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    with Image.open(buf) as im:
        im.load()
        if im.mode == "RGBA" and im.getchannel("A").getextrema() == (255, 255):
            im = im.convert("RGB")
        tmp = path.with_name(path.name + ".tmp")
        im.save(tmp, format="PNG", optimize=True)
    tmp.replace(path)
    return path


def _finite(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _datasets_of(rows: Sequence[Mapping]) -> list[str]:
    return [str(c) for c in (rows[0] if rows else {}) if c not in ("method",)
            and not str(c).endswith(" ±")]


def _paper_lookup(paper_rows: Sequence[Mapping] | None) -> dict[tuple[str, str], float]:
    """(method, dataset lower-case) -> paper mean."""
    out: dict[tuple[str, str], float] = {}
    for r in paper_rows or ():
        for k, v in r.items():
            x = _finite(v)
            if k != "method" and not str(k).endswith(" ±") and x is not None:
                out[(str(r["method"]), str(k).lower())] = x
    return out


def metric_bars(
    rows: Sequence[Mapping],
    path: str | Path,
    *,
    metric: str = "AUROC",
    paper_rows: Sequence[Mapping] | None = None,
    chance: float | None = 0.5,
) -> Path:
    """Bar chart of a ``study_tables`` metric table (rows = methods; columns = datasets and
    "<dataset> ±"): one panel per dataset, a bar per method with ±std error bars, the paper's
    value as a black diamond where the paper has that method and dataset (matched by name,
    case-insensitive). Writes a PNG to ``path`` and returns it."""
    path = Path(path)
    datasets = _datasets_of(rows)
    methods = [str(r["method"]) for r in rows]
    paper = _paper_lookup(paper_rows)
    n = max(len(datasets), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False, sharey=True)
    x = np.arange(len(methods))
    for ax, ds in zip(axes[0], datasets or [""], strict=False):
        mean = np.array([_finite(r.get(ds)) if _finite(r.get(ds)) is not None else np.nan
                         for r in rows])
        std = np.array([_finite(r.get(f"{ds} ±")) or 0.0 for r in rows])
        colors = ["#7f7f7f" if m in ("Naive Ent.", "Sem. Ent.", "P(True)") else CORRECT_COLOR
                  for m in methods]
        ax.bar(x, np.nan_to_num(mean), yerr=std, color=colors, capsize=3, alpha=0.85,
               error_kw={"elinewidth": 1})
        labeled = False
        for i, m in enumerate(methods):
            if np.isnan(mean[i]):
                ax.text(i, 0.02, "n/a", ha="center", va="bottom", fontsize=8)
            p = paper.get((m, ds.lower()))
            if p is not None:
                ax.plot(i, p, marker="D", color=PAPER_COLOR, ms=5, ls="none",
                        label=None if labeled else "paper")
                labeled = True
        if chance is not None:
            ax.axhline(chance, color="0.4", lw=0.8, ls="--")
        ax.set_title(ds)
        ax.set_xticks(x, methods, rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylabel(f"{metric} (mean ± std)")
    top = np.nanmax([_finite(r.get(d)) or 0 for r in rows for d in datasets] + [1.0])
    axes[0][0].set_ylim(0, max(1.0, top * 1.05))
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path


def _draw_group(ax, values: np.ndarray, pos: float, color: str) -> None:
    """A violin (or the points, when there are too few or all equal) at x = ``pos``."""
    if values.size == 0:
        return
    if values.size >= 3 and np.ptp(values) > 0:
        parts = ax.violinplot(values, positions=[pos], widths=0.38, showmedians=True,
                              showextrema=False)
        for body in parts["bodies"]:
            body.set_facecolor(color)
            body.set_edgecolor(color)
            body.set_alpha(0.55)
        parts["cmedians"].set_color(color)
    else:
        ax.plot(np.full(values.size, pos), values, "o", color=color, ms=3)


def _score_panel(ax, groups: Sequence, name: str) -> None:
    """Correct (left) vs incorrect (right) violins of score ``name`` for each model group."""
    for k, g in enumerate(groups):
        v = g.score(name)
        ok = np.isfinite(v)
        if name in LOG_FEATURES:
            ok &= v > 0
            v = np.where(ok, np.log10(np.where(ok, v, 1.0)), np.nan)
        _draw_group(ax, v[ok & (g.correct == 1)], k - 0.2, CORRECT_COLOR)
        _draw_group(ax, v[ok & (g.correct == 0)], k + 0.2, WRONG_COLOR)
    if name in LOG_FEATURES:
        ax.set_ylabel("log10 value", fontsize=8)
    ax.set_xticks(range(len(groups)), [g.model for g in groups], rotation=30, ha="right",
                  fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)


def score_distributions(
    rows: Iterable[Mapping],
    path: str | Path,
    *,
    scores: Sequence[str] | None = None,
) -> Path:
    """Violins of each score for correct vs incorrect answers, per model: per dataset a block
    of panels ``PANEL_COLUMNS`` wide, one panel per score (those some judged row has, in
    ``SCORE_LABELS`` order, then the others). Epistemic scores are drawn as log10
    (non-positive values left out). Writes a PNG to ``path`` and returns it."""
    path = Path(path)
    groups = group_rows(rows)
    datasets = list(dict.fromkeys(ds for ds, _ in groups))
    have = {s for g in groups.values() for s, v in g.scores.items() if np.isfinite(v).any()}
    order = list(scores) if scores is not None else [*SCORE_LABELS, *sorted(have)]
    names = [s for s in dict.fromkeys(order) if s in have] or ["(no scores)"]
    ncols = min(len(names), PANEL_COLUMNS)
    per_ds = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(per_ds * len(datasets), ncols, squeeze=False,
                             figsize=(3.4 * ncols, 2.8 * per_ds * len(datasets)))
    for ax in axes.flat:
        ax.set_visible(False)
    for i, ds in enumerate(datasets):
        models = [m for d, m in groups if d == ds]
        for j, name in enumerate(names):
            ax = axes[i * per_ds + j // ncols][j % ncols]
            ax.set_visible(True)
            _score_panel(ax, [groups[(ds, m)] for m in models], name)
            ax.set_title(f"{ds}: {SCORE_LABELS.get(name, name)}", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.6)
               for c in (CORRECT_COLOR, WRONG_COLOR)]
    fig.legend(handles, ["correct", "incorrect"], loc="upper right", fontsize=8, ncol=2)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    save_png(fig, path)
    plt.close(fig)
    return path


#: scores of ours (blue) and of the critique (orange) in the raw-AUROC forest; the rest grey
OUR_SCORES = ("epistemic", "epistemic_log", "aleatoric")
CRITIQUE_SCORES = ("semgrad", "lm_head_grad", "hybridgrad")
CRITIQUE_COLOR, BASELINE_COLOR = "#e08a1e", "#7f7f7f"


def raw_auroc_forest(raw: Sequence[Mapping], pooled: Sequence[Mapping], path: str | Path) -> Path:
    """Raw AUROC of each score with its 95% interval: one panel per model, then one for the
    models pooled (when given). Rows are :func:`study.analysis.evidence.raw_auroc_rows` /
    ``raw_pooled_rows`` (scores oriented as confidences), so a point right of the dashed 0.5
    line means the score ranks correct answers as more trustworthy. Writes a PNG, returns it."""
    path = Path(path)
    models = list(dict.fromkeys(str(r["model"]) for r in raw))
    panels = [(m, [r for r in raw if r["model"] == m]) for m in models]
    if pooled:
        panels.append((f"{pooled[0]['models']} models pooled", list(pooled)))
    scores = list(dict.fromkeys(str(r["score"]) for _, rows in panels for r in rows))
    y = {s: len(scores) - 1 - i for i, s in enumerate(scores)}
    fig, axes = plt.subplots(1, len(panels), squeeze=False, sharey=True,
                             figsize=(2.6 * len(panels) + 1.6, 0.32 * len(scores) + 1.3))
    for ax, (title, rows) in zip(axes[0], panels, strict=True):
        for r in rows:
            a, lo, hi = _finite(r["auroc"]), _finite(r["ci_low"]), _finite(r["ci_high"])
            if a is None:
                continue
            s = str(r["score"])
            color = (CORRECT_COLOR if s in OUR_SCORES else
                     CRITIQUE_COLOR if s in CRITIQUE_SCORES else BASELINE_COLOR)
            err = [[a - lo], [hi - a]] if lo is not None and hi is not None else None
            ax.errorbar(a, y[s], xerr=err, fmt="o", color=color, ms=4, capsize=2, lw=1)
        ax.axvline(0.5, color="0.4", lw=0.8, ls="--")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("raw AUROC", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks([y[s] for s in scores],
                          [s if s in ("mean_prob", "max_prob", "p_true") else f"−{s}"
                           for s in scores])
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path
