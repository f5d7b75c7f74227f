"""Statistics over probe runs: mean and spread over seeds, and every comparison the report draws
(the layer panel's layer 2 - layer 1, the learned scalar mix against the best single layer, the
trained biLM against each control, per training fraction, selectivity against the control task)
with one test and one correction.

The test (:mod:`elmolab.report.significance`): the two-level bootstrap over the runs' units
and the test sentences they share, on each run's per-sentence sums (correct tokens, span F1's
chunk counts, bits; :func:`run_scores`). A unit is a run's (encoder, seed): within one encoder
the seeds pair (paired design), the trained biLM against a control is unpaired, and a control's
instances (``Display.instances``) are pooled into one cell whose units are grouped by instance.
A method without randomness of its own (WSD 1-NN: one run per encoder, no seed) is tested on its
sentences alone. Runs without per-sentence sums (results written before they were stored) are
not tested. Every test draws from its own seed, the report's seed plus a hash of what it
compares.

Each comparison belongs to a family (:func:`correct`): its ``p_value`` is adjusted by Holm's
method over the family's tests (``p_raw`` keeps the unadjusted one), and every star and verdict
follows the adjusted p. The best single layer is chosen on dev (mean over seeds), never on
test.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from elmolab.core.errors import ElmolabError
from elmolab.report.collect import (
    BY_NAME,
    SCALAR_MIX,
    SINGLE_LAYERS,
    Display,
    ProbeRun,
)
from elmolab.report.significance import Effect, RunScores, adjust, contrast, span_f1_counts

CORRECTION = "holm"  # statsmodels' name of the family-wise correction every family uses


@dataclass(frozen=True)
class CellKey:
    """One task x feature mode x encoder of the report's tables."""

    task: str
    features: str
    encoder: str


@dataclass(frozen=True)
class Cell(CellKey):
    """All runs of one task x feature mode x encoder (a control: all its instances' runs)."""

    runs: tuple[ProbeRun, ...]  # sorted by seed, then instance

    @property
    def applicable(self) -> bool:
        return all(run.applicable for run in self.runs)

    @property
    def metric(self) -> str | None:
        return self.runs[0].metric

    @property
    def seeds(self) -> list[int | None]:
        return [run.seed for run in self.runs]

    @property
    def instances(self) -> list[str]:
        """The encoders whose runs the cell holds (a control's instances), in run order."""
        return list(dict.fromkeys(run.encoder for run in self.runs))

    @property
    def train_fraction(self) -> float:
        return self.runs[0].train_fraction

    @property
    def n_train_sentences(self) -> int | None:
        """The training sentences of the first run that says (every seed sees as many)."""
        return next(
            (r.n_train_sentences for r in self.runs if r.n_train_sentences is not None), None
        )

    @property
    def test(self) -> np.ndarray:
        return np.array([run.test for run in self.runs if run.test is not None], dtype=float)

    @property
    def dev(self) -> np.ndarray:
        return np.array([run.dev for run in self.runs if run.dev is not None], dtype=float)

    @property
    def n(self) -> int:
        return len(self.test)

    @property
    def mean(self) -> float:
        return float(self.test.mean()) if self.n else math.nan

    @property
    def std(self) -> float:
        """Sample standard deviation over runs (ddof 1); nan for fewer than 2 runs."""
        return float(self.test.std(ddof=1)) if self.n > 1 else math.nan

    @property
    def dev_mean(self) -> float:
        return float(self.dev.mean()) if len(self.dev) else math.nan

    @property
    def mix_weights(self) -> np.ndarray | None:
        """Mean learned weights over seeds, (layers,); None when no run has them."""
        weights = [run.mix_weights for run in self.runs if run.mix_weights is not None]
        return np.mean(np.array(weights), axis=0) if weights else None

    @property
    def gamma(self) -> float | None:
        gammas = [run.gamma for run in self.runs if run.gamma is not None]
        return float(np.mean(gammas)) if gammas else None

    def extra(self, key: str) -> np.ndarray:
        """The runs' ``extra[key]`` (e.g. ``test_dspr``), (runs that have it,)."""
        return np.array([run.extra[key] for run in self.runs if key in run.extra], dtype=float)

    @property
    def extra_keys(self) -> list[str]:
        return sorted({key for run in self.runs for key in run.extra})


def unit_of(run: ProbeRun) -> tuple[str, int | None]:
    """A run's unit in the tests: its encoder (a control's instance) and seed."""
    return run.encoder, run.seed


class Tested:
    """A difference with its test: ``p_value`` adjusted within its family (None: not
    testable), ``effect`` the two-level test's difference, interval and unadjusted p."""

    difference: float
    p_value: float | None
    method: str
    effect: Effect | None
    family: str
    family_size: int

    def significant(self, alpha: float) -> bool | None:
        return None if self.p_value is None else self.p_value < alpha

    @property
    def p_raw(self) -> float | None:
        return None if self.effect is None else self.effect.p_value

    @property
    def interval(self) -> tuple[float, float] | None:
        """The difference's 95% interval (None: not tested)."""
        return None if self.effect is None else (self.effect.low, self.effect.high)

    def _verdict(self, alpha: float, higher: str, lower: str) -> str:
        """``higher`` or ``lower`` (the sign of the difference) where significant at ``alpha``."""
        if self.p_value is None:
            return "not testable"
        if self.p_value >= alpha:
            return "no significant difference"
        return higher if self.difference > 0 else lower


@dataclass(frozen=True)
class Comparison(Tested):
    """Scalar mix against the best single layer (chosen on dev) of one task and encoder."""

    task: str
    encoder: str
    best_layer: Cell
    mix: Cell | None  # None: no scalar-mix runs, or the mode does not apply
    difference: float  # mean test metric, mix minus best layer; nan without a mix
    p_value: float | None
    method: str  # how p_value was computed, or why there is none
    effect: Effect | None = None
    family: str = ""
    family_size: int = 0

    def verdict(self, alpha: float) -> str:
        if self.mix is None:
            return "n/a"
        return self._verdict(alpha, "mix better", "best layer better")


@dataclass(frozen=True)
class EncoderComparison(Tested):
    """``encoder`` against ``baseline`` on one task, feature mode and training fraction."""

    task: str
    features: str
    train_fraction: float
    cell: Cell  # the encoder's runs
    baseline_cell: Cell
    difference: float  # mean test metric, encoder minus baseline
    p_value: float | None
    method: str  # how p_value was computed, or why there is none
    effect: Effect | None = None
    family: str = ""
    family_size: int = 0

    @property
    def encoder(self) -> str:
        return self.cell.encoder

    @property
    def baseline(self) -> str:
        return self.baseline_cell.encoder

    def verdict(self, alpha: float) -> str:
        """Whether the encoder is "better" or "worse" than the baseline, or why neither."""
        return self._verdict(alpha, "better", "worse")


@dataclass(frozen=True)
class LayerGap(Tested):
    """The upper biLSTM layer minus the lower one (layer 2 - layer 1) on one task and encoder,
    test set, paired by unit: what the second layer adds to, or loses from, the first."""

    task: str
    encoder: str
    lower: Cell  # layer 1's runs
    upper: Cell  # layer 2's runs
    values: tuple[float, ...]  # per unit both layers have: upper - lower
    difference: float  # mean of values
    p_value: float | None
    method: str  # how p_value was computed, or why there is none
    effect: Effect | None = None
    family: str = ""
    family_size: int = 0

    @property
    def std(self) -> float:
        """Sample standard deviation of the per-unit differences; nan for fewer than 2."""
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan

    def favoured(self, alpha: float) -> str | None:
        """The layer (``lower.features`` or ``upper.features``) significantly better at
        ``alpha``; None when neither is, or the difference is not testable."""
        if not self.significant(alpha):
            return None
        return self.upper.features if self.difference > 0 else self.lower.features

    def verdict(self, alpha: float) -> str:
        return self._verdict(
            alpha, f"{self.upper.features} better", f"{self.lower.features} better"
        )


@dataclass(frozen=True)
class Selectivity(Tested):
    """Task accuracy minus control-task accuracy, paired by unit (Hewitt and Liang 2019)."""

    task: str
    features: str
    encoder: str
    task_accuracy: float  # mean over the paired units
    control_accuracy: float
    values: tuple[float, ...]  # per paired unit
    difference: float  # mean of values
    p_value: float | None
    method: str
    effect: Effect | None = None
    family: str = ""
    family_size: int = 0

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan


T = TypeVar("T", bound=Tested)


@dataclass(frozen=True)
class Bootstrap:
    """Runs the two-level test (:func:`~elmolab.report.significance.contrast`) on probe runs:
    ``samples`` resamples, each test seeded with ``seed`` plus a hash of its ``key``."""

    samples: int
    seed: int

    def test(
        self,
        key: str,
        terms: Sequence[tuple[float, Sequence[ProbeRun]]],
        *,
        paired: bool,
        bits: bool = False,
    ) -> tuple[Effect | None, str]:
        """The effect ``sum_k w_k mean(runs_k)`` of ``terms`` on the test metric (``bits``: on
        the cross-entropy in bits per token) and the method line, or (None, why not)."""
        what = "bits" if bits else "counts"
        sides = [_run_scores(runs, bits) for _, runs in terms]
        if any(side is None for side in sides):
            return None, f"not testable: runs without per-sentence {what}"
        scored = [side for side in sides if side is not None]
        if paired:
            common = [u for u in scored[0].units if all(u in side.units for side in scored[1:])]
            scored = [side.take(common) for side in scored]
        deterministic = all(run.seed is None for _, runs in terms for run in runs)
        try:
            effect = contrast(
                [(w, side) for (w, _), side in zip(terms, scored, strict=True)],
                paired=paired,
                samples=self.samples,
                seed=self.seed + zlib.crc32(key.encode()),
                deterministic=deterministic,
            )
        except ElmolabError as err:
            return None, f"not testable: {err.problem}"
        return effect, effect.method


def _run_scores(runs: Sequence[ProbeRun], bits: bool) -> RunScores | None:
    """The runs' per-sentence numerators and denominators as one :class:`RunScores` (units
    grouped by encoder where the runs are several instances'), or None where a run has none
    or their sentence counts differ."""
    sums = [_sums(run, bits) for run in runs if run.applicable]
    if not sums or any(s is None for s in sums) or len({len(s[0]) for s in sums if s}) > 1:
        return None
    units = tuple(unit_of(run) for run in runs if run.applicable)
    encoders = tuple(encoder for encoder, _ in units)
    return RunScores(
        np.stack([s[0] for s in sums if s is not None]),
        np.stack([s[1] for s in sums if s is not None]),
        units,
        encoders if len(set(encoders)) > 1 else None,
    )


def _sums(run: ProbeRun, bits: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """One run's per-sentence numerator and denominator: bits and tokens, span F1's ``2 tp``
    and ``pred + gold``, or correct and total."""
    if bits:
        b, tokens = run.per_sentence_test_bits, run.per_sentence_test_tokens
        return None if b is None or tokens is None else (b, tokens)
    if run.per_sentence_test_spans is not None:
        spans = run.per_sentence_test_spans
        return span_f1_counts(spans.tp, spans.pred, spans.gold)
    counts = run.per_sentence_test
    return None if counts is None else (counts.correct, counts.total)


def correct(items: Iterable[T], family: Callable[[T], str]) -> list[T]:
    """``items`` with ``p_value`` adjusted by Holm's method within each ``family`` (the untested
    left out of the count) and their family's name and size, in their order."""
    items = list(items)
    members: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        members[family(item)].append(i)
    done = list(items)
    for name, rows in members.items():
        raw = [items[i].p_raw for i in rows]
        size = sum(p is not None for p in raw)
        for i, p in zip(rows, adjust(raw, CORRECTION), strict=True):
            method = items[i].method
            if p is not None:
                method += f"; Holm over the {size} tests of {name}"
            tested = size if p is not None else 0
            done[i] = dataclasses.replace(
                items[i], p_value=p, family=name, family_size=tested, method=method
            )
    return done


def group_cells(
    runs: Iterable[ProbeRun], display: Display = BY_NAME
) -> dict[tuple[str, str, str], Cell]:
    """Runs grouped by (task, features, encoder), a control's instances pooled under the
    control's name, in ``display`` order."""
    groups: dict[tuple[str, str, str], list[ProbeRun]] = defaultdict(list)
    for run in runs:
        groups[run.task, run.features, display.pooled(run.encoder)].append(run)
    return {key: Cell(*key, _by_seed(groups[key])) for key in display.sort(groups)}


def learning_curve_cells(
    curve_runs: Iterable[ProbeRun],
    cells: Mapping[tuple[str, str, str], Cell],
    display: Display = BY_NAME,
) -> dict[tuple[str, str, str, float], Cell]:
    """Runs grouped by (task, features, encoder, training fraction), fractions ascending; every
    (task, features, encoder) with learning-curve runs gets its runs on all the data (from
    ``cells``) as fraction 1."""
    groups: dict[tuple[str, str, str, float], list[ProbeRun]] = defaultdict(list)
    for run in curve_runs:
        key = (run.task, run.features, display.pooled(run.encoder), run.train_fraction)
        groups[key].append(run)
    for task, features, encoder in {key[:3] for key in groups}:
        full = cells.get((task, features, encoder))
        if full is not None:
            groups[task, features, encoder, full.train_fraction] = list(full.runs)
    return {key: Cell(*key[:3], _by_seed(groups[key])) for key in display.sort(groups)}


def _by_seed(runs: Iterable[ProbeRun]) -> tuple[ProbeRun, ...]:
    return tuple(sorted(runs, key=lambda run: (run.seed or 0, run.encoder)))


def compare_encoders(
    cells: Iterable[Cell],
    encoder: str | None,
    baseline: str | None,
    tester: Bootstrap,
    *,
    controls: Mapping[str, str],
) -> list[EncoderComparison]:
    """``encoder`` against ``baseline`` for every task (the control tasks, the keys of
    ``controls``, excluded), feature mode and training fraction where both have applicable runs,
    in the order of ``cells`` (none when either is None: no encoder plays that role); unpaired
    (different encoders), each family one baseline's comparisons at one training fraction or
    all fractions below 1."""
    by_key = {(c.task, c.features, c.train_fraction, c.encoder): c for c in cells}
    comparisons = []
    for (task, features, fraction, name), cell in by_key.items():
        base = by_key.get((task, features, fraction, baseline))
        if name != encoder or base is None or task in controls:
            continue
        if not (cell.applicable and base.applicable and cell.n and base.n):
            continue
        effect, method = tester.test(
            f"{task}/{features}/{fraction}/{name}-{baseline}",
            [(-1.0, base.runs), (1.0, cell.runs)],
            paired=False,
        )
        difference = cell.mean - base.mean if effect is None else effect.effect
        comparisons.append(
            EncoderComparison(
                task, features, fraction, cell, base, difference, None, method, effect
            )
        )
    return correct(
        comparisons,
        lambda c: (
            f"{c.encoder} - {c.baseline}"
            + ("" if c.train_fraction == 1.0 else " (learning curves)")
        ),
    )


def compare_mix_to_best_layer(
    cells: dict[tuple[str, str, str], Cell], tester: Bootstrap
) -> list[Comparison]:
    """One comparison per task and encoder that has at least one single-layer cell, paired by
    unit; one family per encoder."""
    comparisons = []
    for task, encoder in dict.fromkeys((t, e) for t, _, e in cells):
        layers = [
            cells[task, layer, encoder]
            for layer in SINGLE_LAYERS
            if (task, layer, encoder) in cells and cells[task, layer, encoder].n
        ]
        if not layers:
            continue
        best = max(layers, key=lambda cell: cell.dev_mean)
        mix = cells.get((task, SCALAR_MIX, encoder))
        if mix is None or not mix.applicable or not mix.n:
            reason = "scalar mix not applicable" if mix is not None else "no scalar-mix runs"
            comparisons.append(Comparison(task, encoder, best, None, math.nan, None, reason))
            continue
        effect, method = tester.test(
            f"{task}/{encoder}/mix-best", [(-1.0, best.runs), (1.0, mix.runs)], paired=True
        )
        difference = mix.mean - best.mean if effect is None else effect.effect
        comparisons.append(Comparison(task, encoder, best, mix, difference, None, method, effect))
    return correct(comparisons, lambda c: f"scalar mix - best single layer ({c.encoder})")


def layer_gaps(
    cells: Mapping[tuple[str, str, str], Cell],
    lower: str,
    upper: str,
    tester: Bootstrap,
    *,
    controls: Mapping[str, str],
) -> list[LayerGap]:
    """``upper`` minus ``lower`` (feature modes, e.g. layer2 and layer1) for every task (the
    control tasks, the keys of ``controls``, excluded) and encoder where both have applicable
    runs of a common unit, in the order of ``cells``; paired by unit, one family per encoder
    (the layer panel)."""
    gaps = []
    for task, mode, encoder in cells:
        a, b = cells[task, mode, encoder], cells.get((task, upper, encoder))
        if mode != lower or b is None or task in controls:
            continue
        by_unit = {unit_of(run): run.test for run in a.runs if run.test is not None}
        values = tuple(
            run.test - by_unit[unit_of(run)]
            for run in b.runs
            if run.test is not None and unit_of(run) in by_unit
        )
        if not values:
            continue
        effect, method = tester.test(
            f"{task}/{encoder}/{upper}-{lower}", [(-1.0, a.runs), (1.0, b.runs)], paired=True
        )
        difference = float(np.mean(values)) if effect is None else effect.effect
        gaps.append(LayerGap(task, encoder, a, b, values, difference, None, method, effect))
    return correct(gaps, lambda g: f"the layer panel ({g.encoder})")


def centre_of_gravity(weights: np.ndarray) -> float:
    """Tenney et al. (2019)'s centre of gravity ``sum_j j * s_j`` of scalar-mix weights ``s``
    (layers,), which sum to 1: the layer the mix draws on, on average (0 = the token layer)."""
    return float(np.arange(len(weights)) @ weights)


def selectivities(
    cells: dict[tuple[str, str, str], Cell], controls: Mapping[str, str], tester: Bootstrap
) -> list[Selectivity]:
    """For every control task (``controls``: control task -> its task): its task minus the
    control, per features and encoder, paired by unit (both read the same test sentences);
    one family."""
    results = []
    for (task, features, encoder), control in cells.items():
        base = controls.get(task)
        if base is None or (base, features, encoder) not in cells or not control.n:
            continue
        task_cell = cells[base, features, encoder]
        by_unit = {unit_of(run): run.test for run in task_cell.runs}
        pairs = [(by_unit.get(unit_of(r)), r.test) for r in control.runs]
        pairs = [(t, c) for t, c in pairs if t is not None and c is not None]
        if not pairs:
            continue
        task_acc, control_acc = np.mean(pairs, axis=0)
        values = tuple(float(t - c) for t, c in pairs)
        effect, method = tester.test(
            f"{base}-{task}/{features}/{encoder}",
            [(1.0, task_cell.runs), (-1.0, control.runs)],
            paired=True,
        )
        difference = float(np.mean(values)) if effect is None else effect.effect
        results.append(
            Selectivity(
                base,
                features,
                encoder,
                float(task_acc),
                float(control_acc),
                values,
                difference,
                None,
                method,
                effect,
            )
        )
    return correct(results, lambda _: "selectivity")
