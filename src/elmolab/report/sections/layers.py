"""What each layer encodes: the layer panel (per task, grouped by family, layer 2 minus layer 1 on
every encoder with its test, the trained biLM's scalar mix and the ELMo paper's numbers), its
findings per family, and its block of ``summary.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from elmolab.core.schema import PaperLayersConfig
from elmolab.report.collect import FAMILY_ORDER, SCALAR_MIX, ordered
from elmolab.report.data import ReportData, baseline_encoders, main_encoder
from elmolab.report.format import (
    NO_VERDICT,
    family_note,
    json_number,
    json_test,
    metric_label,
    p_text,
    pct,
    significance_mark,
    test_hover,
    test_method,
    verdict_cell,
    with_interval,
)
from elmolab.report.layout import Table, TableCell, columns_of, group_starts, number
from elmolab.report.stats import LayerGap, centre_of_gravity

LAYER_METHOD = (
    "Layer 2 minus layer 1 (the two biLSTM layers), test set, in points, paired by seed (WSD"
    " 1-NN has no seed: its test instances only). Mix: the learned scalar mix's weights after"
    " softmax for layers 0 · 1 · 2 (mean over seeds) and their centre of gravity Σ j·s_j"
    " (Tenney et al. 2019; 0 = the token layer), mean ± std over seeds; WSD 1-NN learns no mix."
)


def ordered_families(data: ReportData) -> list[str]:
    """The families of the tasks with results, syntactic and semantic first."""
    return ordered(set(data.families.values()), FAMILY_ORDER)


def panel_tasks(data: ReportData) -> list[tuple[str, str]]:
    """(family, task) of every task with a layer 2 - layer 1 difference, grouped by family in
    ``FAMILY_ORDER``, tasks in display order within a family."""
    compared = {gap.task for gap in data.layer_gaps}
    tasks = [task for task in data.tasks if task in compared]
    return [
        (family, task)
        for family in ordered_families(data)
        for task in tasks
        if data.families[task] == family
    ]


@dataclass(frozen=True)
class MixSummary:
    """A task's learned scalar mix on the main encoder: weights after softmax (mean over seeds)
    and their centre of gravity ``sum_j j s_j`` per seed (Tenney et al. 2019)."""

    weights: np.ndarray  # (layers,)
    gravity: np.ndarray  # (seeds with weights,)


def mix_summary(data: ReportData, task: str) -> MixSummary | None:
    """The main encoder's scalar mix of ``task``; None without learned weights (WSD 1-NN)."""
    cell = data.cells.get((task, SCALAR_MIX, main_encoder(data)))
    if cell is None or cell.mix_weights is None:
        return None
    per_seed = [np.asarray(run.mix_weights) for run in cell.runs if run.mix_weights is not None]
    return MixSummary(cell.mix_weights, np.array([centre_of_gravity(w) for w in per_seed]))


@dataclass(frozen=True)
class PanelRow:
    family: str
    task: str
    metric: str  # display label
    layers: str  # the main encoder's "layer 1 · layer 2" test scores, "95.01 · 94.02"
    difference: str  # layer 2 - layer 1, points, "−0.99 ± 0.30"
    p_value: str
    verdict: str
    verdict_class: str
    method: str
    weights: str  # the mix's weights after softmax, "0.21 · 0.45 · 0.34", or "–"
    gravity: str  # centre of gravity, "1.13 ± 0.05", or "–"
    baselines: list[str]  # per baseline encoder: its layer 2 - layer 1, "+0.12 *", or "–"
    baseline_hovers: list[str]  # per baseline encoder: the test's p-value and method
    paper: str  # the ELMo paper's "97.30 · 96.80 (−0.50)", or ""
    paper_hover: str  # what the paper measured


def _signed_points(value: float, std: float) -> str:
    """A difference in points with its std over seeds where there is one: "−0.99 ± 0.30"."""
    text = pct(value, signed=True)
    return text if math.isnan(std) else f"{text} ± {pct(std)}"


def panel_rows(data: ReportData) -> list[PanelRow]:
    """Per task, grouped by family: the main encoder's layer 2 minus layer 1 with its test, its
    scalar mix's weights and centre of gravity, every baseline encoder's layer 2 minus layer 1,
    and the ELMo paper's numbers where it has them."""
    alpha = data.significance.alpha
    main = main_encoder(data)
    gaps = {(g.task, g.encoder): g for g in data.layer_gaps}
    rows = []
    for family, task in panel_tasks(data):
        gap = gaps.get((task, main))
        mix = mix_summary(data, task)
        others = [gaps.get((task, encoder)) for encoder in baseline_encoders(data)]
        paper = data.paper_layers.get(task)
        verdict, verdict_class = verdict_cell(
            NO_VERDICT if gap is None else gap.verdict(alpha), data.no_verdicts
        )
        rows.append(
            PanelRow(
                family=family,
                task=task,
                metric=metric_label(next(c.metric for k, c in data.cells.items() if k[0] == task)),
                layers="–" if gap is None else f"{pct(gap.lower.mean)} · {pct(gap.upper.mean)}",
                difference="–" if gap is None else with_interval(gap),
                p_value="–" if gap is None else p_text(gap.p_value),
                verdict=verdict,
                verdict_class=verdict_class,
                method="" if gap is None else test_hover(gap),
                weights="–" if mix is None else " · ".join(f"{w:.2f}" for w in mix.weights),
                gravity="–" if mix is None else _gravity_text(mix.gravity),
                baselines=[
                    "–"
                    if g is None
                    else with_interval(g)
                    + significance_mark(g.significant(alpha), data.no_verdicts)
                    for g in others
                ],
                baseline_hovers=["" if g is None else _gap_hover(g) for g in others],
                paper="" if paper is None else _paper_text(paper),
                paper_hover="" if paper is None else paper.measure,
            )
        )
    return rows


def _paper_text(paper: PaperLayersConfig) -> str:
    """The paper's two layers and their difference: "97.30 · 96.80 (−0.50)"."""
    difference = pct(paper.layer2 - paper.layer1, signed=True)
    return f"{pct(paper.layer1)} · {pct(paper.layer2)} ({difference})"


def _gravity_text(values: np.ndarray) -> str:
    """Mean ± std over seeds of centres of gravity, two decimals."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"


def _gap_hover(gap: LayerGap) -> str:
    return f"{with_interval(gap)} points; {test_hover(gap)}"


def family_findings(data: ReportData) -> list[str]:
    """Per family, how many of its tasks favour layer 1 or layer 2 significantly on the main
    encoder, and how many show no significant difference (or cannot be tested); none where the
    report draws no verdicts."""
    if data.no_verdicts:
        return []
    alpha = data.significance.alpha
    main = main_encoder(data)
    gaps = {g.task: g for g in data.layer_gaps if g.encoder == main}
    lines = []
    for family in ordered_families(data):
        tasks = [t for f, t in panel_tasks(data) if f == family and t in gaps]
        if not tasks:
            continue
        lower, upper = (gaps[tasks[0]].lower.features, gaps[tasks[0]].upper.features)
        groups: dict[str, list[str]] = {lower: [], upper: [], "none": [], "untested": []}
        for task in tasks:
            gap = gaps[task]
            key = "untested" if gap.p_value is None else gap.favoured(alpha) or "none"
            groups[key].append(task)

        parts = [
            f"{len(groups[lower])} of {len(tasks)} tasks favour {_layer_name(lower)} "
            f"significantly{_names(groups[lower])}",
            _count(groups[upper], f"favours {_layer_name(upper)}", f"favour {_layer_name(upper)}"),
            _count(
                groups["none"], "shows no significant difference", "show no significant difference"
            ),
        ]
        if groups["untested"]:
            parts.append(_count(groups["untested"], "is not testable", "are not testable"))
        gravity = [m.gravity.mean() for t in tasks if (m := mix_summary(data, t)) is not None]
        text = (
            f"{family.capitalize()} ({data.display.label(main)}, layer 2 − layer 1,"
            f" Holm-adjusted p < {alpha}): "
        )
        text += ", ".join(parts)
        if gravity:
            text += f"; their scalar mixes' centre of gravity averages {np.mean(gravity):.2f}"
        lines.append(text + ".")
    return lines


def _names(tasks: list[str]) -> str:
    return f" ({', '.join(tasks)})" if tasks else ""


def _count(tasks: list[str], singular: str, plural: str) -> str:
    """ "1 favours layer 2 (ner)", "0 show no significant difference"."""
    return f"{len(tasks)} {singular if len(tasks) == 1 else plural}{_names(tasks)}"


def _layer_name(mode: str) -> str:
    """layer1 -> "layer 1"."""
    return mode.replace("layer", "layer ")


def table(data: ReportData) -> Table | None:
    """The layer panel: per task, grouped by family, what layer 2 adds to layer 1 on the trained
    biLM (with its test), where its scalar mix puts its weight, the baseline encoders' layer 2
    minus layer 1, and the ELMo paper's numbers."""
    rows = panel_rows(data)
    if not rows:
        return None
    main = main_encoder(data)
    baselines = baseline_encoders(data)
    columns = columns_of(
        "family",
        "task",
        ("layer 1 · layer 2", data.display.label(main, short=True)),
        ("layer 2 − layer 1", f"{data.display.label(main, short=True)} [95% CI]"),
        ("p", "Holm"),
        "verdict",
        ("mix weights", "layers 0 · 1 · 2"),
        ("centre of gravity", "Σ j·s_j"),
        *(("layer 2 − layer 1", data.display.label(e, short=True)) for e in baselines),
        ("ELMo paper", "layer 1 · layer 2"),
    )
    starts = group_starts([r.family for r in rows])
    cells = [
        [
            TableCell(r.family if start else "", bold=True),  # once per family
            TableCell(r.task, detail=r.metric),
            number(r.layers),
            number(r.difference),
            number(r.p_value, r.method),
            TableCell(r.verdict, badge=r.verdict_class, hover=r.method),
            number(r.weights),
            number(r.gravity),
            *(number(v, h) for v, h in zip(r.baselines, r.baseline_hovers, strict=True)),
            number(r.paper, r.paper_hover),
        ]
        for r, start in zip(rows, starts, strict=True)
    ]
    references = "; ".join(
        f"{task}: {paper.measure}, layer 1 {100 * paper.layer1:.1f},"
        f" layer 2 {100 * paper.layer2:.1f}"
        for task, paper in data.paper_layers.items()
    )
    return Table(
        columns,
        cells,
        starts,
        note_before="What each layer encodes: per task, the second biLSTM layer against the"
        " first (the ELMo paper: syntax is better in layer 1, word sense in layer 2).",
        note=" ".join(
            [
                LAYER_METHOD,
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(data.layer_gaps),
                f"ELMo paper (Peters et al. 2018, the original 5.5B-token model): {references}.",
            ]
        ),
    )


def summary(data: ReportData) -> dict[str, Any]:
    """Per task: its family, layer 2 minus layer 1 of every encoder with its test (fractions,
    like every score here), the main encoder's mix weights and centre of gravity, and the ELMo
    paper's layers; the findings per family."""
    alpha = data.significance.alpha
    tasks = []
    for family, task in panel_tasks(data):
        mix = mix_summary(data, task)
        paper = data.paper_layers.get(task)
        tasks.append(
            {
                "task": task,
                "family": family,
                "encoders": {
                    g.encoder: {
                        "layer1_mean": json_number(g.lower.mean),
                        "layer2_mean": json_number(g.upper.mean),
                        "difference": json_number(g.difference),
                        "difference_std": json_number(g.std),
                        "values": list(g.values),
                        **json_test(g),
                        "significant": g.significant(alpha),
                        "favoured": g.favoured(alpha),
                    }
                    for g in data.layer_gaps
                    if g.task == task
                },
                "mix_weights": None if mix is None else mix.weights.tolist(),
                "centre_of_gravity": None
                if mix is None
                else {
                    "mean": float(mix.gravity.mean()),
                    "std": json_number(
                        float(mix.gravity.std(ddof=1)) if len(mix.gravity) > 1 else None
                    ),
                    "values": mix.gravity.tolist(),
                },
                "paper": None
                if paper is None
                else {"measure": paper.measure, "layer1": paper.layer1, "layer2": paper.layer2},
            }
        )
    return {
        "method": LAYER_METHOD,
        "findings": family_findings(data),
        "tasks": tasks,
    }
