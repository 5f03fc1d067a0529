"""What a report holds, independent of how it is rendered (HTML, Markdown, LaTeX).

A report is a list of :class:`Section` (one per experiment, one for the QA study); a section
holds :class:`Block` (our table beside the paper's), :class:`Figure` and plain-text notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...runio import slug


@dataclass(frozen=True)
class Table:
    """A formatted table: every cell already a string. ``bold`` holds (row, column) indices."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    bold: frozenset[tuple[int, int]] = frozenset()
    caption: str = ""


@dataclass(frozen=True)
class Block:
    """Our table and, where the paper reports one, the paper's (either may be missing)."""

    ours: Table | None
    paper: Table | None = None

    @property
    def title(self) -> str:
        t = self.ours or self.paper
        return t.title if t else ""

    @property
    def name(self) -> str:
        t = self.ours or self.paper
        return t.name if t else ""


@dataclass(frozen=True)
class Figure:
    """An image file (PNG/SVG/JPEG) inside the report directory; ``path`` relative to it."""

    path: Path
    caption: str = ""


@dataclass(frozen=True)
class Section:
    """One experiment (or the QA study): meta data, blocks, figures, notes, raw tables, and
    ``html``: fragments of HTML made (and escaped) by the section's maker, shown after its
    blocks in ``report.html`` only (e.g. answers shaded span by span)."""

    id: str
    title: str
    source: str
    meta: dict[str, str] = field(default_factory=dict)
    details: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    blocks: tuple[Block, ...] = ()
    figures: tuple[Figure, ...] = ()
    raw: tuple[Table, ...] = ()
    html: tuple[str, ...] = ()


def unique_slug(text: str, taken: set[str]) -> str:
    """``slug(text)``, suffixed -2, -3, ... until not in ``taken``; adds it to ``taken``."""
    base = slug(text, lower=True) or "section"
    s, i = base, 2
    while s in taken:
        s, i = f"{base}-{i}", i + 1
    taken.add(s)
    return s
