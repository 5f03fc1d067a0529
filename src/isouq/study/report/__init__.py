"""Reports: Markdown/LaTeX tables, matplotlib figures and one self-contained ``report.html``
from experiment ``results.json`` files and QA result rows (see :func:`build_report`)."""

from .build import build_report
from .document import Block, Figure, Section, Table
from .figures import metric_bars, score_distributions
from .html import render_html
from .inputs import collect, load_results, read_rows
from .paper_qa import paper_qa_tables
from .tables import (
    make_table,
    qa_tables,
    sections_latex,
    sections_markdown,
    to_latex,
    to_markdown,
)

__all__ = [
    "Block",
    "Figure",
    "Section",
    "Table",
    "build_report",
    "collect",
    "load_results",
    "make_table",
    "metric_bars",
    "paper_qa_tables",
    "qa_tables",
    "read_rows",
    "render_html",
    "score_distributions",
    "sections_latex",
    "sections_markdown",
    "to_latex",
    "to_markdown",
]
