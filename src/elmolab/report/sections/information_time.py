"""The probe time of the information measures (online codes, conditional probes) per task: the
text the two sections' notes show, and the ``information_time`` block of ``summary.json``."""

from __future__ import annotations

from typing import Any, Literal

from elmolab.report.data import ReportData
from elmolab.report.information import measure_times


def measure_time_text(data: ReportData, measure: Literal["online_code", "conditional"]) -> str:
    """The probe time of ``measure`` (``online_code`` or ``conditional``) per task: "upos 312 s,
    chunk 95 s"."""
    times = measure_times(data.online_codes, data.conditional_cells, data.display)
    return ", ".join(
        f"{t.task} {seconds:,.0f} s" for t in times if (seconds := getattr(t, measure)) is not None
    )


def summary(data: ReportData) -> list[dict[str, Any]]:
    """Per task: the seconds its online codes and its conditional probes took (None: none)."""
    return [
        {
            "task": t.task,
            "online_code_seconds": t.online_code,
            "conditional_seconds": t.conditional,
        }
        for t in measure_times(data.online_codes, data.conditional_cells, data.display)
    ]
