"""Selectivity (Hewitt and Liang 2019): task accuracy minus control-task accuracy of the same
probe on the same features, its table and its block of ``summary.json``."""

from __future__ import annotations

from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.format import (
    family_note,
    json_number,
    json_test,
    pct,
    test_hover,
    test_method,
    with_interval,
)
from elmolab.report.layout import Table, TableCell, columns_of, number

SELECTIVITY_METHOD = (
    "Selectivity: the probe's test accuracy on the task minus its accuracy on the control task"
    " (random labels per word type) with the same features, encoder and seed (Hewitt and Liang"
    " 2019): high where the features hold the task, not only the probe's capacity to memorise."
)


def table(data: ReportData) -> Table | None:
    if not data.selectivity:
        return None
    rows = [
        [
            TableCell(s.task),
            TableCell(s.features),
            TableCell(data.display.label(s.encoder, short=True)),
            number(pct(s.task_accuracy)),
            number(pct(s.control_accuracy)),
            number(with_interval(s), test_hover(s)),
            number(str(len(s.values))),
        ]
        for s in data.selectivity
    ]
    return Table(
        columns_of(
            "task",
            "features",
            "encoder",
            "task accuracy",
            "control accuracy",
            ("selectivity", "points [95% CI]"),
            "runs",
        ),
        rows,
        [False] * len(rows),
        note_before=SELECTIVITY_METHOD,
        note=" ".join(
            [
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(data.selectivity),
            ]
        ),
    )


def summary(data: ReportData) -> list[dict[str, Any]]:
    """Per task, feature mode and encoder: both accuracies and the selectivity over runs, with
    its test."""
    return [
        {
            "task": s.task,
            "features": s.features,
            "encoder": s.encoder,
            "task_accuracy": s.task_accuracy,
            "control_accuracy": s.control_accuracy,
            "mean": s.mean,
            "std": json_number(s.std),
            "values": list(s.values),
            "difference": s.difference,
            **json_test(s),
        }
        for s in data.selectivity
    ]
