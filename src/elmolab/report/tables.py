"""The report's tables and key findings as display-ready strings, shared by HTML and Markdown.

Scores are percentages with two decimals; "mean ± std" is over seeds (sample std).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmolab.report.collect import FEATURE_ORDER, SCALAR_MIX, ordered
from elmolab.report.stats import Cell, Comparison

if TYPE_CHECKING:
    from elmolab.report.build import ReportData

MAIN_ENCODER = "trained"
CONTROL_ENCODER = "random"
# A layer order counts as a tie when the two means differ by no more than the larger standard
# deviation over seeds, or than this (a tenth of a point) for methods without seeds.
TIE_MARGIN = 0.001
PAPER_LAYER_ORDERS = {  # task: (better layer, worse layer, the paper's numbers)
    "upos": ("layer1", "layer2", "POS 97.3 vs 96.8"),
    "wsd": ("layer2", "layer1", "WSD F1 69.0 vs 67.4"),
}
VERDICT_CLASSES = {
    "mix better": "good",
    "best layer better": "bad",
    "no significant difference": "neutral",
    "not testable": "neutral",
    "n/a": "neutral",
}


def pct(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"


def p_text(p_value: float | None) -> str:
    if p_value is None:
        return "–"
    return "< 0.001" if p_value < 0.001 else f"{p_value:.3f}"


def mean_std(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    if not cell.applicable:
        return "n/a"
    if cell.n == 0:
        return "–"
    return pct(cell.mean) if cell.n == 1 else f"{pct(cell.mean)} ± {pct(cell.std)}"


def metric_label(metric: str | None) -> str:
    return {"accuracy": "accuracy", "span_f1": "span F1", "f1": "F1"}.get(
        metric or "", metric or ""
    )


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
    random_best: str  # "layer0 80.12" or "–"
    random_mix: str
    gain_over_random: str  # trained best layer minus random best layer, points


def headline(data: ReportData) -> list[HeadlineRow]:
    """Per task: the best single layer against the scalar mix, for the main encoder; the
    random encoder's numbers beside them."""
    main = main_encoder(data)
    by_key = {(c.task, c.encoder): c for c in data.comparisons}
    rows = []
    for task in data.tasks:
        comparison = by_key.get((task, main))
        if comparison is None:
            continue
        control = by_key.get((task, CONTROL_ENCODER)) if main != CONTROL_ENCODER else None
        verdict = comparison.verdict(data.significance.alpha)
        gain = None if control is None else comparison.best_layer.mean - control.best_layer.mean
        random_best = "–"
        if control is not None:
            random_best = f"{control.best_layer.features} {pct(control.best_layer.mean)}"
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
                random_best=random_best,
                random_mix="–" if control is None or control.mix is None else pct(control.mix.mean),
                gain_over_random=pct(gain, signed=True),
            )
        )
    return rows


def main_encoder(data: ReportData) -> str:
    encoders = data.encoders
    return MAIN_ENCODER if MAIN_ENCODER in encoders or not encoders else encoders[0]


@dataclass(frozen=True)
class ResultCell:
    text: str  # "95.21 ± 0.10 (3)"
    best_layer: bool  # the best single layer of its task and encoder (chosen on dev)
    not_significant: bool  # a scalar mix not significantly different from that layer


def results_table(data: ReportData) -> list[tuple[str, str, list[ResultCell]]]:
    """(task, features, one cell per encoder) for every task (control tasks included)."""
    alpha = data.significance.alpha
    by_key: dict[tuple[str, str], Comparison] = {(c.task, c.encoder): c for c in data.comparisons}
    features = ordered({f for _, f, _ in data.cells}, FEATURE_ORDER)
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
        texts.append("–" if value is None else f"{value:,.{digits}f}")
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
    gains = [
        (task, by_key[task, main].best_layer.mean - by_key[task, CONTROL_ENCODER].best_layer.mean)
        for task in data.tasks
        if main != CONTROL_ENCODER and (task, main) in by_key and (task, CONTROL_ENCODER) in by_key
    ]
    if gains:
        lines.append(
            f"Trained vs random encoder: the trained biLM's best layer beats the random "
            f"control's on {sum(gain > 0 for _, gain in gains)} of {len(gains)} tasks "
            f"({', '.join(f'{task} {pct(gain, signed=True)}' for task, gain in gains)} points)."
        )
    if rows:
        lines.append(
            "Best single layer (chosen on dev): "
            + ", ".join(f"{r.task} {r.best_layer}" for r in rows)
            + "."
        )
    lines += _paper_directions(data, main)
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


def _paper_directions(data: ReportData, encoder: str) -> list[str]:
    """Whether the layer orders the ELMo paper found hold here (DESIGN.md section 7)."""
    parts = []
    for task, (better, worse, paper) in PAPER_LAYER_ORDERS.items():
        a, b = data.cells.get((task, better, encoder)), data.cells.get((task, worse, encoder))
        if a is None or b is None or not a.n or not b.n:
            continue
        spreads = [std for std in (a.std, b.std) if not math.isnan(std)]
        margin, spread = a.mean - b.mean, max([*spreads, TIE_MARGIN])
        if abs(margin) <= spread:
            verdict, why = "is a tie", f", within {pct(spread)} points"
        else:
            verdict, why = ("holds" if margin > 0 else "does not hold"), ""
        parts.append(
            f"{task} {better} > {worse} (paper: {paper}) {verdict} here "
            f"({pct(a.mean)} vs {pct(b.mean)}{why})"
        )
    return [f"ELMo paper's layer orders: {'; '.join(parts)}."] if parts else []
