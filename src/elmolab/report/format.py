"""How the report writes its numbers: as text for the tables and findings (scores in percent with
two decimals; "mean ± std" is over seeds, sample std), and as values for ``summary.json``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from elmolab.report.information import PerSeed, TestedDifference
from elmolab.report.stats import Cell, Tested

# A difference's mark by its significance (None: not testable).
SIGNIFICANCE_MARKS = {True: " *", False: "", None: " (untested)"}
NO_VERDICT = "–"  # nothing compared, or no verdicts drawn at all (ReportData.no_verdicts)
# A verdict's badge class (the HTML's colours).
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
    NO_VERDICT: "neutral",
}


# How every difference in the report is tested (a section's method note ends with it).
TEST_METHOD = (
    "Differences: mean [95% interval], from a two-level bootstrap ({samples} resamples) of the"
    " runs' units (the probe seeds; a control's instances first, then their seeds) and of the"
    " test sentences they share, its standard error against a t distribution; p two-sided,"
    " adjusted by Holm's method within each family of tests; *, better and worse: adjusted"
    " p < {alpha} (the intervals are each comparison's own, not adjusted)."
)


def test_method(alpha: float, samples: int) -> str:
    return TEST_METHOD.format(alpha=alpha, samples=f"{samples:,}")


def family_note(tested: Iterable[Tested]) -> str:
    """The families of ``tested`` and their sizes: "Holm families: the layer panel (trained),
    10 tests." ("" when none was tested)."""
    sizes = {t.family: t.family_size for t in tested if t.family and t.family_size}
    if not sizes:
        return ""
    names = "; ".join(f"{name}, {size} test{'s' * (size != 1)}" for name, size in sizes.items())
    return f"Holm famil{'ies' if len(sizes) > 1 else 'y'}: {names}."


def verdict_cell(verdict: str, no_verdicts: str | None) -> tuple[str, str]:
    """(text, badge class) of ``verdict``; "–" where the report draws no verdicts."""
    shown = NO_VERDICT if no_verdicts else verdict
    return shown, VERDICT_CLASSES[shown]


def significance_mark(significant: bool | None, no_verdicts: str | None) -> str:
    """A difference's mark by its significance; none where the report draws no verdicts."""
    return "" if no_verdicts else SIGNIFICANCE_MARKS[significant]


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


def interval_text(
    value: float, interval: tuple[float, float] | None, digits: int = 2, scale: float = 1.0
) -> str:
    """A difference and its 95% interval, ``scale`` times: "+0.48 [+0.30, +0.66]"; the
    difference alone without an interval."""
    text = f"{scale * value:+z.{digits}f}"
    if interval is None:
        return text
    low, high = (f"{scale * end:+z.{digits}f}" for end in interval)
    return f"{text} [{low}, {high}]"


def with_interval(tested: Tested, digits: int = 2, scale: float = 100.0) -> str:
    """A tested difference and its 95% interval, in points by default (:func:`interval_text`);
    the difference alone where it was not tested."""
    return interval_text(tested.difference, tested.interval, digits, scale)


def test_hover(tested: Tested) -> str:
    """A test's adjusted and unadjusted p-values and method, for hover text."""
    if tested.p_value is None:
        return tested.method
    return f"{p_equals(tested.p_value)} (Holm; unadjusted {p_text(tested.p_raw)}); {tested.method}"


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


# A count's unit by its size, the largest first (thousand, million, billion).
COUNT_UNITS = ((1e9, "B"), (1e6, "M"), (1e3, "k"))


def token_count(tokens: float) -> str:
    """A number of tokens to one decimal of its unit: 19,200 -> "19.2k", 7,680,000 -> "7.7M",
    20,000 -> "20k", 950 -> "950"."""
    for scale, unit in COUNT_UNITS:
        if round(abs(tokens) / scale, 1) >= 1:  # 999,960 is "1M", not "1000k"
            return f"{tokens / scale:,.1f}".removesuffix(".0") + unit
    return f"{tokens:,.0f}"


def fraction_text(fraction: float) -> str:
    """0.01 -> "1%"."""
    return f"{100 * fraction:g}%"


def per_seed(values: PerSeed, digits: int, scale: float = 1.0, signed: bool = False) -> str:
    """Mean ± std over seeds of ``scale`` times ``values``, ``digits`` decimals; "–" for none."""
    if not values.n:
        return "–"
    mean = f"{scale * values.mean:{'+z' if signed else 'z'}.{digits}f}"  # z: no "-0.00"
    return mean if values.n == 1 else f"{mean} ± {scale * values.std:.{digits}f}"


# --- summary.json's values ----------------------------------------------------------------------


def json_number(value: float | None) -> float | None:
    """JSON has no nan: None instead."""
    return None if value is None or math.isnan(value) else value


def json_per_seed(values: PerSeed) -> dict[str, Any]:
    return {
        "mean": json_number(values.mean),
        "std": json_number(values.std),
        "values": list(values.values),
    }


def json_test(tested: Tested) -> dict[str, Any]:
    """A tested difference's test: the two-level test's difference, interval, smallest
    detectable effect and unadjusted p, the p adjusted within its family (``p_value``) and the
    family."""
    effect = tested.effect
    return {
        "p_value": tested.p_value,
        "p_unadjusted": tested.p_raw,
        "low": None if effect is None else effect.low,
        "high": None if effect is None else effect.high,
        "detectable": None if effect is None else effect.detectable,
        "family": tested.family or None,
        "family_tests": tested.family_size,
        "method": tested.method,
    }


def json_tested(difference: TestedDifference, alpha: float) -> dict[str, Any]:
    return {
        **json_per_seed(difference),
        **json_test(difference),
        "significant": difference.significant(alpha),
    }


def gain_cells(versus: Mapping[str, Any]) -> list[str]:
    """A comparison's gain with its 95% interval, relative error reduction and adjusted p, as
    text ("–" where not tested)."""
    tested = versus["low"] is not None
    gain = interval_text(versus["effect"], (versus["low"], versus["high"]) if tested else None)
    relative = versus["relative"]
    p_value = versus["p_adjusted"]
    return [
        gain,
        "–" if relative is None else f"{100 * relative:+.1f}%",
        p_text(p_value),
    ]
