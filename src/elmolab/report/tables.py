"""The report's tables and key findings as display-ready strings, shared by HTML and Markdown.

Scores are percentages with two decimals; "mean ± std" is over seeds (sample std).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from elmolab.io.results import FIRST_SENSE, MAJORITY_BASELINE
from elmolab.report.collect import (
    CONTROL_SUFFIX,
    FAMILY_ORDER,
    SCALAR_MIX,
    STRUCTURAL_TASK,
    Display,
    ordered,
)
from elmolab.report.data import ReportData
from elmolab.report.information import (
    CodeCell,
    PerSeed,
    TestedDifference,
    conditional_label,
    measure_times,
)
from elmolab.report.stats import (
    Cell,
    Comparison,
    EncoderComparison,
    LayerGap,
    centre_of_gravity,
)

# The ELMo paper's layer 1 and layer 2 on the tasks it probed per layer (Peters et al. 2018,
# Tables 5 and 6): the reference beside the layer panel.
PAPER_LAYERS = {  # task: (what the paper measured, layer 1, layer 2)
    "upos": ("POS, linear probe, accuracy", 0.973, 0.968),
    "wsd": ("WSD, 1-NN, F1", 0.674, 0.690),
}
# Scores of a baseline that reads no features (elmolab.io.results), shown beside a task's.
TASK_BASELINES = {FIRST_SENSE: "WordNet first sense", MAJORITY_BASELINE: "majority class"}
# A difference's mark by its significance (None: not testable).
SIGNIFICANCE_MARKS = {True: " *", False: "", None: " (untested)"}
VERDICT_CLASSES = {
    "mix better": "good",
    "best layer better": "bad",
    "better": "good",  # an encoder comparison: the main encoder better than the baseline
    "worse": "bad",
    "no significant difference": "neutral",
    "not testable": "neutral",
    "layer1 better": "lower",  # the layer panel: the first biLSTM layer significantly better
    "layer2 better": "upper",
    "n/a": "neutral",
}
DSPR_KEY = "test_dspr"  # the structural probe's distance Spearman correlation, test set
# Hewitt and Manning (2019), Table 1: ELMo on the PTB, UUAS of layer 0 and layer 1.
STRUCTURAL_REFERENCE = {"layer0": 0.268, "layer1": 0.770}
STRUCTURAL_CAPTION = (
    "UUAS: undirected unlabelled attachment score of the minimum spanning tree of the probe's "
    "predicted distances; DSpr: Spearman correlation of the predicted with the gold tree "
    "distances. Published ELMo reference (Hewitt and Manning 2019, PTB): layer 0 26.8 UUAS, "
    "layer 1 77.0 UUAS."
)


def pct(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"


def p_text(p_value: float | None) -> str:
    if p_value is None:
        return "–"
    return "< 0.001" if p_value < 0.001 else f"{p_value:.3f}"


def p_equals(p_value: float | None) -> str:
    """The p-value as "p = 0.012" or "p < 0.001"."""
    text = p_text(p_value)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def mean_std(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    if not cell.applicable:
        return "n/a"
    if cell.n == 0:
        return "–"
    return pct(cell.mean) if cell.n == 1 else f"{pct(cell.mean)} ± {pct(cell.std)}"


METRIC_LABELS = {
    "accuracy": "accuracy",
    "span_f1": "span F1",
    "f1": "F1",
    "uas": "UAS (attachment accuracy)",
    "uuas": "UUAS (undirected attachment)",
}


def metric_label(metric: str | None) -> str:
    return METRIC_LABELS.get(metric or "", metric or "")


def fraction_text(fraction: float) -> str:
    """0.01 -> "1%"."""
    return f"{100 * fraction:g}%"


def correlation(values: np.ndarray) -> str:
    """Mean ± std (over seeds) of a correlation, three decimals; "–" for none."""
    if not len(values):
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


@dataclass(frozen=True)
class BaselineScores:
    """A baseline encoder's numbers beside the main encoder's in the headline."""

    encoder: str
    best: str  # "layer0 80.12" or "–"
    mix: str
    gain: str  # main encoder's best layer minus the baseline's best layer, points


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


def headline(data: ReportData) -> list[HeadlineRow]:
    """Per task: the best single layer against the scalar mix, for the main encoder; every
    baseline encoder's numbers beside them."""
    main = main_encoder(data)
    by_key = {(c.task, c.encoder): c for c in data.comparisons}
    rows = []
    for task in data.tasks:
        comparison = by_key.get((task, main))
        if comparison is None:
            continue
        verdict = comparison.verdict(data.significance.alpha)
        baselines = []
        for encoder in baseline_encoders(data):
            control = by_key.get((task, encoder))
            if control is None:
                baselines.append(BaselineScores(encoder, "–", "–", "–"))
                continue
            baselines.append(
                BaselineScores(
                    encoder,
                    best=f"{control.best_layer.features} {pct(control.best_layer.mean)}",
                    mix="–" if control.mix is None else pct(control.mix.mean),
                    gain=pct(comparison.best_layer.mean - control.best_layer.mean, signed=True),
                )
            )
        rows.append(
            HeadlineRow(
                task=task,
                metric=metric_label(comparison.best_layer.metric),
                best_layer=comparison.best_layer.features,
                best_value=mean_std(comparison.best_layer),
                mix_value=mean_std(data.cells.get((task, SCALAR_MIX, main))),
                difference=pct(comparison.difference, signed=True),
                p_value=p_text(comparison.p_value),
                verdict=verdict,
                verdict_class=VERDICT_CLASSES[verdict],
                method=comparison.method,
                baselines=baselines,
                no_features="; ".join(
                    f"{name} {pct(value)}" for name, value in task_baselines(data, task)
                ),
            )
        )
    return rows


def main_encoder(data: ReportData) -> str:
    """The main encoder (``report.encoders.main``) if it has results, else the first that has."""
    encoders = data.encoders
    return data.display.main_of(encoders) if encoders else data.display.main or ""


def baseline_encoders(data: ReportData) -> list[str]:
    """Every encoder but the main one, in display order."""
    main = main_encoder(data)
    return [encoder for encoder in data.encoders if encoder != main]


def encoder_verdict(
    comparison: EncoderComparison, alpha: float, display: Display
) -> tuple[str, str]:
    """(display text, badge class) of an encoder comparison's verdict."""
    verdict = comparison.verdict(alpha)
    winner = {"better": comparison.encoder, "worse": comparison.baseline}.get(verdict)
    text = verdict if winner is None else f"{display.label(winner, short=True)} better"
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


def trained_vs_token_layer(data: ReportData) -> list[EncoderRow]:
    """Per task and feature mode: the trained biLM against its token layer under random LSTMs,
    on all the training data."""
    return encoder_rows(data, data.token_comparisons)


def trained_vs_random(data: ReportData) -> list[EncoderRow]:
    """Per task and feature mode: the trained biLM against the random-initialisation control."""
    return encoder_rows(data, data.random_comparisons)


def encoder_rows(data: ReportData, comparisons: list[EncoderComparison]) -> list[EncoderRow]:
    """A row per comparison of the trained biLM with a baseline encoder."""
    alpha = data.significance.alpha
    rows = []
    for c in comparisons:
        verdict, verdict_class = encoder_verdict(c, alpha, data.display)
        rows.append(
            EncoderRow(
                task=c.task,
                features=c.features,
                value=mean_std(c.cell),
                baseline_value=mean_std(c.baseline_cell),
                difference=pct(c.difference, signed=True),
                p_value=p_text(c.p_value),
                verdict=verdict,
                verdict_class=verdict_class,
                method=c.method,
            )
        )
    return rows


def _token_finding(data: ReportData) -> list[str]:
    """Where the trained biLM beats its own token layer under random LSTMs, significantly."""
    return _encoder_finding(data, data.token_comparisons, "its token layer with random LSTMs")


def _random_finding(data: ReportData) -> list[str]:
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
    return [f"Trained biLM vs {baseline} (p < {alpha}): {'; '.join(parts)}."]


@dataclass(frozen=True)
class CurveRow:
    task: str
    features: str
    label: str  # the encoder, or "trained − token layer" for the difference row
    values: list[str]  # one per training fraction: "95.21 ± 0.10", or "+1.20 *"
    titles: list[str]  # hover text per value: the test and its p-value, or ""
    difference: bool  # a difference row


def learning_curve_fractions(data: ReportData) -> list[float]:
    return sorted({key[3] for key in data.curve_cells})


def learning_curve_table(data: ReportData) -> list[CurveRow]:
    """Per task and feature mode with learning curves: each encoder's score at each training
    fraction, then the trained − token layer difference at each fraction, marked * where the
    paired test finds it significant."""
    alpha = data.significance.alpha
    fractions = learning_curve_fractions(data)
    by_key = {(c.task, c.features, c.train_fraction): c for c in data.curve_comparisons}
    rows = []
    for task, features in dict.fromkeys(key[:2] for key in data.curve_cells):
        # curve_cells is in display order; an encoder may have curves and no other runs
        encoders = dict.fromkeys(e for t, f, e, _ in data.curve_cells if (t, f) == (task, features))
        for encoder in encoders:
            values = [
                mean_std(data.curve_cells.get((task, features, encoder, x))) for x in fractions
            ]
            rows.append(
                CurveRow(task, features, encoder, values, [""] * len(fractions), difference=False)
            )
        comparisons = [by_key.get((task, features, x)) for x in fractions]
        if any(comparisons):
            first = next(c for c in comparisons if c is not None)
            label = (
                f"{data.display.label(first.encoder, short=True)} − "
                f"{data.display.label(first.baseline, short=True)}"
            )
            rows.append(
                CurveRow(
                    task,
                    features,
                    label,
                    [_marked_difference(c, alpha) for c in comparisons],
                    [
                        "" if c is None else f"{p_equals(c.p_value)}; {c.method}"
                        for c in comparisons
                    ],
                    difference=True,
                )
            )
    return rows


def _marked_difference(comparison: EncoderComparison | None, alpha: float) -> str:
    if comparison is None:
        return "–"
    mark = SIGNIFICANCE_MARKS[comparison.significant(alpha)]
    return pct(comparison.difference, signed=True) + mark


@dataclass(frozen=True)
class StructuralRow:
    features: str
    encoder: str
    uuas: str  # "77.00 ± 0.20"
    dspr: str  # "0.812 ± 0.004"
    reference: str  # the published ELMo UUAS of this layer (trained biLM rows), or ""


def structural_table(data: ReportData) -> list[StructuralRow]:
    """The structural probe's UUAS and DSpr (test set) per feature mode and encoder."""
    rows = []
    for (task, features, encoder), cell in data.cells.items():
        if task != STRUCTURAL_TASK:
            continue
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


# --- information measures (report.information) --------------------------------------------------


def per_seed(values: PerSeed, digits: int, scale: float = 1.0, signed: bool = False) -> str:
    """Mean ± std over seeds of ``scale`` times ``values``, ``digits`` decimals; "–" for none."""
    if not values.n:
        return "–"
    mean = f"{scale * values.mean:{'+z' if signed else 'z'}.{digits}f}"  # z: no "-0.00"
    return mean if values.n == 1 else f"{mean} ± {scale * values.std:.{digits}f}"


def _significance(difference: TestedDifference, alpha: float) -> str:
    """The test's outcome in words: "significant, p = 0.002", "not significant, p = 0.412" or
    "untested"."""
    significant = difference.significant(alpha)
    if significant is None:
        return "untested"
    return f"{'' if significant else 'not '}significant, {p_equals(difference.p_value)}"


def _test_text(difference: TestedDifference) -> str:
    """A test's p-value and method, for hover text."""
    if difference.p_value is None:
        return difference.method
    return f"{p_equals(difference.p_value)}; {difference.method}"


def _marked(difference: TestedDifference, digits: int, scale: float, alpha: float) -> str:
    """A difference's mean ± std, marked * where significant."""
    if not difference.n:
        return "–"
    marked = SIGNIFICANCE_MARKS[difference.significant(alpha)]
    return per_seed(difference, digits, scale, signed=True) + marked


def online_code_encoders(data: ReportData) -> list[str]:
    return data.display.ordered_encoders({encoder for _, _, encoder in data.online_codes})


def online_code_tasks(data: ReportData) -> list[tuple[str, str | None]]:
    """(task, its control task where that has online codes too) in display order; a control task
    beside its task is not listed on its own."""
    tasks = list(dict.fromkeys(task for task, _, _ in data.online_codes))
    return [
        (task, task + CONTROL_SUFFIX if task + CONTROL_SUFFIX in tasks else None)
        for task in tasks
        if task.removesuffix(CONTROL_SUFFIX) == task
        or task.removesuffix(CONTROL_SUFFIX) not in tasks
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


def online_code_table(data: ReportData) -> list[OnlineCodeRow]:
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


def online_code_findings(data: ReportData) -> list[str]:
    """Per task: the feature mode that compresses best for the main encoder, the baseline
    encoders' compression on it, and its control task's."""
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


def conditional_table(data: ReportData) -> list[ConditionalRow]:
    """Per task with conditional probes and mode: each encoder's information beyond layer 0 (test
    bits per token, test metric in points), marked * where significant."""
    alpha = data.significance.alpha
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
                bits=["–" if g is None else _marked(g.test_bits, 3, 1.0, alpha) for g in gains],
                bits_hovers=[
                    ""
                    if g is None
                    else f"dev: {per_seed(g.dev_bits, 3, signed=True)} bits/token; "
                    f"test: {_test_text(g.test_bits)}"
                    for g in gains
                ],
                metric_gains=[
                    "–" if g is None else _marked(g.metric, 2, 100.0, alpha) for g in gains
                ],
                metric_hovers=["" if g is None else _test_text(g.metric) for g in gains],
            )
        )
    return rows


def conditional_findings(data: ReportData) -> list[str]:
    """Per task: the mode that adds the most beyond layer 0 for the main encoder (chosen on dev
    where every mode has dev bits), its test gains and their significance, and the baseline
    encoders' gains with that mode."""
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


def measure_time_text(data: ReportData, measure: Literal["online_code", "conditional"]) -> str:
    """The probe time of ``measure`` (``online_code`` or ``conditional``) per task: "upos 312 s,
    chunk 95 s"."""
    times = measure_times(data.online_codes, data.conditional_cells, data.display)
    return ", ".join(
        f"{t.task} {seconds:,.0f} s" for t in times if (seconds := getattr(t, measure)) is not None
    )


@dataclass(frozen=True)
class ResultCell:
    text: str  # "95.21 ± 0.10 (3)"
    best_layer: bool  # the best single layer of its task and encoder (chosen on dev)
    not_significant: bool  # a scalar mix not significantly different from that layer


def results_table(data: ReportData) -> list[tuple[str, str, list[ResultCell]]]:
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
                        and comparison.significant(alpha) is False,
                    )
                )
            rows.append((task, mode, cells))
    return rows


# (quantity, dotted keys into metrics.json, decimals, shown for the random control too)
PRETRAINING_ROWS = (
    ("validation perplexity, mean of both directions", ("val.ppl",), 1, True),
    ("validation perplexity, forward / backward", ("val.ppl_fwd", "val.ppl_bwd"), 1, True),
    (
        "validation perplexity, stateless (every sentence from zero, as extracted): fwd / bwd",
        ("val.stateless_ppl_fwd", "val.stateless_ppl_bwd"),
        1,
        True,
    ),
    ("test perplexity, mean of both directions", ("test.ppl",), 1, True),
    ("test perplexity, forward / backward", ("test.ppl_fwd", "test.ppl_bwd"), 1, True),
    ("unigram perplexity, validation / test", ("unigram_ppl.valid", "unigram_ppl.test"), 1, False),
    (
        "parameters: char CNN / LSTMs / softmax",
        ("parameters.char_cnn", "parameters.lstm", "parameters.softmax"),
        0,
        True,
    ),
    ("training steps / tokens", ("steps", "tokens"), 0, False),
    ("training time (s) / tokens per second", ("wall_seconds", "tokens_per_second"), 0, False),
    ("precision (trainer.precision: auto chooses by hardware)", ("precision.chosen",), 0, False),
)


def pretraining_table(data: ReportData) -> list[tuple[str, str, str]]:
    """(quantity, trained biLM, random-initialisation control)."""
    trained = data.inputs.trained.metrics if data.inputs.trained else {}
    random = data.inputs.random.metrics if data.inputs.random else {}
    return [
        (label, _numbers(trained, keys, digits), _numbers(random, keys, digits) if both else "")
        for label, keys, digits, both in PRETRAINING_ROWS
    ]


def _numbers(metrics: dict[str, Any], keys: tuple[str, ...], digits: int) -> str:
    texts = []
    for key in keys:
        value: Any = metrics
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            texts.append("–")
        elif isinstance(value, str):
            texts.append(value)
        else:
            texts.append(f"{value:,.{digits}f}")
    return " / ".join(texts)


def selectivity_table(data: ReportData) -> list[tuple[str, str, str, str, str, str]]:
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


def findings(data: ReportData) -> list[str]:
    """The main result in a few sentences: the probing comparisons first, pretraining last."""
    lines = []
    rows = headline(data)
    main = main_encoder(data)
    tested = [r for r in rows if r.verdict not in ("n/a", "not testable")]
    if tested:
        groups = {
            verdict: [r.task for r in tested if r.verdict == verdict]
            for verdict in ("mix better", "best layer better", "no significant difference")
        }
        parts = [f"{v} on {', '.join(t)}" for v, t in groups.items() if t]
        lines.append(
            f"Scalar mix vs best single layer ({main} biLM, p < {data.significance.alpha}): "
            f"{'; '.join(parts)}."
        )
    by_key = {(c.task, c.encoder): c for c in data.comparisons}
    for baseline in baseline_encoders(data):
        gains = [
            (task, by_key[task, main].best_layer.mean - by_key[task, baseline].best_layer.mean)
            for task in data.tasks
            if (task, main) in by_key and (task, baseline) in by_key
        ]
        if gains:
            name = data.display.label(main)
            lines.append(
                f"{name[0].upper()}{name[1:]} vs {data.display.label(baseline)}, best single layer "
                f"each: {data.display.label(main, short=True)} ahead on "
                f"{sum(gain > 0 for _, gain in gains)} of {len(gains)} tasks "
                f"({', '.join(f'{task} {pct(gain, signed=True)}' for task, gain in gains)} "
                "points)."
            )
    lines += _random_finding(data)
    lines += _token_finding(data)
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
    trained = data.inputs.trained
    if trained is not None:
        val = trained.metrics["val"]
        text = (
            f"Pretraining: validation perplexity {val['ppl']:,.1f} (forward {val['ppl_fwd']:,.1f}, "
            f"backward {val['ppl_bwd']:,.1f})"
        )
        if "tokens" in trained.metrics:
            text += f" after {trained.metrics['tokens'] / 1e6:,.1f}M training tokens"
        unigram = trained.metrics.get("unigram_ppl", {}).get("valid")
        if unigram is not None:
            text += f"; a unigram model gets {unigram:,.0f}"
        if data.inputs.random is not None:
            text += f", the untrained network {data.inputs.random.metrics['val']['ppl']:,.0f}"
        lines.append(text + ".")
    return lines


# --- the layer panel: what each layer encodes ---------------------------------------------------


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


def layer_panel(data: ReportData) -> list[PanelRow]:
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
        paper = PAPER_LAYERS.get(task)
        verdict = "–" if gap is None else gap.verdict(alpha)
        rows.append(
            PanelRow(
                family=family,
                task=task,
                metric=metric_label(next(c.metric for k, c in data.cells.items() if k[0] == task)),
                layers="–" if gap is None else f"{pct(gap.lower.mean)} · {pct(gap.upper.mean)}",
                difference="–" if gap is None else _signed_points(gap.difference, gap.std),
                p_value="–" if gap is None else p_text(gap.p_value),
                verdict=verdict,
                verdict_class=VERDICT_CLASSES.get(verdict, "neutral"),
                method="" if gap is None else gap.method,
                weights="–" if mix is None else " · ".join(f"{w:.2f}" for w in mix.weights),
                gravity="–" if mix is None else _gravity_text(mix.gravity),
                baselines=[
                    "–"
                    if g is None
                    else pct(g.difference, signed=True) + SIGNIFICANCE_MARKS[g.significant(alpha)]
                    for g in others
                ],
                baseline_hovers=["" if g is None else _gap_hover(g) for g in others],
                paper=""
                if paper is None
                else f"{pct(paper[1])} · {pct(paper[2])} ({pct(paper[2] - paper[1], signed=True)})",
                paper_hover="" if paper is None else paper[0],
            )
        )
    return rows


def _gravity_text(values: np.ndarray) -> str:
    """Mean ± std over seeds of centres of gravity, two decimals."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"


def _gap_hover(gap: LayerGap) -> str:
    spread = "" if math.isnan(gap.std) else f" ± {pct(gap.std)}"
    test = gap.method if gap.p_value is None else f"{p_equals(gap.p_value)}; {gap.method}"
    return f"{pct(gap.difference, signed=True)}{spread} points; {test}"


def family_findings(data: ReportData) -> list[str]:
    """Per family, how many of its tasks favour layer 1 or layer 2 significantly on the main
    encoder, and how many show no significant difference (or cannot be tested)."""
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
            f"{family.capitalize()} ({data.display.label(main)}, layer 2 − layer 1, p < {alpha}): "
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


def task_baselines(data: ReportData, task: str) -> list[tuple[str, float]]:
    """(name, test score) of each baseline without features the task's runs record."""
    cells = [c for (t, _, _), c in data.cells.items() if t == task]
    found = []
    for key, name in TASK_BASELINES.items():
        values = next((v for c in cells if len(v := c.extra(f"test_{key}"))), None)
        if values is not None:
            found.append((name, float(values.mean())))
    return found
