"""Every probe result: the table of test scores per task, feature mode and encoder (the best single
layer in bold), and the ``probes`` and ``training`` blocks of ``summary.json`` (every cell's
numbers, how the trained probe runs stopped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.collect import SCALAR_MIX
from elmolab.report.data import ReportData
from elmolab.report.format import json_number, mean_std
from elmolab.report.layout import Column, Table, TableCell, group_starts
from elmolab.report.stats import Comparison


@dataclass(frozen=True)
class ResultCell:
    text: str  # "95.21 ± 0.10 (3)"
    best_layer: bool  # the best single layer of its task and encoder (chosen on dev)
    not_significant: bool  # a scalar mix not significantly different from that layer


def result_rows(data: ReportData) -> list[tuple[str, str, list[ResultCell]]]:
    """(task, features, one cell per encoder) for every task (control tasks included)."""
    alpha = data.significance.alpha
    by_key: dict[tuple[str, str], Comparison] = {(c.task, c.encoder): c for c in data.comparisons}
    features = data.display.ordered_features({f for _, f, _ in data.cells})
    tasks = list(dict.fromkeys(t for t, _, _ in data.cells))
    rows = []
    for task in tasks:
        for mode in features:
            if not any((task, mode, e) in data.cells for e in data.encoders):
                continue
            cells = []
            for encoder in data.encoders:
                cell = data.cells.get((task, mode, encoder))
                comparison = by_key.get((task, encoder))
                text = mean_std(cell)
                if cell is not None and cell.applicable and cell.n:
                    text += f" ({cell.n})"
                cells.append(
                    ResultCell(
                        text,
                        best_layer=comparison is not None
                        and comparison.best_layer.features == mode,
                        not_significant=mode == SCALAR_MIX
                        and comparison is not None
                        and comparison.significant(alpha) is False
                        and not data.no_verdicts,
                    )
                )
            rows.append((task, mode, cells))
    return rows


def table(data: ReportData) -> Table | None:
    rows = result_rows(data)
    if not rows:
        return None
    return Table(
        [
            Column("task"),
            Column("features"),
            *(Column(data.display.label(e)) for e in data.encoders),
        ],
        [
            [
                TableCell(task),
                TableCell(mode),
                *(
                    TableCell(
                        c.text,
                        numeric=True,
                        bold=c.best_layer,
                        not_significant=c.not_significant,
                    )
                    for c in cells
                ),
            ]
            for task, mode, cells in rows
        ],
        group_starts([task for task, _, _ in rows]),
        note_before="Bold: the task's best single layer (chosen on dev). ≈: the scalar mix is"
        " not significantly different from it"
        f" (p ≥ {data.significance.alpha}). n/a: the mode does not apply (WSD 1-NN trains no"
        " scalar mix).",
    )


def summary(data: ReportData) -> dict[str, dict[str, dict[str, Any]]]:
    """Per task, feature mode and encoder: the cell's mean and std over seeds, every seed's
    numbers, and its scalar mix."""
    probes: dict[str, dict[str, dict[str, Any]]] = {}
    for (task, mode, encoder), cell in data.cells.items():
        probes.setdefault(task, {}).setdefault(mode, {})[encoder] = {
            "metric": cell.metric,
            "applicable": cell.applicable,
            "n": cell.n,
            "mean": json_number(cell.mean),
            "std": json_number(cell.std),
            "seeds": cell.seeds if cell.applicable else [],
            "test": cell.test.tolist(),
            "dev": cell.dev.tolist(),
            "mix_weights": None if cell.mix_weights is None else cell.mix_weights.tolist(),
            "gamma": cell.gamma,
            "n_train_sentences": cell.n_train_sentences,
            "extra": {key: cell.extra(key).tolist() for key in cell.extra_keys},
        }
    return probes


def training_summary(data: ReportData) -> dict[str, Any]:
    """How the trained probe runs stopped: how many, and how many at the epoch cap."""
    runs = [
        run
        for run in [*data.inputs.probes, *data.inputs.conditional, *data.inputs.curves]
        if run.applicable and run.hit_epoch_cap is not None
    ]
    capped = [run for run in runs if run.hit_epoch_cap]
    return {
        "trained_runs": len(runs),
        "hit_epoch_cap": len(capped),
        "hit_epoch_cap_share": len(capped) / len(runs) if runs else None,
        "hit_epoch_cap_by_task": {
            task: sum(run.task == task for run in capped)
            for task in sorted({run.task for run in runs})
        },
    }
