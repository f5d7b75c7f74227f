"""Probe learning curves: each encoder's test score by fraction of the task's training sentences,
the trained biLM minus its token layer at each fraction, and their block of ``summary.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.format import (
    family_note,
    fraction_text,
    json_number,
    mean_std,
    significance_mark,
    test_hover,
    test_method,
    with_interval,
)
from elmolab.report.layout import Table, TableCell, columns_of, group_starts, number
from elmolab.report.sections.encoders import comparison_summary
from elmolab.report.stats import EncoderComparison


@dataclass(frozen=True)
class CurveRow:
    task: str
    features: str
    label: str  # the encoder, or "trained − token layer" for the difference row
    values: list[str]  # one per training fraction: "95.21 ± 0.10", or "+1.20 *"
    titles: list[str]  # hover text per value: the test and its p-value, or ""
    difference: bool  # a difference row


def learning_curve_fractions(data: ReportData) -> list[float]:
    return sorted({key[3] for key in data.curve_cells})


def curve_rows(data: ReportData) -> list[CurveRow]:
    """Per task and feature mode with learning curves: each encoder's score at each training
    fraction, then the trained − token layer difference at each fraction, marked * where the
    paired test finds it significant."""
    fractions = learning_curve_fractions(data)
    by_key = {
        (c.task, c.features, c.train_fraction): c
        for c in [*data.curve_comparisons, *data.token_comparisons]
    }
    rows = []
    for task, features in dict.fromkeys(key[:2] for key in data.curve_cells):
        # curve_cells is in display order; an encoder may have curves and no other runs
        encoders = dict.fromkeys(e for t, f, e, _ in data.curve_cells if (t, f) == (task, features))
        for encoder in encoders:
            values = [
                mean_std(data.curve_cells.get((task, features, encoder, x))) for x in fractions
            ]
            rows.append(
                CurveRow(task, features, encoder, values, [""] * len(fractions), difference=False)
            )
        comparisons = [by_key.get((task, features, x)) for x in fractions]
        if any(comparisons):
            first = next(c for c in comparisons if c is not None)
            label = (
                f"{data.display.label(first.encoder, short=True)} − "
                f"{data.display.label(first.baseline, short=True)}"
            )
            rows.append(
                CurveRow(
                    task,
                    features,
                    label,
                    [_marked_difference(c, data) for c in comparisons],
                    ["" if c is None else test_hover(c) for c in comparisons],
                    difference=True,
                )
            )
    return rows


def _marked_difference(comparison: EncoderComparison | None, data: ReportData) -> str:
    if comparison is None:
        return "–"
    mark = significance_mark(comparison.significant(data.significance.alpha), data.no_verdicts)
    return with_interval(comparison) + mark


def table(data: ReportData) -> Table | None:
    rows = curve_rows(data)
    if not rows:
        return None
    fractions = [fraction_text(x) for x in learning_curve_fractions(data)]
    return Table(
        columns_of("task", "features", "encoder", *fractions),
        [
            [
                TableCell(r.task),
                TableCell(r.features),
                TableCell(r.label, italic=True)
                if r.difference
                else TableCell(data.display.label(r.label, short=True)),
                *(number(value, title) for value, title in zip(r.values, r.titles, strict=True)),
            ]
            for r in rows
        ],
        group_starts([(r.task, r.features) for r in rows]),
        note_before="Test score by fraction of the task's training sentences, mean ± std over"
        " runs. Difference rows: trained biLM minus its token layer under random LSTMs, in"
        " points [95% CI]; at 100% the comparison of the encoders' table.",
        note=" ".join(
            [
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(data.curve_comparisons),
            ]
        ),
    )


def summary(data: ReportData) -> dict[str, Any]:
    """Every point of every curve (fractions, like every score here), and the trained biLM
    against its token layer at each training fraction."""
    alpha = data.significance.alpha
    return {
        "points": [
            {
                "task": task,
                "features": mode,
                "encoder": encoder,
                "train_fraction": fraction,
                "n_train_sentences": cell.n_train_sentences,
                "n": cell.n,
                "mean": json_number(cell.mean),
                "std": json_number(cell.std),
                "seeds": cell.seeds,
                "test": cell.test.tolist(),
            }
            for (task, mode, encoder, fraction), cell in data.curve_cells.items()
        ],
        "trained_vs_token_only": [comparison_summary(c, alpha) for c in data.curve_comparisons],
    }
