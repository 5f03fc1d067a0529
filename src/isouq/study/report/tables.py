"""Dict rows -> formatted :class:`Table` (QA views shaped like the paper's) -> Markdown / LaTeX.

Conventions: a column ``"X ±"`` is the standard deviation of column ``X`` and is shown merged
as ``"mean ± std"``; missing values show as ``–``; bold cells are ``**x**`` in Markdown and
``\\textbf{x}`` in LaTeX (tables need ``\\usepackage{booktabs}``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...evaluation.significance import format_p as significance_format_p
from ...runio import markdown_grid
from .document import Block, Section, Table

MISSING = "–"
STD = " ±"


# --------------------------------------------------------------------------- formatting


def format_value(v, digits: int = 3) -> str:
    """One cell: ints as they are, floats with ``digits`` decimals (scientific when tiny or
    huge), None/NaN as ``–``, booleans as yes/no, anything else ``str``."""
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        x = float(v)
        if not math.isfinite(x):
            return MISSING
        if x != 0 and (abs(x) < 10.0**-digits or abs(x) >= 1e5):
            return f"{x:.{max(digits - 1, 1)}e}"
        return f"{x:.{digits}f}"
    return str(v)


def format_std(v, digits: int = 3) -> str:
    """A standard deviation: always fixed-point (round-off like 1e-17 shows as 0.000)."""
    x = _number(v)
    return MISSING if x is None else f"{abs(x):.{digits}f}"


def format_speedup(v) -> str:
    """A speed-up factor: '31.0×'."""
    x = _number(v)
    return MISSING if x is None else f"{x:.1f}×"


def format_p(p) -> str:
    """A p-value cell: '<0.001', '0.005', '–' when missing (``significance.format_p``)."""
    return significance_format_p(p) or MISSING


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def columns_of(rows: Iterable[Mapping]) -> list[str]:
    """Union of the rows' keys in first-seen order, without ``"X ±"`` when ``X`` is a column."""
    cols: list[str] = []
    for r in rows:
        cols += [str(k) for k in r if str(k) not in cols]
    return [c for c in cols if not (c.endswith(STD) and c[: -len(STD)] in cols)]


def _best(values: Sequence[float | None]) -> set[int]:
    nums = [v for v in values if v is not None]
    if len(nums) < 2:
        return set()
    top = max(nums)
    return {i for i, v in enumerate(values) if v is not None and v == top}


def make_table(
    name: str,
    rows: Sequence[Mapping],
    *,
    title: str | None = None,
    caption: str = "",
    digits: int = 3,
    columns: Sequence[str] | None = None,
    best: str | None = None,
    best_columns: Sequence[str] | None = None,
    formatters: Mapping[str, Callable[[object], str]] | None = None,
) -> Table:
    """Format dict ``rows`` (union of keys, ``"X ±"`` merged into ``X``) into a Table.

    ``best`` = "column" or "row" bolds the largest number per column / per row among
    ``best_columns`` (default: every column). ``formatters`` maps a column to its own
    formatter (e.g. :func:`format_p`).
    """
    cols = list(columns) if columns is not None else columns_of(rows)
    fmts = dict(formatters or {})
    cells = []
    for r in rows:
        line = []
        for c in cols:
            fmt = fmts.get(c, lambda v: format_value(v, digits))
            s = fmt(r.get(c))
            if r.get(c + STD) is not None:
                s += " ± " + format_std(r.get(c + STD), digits)
            line.append(s)
        cells.append(tuple(line))
    bold: set[tuple[int, int]] = set()
    if best in ("column", "row"):
        bcols = [j for j, c in enumerate(cols) if best_columns is None or c in best_columns]
        grid = [[_number(r.get(cols[j])) for j in bcols] for r in rows]
        if best == "column":
            for k, j in enumerate(bcols):
                bold |= {(i, j) for i in _best([g[k] for g in grid])}
        else:
            for i, g in enumerate(grid):
                bold |= {(i, bcols[k]) for k in _best(g)}
    return Table(name=name, title=title or name.replace("_", " ").capitalize(),
                 columns=tuple(cols), rows=tuple(cells), bold=frozenset(bold), caption=caption)


# --------------------------------------------------------------------------- QA views


def _metric_view(name: str, label: str) -> Callable[[list[dict], int], Table]:
    def view(rows: list[dict], digits: int) -> Table:
        return make_table(
            name, rows, title=f"{label} by method and dataset", digits=digits, best="column",
            caption=f"{label}: mean ± std over bootstrap runs and models (higher is better"
            + ("; 0.5 is chance" if label == "AUROC" else "")
            + "). Best per column in bold."
            + (" Paper: tab:qa-results (§4.2)." if label == "AUROC" else ""),
        )
    return view


def _per_model_view(rows: list[dict], digits: int) -> Table:
    methods = [c for c in columns_of(rows) if c not in ("dataset", "model")]
    return make_table("auroc_per_model", rows, title="Per-model AUROC", digits=digits,
                      best="row", best_columns=methods,
                      caption="AUROC per model (mean over bootstrap runs); best per row in "
                      "bold. Paper: tab:qa-per-model.")


def _common_rows_view(rows: list[dict], digits: int) -> Table:
    methods = [c for c in columns_of(rows) if c not in ("dataset", "model", "n", "of")]
    return make_table("auroc_common_rows", rows, title="Per-model AUROC on the rows every "
                      "method has scored (runs in progress)", digits=digits, best="row",
                      best_columns=methods,
                      caption="For (dataset, model) groups where a method's run is still in "
                      "progress (left out of the tables above): every method on the n of the "
                      "group's judged rows that carry all scores, so the methods are compared "
                      "on the same questions. A subset, not the whole group: read it as an "
                      "interim result.")


def _significance_view(rows: list[dict], digits: int) -> Table:
    t = make_table("significance", rows, title="Significance (paired t-tests, BH-adjusted)",
                   digits=digits,
                   caption="BH-adjusted p of paired t-tests over random 80/20 splits, gradient "
                   "method vs baseline; bold = significant at 0.05; ↑ gradient method better, "
                   "↓ baseline better. Paper: tab:qa-significance.")
    bold = {(i, j) for i, row in enumerate(t.rows) for j, c in enumerate(row)
            if "↑" in c or "↓" in c}
    return Table(t.name, t.title, t.columns, t.rows, frozenset(bold), t.caption)


def _bootstrap_view(rows: list[dict], digits: int) -> Table:
    digits = max(digits, 3)  # differences of a few thousandths
    shaped = [{
        "dataset": r.get("dataset"),
        "comparison": f"{r.get('method')} vs {r.get('reference')}",
        "ΔAUROC": r.get("delta_auroc"),
        f"{round(100 * (r.get('confidence') or 0.95))}% CI":
            f"[{format_value(r.get('ci_low'), digits)}, {format_value(r.get('ci_high'), digits)}]",
        "p": r.get("p"),
        "cells": r.get("n_cells"),
    } for r in rows]
    return make_table("paired_bootstrap", shaped, title="Paired bootstrap of the epistemic lift",
                      digits=digits, formatters={"p": format_p},
                      caption="ΔAUROC of Epi. & Alea. over Alea., resampling (model, split) "
                      "cells. Paper: App. QA significance (text).")


def _correlation_view(rows: list[dict], digits: int) -> Table:
    shaped = [{"model": r.get("model"), "dataset": r.get("dataset"), "n": r.get("n"),
               "ρ": r.get("rho"), "p": r.get("p")} for r in rows]
    return make_table("correlation", shaped, title="Spearman ρ(‖g‖², P(True))", digits=digits,
                      formatters={"p": format_p},
                      caption="Spearman rank correlation between the epistemic score and "
                      "P(True), per model and pooled. Paper: tab:qa-correlation.")


def _lomo_view(rows: list[dict], digits: int) -> Table:
    cols = [c for c in columns_of(rows) if c not in ("dataset", "held_out")]
    shaped: list[dict] = []
    for r in rows:
        if r.get("held_out") == "Std":
            continue
        if r.get("held_out") == "Mean":
            std = next((s for s in rows if s.get("dataset") == r.get("dataset")
                        and s.get("held_out") == "Std"), {})
            r = {"dataset": r.get("dataset"), "held_out": "Mean (Std)",
                 **{c: f"{format_value(r.get(c), digits)} ({format_std(std.get(c), digits)})"
                    for c in cols}}
        shaped.append(dict(r))
    return make_table("lomo", shaped, title="Leave-one-model-out transfer AUROC", digits=digits,
                      caption="Train on the other models, evaluate on the held-out one; raw "
                      "‖g‖² vs ‖g‖²/‖θ*‖², alone and with Alea. Paper: tab:qa-lomo.")


def _cost_view(rows: list[dict], digits: int) -> Table:
    pivot: dict[tuple, dict] = {}
    for r in rows:
        key = (r.get("dataset"), r.get("model"))
        row = pivot.setdefault(key, {"dataset": key[0], "model": key[1]})
        row[str(r.get("method"))] = r.get("mean_s")
        row[f"{r.get('method')}{STD}"] = r.get("std_s")
        if r.get("median_s") is not None:
            row[f"{r.get('method')} median"] = r.get("median_s")
    ds_order = list(dict.fromkeys(k[0] for k in pivot))
    model_order = list(dict.fromkeys(k[1] for k in pivot))
    keys = sorted(pivot, key=lambda k: (ds_order.index(k[0]), model_order.index(k[1])))
    return make_table("cost", [pivot[k] for k in keys], title="Seconds per sample",
                      digits=digits,
                      caption="Wall-clock seconds per sample beyond the shared generation "
                      "(mean ± std, and the median, which a few samples timed on a busy "
                      "machine do not move). Paper: tab:timing-full (one H100).")


def _passes_view(rows: list[dict], digits: int) -> Table:
    seen: dict[str, dict] = {}
    for r in rows:
        m = str(r.get("method"))
        s = seen.setdefault(m, {"method": m, "passes per sample": r.get("passes"),
                                "speed-up of ours": []})
        if r.get("speedup") is not None:
            s["speed-up of ours"].append(float(r["speedup"]))
    shaped = [{**s, "speed-up of ours": (sum(s["speed-up of ours"]) / len(s["speed-up of ours"])
                                         if s["speed-up of ours"] else None)}
              for s in seen.values()]
    return make_table("passes", shaped, title="Passes per sample and speed-up", digits=digits,
                      formatters={"speed-up of ours": format_speedup},
                      caption="Extra passes per sample (generations + forward + backward) and "
                      "mean time of the method / mean time of the gradient norm, averaged "
                      "over models; where rows record the machine (timed_on), only rows timed "
                      "on one machine are compared (the raw cost table's 'compared' says which). "
                      "Paper: tab:complexity.")


def _without_empty_columns(rows: list[dict]) -> list[str]:
    return [c for c in columns_of(rows) if any(r.get(c) is not None for r in rows)]


def _label_agreement_view(rows: list[dict], digits: int) -> Table:
    return make_table("label_agreement", rows, title="How good are the labels? Judge and "
                      "lexical labels against hand labels", digits=digits,
                      caption="Per (dataset, model) and label source, on the rows a person "
                      "labelled (results/qa/gold/): positives, true/false positives, accuracy "
                      "and Cohen's κ against the hand labels. κ near 0 = the labels the study "
                      "is scored on carry little of the truth.")


def _auroc_by_labels_view(rows: list[dict], digits: int) -> Table:
    cols = _without_empty_columns(rows)
    methods = [c for c in cols if c not in ("dataset", "model", "labels", "n", "correct")]
    return make_table("auroc_by_labels", rows, title="AUROC with hand labels vs judge labels "
                      "(same rows)", digits=digits, columns=cols, best="row",
                      best_columns=methods,
                      caption="Per-model AUROC of every method (the study's logistic regression, "
                      "out-of-bag bootstrap) on the hand-labelled rows, scored once with the hand "
                      "labels and once with the judge's. Where they differ, the judge's label "
                      "noise, not the method, drives the main table.")


def _raw_auroc_by_labels_view(rows: list[dict], digits: int) -> Table:
    return make_table("raw_auroc_by_labels", rows, title="Raw scores as uncertainty, by labels",
                      digits=digits, columns=_without_empty_columns(rows),
                      caption="AUROC of each raw score used as the uncertainty, without fitting "
                      "(mean_prob and p_true negated). 0.5 is chance; below 0.5 the score ranks "
                      "correct answers as more uncertain, a direction the regression of the "
                      "main table learns and hides.")


def _raw_auroc_view(rows: list[dict], digits: int) -> Table:
    keep = ("dataset", "model", "score", "n", "auroc", "ci_low", "ci_high", "score_direction")
    rows = [{k: r.get(k) for k in keep} for r in rows]
    return make_table("raw_auroc", rows, title="Which direction predicts errors: raw scores",
                      digits=digits, columns=list(keep),
                      caption="AUROC of each score used as it is (no fit), oriented as a "
                      "confidence (p̄, P(True) as they are; the uncertainty scores negated), with "
                      "a 95% bootstrap interval over questions; score_direction says what the "
                      "interval supports for the raw score ('none' when it holds 0.5).")


#: study table name -> (view name, view function), in report order.
QA_VIEWS: tuple[tuple[str, Callable[[list[dict], int], Table]], ...] = (
    ("auroc", _metric_view("auroc", "AUROC")),
    ("auroc_per_model", _per_model_view),
    ("auroc_common_rows", _common_rows_view),
    ("significance_wide", _significance_view),
    ("paired_bootstrap", _bootstrap_view),
    ("correlation", _correlation_view),
    ("lomo", _lomo_view),
    ("cost", _cost_view),
    ("cost", _passes_view),
    ("prr", _metric_view("prr", "PRR")),
    ("aurac", _metric_view("aurac", "AURAC")),
    ("raw_auroc", _raw_auroc_view),
    ("label_agreement", _label_agreement_view),
    ("auroc_by_labels", _auroc_by_labels_view),
    ("raw_auroc_by_labels", _raw_auroc_by_labels_view),
)


def qa_tables(study: Mapping[str, list[dict]], digits: int = 3) -> list[Table]:
    """The paper-shaped QA tables from ``study_tables`` output (or the paper's rows); tables
    absent from ``study`` are skipped, empty ones kept (rendered as 'no rows')."""
    return [view(list(study[src]), digits) for src, view in QA_VIEWS if src in study]


def qa_blocks(study: Mapping[str, list[dict]], paper: Mapping[str, list[dict]]) -> list[Block]:
    """Our QA tables, each paired with the paper's table of the same name when there is one."""
    names = {str(r.get("dataset")) for rows in study.values() for r in rows if "dataset" in r}
    ours = qa_tables(study, digits=3)
    theirs = {t.name: t for t in qa_tables(rename_datasets(paper, names), digits=2)}
    return [Block(ours=t, paper=align_columns(theirs[t.name], t.columns) if t.name in theirs
                  else None) for t in ours]


def rename_datasets(
    tables: Mapping[str, list[dict]], names: Iterable[str]
) -> dict[str, list[dict]]:
    """``tables`` with dataset names (in ``dataset`` values and ``<dataset>[ ±]`` columns)
    spelled as in ``names`` where they match case-insensitively ('TriviaQA' -> 'triviaqa')."""
    spell = {n.lower(): n for n in names}

    def fix(x):
        if not isinstance(x, str):
            return x
        base, std = (x[: -len(STD)], STD) if x.endswith(STD) else (x, "")
        return spell.get(base.lower(), base) + std

    return {name: [{fix(k): (fix(v) if k == "dataset" else v) for k, v in r.items()}
                   for r in rows] for name, rows in tables.items()}


def align_columns(table: Table, order: Sequence[str]) -> Table:
    """``table`` with the columns it shares with ``order`` in that order, the rest after."""
    cols = [c for c in order if c in table.columns]
    cols += [c for c in table.columns if c not in cols]
    idx = [table.columns.index(c) for c in cols]
    rows = tuple(tuple(r[j] for j in idx) for r in table.rows)
    bold = frozenset((i, idx.index(j)) for i, j in table.bold)
    return Table(table.name, table.title, tuple(cols), rows, bold, table.caption)


# --------------------------------------------------------------------------- Markdown


def _md_cell(s: str, bold: bool) -> str:
    return f"**{s}**" if bold and s and s != MISSING else s


def to_markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table, best cells in bold; '_(no rows)_' when empty."""
    if not table.rows:
        return "_(no rows)_\n"
    return markdown_grid(table.columns, ([_md_cell(c, (i, j) in table.bold)
                                          for j, c in enumerate(row)]
                                         for i, row in enumerate(table.rows)))


def _md_block(block: Block) -> str:
    out = [f"### {block.title}\n"]
    cap = (block.ours or block.paper).caption if (block.ours or block.paper) else ""
    if cap:
        out.append(f"\n{cap}\n")
    if block.ours is not None:
        out.append("\nOurs:\n\n" + to_markdown(block.ours))
    if block.paper is not None:
        out.append("\nPaper:\n\n" + to_markdown(block.paper))
    return "".join(out)


def sections_markdown(sections: Sequence[Section], title: str = "isouq report") -> str:
    """All sections' tables (ours and the paper's) as one Markdown document."""
    parts = [f"# {title}\n"]
    for s in sections:
        parts.append(f"\n## {s.title}\n\nSource: `{s.source}`\n")
        parts += [f"\n{n}\n" for n in s.notes]
        parts += ["\n" + _md_block(b) for b in s.blocks]
    return "".join(parts)


# --------------------------------------------------------------------------- LaTeX

_LATEX_TEXT = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "−": "-", "–": "--", "—": "---", "∗": "*", "[": "{[}", "]": "{]}",
}
_LATEX_MATH = {
    "±": r"\pm", "↑": r"\uparrow", "↓": r"\downarrow", "ρ": r"\rho", "θ": r"\theta",
    "σ": r"\sigma", "Δ": r"\Delta", "‖": r"\|", "²": "^2", "×": r"\times", "≥": r"\geq",
    "≤": r"\leq", "<": "<", ">": ">", "·": r"\cdot", "≈": r"\approx", "μ": r"\mu",
}


def latex_escape(s: str) -> str:
    """Escape LaTeX specials; runs of the Unicode symbols the tables use become one math run
    (``‖g‖²`` -> ``$\\|$g$\\|^2$``)."""
    out: list[str] = []
    run: list[str] = []
    for ch in s:
        if ch in _LATEX_MATH:
            run.append(_LATEX_MATH[ch])
            continue
        if run:
            out.append("$" + "".join(run) + "$")
            run = []
        out.append(_LATEX_TEXT.get(ch, ch))
    if run:
        out.append("$" + "".join(run) + "$")
    return "".join(out)


def _tex_cell(s: str, bold: bool) -> str:
    e = latex_escape(s)
    return rf"\textbf{{{e}}}" if bold and s and s != MISSING else e


def to_latex(table: Table, label_prefix: str = "tab:isouq-") -> str:
    """A booktabs ``table`` environment with caption and label; a comment when empty."""
    if not table.rows:
        return f"% {latex_escape(table.title)}: no rows\n"
    spec = "l" + "c" * (len(table.columns) - 1)
    lines = [
        r"\begin{table}[h]", r"  \centering", r"  \small",
        rf"  \begin{{tabular}}{{{spec}}}", r"    \toprule",
        "    " + " & ".join(_tex_cell(c, False) for c in table.columns) + r" \\",
        r"    \midrule",
    ]
    for i, row in enumerate(table.rows):
        lines.append("    " + " & ".join(_tex_cell(c, (i, j) in table.bold)
                                         for j, c in enumerate(row)) + r" \\")
    caption = latex_escape(table.title + (". " + table.caption if table.caption else ""))
    lines += [r"    \bottomrule", r"  \end{tabular}", rf"  \caption{{{caption}}}",
              rf"  \label{{{label_prefix}{table.name.replace('_', '-')}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def sections_latex(sections: Sequence[Section], title: str = "isouq report") -> str:
    """All sections' tables as LaTeX fragments to ``\\input`` (needs booktabs)."""
    parts = [f"% {title}: generated by isouq.study.report; needs \\usepackage{{booktabs}}\n"]
    for s in sections:
        parts.append(f"\n% ===== {s.title} ({s.source})\n"
                     f"\\subsection*{{{latex_escape(s.title)}}}\n")
        for b in s.blocks:
            if b.ours is not None:
                parts.append("\n" + to_latex(b.ours, f"tab:{s.id}-"))
            if b.paper is not None:
                paper = Table(b.paper.name + "-paper", b.paper.title + " (paper)",
                              b.paper.columns, b.paper.rows, b.paper.bold, b.paper.caption)
                parts.append("\n" + to_latex(paper, f"tab:{s.id}-"))
    return "".join(parts)
