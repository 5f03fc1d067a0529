"""Answers shaded span by span: rows with a ``spans`` list (``isouq ask --spans``, ``isouq score
--spans``) as one self-contained HTML page (plain CSS, no JavaScript, no external URL).

Each answer is shown whole, each span's background shaded by the span score that picks the
least-trusted sentence (``isouq.defaults.SPAN_SCORE``, chosen from the kept evidence) relative
to the other spans of the same answer (the palest is the most trusted, the darkest the least
trusted, outlined); hovering a span shows its p̄, aleatoric, epistemic and epistemic_log. Text
outside every span (the blanks between sentences) is shown unshaded.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from ...defaults import HIGHER_IS_LESS_TRUSTED, LOG_SCALE, SPAN_SCORE, least_trusted

#: the style of shaded answers, shared by this page and ``isouq report`` (its span section)
SPAN_CSS = """
.q { font-weight: 600; margin: 28px 0 4px; }
.a { white-space: pre-wrap; line-height: 1.7; }
.s { border-radius: 3px; padding: 1px 0; }
.worst { outline: 2px solid #b3261e; }
.wrong { text-decoration: underline wavy #b3261e; }
.legend { font-size: 13px; color: #57606a; }
"""
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 900px; padding: 0 24px 48px; color: #1d1d1f;
       line-height: 1.7; }
""" + SPAN_CSS
#: what the shading means (the page's legend; a note of the report's span section)
LEGEND = (f"Each span is shaded by its {SPAN_SCORE} among the spans of its answer (the score "
          "that picks the sentence to check first, chosen from the kept evidence: docs, Which "
          "score should I trust?): the darker, the less trusted; the outlined span is the one "
          "to check first; a span labelled wrong (correct = 0) is underlined in a wave. Hover a "
          "span for its scores. None of these is a probability of being right.")


def shades(spans: Sequence[dict], score: str = SPAN_SCORE) -> list[float]:
    """Each span's shade in [0, 1], from the most trusted (0) to the least trusted (1) of the
    answer by ``score`` (a squared norm on a log scale); 0.5 for every span when they are all
    equal or not finite."""
    sign = 1.0 if HIGHER_IS_LESS_TRUSTED[score] else -1.0
    vals = [float(s["scores"][score]) for s in spans]
    logs = [None if not math.isfinite(v) or (score in LOG_SCALE and v <= 0)
            else sign * (math.log10(v) if score in LOG_SCALE else v) for v in vals]
    have = [v for v in logs if v is not None]
    if len(have) < 2 or max(have) == min(have):
        return [0.5] * len(spans)
    lo, hi = min(have), max(have)
    return [1.0 if v is None else (v - lo) / (hi - lo) for v in logs]


def _pieces(answer: str, spans: Sequence[dict]) -> list[tuple[str, int | None]]:
    """(text, span index or None) pieces of the answer: the answer's own text between the spans
    when the spans' ranges index it, else the spans' texts joined by blanks."""
    if all(answer[s["start"]:s["end"]] == s["text"] for s in spans):
        out, at = [], 0
        for k in sorted(range(len(spans)), key=lambda k: spans[k]["start"]):
            s = spans[k]
            out += [(answer[at:s["start"]], None), (s["text"], k)]
            at = s["end"]
        return [*out, (answer[at:], None)]
    return [p for k, s in enumerate(spans) for p in ((" " if k else "", None), (s["text"], k))]


def answer_html(row: dict) -> str:
    """One answer row as HTML: its question (or key) and its answer, spans shaded."""
    spans = row.get("spans") or []
    worst = least_trusted(spans)
    shade = shades(spans)
    parts = []
    for text, k in _pieces(str(row.get("answer") or ""), spans):
        if k is None:
            parts.append(html.escape(text))
            continue
        sc = spans[k]["scores"]
        tip = (f"p̄ {sc['mean_prob']:.3f} · aleatoric {sc['aleatoric']:.3f} · epistemic "
               f"{sc['epistemic']:.3g} · epistemic_log {sc['epistemic_log']:.3g}")
        label = spans[k].get("correct")
        if label is not None:
            tip += " · labelled " + ("right" if label else "wrong")
        alpha = 0.06 + 0.54 * shade[k]
        cls = "s" + (" worst" if k == worst else "") + (" wrong" if label == 0 else "")
        parts.append(f'<span class="{cls}" '
                     f'style="background: rgba(214, 39, 40, {alpha:.2f})" '
                     f'title="{html.escape(tip)}">{html.escape(text)}</span>')
    head = row.get("question") or row.get("prompt") or row.get("key")
    head = head if isinstance(head, str) else str(row.get("key"))
    return (f'<div class="q">{html.escape(head)}</div>\n'
            f'<div class="a">{"".join(parts) or "(no answer)"}</div>')


def spans_page(rows: Sequence[dict], title: str = "isouq: answers span by span") -> str:
    """The self-contained HTML page of ``rows`` (answer rows with ``spans``)."""
    body = "\n".join(answer_html(r) for r in rows if "error" not in r)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p class=\"legend\">{html.escape(LEGEND)}</p>\n"
            f"{body}\n</body></html>\n")


__all__ = ["CSS", "LEGEND", "SPAN_CSS", "answer_html", "shades", "spans_page"]
