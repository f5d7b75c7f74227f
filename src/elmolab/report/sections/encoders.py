"""The trained biLM against a baseline encoder, per task and feature mode: against its own token
layer under random LSTMs (what pretraining the LSTMs added) and against the random-initialisation
control (what pretraining added at all); their tables, findings and blocks of ``summary.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elmolab.report.collect import Display
from elmolab.report.data import ReportData
from elmolab.report.format import (
    VERDICT_CLASSES,
    family_note,
    json_number,
    json_test,
    mean_std,
    p_text,
    test_hover,
    test_method,
    verdict_cell,
    with_interval,
)
from elmolab.report.layout import (
    Table,
    TableCell,
    columns_of,
    comparison_cells,
    group_starts,
    number,
)
from elmolab.report.stats import EncoderComparison

ENCODER_METHOD = (
    "Trained biLM minus its trained token layer (char CNN, highway, projection) under random"
    " orthogonal LSTMs, pooled over the control's instances, same task and features, test set."
    " On layer0 both encoders have the same features by construction."
)
RANDOM_METHOD = (
    "Trained biLM minus the same network never trained (random initialisation), pooled over"
    " the control's instances, same task and features, test set."
)


def encoder_verdict(comparison: EncoderComparison, data: ReportData) -> tuple[str, str]:
    """(display text, badge class) of an encoder comparison's verdict; "–" where the report draws
    no verdicts."""
    verdict = comparison.verdict(data.significance.alpha)
    if data.no_verdicts:
        return verdict_cell(verdict, data.no_verdicts)
    winner = {"better": comparison.encoder, "worse": comparison.baseline}.get(verdict)
    text = verdict if winner is None else f"{data.display.label(winner, short=True)} better"
    return text, VERDICT_CLASSES[verdict]


@dataclass(frozen=True)
class EncoderRow:
    task: str
    features: str
    value: str  # the main encoder's "95.21 ± 0.10"
    baseline_value: str
    difference: str  # "+0.22", points
    p_value: str
    verdict: str
    verdict_class: str  # good, bad, neutral
    method: str


def token_layer_rows(data: ReportData) -> list[EncoderRow]:
    """Per task and feature mode: the trained biLM against its token layer under random LSTMs,
    on all the training data."""
    return encoder_rows(data, data.token_comparisons)


def random_rows(data: ReportData) -> list[EncoderRow]:
    """Per task and feature mode: the trained biLM against the random-initialisation control."""
    return encoder_rows(data, data.random_comparisons)


def encoder_rows(data: ReportData, comparisons: list[EncoderComparison]) -> list[EncoderRow]:
    """A row per comparison of the trained biLM with a baseline encoder."""
    rows = []
    for c in comparisons:
        verdict, verdict_class = encoder_verdict(c, data)
        rows.append(
            EncoderRow(
                task=c.task,
                features=c.features,
                value=mean_std(c.cell),
                baseline_value=mean_std(c.baseline_cell),
                difference=with_interval(c),
                p_value=p_text(c.p_value),
                verdict=verdict,
                verdict_class=verdict_class,
                method=test_hover(c),
            )
        )
    return rows


def token_finding(data: ReportData) -> list[str]:
    """Where the trained biLM beats its own token layer under random LSTMs, significantly."""
    return _encoder_finding(data, data.token_comparisons, "its token layer with random LSTMs")


def random_finding(data: ReportData) -> list[str]:
    """Where the trained biLM beats the random-initialisation control, significantly."""
    return _encoder_finding(data, data.random_comparisons, "random init")


def _encoder_finding(
    data: ReportData, comparisons: list[EncoderComparison], baseline: str
) -> list[str]:
    """One sentence: the tasks and feature modes where the trained biLM is significantly better
    than, not significantly different from, or worse than a baseline encoder."""
    alpha = data.significance.alpha
    compared: dict[str, list[str]] = {}  # task: its compared feature modes
    groups: dict[str, dict[str, list[str]]] = {}  # verdict: task: feature modes
    for c in comparisons:
        compared.setdefault(c.task, []).append(c.features)
        groups.setdefault(c.verdict(alpha), {}).setdefault(c.task, []).append(c.features)
    names = {
        "better": "significantly better on",
        "no significant difference": "not significant on",
        "worse": "significantly worse on",
        "not testable": "not testable on",
    }

    def where(task: str, modes: list[str]) -> str:
        everywhere = len(modes) > 1 and modes == compared[task]
        return f"{task} ({'all modes' if everywhere else ', '.join(modes)})"

    parts = [
        f"{name} {', '.join(where(task, modes) for task, modes in tasks.items())}"
        for verdict, name in names.items()
        if (tasks := groups.get(verdict))
    ]
    if not parts:
        return []
    return [f"Trained biLM vs {baseline} (Holm-adjusted p < {alpha}): {'; '.join(parts)}."]


def token_layer_table(data: ReportData) -> Table | None:
    return _encoder_table(
        token_layer_rows(data),
        data.display.token_layer,
        data.display,
        "What pretraining the LSTMs added beyond a good token layer: the trained biLM against its"
        " own token layer (char CNN, highway, projection) under random orthogonal LSTMs.",
        " ".join(
            [
                ENCODER_METHOD,
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(data.token_comparisons),
            ]
        ),
    )


def random_table(data: ReportData) -> Table | None:
    """Per task and feature mode: the trained biLM against the random-initialisation control."""
    return _encoder_table(
        random_rows(data),
        data.display.random,
        data.display,
        "What pretraining added at all: the trained biLM against the same network with its"
        " initial random weights.",
        " ".join(
            [
                RANDOM_METHOD,
                test_method(data.significance.alpha, data.significance.bootstrap_samples),
                family_note(data.random_comparisons),
            ]
        ),
    )


def _encoder_table(
    rows: list[EncoderRow],
    baseline: str | None,
    display: Display,
    note_before: str,
    method: str,
) -> Table | None:
    """The trained biLM against a baseline encoder, a row per task and feature mode."""
    if not rows:
        return None
    return Table(
        columns_of(
            "task",
            "features",
            display.label(display.main or ""),
            display.label(baseline or ""),
            ("difference", "points [95% CI]"),
            ("p", "Holm"),
            "verdict",
        ),
        [
            [
                TableCell(r.task),
                TableCell(r.features),
                number(r.value),
                number(r.baseline_value),
                *comparison_cells(r.difference, r.p_value, r.verdict, r.verdict_class, r.method),
            ]
            for r in rows
        ],
        group_starts([r.task for r in rows]),
        note_before=note_before,
        note=f"Test scores in %, mean ± std over seeds. {method}",
    )


def comparison_summary(c: EncoderComparison, alpha: float) -> dict[str, Any]:
    """An encoder comparison's numbers (fractions, like every score here) and its test."""
    return {
        "task": c.task,
        "features": c.features,
        "train_fraction": c.train_fraction,
        "encoder": c.encoder,
        "baseline": c.baseline,
        "encoder_mean": json_number(c.cell.mean),
        "encoder_std": json_number(c.cell.std),
        "baseline_mean": json_number(c.baseline_cell.mean),
        "baseline_std": json_number(c.baseline_cell.std),
        "n": c.cell.n,
        "difference": json_number(c.difference),
        **json_test(c),
        "significant": c.significant(alpha),
        "verdict": c.verdict(alpha),
    }


def token_layer_summary(data: ReportData) -> dict[str, Any]:
    """The trained biLM against its token layer under random LSTMs: the test and each comparison."""
    alpha = data.significance.alpha
    return {
        "method": ENCODER_METHOD,
        "comparisons": [comparison_summary(c, alpha) for c in data.token_comparisons],
    }


def random_summary(data: ReportData) -> dict[str, Any]:
    """The trained biLM against the random-initialisation control: the test and each comparison."""
    alpha = data.significance.alpha
    return {
        "method": RANDOM_METHOD,
        "comparisons": [comparison_summary(c, alpha) for c in data.random_comparisons],
    }
