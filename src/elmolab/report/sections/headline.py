"""The main result: the findings in a few sentences and the headline table (per task, the trained
biLM's best single layer against its scalar mix, every baseline encoder beside them), and their
blocks of ``summary.json`` (the significance test, the comparisons, the baselines without features)
and ``metrics.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.io.results import FIRST_SENSE, MAJORITY_BASELINE
from elmolab.report.collect import SCALAR_MIX
from elmolab.report.data import ReportData, baseline_encoders, main_encoder
from elmolab.report.format import (
    family_note,
    json_number,
    json_test,
    mean_std,
    metric_label,
    p_text,
    pct,
    significance_mark,
    test_hover,
    test_method,
    token_count,
    verdict_cell,
    with_interval,
)
from elmolab.report.layout import Column, Table, TableCell, columns_of, comparison_cells, number
from elmolab.report.sections.encoders import random_finding, token_finding
from elmolab.report.sections.layers import family_findings

SIGNIFICANCE_METHOD = (
    "Scalar mix minus the best single layer (chosen on dev), paired by seed; the trained biLM"
    " minus each control's scalar mix, pooled over the control's instances; test set."
)


# Scores of a baseline that reads no features (elmolab.io.results), shown beside a task's.
TASK_BASELINES = {FIRST_SENSE: "WordNet first sense", MAJORITY_BASELINE: "majority class"}


@dataclass(frozen=True)
class BaselineScores:
    """A baseline encoder's numbers beside the main encoder's in the headline."""

    encoder: str
    mix: str  # the baseline's scalar mix, mean ± std over its runs
    gain: str  # the main encoder's scalar mix minus the baseline's [95% CI], points, marked
    hover: str  # the gain's test


@dataclass(frozen=True)
class HeadlineRow:
    task: str
    metric: str
    best_layer: str  # "layer1"
    best_value: str  # "95.21 ± 0.10"
    mix_value: str
    difference: str  # "+0.22"
    p_value: str
    verdict: str
    verdict_class: str  # good, bad, neutral
    method: str
    baselines: list[BaselineScores]  # one per baseline encoder, in display order
    # Baselines without features on the same test set: "WordNet first sense 65.32", or "".
    no_features: str = ""


def headline_rows(data: ReportData) -> list[HeadlineRow]:
    """Per task: the best single layer against the scalar mix, for the main encoder; every
    baseline encoder's numbers beside them."""
    main = main_encoder(data)
    by_key = {(c.task, c.encoder): c for c in data.comparisons}
    mixes = {
        (c.task, c.baseline): c
        for c in [*data.random_comparisons, *data.token_comparisons]
        if c.features == SCALAR_MIX
    }
    rows = []
    for task in data.tasks:
        comparison = by_key.get((task, main))
        if comparison is None:
            continue
        verdict, verdict_class = verdict_cell(
            comparison.verdict(data.significance.alpha), data.no_verdicts
        )
        baselines = []
        for encoder in baseline_encoders(data):
            versus = mixes.get((task, encoder))
            gain, hover = "–", ""
            if versus is not None:
                mark = significance_mark(
                    versus.significant(data.significance.alpha), data.no_verdicts
                )
                gain, hover = with_interval(versus) + mark, test_hover(versus)
            baselines.append(
                BaselineScores(
                    encoder, mean_std(data.cells.get((task, SCALAR_MIX, encoder))), gain, hover
                )
            )
        rows.append(
            HeadlineRow(
                task=task,
                metric=metric_label(comparison.best_layer.metric),
                best_layer=comparison.best_layer.features,
                best_value=mean_std(comparison.best_layer),
                mix_value=mean_std(data.cells.get((task, SCALAR_MIX, main))),
                difference=with_interval(comparison) if comparison.mix is not None else "–",
                p_value=p_text(comparison.p_value),
                verdict=verdict,
                verdict_class=verdict_class,
                method=test_hover(comparison),
                baselines=baselines,
                no_features="; ".join(
                    f"{name} {pct(value)}" for name, value in task_baselines(data, task)
                ),
            )
        )
    return rows


def task_baselines(data: ReportData, task: str) -> list[tuple[str, float]]:
    """(name, test score) of each baseline without features the task's runs record."""
    cells = [c for (t, _, _), c in data.cells.items() if t == task]
    found = []
    for key, name in TASK_BASELINES.items():
        values = next((v for c in cells if len(v := c.extra(f"test_{key}"))), None)
        if values is not None:
            found.append((name, float(values.mean())))
    return found


def findings(data: ReportData) -> list[str]:
    """The main result in a few sentences: the probing comparisons first, pretraining last; where
    the report draws no verdicts (``data.no_verdicts``), why not instead of the comparisons."""
    if data.no_verdicts:
        return [data.no_verdicts, *_pretraining_finding(data)]
    lines = []
    rows = headline_rows(data)
    main = main_encoder(data)
    tested = [r for r in rows if r.verdict not in ("n/a", "not testable")]
    if tested:
        groups = {
            verdict: [r.task for r in tested if r.verdict == verdict]
            for verdict in ("mix better", "best layer better", "no significant difference")
        }
        parts = [f"{v} on {', '.join(t)}" for v, t in groups.items() if t]
        lines.append(
            f"Scalar mix vs best single layer ({main} biLM, Holm-adjusted p <"
            f" {data.significance.alpha}): "
            f"{'; '.join(parts)}."
        )
    lines += random_finding(data)
    lines += token_finding(data)
    if rows:
        lines.append(
            "Best single layer (chosen on dev): "
            + ", ".join(f"{r.task} {r.best_layer}" for r in rows)
            + "."
        )
    lines += family_findings(data)
    for task in dict.fromkeys(s.task for s in data.selectivity):
        ours = [s for s in data.selectivity if s.task == task and s.encoder == main]
        if ours:
            top = max(ours, key=lambda s: s.mean)
            lines.append(
                f"Selectivity ({task} minus its control task): highest with {top.features} "
                f"({pct(top.mean)} points)."
            )
    return lines + _pretraining_finding(data)


def _pretraining_finding(data: ReportData) -> list[str]:
    """The trained biLM's perplexities beside the unigram model's and the untrained network's, in
    a sentence; none before pretraining has run."""
    trained = data.inputs.trained
    if trained is None:
        return []
    val = trained.metrics["val"]
    text = (
        f"Pretraining: validation perplexity {val['ppl']:,.1f} (forward {val['ppl_fwd']:,.1f}, "
        f"backward {val['ppl_bwd']:,.1f})"
    )
    if "tokens" in trained.metrics:
        text += f" after {token_count(trained.metrics['tokens'])} training tokens"
    unigram = trained.metrics.get("unigram_ppl", {}).get("valid")
    if unigram is not None:
        text += f"; a unigram model gets {unigram:,.0f}"
    if data.inputs.random is not None:
        text += f", the untrained network {data.inputs.random.metrics['val']['ppl']:,.0f}"
    return [text + "."]


def table(data: ReportData) -> Table | None:
    """Main result: per task, the trained biLM's best single layer against its scalar mix, and
    every baseline encoder's best layer and mix beside them."""
    rows = headline_rows(data)
    if not rows:
        return None
    columns = columns_of(
        "task",
        ("best single layer", "trained, chosen on dev"),
        "its score",
        ("scalar mix", "trained"),
        ("mix − layer", "[95% CI]"),
        ("p", "Holm"),
        "verdict",
    )
    for b in rows[0].baselines:
        label = data.display.label(b.encoder, short=True)
        columns += [
            Column(f"{label} encoder", "scalar mix"),
            Column(f"trained − {label}", "scalar mixes [95% CI]"),
        ]
    no_features = any(r.no_features for r in rows)
    if no_features:
        columns.append(Column("baseline without features", "same test set"))
    cells = [
        [
            TableCell(r.task, bold=True, detail=r.metric),
            TableCell(r.best_layer),
            number(r.best_value),
            number(r.mix_value),
            *comparison_cells(r.difference, r.p_value, r.verdict, r.verdict_class, r.method),
            *(cell for b in r.baselines for cell in (number(b.mix), number(b.gain, b.hover))),
            *([number(r.no_features)] if no_features else []),
        ]
        for r in rows
    ]
    method = " ".join(
        [
            SIGNIFICANCE_METHOD,
            test_method(data.significance.alpha, data.significance.bootstrap_samples),
            family_note([*data.comparisons, *data.random_comparisons, *data.token_comparisons]),
        ]
    )
    note = f"Test scores in %, mean ± std over runs. {method}"
    return Table(columns, cells, [False] * len(cells), note=note)


def metrics_json(data: ReportData) -> dict[str, Any]:
    """``metrics.json``: the numbers to compare across experiments (``dvc exp show``), numeric
    only: validation perplexity, and per task and encoder the best single layer (its index and
    test score), the scalar mix's test score, their difference and its p-value."""
    metrics: dict[str, Any] = {}
    if data.inputs.trained is not None:
        val = data.inputs.trained.metrics["val"]
        metrics["pretraining"] = {f"val_{key}": val[key] for key in ("ppl", "ppl_fwd", "ppl_bwd")}
    for c in data.comparisons:
        metrics.setdefault(c.task, {})[c.encoder] = {
            "best_layer": int(c.best_layer.features.removeprefix("layer")),
            "best_layer_test": json_number(c.best_layer.mean),
            "scalar_mix_test": None if c.mix is None else json_number(c.mix.mean),
            "mix_minus_layer": json_number(c.difference),
            "p_value": c.p_value,
        }
    return metrics


def significance_summary(data: ReportData) -> dict[str, Any]:
    """The test of the scalar mix against the best single layer: its level and method."""
    alpha = data.significance.alpha
    return {
        "alpha": alpha,
        "bootstrap_samples": data.significance.bootstrap_samples,
        "method": " ".join(
            [SIGNIFICANCE_METHOD, test_method(alpha, data.significance.bootstrap_samples)]
        ),
    }


def comparisons_summary(data: ReportData) -> list[dict[str, Any]]:
    """Per task and encoder: the best single layer against the scalar mix, with its test."""
    alpha = data.significance.alpha
    return [
        {
            "task": c.task,
            "encoder": c.encoder,
            "best_layer": c.best_layer.features,
            "best_layer_mean": json_number(c.best_layer.mean),
            "mix_mean": None if c.mix is None else json_number(c.mix.mean),
            "difference": json_number(c.difference),
            **json_test(c),
            "significant": c.significant(alpha),
            "verdict": c.verdict(alpha),
        }
        for c in data.comparisons
    ]


def baselines_summary(data: ReportData) -> dict[str, dict[str, float]]:
    """Per task: the test score of each baseline without features its runs record."""
    return {
        task: {name: value for name, value in found}
        for task in data.tasks
        if (found := task_baselines(data, task))
    }
