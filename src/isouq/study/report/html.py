"""Sections -> one ``report.html``: plain CSS, no JavaScript, no external URLs; figures linked
as files beside it by relative path (the folder opens anywhere as a whole, and the page stays
small: a re-render adds to git only the figures that changed). With ``embed=True`` the figures
go into the page as base64 data URIs instead, for a single file that opens alone."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .document import Block, Figure, Section, Table
from .spans import SPAN_CSS

MIME: dict[str, str] = {
    ".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
    ".gif": "image/gif", ".webp": "image/webp",
}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1200px; padding: 0 24px 48px; color: #1d1d1f;
       line-height: 1.45; }
h1 { margin-top: 24px; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px;
       margin-top: 40px; } h3 { margin: 24px 0 6px; }
nav { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px;
      padding: 8px 20px; }
nav ol { margin: 4px 0; } nav li { margin: 2px 0; }
a { color: #0b62a3; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f0f3f6; text-align: center; }
td:first-child, th:first-child, td.t { text-align: left; }
tbody tr:nth-child(even) { background: #fafbfc; }
td.b { font-weight: 700; background: #fff4d6; }
.pair { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.pair > div { overflow-x: auto; max-width: 100%; }
.label { font-size: 12px; font-weight: 600; text-transform: uppercase; color: #57606a;
         letter-spacing: .04em; }
.label.paper { color: #8250df; }
.caption { font-size: 13px; color: #57606a; margin: 2px 0 6px; max-width: 900px; }
.note { background: #fff8c5; border-left: 4px solid #d4a72c; padding: 4px 10px;
        font-size: 13px; margin: 6px 0; }
figure { margin: 12px 0 20px; } figure img { max-width: 100%; height: auto;
         border: 1px solid #e1e4e8; } figcaption { font-size: 13px; color: #57606a; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 2px 12px;
          font-size: 13px; margin: 8px 0; } dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; word-break: break-all; }
details { margin: 6px 0; font-size: 13px; } summary { cursor: pointer; font-weight: 600; }
.muted { color: #57606a; font-size: 13px; }
.answers { max-width: 900px; }
""" + SPAN_CSS


def data_uri(path: str | Path) -> str:
    """``data:<mime>;base64,...`` for an image file (type from its suffix)."""
    path = Path(path)
    mime = MIME.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


_NUMERIC = re.compile(r"^[-−+<>\[(]*\s*[0-9.]|^–$")


def _td(cell: str, bold: bool) -> str:
    """A cell: class ``b`` when bold, ``t`` (left-aligned) when it is text, not a number."""
    cls = " ".join(c for c, on in (("b", bold), ("t", not _NUMERIC.match(cell))) if on)
    return f'<td class="{cls}">{_e(cell)}</td>' if cls else f"<td>{_e(cell)}</td>"


def table_html(table: Table) -> str:
    """An HTML ``<table>``; bold cells get class ``b``, text cells class ``t``."""
    if not table.rows:
        return '<p class="muted">(no rows)</p>'
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = []
    for i, row in enumerate(table.rows):
        cells = "".join(_td(c, (i, j) in table.bold) for j, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return (f'<table data-name="{_e(table.name)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def block_html(block: Block, anchor: str) -> str:
    """A block: title, caption, our table and the paper's side by side."""
    first = block.ours or block.paper
    parts = [f'<h3 id="{_e(anchor)}">{_e(block.title)}</h3>']
    if first is not None and first.caption:
        parts.append(f'<p class="caption">{_e(first.caption)}</p>')
    cols = []
    if block.ours is not None:
        cols.append(f'<div><div class="label">ours</div>{table_html(block.ours)}</div>')
    if block.paper is not None:
        cols.append(f'<div><div class="label paper">paper</div>{table_html(block.paper)}</div>')
    parts.append(f'<div class="pair">{"".join(cols)}</div>')
    return "\n".join(parts)


def figure_html(fig: Figure, root: Path, embed: bool = False) -> str:
    """A ``<figure>`` with the image linked by its path relative to ``root`` (or, with
    ``embed``, embedded as a data URI)."""
    src = data_uri(root / fig.path) if embed else fig.path.as_posix()
    return (f'<figure><img src="{_e(src)}" alt="{_e(fig.caption or fig.path.name)}">'
            f"<figcaption>{_e(fig.caption)}</figcaption></figure>")


def _dl(meta: Mapping[str, str]) -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in meta.items())
    return f'<dl class="meta">{items}</dl>' if items else ""


def _anchor(section: Section, i: int, block: Block) -> str:
    return f"{section.id}--{i}-{block.name.replace('_', '-')}"


def section_html(section: Section, root: Path, embed: bool = False) -> str:
    """One ``<section>``: meta data, notes, figures, blocks, the section's own HTML, then
    collapsed raw tables."""
    parts = [f'<section id="{_e(section.id)}"><h2>{_e(section.title)}</h2>',
             f'<p class="muted">source: <code>{_e(section.source)}</code></p>',
             _dl(section.meta)]
    for name, d in section.details.items():
        parts.append(f"<details><summary>{_e(name)}</summary>{_dl(d)}</details>")
    parts += [f'<p class="note">{_e(n)}</p>' for n in section.notes]
    parts += [figure_html(f, root, embed) for f in section.figures]
    parts += [block_html(b, _anchor(section, i, b)) for i, b in enumerate(section.blocks)]
    parts += list(section.html)
    if section.raw:
        inner = "".join(f"<h4>{_e(t.name)}</h4>{table_html(t)}" for t in section.raw)
        parts.append(f"<details><summary>All tables, unformatted names "
                     f"({len(section.raw)})</summary>{inner}</details>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def toc_html(sections: Sequence[Section]) -> str:
    """A table of contents: sections, and their tables one level down."""
    items = []
    for s in sections:
        sub = "".join(f'<li><a href="#{_e(_anchor(s, i, b))}">{_e(b.title)}</a></li>'
                      for i, b in enumerate(s.blocks))
        items.append(f'<li><a href="#{_e(s.id)}">{_e(s.title)}</a>'
                     + (f"<ol>{sub}</ol>" if sub else "") + "</li>")
    return f"<nav><h2>Contents</h2><ol>{''.join(items)}</ol></nav>"


def render_html(
    sections: Sequence[Section],
    root: Path,
    *,
    title: str = "isouq report",
    header: Mapping[str, str] | None = None,
    embed: bool = False,
) -> str:
    """The whole page. ``root`` is the report directory figure paths are relative to;
    ``embed`` puts the figures into the page as data URIs instead of linking them."""
    body = "\n".join(section_html(s, root, embed) for s in sections)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>{_dl(header or {})}{toc_html(sections)}\n{body}\n"
        "</body></html>\n"
    )
