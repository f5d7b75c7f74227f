"""Selectivity (Hewitt and Liang 2019): task accuracy minus control-task accuracy of the same
probe on the same features, its table and its block of ``summary.json``."""

from __future__ import annotations

import math
from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.format import json_number, pct
from elmolab.report.layout import Table, TableCell, columns_of, number


def selectivity_rows(data: ReportData) -> list[tuple[str, str, str, str, str, str]]:
    """(task, features, encoder, task accuracy, control accuracy, selectivity ± std (n))."""
    rows = []
    for s in data.selectivity:
        spread = "" if math.isnan(s.std) else f" ± {pct(s.std)}"
        rows.append(
            (
                s.task,
                s.features,
                s.encoder,
                pct(s.task_accuracy),
                pct(s.control_accuracy),
                f"{pct(s.mean)}{spread} ({len(s.values)})",
            )
        )
    return rows


def table(data: ReportData) -> Table | None:
    rows = selectivity_rows(data)
    if not rows:
        return None
    return Table(
        columns_of(
            "task",
            "features",
            "encoder",
            "task accuracy",
            "control accuracy",
            "selectivity ± std (n)",
        ),
        [[*map(TableCell, row[:3]), *map(number, row[3:])] for row in rows],
        [False] * len(rows),
    )


def summary(data: ReportData) -> list[dict[str, Any]]:
    """Per task, feature mode and encoder: both accuracies and the selectivity over seeds."""
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
        }
        for s in data.selectivity
    ]
