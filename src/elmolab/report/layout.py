"""The report's tables as one model: a section's :class:`Table` (columns, cells with their
emphasis and hover text, notes), which the HTML template (``templates/report.html``) and the
Markdown template (``templates/report.md``) both render, so that the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Column:
    title: str
    detail: str = ""  # a second, smaller header line (Markdown: in parentheses)


@dataclass(frozen=True)
class TableCell:
    text: str
    numeric: bool = False  # right-aligned figures
    detail: str = ""  # smaller text after the main text (Markdown: in parentheses)
    hover: str = ""  # how a figure came about (HTML: a tooltip; Markdown drops it)
    bold: bool = False
    italic: bool = False
    badge: str = ""  # a verdict's class (good, bad, neutral): HTML draws a badge
    not_significant: bool = False  # a scalar mix not significantly different: marked ≈

    @property
    def classes(self) -> str:
        """The HTML cell's CSS classes."""
        names = [("num", self.numeric), ("best", self.bold), ("ns", self.not_significant)]
        return " ".join(name for name, on in names if on)


@dataclass(frozen=True)
class Table:
    columns: list[Column]
    rows: list[list[TableCell]]
    group_starts: list[bool] = field(default_factory=list)  # per row: a rule above it (HTML)
    note_before: str = ""  # what the figures are, above the table
    note: str = ""  # below the table


def columns_of(*titles: str | tuple[str, str]) -> list[Column]:
    """Columns from titles, or (title, detail) pairs."""
    return [Column(*title) if isinstance(title, tuple) else Column(title) for title in titles]


def number(text: str, hover: str = "") -> TableCell:
    return TableCell(text, numeric=True, hover=hover)


def comparison_cells(difference: str, p_value: str, verdict: str, badge: str, method: str):
    """A comparison's difference, its p-value and verdict (both hover with the test's method)."""
    return [
        number(difference),
        number(p_value, method),
        TableCell(verdict, badge=badge, hover=method),
    ]


def group_starts(keys: list[object]) -> list[bool]:
    """A new group wherever the key differs from the row above."""
    return [i == 0 or key != keys[i - 1] for i, key in enumerate(keys)]
