"""The study's claims, each tested once: the ELMo paper's findings that this study can check, as
one effect, its 95% interval, a p-value adjusted over the claims (Holm) and a verdict.

A claim over several tasks (layer 1 holds more syntax than layer 2) is the mean of its tasks'
effects (each the report's two-level test of that task, :mod:`elmolab.report.stats`). The tasks
are scored on different test sets by different probes, so their effects are independent: the
mean's standard error is ``sqrt(sum SE_k^2) / K`` and its t reference has Welch-Satterthwaite's
degrees of freedom ``(sum SE_k^2)^2 / sum(SE_k^4 / df_k)``. How many tasks agree on their own
(after their family's correction) is shown beside it.

Verdicts (:func:`~elmolab.report.significance.verdict`): "supported" or "contradicted" where the
adjusted p is below alpha, by the effect's sign; otherwise "inconclusive", with the smallest
effect the run could have detected (alpha 0.05, power 0.8). "At least as good" claims have no
margin to test equivalence against: a non-significant difference is inconclusive, and the
interval says which losses the run excludes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from elmolab.core.schema import MIX_PREFIX
from elmolab.report.collect import SCALAR_MIX
from elmolab.report.data import ReportData, main_encoder
from elmolab.report.significance import (
    ALPHA,
    Effect,
    RunScores,
    adjust,
    compare,
    t_effect,
)
from elmolab.report.stats import Tested

CLAIMS_FAMILY = "the claims"


@dataclass(frozen=True)
class Claim:
    """One claim of the study and its test (``effect`` None: the run has nothing to test it)."""

    text: str  # "layer 1 holds more syntax than layer 2"
    measure: str  # what the effect is, and its unit
    direction: Literal["higher", "at least"]  # the effect's sign the claim expects: > 0, >= 0
    effect: Effect | None  # in points
    evidence: str  # how the effect came about: its tasks, instances or occurrences
    p_adjusted: float | None = None
    agreement: str = ""  # how many tasks agree on their own (their family's verdicts), or ""

    def verdict(self, alpha: float = ALPHA) -> str:
        if self.effect is None or self.p_adjusted is None:
            return "not testable"
        if self.p_adjusted < alpha and self.effect.effect != 0:
            return "supported" if self.effect.effect > 0 else "contradicted"
        text = f"inconclusive (smallest detectable effect {self.effect.detectable:.2f})"
        if self.direction == "at least" and self.effect.low < 0:
            text += f"; losses beyond {-self.effect.low:.2f} excluded"
        return text


def claims(data: ReportData) -> list[Claim]:
    """The study's claims with their tests, Holm-adjusted over those the run can test."""
    found = [
        _layers(data, "syntactic", lower_better=True),
        _layers(data, "semantic", lower_better=False),
        _mix(data),
        *(_versus(data, control) for control in (data.display.random, data.display.token_layer)),
        _task_model(data),
        _polysemy(data),
    ]
    listed = [claim for claim in found if claim is not None]
    adjusted = adjust([None if c.effect is None else c.effect.p_value for c in listed])
    return [dataclasses.replace(c, p_adjusted=p) for c, p in zip(listed, adjusted, strict=True)]


def pooled(effects: Sequence[Effect], signs: Sequence[float], scale: float = 100.0) -> Effect:
    """The mean of ``signs[k] * effects[k]`` (independent effects), times ``scale``, with its
    standard error, Welch-Satterthwaite's df, interval, p and smallest detectable effect."""
    k = len(effects)
    mean = scale * sum(s * e.effect for s, e in zip(signs, effects, strict=True)) / k
    variances = [(scale * e.standard_error / k) ** 2 for e in effects]
    variance = sum(variances)
    spread = sum(v**2 / e.df for v, e in zip(variances, effects, strict=True))
    df = variance**2 / spread if spread > 0 else min(e.df for e in effects)
    return t_effect(
        mean,
        math.sqrt(variance),
        df,
        (effects[0].units_a, effects[0].units_b, sum(e.sentences for e in effects)),
        f"the mean of {k} tasks' two-level tests, its SE from theirs on {df:.1f} df",
    )


def _counted(items: Sequence[Tested], alpha: float, positive: str, negative: str) -> str:
    """ "3 of 6 tasks <positive> on their own (Holm), 1 <negative>" of tested ``items``."""
    tested = [t for t in items if t.p_value is not None]
    up = sum(1 for t in tested if t.p_value < alpha and t.difference > 0)
    down = sum(1 for t in tested if t.p_value < alpha and t.difference < 0)
    return f"{up} of {len(tested)} tasks {positive} on their own (Holm), {down} {negative}"


def _layers(data: ReportData, family: str, lower_better: bool) -> Claim | None:
    """Layer 1 against layer 2 over the family's tasks, on the main encoder."""
    main = main_encoder(data)
    if family not in data.families.values():
        return None
    gaps = [
        g
        for g in data.layer_gaps
        if g.encoder == main and data.families.get(g.task) == family and g.effect is not None
    ]
    sign = -1.0 if lower_better else 1.0
    measure = (
        f"{'layer 1 − layer 2' if lower_better else 'layer 2 − layer 1'}, mean over the"
        f" {family} tasks, points"
    )
    text = (
        "layer 1 holds more syntax than layer 2"
        if lower_better
        else "layer 2 holds more word sense and semantics than layer 1"
    )
    if not gaps:
        return Claim(text, measure, "higher", None, "no tested layer gap")
    return Claim(
        text,
        measure,
        "higher",
        pooled([g.effect for g in gaps], [sign] * len(gaps)),  # type: ignore[misc]
        ", ".join(g.task for g in gaps),
        agreement=_counted(gaps, data.significance.alpha, "favour layer 2", "favour layer 1"),
    )


def _mix(data: ReportData) -> Claim | None:
    main = main_encoder(data)
    tested = [
        c
        for c in data.comparisons
        if c.encoder == main and c.effect is not None and not data.display.is_control(c.task)
    ]
    if not data.comparisons:
        return None
    return _over_tasks(
        Claim(
            "the learned scalar mix is at least as good as the best single layer",
            "scalar mix − best single layer (chosen on dev), mean over tasks, points",
            "at least",
            None,
            "",
            agreement=_counted(tested, data.significance.alpha, "favour the mix", "the best layer"),
        ),
        tested,
    )


def _versus(data: ReportData, control: str | None) -> Claim | None:
    if control is None:
        return None
    comparisons = [
        c
        for c in [*data.random_comparisons, *data.token_comparisons]
        if c.baseline == control and c.features == SCALAR_MIX
    ]
    if not comparisons:
        return None
    label = data.display.label(control)
    tested = [c for c in comparisons if c.effect is not None]
    instances = len(comparisons[0].baseline_cell.instances)
    return _over_tasks(
        Claim(
            f"the trained biLM beats the {label} control",
            f"trained − {label}, scalar mixes, mean over tasks, points",
            "higher",
            None,
            f"{instances} instance(s) of the control",
            agreement=_counted(
                tested, data.significance.alpha, "favour the trained biLM", "the control"
            ),
        ),
        tested,
    )


def _over_tasks(claim: Claim, tested: Sequence[Tested]) -> Claim:
    """``claim`` with the pooled effect of its ``tested`` tasks (one comparison each), the tasks
    added to its evidence."""
    if not tested:
        return dataclasses.replace(claim, evidence="no tested comparison", agreement="")
    effects = [t.effect for t in tested if t.effect is not None]
    tasks = ", ".join(getattr(t, "task", "") for t in tested)
    evidence = "; ".join(part for part in (tasks, claim.evidence) if part)
    return dataclasses.replace(
        claim, effect=pooled(effects, [1.0] * len(effects)), evidence=evidence
    )


def _task_model(data: ReportData) -> Claim | None:
    """The task model's gain from the main encoder's frozen mix, as its stage tested it."""
    summary = data.taskmodel
    if not summary:
        return None
    text = "ELMo adds to a task model"
    measure = "the task model's test span F1, + frozen mix of the trained biLM − baseline"
    versus = summary.get("vs_baseline", {}).get(MIX_PREFIX + str(data.display.main))
    if not versus or versus.get("standard_error") is None:
        return Claim(text, measure + ", points", "higher", None, "the stage has no two-level test")
    effect = t_effect(
        versus["effect"],
        versus["standard_error"],
        versus["df"],
        (0, 0, 0),
        versus["method"],
    )
    return Claim(
        text,
        measure + ", F1 points",
        "higher",
        effect,
        f"the stage's test (Holm over its {summary.get('family', {}).get('tests', '?')} inputs)",
    )


def _polysemy(data: ReportData) -> Claim | None:
    agreement = data.sense_agreement
    if agreement is None or len(agreement.contextual) < 2:
        return None
    n = len(agreement.contextual)
    ones = np.ones((1, n))
    effect = compare(
        RunScores(agreement.token_layer[None, :], ones, (0,)),
        RunScores(agreement.contextual[None, :], ones, (0,)),
        paired=True,
        samples=data.significance.bootstrap_samples,
        seed=0,
        deterministic=True,
    )
    scaled = Effect(
        100 * effect.effect,
        100 * effect.low,
        100 * effect.high,
        effect.p_value,
        100 * effect.standard_error,
        100 * effect.detectable,
        effect.df,
        1,
        1,
        n,
        effect.method.replace("test sentences", "SemCor occurrences"),
    )
    words = len(set(agreement.words))
    return Claim(
        "contextual vectors separate the senses of a polysemous word",
        "nearest-neighbour sense agreement, contextual − token layer (layer 0), points",
        "higher",
        scaled,
        f"{n} SemCor occurrences of {words} words; contextual"
        f" {100 * agreement.contextual.mean():.1f}%, token layer"
        f" {100 * agreement.token_layer.mean():.1f}%",
    )
