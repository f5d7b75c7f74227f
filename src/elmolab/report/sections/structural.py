"""The structural probe (Hewitt and Manning 2019): UUAS and DSpr per feature mode and encoder
beside the published ELMo numbers, and its block of ``summary.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from elmolab.core.schema import TaskKind
from elmolab.report.data import ReportData
from elmolab.report.format import json_number, mean_std, pct
from elmolab.report.layout import Table, TableCell, columns_of, group_starts, number
from elmolab.report.stats import Cell

KIND = TaskKind.STRUCTURAL  # Hewitt and Manning's probe: UUAS and DSpr, not labels
DSPR_KEY = "test_dspr"  # the structural probe's distance Spearman correlation, test set
# Hewitt and Manning (2019), Table 1: ELMo on the PTB, UUAS of layer 0 and layer 1.
STRUCTURAL_REFERENCE = {"layer0": 0.268, "layer1": 0.770}
STRUCTURAL_CAPTION = (
    "UUAS: undirected unlabelled attachment score of the minimum spanning tree of the probe's "
    "predicted distances; DSpr: Spearman correlation of the predicted with the gold tree "
    "distances. Published ELMo reference (Hewitt and Manning 2019, PTB): layer 0 26.8 UUAS, "
    "layer 1 77.0 UUAS."
)


def correlation(values: np.ndarray) -> str:
    """Mean ± std (over seeds) of a correlation, three decimals; "–" for none."""
    if not len(values):
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


@dataclass(frozen=True)
class StructuralRow:
    features: str
    encoder: str
    uuas: str  # "77.00 ± 0.20"
    dspr: str  # "0.812 ± 0.004"
    reference: str  # the published ELMo UUAS of this layer (trained biLM rows), or ""


def structural_cells(data: ReportData) -> list[Cell]:
    """The cells of the structural probe's tasks (kind structural in grid.tasks)."""
    return [cell for cell in data.cells.values() if data.display.kinds.get(cell.task) == KIND]


def structural_rows(data: ReportData) -> list[StructuralRow]:
    """The structural probe's UUAS and DSpr (test set) per feature mode and encoder."""
    rows = []
    for cell in structural_cells(data):
        features, encoder = cell.features, cell.encoder
        reference = STRUCTURAL_REFERENCE.get(features) if encoder == data.display.main else None
        rows.append(
            StructuralRow(
                features=features,
                encoder=encoder,
                uuas=mean_std(cell),
                dspr=correlation(cell.extra(DSPR_KEY)) if cell.applicable else "n/a",
                reference="" if reference is None else pct(reference),
            )
        )
    return rows


def table(data: ReportData) -> Table | None:
    rows = structural_rows(data)
    if not rows:
        return None
    return Table(
        columns_of("features", "encoder", "UUAS (%)", "DSpr", ("ELMo UUAS", "paper, PTB")),
        [
            [
                TableCell(r.features),
                TableCell(data.display.label(r.encoder)),
                number(r.uuas),
                number(r.dspr),
                number(r.reference),
            ]
            for r in rows
        ],
        group_starts([r.features for r in rows]),
        note=STRUCTURAL_CAPTION,
    )


def _structural_row(cell: Cell) -> dict[str, Any]:
    dspr = cell.extra(DSPR_KEY)  # (runs with it,)
    return {
        "features": cell.features,
        "encoder": cell.encoder,
        "n": cell.n,
        "uuas_mean": json_number(cell.mean),
        "uuas_std": json_number(cell.std),
        "dspr_mean": float(dspr.mean()) if len(dspr) else None,
        "dspr_std": float(dspr.std(ddof=1)) if len(dspr) > 1 else None,
        "dspr": dspr.tolist(),
    }


def summary(data: ReportData) -> dict[str, Any]:
    """The published ELMo UUAS per layer, and UUAS and DSpr per feature mode and encoder."""
    return {
        "reference_uuas": STRUCTURAL_REFERENCE,
        "rows": [_structural_row(cell) for cell in structural_cells(data)],
    }
