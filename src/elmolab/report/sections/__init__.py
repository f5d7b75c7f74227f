"""The report's sections, one module each: a section computes its rows from
:class:`~elmolab.report.data.ReportData`, lays them out as a :class:`~elmolab.report.layout.Table`
and writes its block of ``summary.json``. Here they come together: :class:`Sections`, what the HTML
and the Markdown template both render, and :func:`summary_json`, every number of the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.layout import Table
from elmolab.report.sections import (
    claims,
    conditional,
    encoders,
    headline,
    information_time,
    layers,
    learning_curves,
    online_code,
    polysemy,
    pretraining,
    results,
    selectivity,
    structural,
    task_model,
)

ONLINE_CODE_OFF = (
    "The online code (minimum description length, Voita and Titov 2020) is off in this study:"
    " `make run EXPERIMENT=information` turns it on for every token task (it about doubles those"
    " cells' probe time)."
)
QUICK_LOOK = (
    "A quick look, not a study (report.quick_look): a few minutes of training on a slice of the"
    " data, to show that every stage runs. Its numbers say nothing about what ELMo learns."
)


@dataclass(frozen=True)
class Sections:
    """The banner, the main result's findings and every table of the report (None: a section
    without results yet): what index.html and summary.md both render."""

    banner: str | None  # above everything: what kind of run this is (None: a study)
    claims: Table | None  # the study's claims, tested: the first table
    findings: list[str]
    headline: Table | None
    layers: Table | None
    layer_findings: list[str]  # a sentence per task family
    task_model: Table | None
    pretraining: Table
    random: Table | None
    token_layer: Table | None
    curves: Table | None
    structural: Table | None
    selectivity: Table | None
    results: Table | None
    online_code: Table | None
    online_code_findings: list[str]  # a sentence per task
    online_code_off: str | None  # how to turn the online code on, where the study has none
    conditional: Table | None
    conditional_findings: list[str]  # a sentence per task

    @classmethod
    def of(cls, data: ReportData) -> Sections:
        return cls(
            banner=QUICK_LOOK if data.quick_look else None,
            claims=claims.table(data),
            findings=headline.findings(data),
            headline=headline.table(data),
            layers=layers.table(data),
            layer_findings=layers.family_findings(data),
            task_model=task_model.table(data),
            pretraining=pretraining.table(data),
            random=encoders.random_table(data),
            token_layer=encoders.token_layer_table(data),
            curves=learning_curves.table(data),
            structural=structural.table(data),
            selectivity=selectivity.table(data),
            results=results.table(data),
            online_code=online_code.table(data),
            online_code_findings=online_code.findings(data),
            online_code_off=ONLINE_CODE_OFF if data.cells and not data.online_codes else None,
            conditional=conditional.table(data),
            conditional_findings=conditional.findings(data),
        )


def summary_json(data: ReportData) -> dict[str, Any]:
    """Every number of the report, machine-readable (scores as fractions, not percent)."""
    return {
        "title": data.title,
        "code_version": {"commit": data.version.commit, "dirty": data.version.dirty},
        "quick_look": data.quick_look,
        "no_verdicts": data.no_verdicts,
        "missing": data.inputs.missing,
        "claims": claims.summary(data),
        "pretraining": pretraining.summary(data),
        "probes": results.summary(data),
        "taskmodel": task_model.summary(data),
        "training": results.training_summary(data),
        "significance": headline.significance_summary(data),
        "comparisons": headline.comparisons_summary(data),
        "trained_vs_random": encoders.random_summary(data),
        "trained_vs_token_only": encoders.token_layer_summary(data),
        "learning_curves": learning_curves.summary(data),
        "structural_probe": structural.summary(data),
        "selectivity": selectivity.summary(data),
        "layer_panel": layers.summary(data),
        "baselines_without_features": headline.baselines_summary(data),
        "online_code": online_code.summary(data),
        "conditional_probing": conditional.summary(data),
        "information_time": information_time.summary(data),
        "polysemy": polysemy.summary(data),
    }
