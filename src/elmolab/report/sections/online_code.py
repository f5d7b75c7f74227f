"""Online code (Voita and Titov 2020): per task and feature mode, each encoder's compression and
online code length beside its control task's, the findings per task, and the block of
``summary.json`` with every seed's blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.format import fraction_text, json_per_seed, per_seed
from elmolab.report.information import CodeCell
from elmolab.report.layout import Column, Table, TableCell, group_starts, number
from elmolab.report.sections.information_time import measure_time_text

ONLINE_CODE_METHOD = (
    "Online code (Voita and Titov 2020): the training labels sent in blocks that end at {blocks}"
    " of the training sentences, the first block under the uniform code, each later one under a"
    " probe trained on the blocks before it. Compression: uniform code length / online code"
    " length (higher: the features make the labels easier to learn, from less data); mean ± std"
    " over seeds."
)


def online_code_encoders(data: ReportData) -> list[str]:
    return data.display.ordered_encoders({encoder for _, _, encoder in data.online_codes})


def online_code_tasks(data: ReportData) -> list[tuple[str, str | None]]:
    """(task, its control task where that has online codes too) in display order; a control task
    beside its task is not listed on its own."""
    tasks = list(dict.fromkeys(task for task, _, _ in data.online_codes))
    return [
        (task, data.display.control_task(task, tasks))
        for task in tasks
        if data.display.controls.get(task) not in tasks
    ]


@dataclass(frozen=True)
class OnlineCodeRow:
    task: str
    features: str
    control_task: str | None  # the control task whose compression is beside the task's
    compression: list[str]  # per encoder (online_code_encoders): "3.45 ± 0.02"
    kbits: list[str]  # per encoder: the online code length in kbits, "123.4 ± 0.5"
    control: list[str]  # per encoder: the control task's compression on these features, or "–"
    hovers: list[str]  # per encoder: the seeds' compression, and a copy's source encoder


def online_code_rows(data: ReportData) -> list[OnlineCodeRow]:
    """Per task with online codes and feature mode: each encoder's compression and online code
    length, and its control task's compression."""
    encoders = online_code_encoders(data)
    rows = []
    for task, control in online_code_tasks(data):
        for mode in data.display.ordered_features(
            {f for t, f, _ in data.online_codes if t == task}
        ):
            cells = [data.online_codes.get((task, mode, e)) for e in encoders]
            controls = [data.online_codes.get((control or "", mode, e)) for e in encoders]
            rows.append(
                OnlineCodeRow(
                    task=task,
                    features=mode,
                    control_task=control,
                    compression=["–" if c is None else per_seed(c.compression, 2) for c in cells],
                    kbits=[
                        "–" if c is None else per_seed(c.online_bits, 1, scale=1e-3) for c in cells
                    ],
                    control=["–" if c is None else per_seed(c.compression, 2) for c in controls],
                    hovers=[_code_hover(c) for c in cells],
                )
            )
    return rows


def _code_hover(cell: CodeCell | None) -> str:
    if cell is None:
        return ""
    seeds = ", ".join(map(str, cell.seeds))
    text = f"seeds {seeds}: {', '.join(f'{v:.2f}' for v in cell.compression.values)}"
    copied = cell.same_features_as
    return text + (f"; copied from {copied} (identical features)" if copied else "")


def online_code_blocks(data: ReportData) -> str:
    """The blocks' ends as shares of the training sentences ("0.1%, 0.2%, ..., 100%"), or a
    sentence saying that runs differ."""
    fractions = {cell.fractions for cell in data.online_codes.values()}
    if len(fractions) != 1:
        return "per run (summary.json)"
    return ", ".join(fraction_text(x) for x in fractions.pop())


def uniform_codes(data: ReportData) -> str:
    """Per task, its uniform code length: "upos 123.4 kbits (17 labels, 40,000 tokens)"."""
    first: dict[str, CodeCell] = {}
    for (task, _, _), cell in data.online_codes.items():
        first.setdefault(task, cell)
    return "; ".join(
        f"{task} {cell.uniform_bits / 1000:,.1f} kbits ({cell.labels} labels, "
        f"{cell.tokens:,} tokens)"
        for task, cell in first.items()
    )


def findings(data: ReportData) -> list[str]:
    """Per task: the feature mode that compresses best for the main encoder, the baseline
    encoders' compression on it, and its control task's; none where the report draws no
    verdicts."""
    if data.no_verdicts:
        return []
    lines = []
    for task, control in online_code_tasks(data):
        cells = {(f, e): c for (t, f, e), c in data.online_codes.items() if t == task}
        encoders = data.display.ordered_encoders({e for _, e in cells})
        main = data.display.main_of(encoders)
        best = max(
            (c for (_, e), c in cells.items() if e == main), key=lambda c: c.compression.mean
        )
        value = best.compression.mean
        text = (
            f"{task}: with the {data.display.label(main)}, {best.features} compresses the labels"
            f" best ({per_seed(best.compression, 2)})"
        )
        others = [
            cells[best.features, e] for e in encoders if e != main and (best.features, e) in cells
        ]
        if others:
            text += (
                f"; on {best.features}, "
                + " and ".join(
                    f"{data.display.label(c.encoder)} reaches {c.compression.mean:.2f}"
                    for c in others
                )
                + f", so the {data.display.label(main, short=True)} encoder compresses "
                + " and ".join(f"{value / c.compression.mean:.2f}" for c in others)
                + " times as well"
            )
        control_cell = data.online_codes.get((control or "", best.features, main))
        if control_cell is not None:
            relation = "lower than" if control_cell.compression.mean < value else "not lower than"
            text += (
                f"; its control task {control} reaches {control_cell.compression.mean:.2f} there, "
                f"{relation} the task"
            )
        lines.append(text + ".")
    return lines


def table(data: ReportData) -> Table | None:
    rows = online_code_rows(data)
    if not rows:
        return None
    encoders = online_code_encoders(data)
    controlled = any(r.control_task for r in rows)
    columns = [Column("task"), Column("features")]
    for encoder in encoders:
        label = data.display.label(encoder, short=True)
        columns += [Column(label, "compression"), Column(label, "online code, kbits")]
        columns += [Column(label, "control task's compression")] if controlled else []
    cells = []
    for r in rows:
        row = [TableCell(r.task), TableCell(r.features)]
        for e in range(len(encoders)):
            row += [number(r.compression[e], r.hovers[e]), number(r.kbits[e])]
            control = f"control task {r.control_task}" if r.control_task else ""
            row += [number(r.control[e], control)] if controlled else []
        cells.append(row)
    blocks = online_code_blocks(data)
    note = f"Uniform code: {uniform_codes(data)}."
    note += f" Probe time of the online codes: {measure_time_text(data, 'online_code')}."
    return Table(
        columns,
        cells,
        group_starts([r.task for r in rows]),
        note_before=ONLINE_CODE_METHOD.format(blocks=blocks),
        note=note + " Copies (an encoder with identical features) are not counted.",
    )


def summary(data: ReportData) -> dict[str, Any]:
    """Per task, feature mode and encoder: the online codes' compression and length over seeds,
    and every seed's blocks."""
    return {
        "findings": findings(data),
        "cells": [
            {
                "task": cell.task,
                "features": cell.features,
                "encoder": cell.encoder,
                "seeds": cell.seeds,
                "labels": cell.labels,
                "uniform_bits": cell.uniform_bits,
                "compression": json_per_seed(cell.compression),
                "online_bits": json_per_seed(cell.online_bits),
                "wall_seconds": cell.wall_seconds,
                "same_features_as": cell.same_features_as,
                "blocks": [
                    {
                        "seed": code.seed,
                        "fractions": list(code.fractions),
                        "block_tokens": list(code.block_tokens),
                        "block_bits": list(code.block_bits),
                    }
                    for code in cell.codes
                ],
            }
            for cell in data.online_codes.values()
        ],
    }
