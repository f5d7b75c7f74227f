"""Statistics over probe runs: mean and spread over seeds, the best single layer against the
learned scalar mix with a significance test, one encoder against another (the trained biLM
against its token layer under random LSTMs) on the same task, feature mode and training fraction
with the same test, and selectivity against the control task.

Significance of "scalar mix minus best single layer" on the test set, per task and encoder:

- paired bootstrap over test sentences, when both modes have per-sentence counts for the same
  seeds (accuracy tasks): the per-sentence differences ``d_i = mean_seeds(mix_i - layer_i)``
  (correct tokens) are resampled with replacement ``B`` times, each resample giving
  ``delta* = sum(d[idx]) / sum(total[idx])``; the two-sided p-value is
  ``min(1, 2 (1 + min(#{delta* <= 0}, #{delta* >= 0})) / (B + 1))``;
- otherwise a paired t-test over seeds (span F1 tasks), with at least 2 seeds in common;
- otherwise no test (a single run each, as WSD 1-NN, which has no scalar mix anyway).

The best single layer is chosen on dev (mean over seeds), never on test. Encoders are compared
the same way, pairing their runs by seed (and test sentence), and so are cross-entropies in bits
per token (:func:`paired_bits_test`: the bootstrap on each test sentence's summed bits).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

from elmolab.report.collect import (
    BY_NAME,
    SCALAR_MIX,
    SINGLE_LAYERS,
    TEST_BITS,
    Display,
    ProbeRun,
)


@dataclass(frozen=True)
class CellKey:
    """One task x feature mode x encoder of the report's tables."""

    task: str
    features: str
    encoder: str


@dataclass(frozen=True)
class Cell(CellKey):
    """All runs of one task x feature mode x encoder."""

    runs: tuple[ProbeRun, ...]  # sorted by seed

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
        """Sample standard deviation over seeds (ddof 1); nan for fewer than 2 runs."""
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


class _Tested:
    """A difference of means with the p-value of its significance test (None: not testable)."""

    difference: float
    p_value: float | None

    def significant(self, alpha: float) -> bool | None:
        return None if self.p_value is None else self.p_value < alpha

    def _verdict(self, alpha: float, higher: str, lower: str) -> str:
        """``higher`` or ``lower`` (the sign of the difference) where significant at ``alpha``."""
        if self.p_value is None:
            return "not testable"
        if self.p_value >= alpha:
            return "no significant difference"
        return higher if self.difference > 0 else lower


@dataclass(frozen=True)
class Comparison(_Tested):
    """Scalar mix against the best single layer (chosen on dev) of one task and encoder."""

    task: str
    encoder: str
    best_layer: Cell
    mix: Cell | None  # None: no scalar-mix runs, or the mode does not apply
    difference: float  # mean test metric, mix minus best layer; nan without a mix
    p_value: float | None
    method: str  # how p_value was computed, or why there is none

    def verdict(self, alpha: float) -> str:
        if self.mix is None:
            return "n/a"
        return self._verdict(alpha, "mix better", "best layer better")


@dataclass(frozen=True)
class EncoderComparison(_Tested):
    """``encoder`` against ``baseline`` on one task, feature mode and training fraction."""

    task: str
    features: str
    train_fraction: float
    cell: Cell  # the encoder's runs
    baseline_cell: Cell
    difference: float  # mean test metric, encoder minus baseline
    p_value: float | None
    method: str  # how p_value was computed, or why there is none

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
class LayerGap(_Tested):
    """The upper biLSTM layer minus the lower one (layer 2 - layer 1) on one task and encoder,
    test set, paired by seed: what the second layer adds to, or loses from, the first."""

    task: str
    encoder: str
    lower: Cell  # layer 1's runs
    upper: Cell  # layer 2's runs
    values: tuple[float, ...]  # per seed both layers have: upper - lower
    difference: float  # mean of values
    p_value: float | None
    method: str  # how p_value was computed, or why there is none

    @property
    def std(self) -> float:
        """Sample standard deviation of the per-seed differences; nan for fewer than 2."""
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
class Selectivity:
    """Task accuracy minus control-task accuracy, paired by seed (Hewitt and Liang 2019)."""

    task: str
    features: str
    encoder: str
    task_accuracy: float  # mean over the paired seeds
    control_accuracy: float
    values: tuple[float, ...]  # per paired seed

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan


def group_cells(
    runs: Iterable[ProbeRun], display: Display = BY_NAME
) -> dict[tuple[str, str, str], Cell]:
    """Runs grouped by (task, features, encoder), in ``display`` order."""
    groups: dict[tuple[str, str, str], list[ProbeRun]] = defaultdict(list)
    for run in runs:
        groups[run.task, run.features, run.encoder].append(run)
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
        groups[run.task, run.features, run.encoder, run.train_fraction].append(run)
    for task, features, encoder in {key[:3] for key in groups}:
        full = cells.get((task, features, encoder))
        if full is not None:
            groups[task, features, encoder, full.train_fraction] = list(full.runs)
    return {key: Cell(*key[:3], _by_seed(groups[key])) for key in display.sort(groups)}


def _by_seed(runs: Iterable[ProbeRun]) -> tuple[ProbeRun, ...]:
    return tuple(sorted(runs, key=lambda run: run.seed or 0))


def compare_encoders(
    cells: Iterable[Cell],
    encoder: str | None,
    baseline: str | None,
    bootstrap_samples: int,
    seed: int,
    *,
    controls: Mapping[str, str],
) -> list[EncoderComparison]:
    """``encoder`` against ``baseline`` for every task (the control tasks, the keys of
    ``controls``, excluded), feature mode and training fraction where both have applicable runs,
    in the order of ``cells`` (none when either is None: no encoder plays that role)."""
    by_key = {(c.task, c.features, c.train_fraction, c.encoder): c for c in cells}
    comparisons = []
    for (task, features, fraction, name), cell in by_key.items():
        base = by_key.get((task, features, fraction, baseline))
        if name != encoder or base is None or task in controls:
            continue
        if not (cell.applicable and base.applicable and cell.n and base.n):
            continue
        p_value, method = paired_test(base.runs, cell.runs, bootstrap_samples, seed)
        comparisons.append(
            EncoderComparison(
                task, features, fraction, cell, base, cell.mean - base.mean, p_value, method
            )
        )
    return comparisons


def compare_mix_to_best_layer(
    cells: dict[tuple[str, str, str], Cell], bootstrap_samples: int, seed: int
) -> list[Comparison]:
    """One comparison per task and encoder that has at least one single-layer cell."""
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
        p_value, method = paired_test(best.runs, mix.runs, bootstrap_samples, seed)
        comparisons.append(
            Comparison(task, encoder, best, mix, mix.mean - best.mean, p_value, method)
        )
    return comparisons


def layer_gaps(
    cells: Mapping[tuple[str, str, str], Cell],
    lower: str,
    upper: str,
    bootstrap_samples: int,
    seed: int,
    *,
    controls: Mapping[str, str],
) -> list[LayerGap]:
    """``upper`` minus ``lower`` (feature modes, e.g. layer2 and layer1) for every task (the
    control tasks, the keys of ``controls``, excluded) and encoder where both have applicable
    runs of a common seed, in the order of ``cells``; tested as the other paired comparisons
    (:func:`paired_test`)."""
    gaps = []
    for task, mode, encoder in cells:
        a, b = cells[task, mode, encoder], cells.get((task, upper, encoder))
        if mode != lower or b is None or task in controls:
            continue
        by_seed = {run.seed: run.test for run in a.runs if run.test is not None}
        values = tuple(
            run.test - by_seed[run.seed]
            for run in b.runs
            if run.test is not None and run.seed in by_seed
        )
        if not values:
            continue
        p_value, method = paired_test(a.runs, b.runs, bootstrap_samples, seed)
        gaps.append(LayerGap(task, encoder, a, b, values, float(np.mean(values)), p_value, method))
    return gaps


def centre_of_gravity(weights: np.ndarray) -> float:
    """Tenney et al. (2019)'s centre of gravity ``sum_j j * s_j`` of scalar-mix weights ``s``
    (layers,), which sum to 1: the layer the mix draws on, on average (0 = the token layer)."""
    return float(np.arange(len(weights)) @ weights)


def paired_test(
    a: tuple[ProbeRun, ...], b: tuple[ProbeRun, ...], bootstrap_samples: int, seed: int
) -> tuple[float | None, str]:
    """p-value of "b's test metric differs from a's" and the method used (see the module
    docstring)."""
    return _paired(a, b, _counts, lambda run: run.test, "counts", bootstrap_samples, seed)


def paired_bits_test(
    a: tuple[ProbeRun, ...], b: tuple[ProbeRun, ...], bootstrap_samples: int, seed: int
) -> tuple[float | None, str]:
    """p-value of "b's test cross-entropy (bits per token) differs from a's" and the method used:
    the paired bootstrap over test sentences on their summed bits and tokens (bits per token as a
    ratio of sums), else a paired t-test over seeds on ``test_bits``."""
    return _paired(
        a, b, _sentence_bits, lambda run: run.extra.get(TEST_BITS), "bits", bootstrap_samples, seed
    )


# A run's per-sentence sums and token totals, both (sentences,), or None where it has none.
PerSentenceSums = Callable[[ProbeRun], tuple[np.ndarray, np.ndarray] | None]


def _counts(run: ProbeRun) -> tuple[np.ndarray, np.ndarray] | None:
    counts = run.per_sentence_test
    return None if counts is None else (counts.correct, counts.total)


def _sentence_bits(run: ProbeRun) -> tuple[np.ndarray, np.ndarray] | None:
    bits, tokens = run.per_sentence_test_bits, run.per_sentence_test_tokens
    return None if bits is None or tokens is None else (bits, tokens)


def _paired(
    a: tuple[ProbeRun, ...],
    b: tuple[ProbeRun, ...],
    per_sentence: PerSentenceSums,
    score: Callable[[ProbeRun], float | None],
    what: str,
    bootstrap_samples: int,
    seed: int,
) -> tuple[float | None, str]:
    """p-value of "b differs from a", pairing runs by seed: the paired bootstrap over the
    sentences' sums where every paired run has them for the same sentences, else a paired t-test
    over seeds on ``score``, else none (``what``: the sums' name, for the reason)."""
    by_seed_a = {run.seed: run for run in a}
    pairs = [(by_seed_a[run.seed], run) for run in b if run.seed in by_seed_a]
    sums = [(per_sentence(x), per_sentence(y)) for x, y in pairs]
    counted = [(x, y) for x, y in sums if x is not None and y is not None]
    totals = [x[1] for x, _ in counted] + [y[1] for _, y in counted]
    if counted and all(np.array_equal(totals[0], t) for t in totals):
        sums_a = np.stack([x[0] for x, _ in counted])  # (seeds, sentences)
        sums_b = np.stack([y[0] for _, y in counted])  # (seeds, sentences)
        p_value = paired_bootstrap(sums_a, sums_b, totals[0], bootstrap_samples, seed)
        return p_value, (
            f"paired bootstrap over {len(totals[0])} test sentences "
            f"({bootstrap_samples} resamples, {len(counted)} seed(s))"
        )
    scored = [(score(x), score(y)) for x, y in pairs]
    scored = [(x, y) for x, y in scored if x is not None and y is not None]
    if len(scored) >= 2:
        return paired_t_test([x for x, _ in scored], [y for _, y in scored]), (
            f"paired t-test over {len(scored)} seeds"
        )
    return None, f"not testable: one run each and no per-sentence {what}"


def paired_bootstrap(
    correct_a: np.ndarray, correct_b: np.ndarray, total: np.ndarray, samples: int, seed: int
) -> float:
    """Two-sided p-value of a paired bootstrap over sentences of the accuracy difference b - a.

    ``correct_a``, ``correct_b``: (seeds, sentences) correct tokens (or any per-sentence sums, such
    as bits: the difference of their ratios to the tokens); ``total``: (sentences,) tokens.
    """
    d = (correct_b - correct_a).mean(axis=0)  # (sentences,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(total), size=(samples, len(total)))  # (samples, sentences)
    delta = d[idx].sum(axis=1) / np.maximum(total[idx].sum(axis=1), 1)  # (samples,)
    tail = min(int((delta <= 0).sum()), int((delta >= 0).sum()))
    return min(1.0, 2 * (1 + tail) / (samples + 1))


def paired_t_test(a: list[float | None], b: list[float | None]) -> float:
    """Two-sided paired t-test p-value; identical differences give 0 (or 1 when all zero)."""
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if np.allclose(diff, diff[0]):
        return 1.0 if math.isclose(diff[0], 0.0, abs_tol=1e-12) else 0.0
    return float(stats.ttest_rel(b, a).pvalue)


def selectivities(
    cells: dict[tuple[str, str, str], Cell], controls: Mapping[str, str]
) -> list[Selectivity]:
    """For every control task (``controls``: control task -> its task): its task minus the
    control, per features and encoder."""
    results = []
    for (task, features, encoder), control in cells.items():
        base = controls.get(task)
        if base is None or (base, features, encoder) not in cells or not control.n:
            continue
        by_seed = {run.seed: run.test for run in cells[base, features, encoder].runs}
        pairs = [(by_seed[r.seed], r.test) for r in control.runs if by_seed.get(r.seed) is not None]
        pairs = [(t, c) for t, c in pairs if c is not None]
        if not pairs:
            continue
        task_acc, control_acc = np.mean(pairs, axis=0)
        results.append(
            Selectivity(
                base,
                features,
                encoder,
                float(task_acc),
                float(control_acc),
                tuple(float(t - c) for t, c in pairs),
            )
        )
    return results
