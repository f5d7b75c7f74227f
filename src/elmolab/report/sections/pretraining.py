"""Pretraining: the trained biLM's and the random-initialisation control's perplexities, sizes and
training run, and their block of ``summary.json`` (both metrics files)."""

from __future__ import annotations

from typing import Any

from elmolab.report.data import ReportData
from elmolab.report.layout import Table, TableCell, columns_of, number

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


def pretraining_rows(data: ReportData) -> list[tuple[str, str, str]]:
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


def table(data: ReportData) -> Table:
    rows = pretraining_rows(data)
    return Table(
        columns_of("", "trained biLM", "random init"),
        [[TableCell(label), number(trained), number(random)] for label, trained, random in rows],
        [False] * len(rows),
    )


def summary(data: ReportData) -> dict[str, Any]:
    """Both encoders' pretraining metrics, whole; None for one that has not run."""
    return {
        "trained": data.inputs.trained.metrics if data.inputs.trained else None,
        "random": data.inputs.random.metrics if data.inputs.random else None,
    }
