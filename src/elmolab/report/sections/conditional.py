"""Information beyond layer 0 (conditional probing, Hewitt et al. 2021): per task and mode, each
encoder's test bits per token and metric gained over the probe on layer 0 alone, the findings per
task, and the block of ``summary.json`` with the runs' own numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.collect import DEV_BITS, TEST_BITS
from elmolab.report.data import ReportData
from elmolab.report.format import (
    family_note,
    json_per_seed,
    json_tested,
    metric_label,
    p_equals,
    per_seed,
    significance_mark,
    test_hover,
    test_method,
    with_interval,
)
from elmolab.report.information import TestedDifference, conditional_label
from elmolab.report.layout import Column, Table, TableCell, group_starts, number
from elmolab.report.sections.information_time import measure_time_text
from elmolab.report.stats import Cell

CONDITIONAL_METHOD = (
    "Information beyond layer 0 (conditional probing, Hewitt et al. 2021): the test"
    " cross-entropy of the probe on layer 0 minus that of the probe on layer 0 beside the mode,"
    " in bits per token (positive: the mode adds information that layer 0 lacks), and the test"
    " metric of the latter minus the former, in points; paired by seed (a control: by instance"
    ' and seed). Rows "task − control task": the task\'s gain net of the same gain on its'
    " control task, whose labels are random per word type: what the layer adds beyond the"
    " probe's capacity to memorise word types."
)


def _significance(difference: TestedDifference, alpha: float) -> str:
    """The test's outcome in words: "significant, p = 0.002", "not significant, p = 0.412" or
    "untested"."""
    significant = difference.significant(alpha)
    if significant is None:
        return "untested"
    return (
        f"{'' if significant else 'not '}significant, Holm-adjusted {p_equals(difference.p_value)}"
    )


def _marked(difference: TestedDifference, digits: int, scale: float, data: ReportData) -> str:
    """A difference [95% interval], marked * where significant after correction (unmarked where
    the report draws no verdicts)."""
    if not difference.n:
        return "–"
    marked = significance_mark(difference.significant(data.significance.alpha), data.no_verdicts)
    return with_interval(difference, digits, scale) + marked


def conditional_encoders(data: ReportData) -> list[str]:
    return data.display.ordered_encoders({gain.encoder for gain in data.gains})


@dataclass(frozen=True)
class ConditionalRow:
    task: str
    metric: str  # the task's metric, display label
    mode: str  # what the probe reads beside layer 0
    bits: list[str]  # per encoder (conditional_encoders): test bits/token gained, "+0.123 *"
    bits_hovers: list[str]  # per encoder: the dev set's, and the test's p-value and method
    metric_gains: list[str]  # per encoder: test metric gained in points, "+1.20 ± 0.10 *"
    metric_hovers: list[str]  # per encoder: the test's p-value and method


def conditional_rows(data: ReportData) -> list[ConditionalRow]:
    """Per task with conditional probes and mode: each encoder's information beyond layer 0 (test
    bits per token, test metric in points), marked * where significant."""
    encoders = conditional_encoders(data)
    by_key = {(g.task, g.mode, g.encoder): g for g in data.gains}
    rows = []
    for task, mode in dict.fromkeys((g.task, g.mode) for g in data.gains):
        gains = [by_key.get((task, mode, e)) for e in encoders]
        metric = next(g.conditional.metric for g in gains if g is not None)
        rows.append(
            ConditionalRow(
                task=task,
                metric=metric_label(metric),
                mode=mode,
                bits=["–" if g is None else _marked(g.test_bits, 3, 1.0, data) for g in gains],
                bits_hovers=[
                    ""
                    if g is None
                    else f"dev: {per_seed(g.dev_bits, 3, signed=True)} bits/token; "
                    f"test: {test_hover(g.test_bits)}"
                    for g in gains
                ],
                metric_gains=[
                    "–" if g is None else _marked(g.metric, 2, 100.0, data) for g in gains
                ],
                metric_hovers=["" if g is None else test_hover(g.metric) for g in gains],
            )
        )
        if any(n.control_task == task for n in data.net_gains):
            rows.extend(_net_rows(data, task, mode, encoders))
    return rows


def _net_rows(data: ReportData, task: str, mode: str, encoders: list[str]) -> list[ConditionalRow]:
    """After ``task``'s control task's row of ``mode``: ``task``'s gains net of it."""
    nets = {(n.control_task, n.mode, n.encoder): n for n in data.net_gains}
    controls = dict.fromkeys(n.control_task for n in data.net_gains if n.control_task == task)
    rows = []
    for control_task in controls:
        found = [nets.get((control_task, mode, e)) for e in encoders]
        if not any(found):
            continue
        first = next(n for n in found if n is not None)
        rows.append(
            ConditionalRow(
                task=f"{first.task} − {control_task}",
                metric="net of the control task",
                mode=mode,
                bits=["–" if n is None else _marked(n.test_bits, 3, 1.0, data) for n in found],
                bits_hovers=["" if n is None else test_hover(n.test_bits) for n in found],
                metric_gains=[
                    "–" if n is None else _marked(n.metric, 2, 100.0, data) for n in found
                ],
                metric_hovers=["" if n is None else test_hover(n.metric) for n in found],
            )
        )
    return rows


def findings(data: ReportData) -> list[str]:
    """Per task: the mode that adds the most beyond layer 0 for the main encoder (chosen on dev
    where every mode has dev bits), its test gains and their significance, and the baseline
    encoders' gains with that mode; none where the report draws no verdicts."""
    if data.no_verdicts:
        return []
    alpha = data.significance.alpha
    lines = []
    for task in dict.fromkeys(g.task for g in data.gains):
        gains = [g for g in data.gains if g.task == task]
        main = data.display.main_of(data.display.ordered_encoders({g.encoder for g in gains}))
        ours = [g for g in gains if g.encoder == main and g.test_bits.n]
        if not ours:
            continue
        on_dev = all(g.dev_bits.n for g in ours)
        best = max(ours, key=lambda g: g.dev_bits.mean if on_dev else g.test_bits.mean)
        text = (
            f"{task}: for the {data.display.label(main)}, {conditional_label(best.mode)} adds the"
            f" most beyond layer 0{' (chosen on dev)' if on_dev else ''}: "
            f"{per_seed(best.test_bits, 3, signed=True)} bits/token on test "
            f"({_significance(best.test_bits, alpha)})"
        )
        if best.metric.n:
            text += (
                f" and {per_seed(best.metric, 2, 100.0, signed=True)} points of "
                f"{metric_label(best.conditional.metric)} ({_significance(best.metric, alpha)})"
            )
        others = [g for g in gains if g.mode == best.mode and g.encoder != main and g.test_bits.n]
        if others:
            text += "; with the same mode, " + " and ".join(
                f"{data.display.label(g.encoder)} gains {g.test_bits.mean:+.3f} bits/token"
                for g in others
            )
        lines.append(text + ".")
    return lines


def table(data: ReportData) -> Table | None:
    rows = conditional_rows(data)
    if not rows:
        return None
    encoders = conditional_encoders(data)
    columns = [Column("task"), Column("probe reads")]
    for encoder in encoders:
        label = data.display.label(encoder, short=True)
        columns += [Column(label, "bits/token gained"), Column(label, "metric gained, points")]
    cells = [
        [
            TableCell(r.task, detail=r.metric),
            TableCell(conditional_label(r.mode)),
            *(
                cell
                for e in range(len(encoders))
                for cell in (
                    number(r.bits[e], r.bits_hovers[e]),
                    number(r.metric_gains[e], r.metric_hovers[e]),
                )
            ),
        ]
        for r in rows
    ]
    seconds = measure_time_text(data, "conditional")
    return Table(
        columns,
        cells,
        group_starts([r.task for r in rows]),
        note_before=CONDITIONAL_METHOD,
        note=" ".join(
            [
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(
                    [
                        *(g.test_bits for g in data.gains),
                        *(g.metric for g in data.gains),
                        *(n.test_bits for n in data.net_gains),
                        *(n.metric for n in data.net_gains),
                    ]
                ),
                "Dev bits per token gained: in each bits cell's hover text. Probe time of the"
                f" conditional probes: {seconds}.",
            ]
        ),
    )


def summary(data: ReportData) -> dict[str, Any]:
    """Per task, mode and encoder: the information beyond layer 0 (bits per token on test and
    dev; the test metric's difference as a fraction, like every score here) and the runs' own
    numbers."""
    alpha = data.significance.alpha
    return {
        "method": " ".join(
            [CONDITIONAL_METHOD, test_method(alpha, data.significance.bootstrap_samples)]
        ),
        "findings": findings(data),
        "gains": [
            {
                "task": g.task,
                "mode": g.mode,
                "features": g.features,
                "encoder": g.encoder,
                "metric": g.conditional.metric,
                "test_bits_gain": json_tested(g.test_bits, alpha),
                "dev_bits_gain": json_per_seed(g.dev_bits),
                "metric_gain": json_tested(g.metric, alpha),
                "layer0": _bits_runs(g.baseline),
                "conditional": _bits_runs(g.conditional),
            }
            for g in data.gains
        ],
        "net_of_control_task": [
            {
                "task": n.task,
                "control_task": n.control_task,
                "mode": n.mode,
                "encoder": n.encoder,
                "test_bits_gain": json_tested(n.test_bits, alpha),
                "metric_gain": json_tested(n.metric, alpha),
            }
            for n in data.net_gains
        ],
    }


def _bits_runs(cell: Cell) -> dict[str, Any]:
    """A cell's seeds, test metric and bits per token (test, dev; None where a run lacks them)."""
    return {
        "seeds": cell.seeds,
        "test": [run.test for run in cell.runs],
        "test_bits": [run.extra.get(TEST_BITS) for run in cell.runs],
        "dev_bits": [run.extra.get(DEV_BITS) for run in cell.runs],
    }
