"""One significance test for every difference between probe runs: a two-level bootstrap over
units (seeds, or a control's (instance, seed) pairs) and test sentences, studentized with a t
reference.

Every metric is a ratio of per-sentence sums. A side of a comparison (:class:`RunScores`) holds,
per unit and test sentence, a numerator and a denominator, both (units, sentences): accuracy,
UAS and UUAS are correct / tokens (or words), bits per token bits / tokens, sentence labels and
WSD instances correct / 1, span F1 ``2 tp / (pred + gold)`` (:func:`span_f1_counts`). A unit's
score is ``sum(numerator) / sum(denominator)``; the effect of ``b`` over ``a`` is the mean of b's
unit scores minus the mean of a's.

Two designs, both on the same test sentences: *paired* units (the same seeds on both sides, e.g.
layer 2 against layer 1 of one encoder), and *unpaired* units (the trained biLM's 5 seeds against
a control's 3 instances x 5 seeds).

The bootstrap (:func:`compare`): every resample draws the units with replacement (paired: the
same draw for both sides; unpaired: each side's own) and one draw of the test sentences, shared
by every unit of both sides, and recomputes the effect. The sentences are crossed with the units,
not nested in them: every seed is scored on the same sentences, so what a sentence favours is
shared by all seeds, and redrawing sentences separately inside each unit would average that
share away (it undercounts the sentence variance by the number of units). The same draws, with
only the units or only the sentences redrawn, give the two levels' variances apart.

The test: ``t = effect / SE`` with SE the standard deviation of the resampled effects, against a
t distribution whose degrees of freedom are Welch-Satterthwaite's over the levels (units - 1 for
the unit level, per side where unpaired; sentences - 1 for the sentence level): close to
units - 1 when the seeds dominate the variance, large when the sentences do. The 95% interval is
``effect +- t_{0.975, df} SE``, the p-value two-sided, and the smallest detectable effect at
alpha 0.05 and power 0.8 is ``(t_{0.975, df} + t_{0.8, df}) SE``.

Why not the plain percentile bootstrap: with 5 seeds the bootstrap distribution of a mean of 5
has the normal's tails and (4/5 of) the variance, while the sampling distribution has t_4's.
``bench/significance_calibration.py`` with its defaults (400 simulated studies per cell, 5 seeds,
300 sentences of 5-40 tokens, binomial tokens, 1,000 resamples, seed 0; Intel Xeon family 6
model 167, 2 cores, 81 s), paired design, rejected at 0.05 in null studies / 95% intervals
covering a true effect of 2 points:

    variance from                   seeds         sentences     both          neither
    sentence bootstrap (stats.py)   0.333/0.630   0.048/0.932   0.100/0.910   0.050/0.943
    paired t-test over seeds        0.068/0.955   0.415/0.542   0.168/0.853   0.048/0.960
    nested two-level, percentile    0.085/0.912   0.223/0.713   0.160/0.863   0.010/0.988
    crossed two-level, percentile   0.065/0.950   0.030/0.958   0.045/0.965   0.005/0.998
    this module                     0.043/0.985   0.025/0.965   0.035/0.973   0.005/0.998

(seeds: seed sd 1 point; sentences: sentence-by-model sd 15 points; both: 0.6 and 10 points;
neither: only the tokens' binomial noise. A rate over 400 studies has sd 0.011 at 0.05.) An
earlier simulation of the same design also tried the crossed SE against t(units - 1)
(0.000-0.010: far too cautious) and Satterthwaite's df without the de-biasing (0.003-0.045);
with a seed sd of 3 points it had the percentile bootstrap reject 0.135, the Satterthwaite test
without the de-biasing 0.083, this module 0.045.

Grouped units: a control's 3 random instances, each probed with 5 seeds, are not 15 independent
units; what an instance favours is shared by its seeds. With ``groups`` (the instance of each
unit), a resample draws the groups with replacement, then each drawn group's units, and the
unit level's df is groups - 1 (de-biased by groups / (groups - 1)). Redrawing the units inside
a group counts their spread a second time, so this errs towards "not significant" where the
seeds vary more than the instances. A trained biLM's 5 seeds against an equally good control
whose instances differ by 1 point (sd; seeds 0.5), in the bench run above: rejected 0.115 of
null studies without the grouping, 0.035 with it.

The crossed bootstrap counts the noise of a unit on a sentence at both levels, so where that noise
dominates it errs towards "not significant" (the smallest detectable effect it reports then is
larger than it need be); it never errs the other way in these simulations.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

from elmolab.core.errors import ElmolabError

ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class RunScores:
    """One side of a comparison: per unit and test sentence, the metric's numerator and
    denominator, both (units, sentences); ``units``: the units' ids (a seed, or a (control
    instance, seed)), in the arrays' order; ``groups``: where units are not independent (a
    control's seeds probe the same random instance), each unit's group id (its instance), in
    the same order. Checked on construction."""

    numerators: np.ndarray  # (units, sentences)
    denominators: np.ndarray  # (units, sentences)
    units: tuple[Hashable, ...]
    groups: tuple[Hashable, ...] | None = None

    def __post_init__(self) -> None:
        num, den = np.asarray(self.numerators), np.asarray(self.denominators)
        if num.ndim != 2 or num.shape != den.shape:
            raise ElmolabError(
                f"numerators {num.shape} and denominators {den.shape} must be the same "
                "(units, sentences) shape"
            )
        if len(self.units) != num.shape[0] or len(set(self.units)) != len(self.units):
            raise ElmolabError(
                f"{len(self.units)} unit ids {list(self.units)} for {num.shape[0]} rows: "
                "one distinct id per unit"
            )
        if self.groups is not None and len(self.groups) != len(self.units):
            raise ElmolabError(
                f"{len(self.groups)} group ids for {len(self.units)} units: one per unit"
            )
        empty = [
            unit for unit, total in zip(self.units, den.sum(axis=1), strict=True) if total <= 0
        ]
        if empty:
            raise ElmolabError(f"units {empty} have no denominator (nothing scored)")
        object.__setattr__(self, "numerators", num.astype(float))
        object.__setattr__(self, "denominators", den.astype(float))

    @property
    def n_sentences(self) -> int:
        return self.numerators.shape[1]

    @property
    def scores(self) -> np.ndarray:
        """Each unit's score, (units,)."""
        return self.numerators.sum(axis=1) / self.denominators.sum(axis=1)

    def take(self, units: Sequence[Hashable]) -> RunScores:
        """These ``units``' rows, in that order."""
        rows = [self.units.index(unit) for unit in units]
        groups = None if self.groups is None else tuple(self.groups[row] for row in rows)
        return RunScores(self.numerators[rows], self.denominators[rows], tuple(units), groups)

    @property
    def n_groups(self) -> int:
        """The independent draws at the unit level: the groups, or the units without them."""
        return len(self.units) if self.groups is None else len(set(self.groups))


def span_f1_counts(
    true_positives: np.ndarray, predicted: np.ndarray, gold: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Span F1's numerator and denominator per sentence: ``2 tp`` and ``pred + gold``, whose
    ratio of sums is the corpus F1 ``2 TP / (2 TP + FP + FN)``."""
    return 2 * np.asarray(true_positives), np.asarray(predicted) + np.asarray(gold)


@dataclass(frozen=True)
class Effect:
    """b minus a, in the metric's units, with its test (see the module docstring)."""

    effect: float  # mean of b's unit scores minus mean of a's
    low: float  # 95% interval
    high: float
    p_value: float  # two-sided
    standard_error: float
    detectable: float  # the smallest effect detectable at ALPHA with POWER
    df: float  # the t reference's degrees of freedom
    units_a: int
    units_b: int
    sentences: int
    method: str  # one line: the design and what was resampled


def compare(
    a: RunScores,
    b: RunScores,
    *,
    paired: bool,
    samples: int = 2000,
    seed: int = 0,
    deterministic: bool = False,
) -> Effect:
    """The effect of ``b`` over ``a`` on the same test sentences: :func:`contrast` of ``-a`` and
    ``+b``; ``paired``: both have the same units (seeds), paired by id."""
    return contrast(
        [(-1.0, a), (1.0, b)],
        paired=paired,
        samples=samples,
        seed=seed,
        deterministic=deterministic,
    )


def contrast(
    terms: Sequence[tuple[float, RunScores]],
    *,
    paired: bool,
    samples: int = 2000,
    seed: int = 0,
    deterministic: bool = False,
) -> Effect:
    """The effect ``sum_k w_k mean(scores_k)`` of ``terms`` ``(w_k, side_k)`` on the same test
    sentences (:func:`compare`: b - a; a conditional gain net of the control task's: four
    sides). ``paired``: every side has the same units, paired by id (one draw of the units for
    all); else each side's units are drawn on their own. ``samples`` resamples from ``numpy``'s
    generator seeded with ``seed``. Grouped units (:class:`RunScores` ``groups``) are drawn
    groups first, and their unit level's degrees of freedom are groups - 1. ``deterministic``:
    the scored method has no randomness of its own (WSD 1-NN), so a side may be one unit, which
    adds no unit-level variance. Errors: different sentence counts, units that do not pair or
    are grouped differently, fewer than 2 units (groups) a side otherwise."""
    weights = [float(w) for w, _ in terms]
    sides = [side for _, side in terms]
    counts = sorted({side.n_sentences for side in sides})
    if len(counts) > 1:
        raise ElmolabError(
            f"the sides have {' and '.join(map(str, counts))} test sentences: all must be scored "
            "on the same ones"
        )
    if paired:
        sides = _paired(sides)
    least = 1 if deterministic else 2
    small = [str(k) for k, side in enumerate(sides) if side.n_groups < least]
    if small:
        raise ElmolabError(
            f"side(s) {', '.join(small)} need at least {least} units (or groups of units) each "
            "to be tested"
        )
    n = sides[0].n_sentences
    rng = np.random.default_rng(seed)
    sentence_draws = _sentence_weights(rng, samples, n)  # (samples, sentences)
    resampled = [
        (sentence_draws @ side.numerators.T) / (sentence_draws @ side.denominators.T)
        for side in sides
    ]  # each (samples, units)
    draws = [_unit_counts(rng, samples, sides[0])]
    if not paired:
        draws += [_unit_counts(rng, samples, side) for side in sides[1:]]  # (samples, units)

    def mean_of(scores: np.ndarray, draw: np.ndarray) -> np.ndarray:
        return (scores * draw).sum(axis=-1) / draw.sum(axis=1)  # (samples,)

    if paired:
        combined = sum(w * scores for w, scores in zip(weights, resampled, strict=True))
        both = mean_of(combined, draws[0])
        sentences_only = combined.mean(axis=1)
        unit_scores = sum(w * side.scores for w, side in zip(weights, sides, strict=True))
        unit_levels = [(mean_of(unit_scores, draws[0]).var(ddof=1), sides[0].n_groups - 1)]
    else:
        both = sum(
            w * mean_of(scores, draw)
            for w, scores, draw in zip(weights, resampled, draws, strict=True)
        )
        sentences_only = sum(
            w * scores.mean(axis=1) for w, scores in zip(weights, resampled, strict=True)
        )
        unit_levels = [
            (w**2 * mean_of(side.scores, draw).var(ddof=1), side.n_groups - 1)
            for w, side, draw in zip(weights, sides, draws, strict=True)
        ]
    unit_levels = [(v, df) for v, df in unit_levels if df > 0]
    # Resampling k units gives (k - 1) / k of a mean's variance: each unit level gets its
    # missing 1 / (k - 1) back. Each level's variance and df then give Welch-Satterthwaite's df.
    variance = float(both.var(ddof=1) + sum(v / df for v, df in unit_levels))
    levels = [(v * (df + 1) / df, df) for v, df in unit_levels]
    levels.append((sentences_only.var(ddof=1), n - 1))
    effect = float(sum(w * side.scores.mean() for w, side in zip(weights, sides, strict=True)))
    spread = sum(v**2 / df for v, df in levels)
    df = float(max(1.0, variance**2 / spread) if spread > 0 else min(d for _, d in levels))
    sizes = " and ".join(str(len(side.units)) for side in sides)
    design = f"the {len(sides[0].units)} paired units" if paired else f"each side's units ({sizes})"
    if any(side.groups is not None for side in sides):
        design += f", groups first ({' and '.join(str(side.n_groups) for side in sides)})"
    return t_effect(
        effect,
        math.sqrt(variance),
        df,
        (len(sides[0].units), len(sides[-1].units), n),
        f"two-level bootstrap ({samples} resamples of {design} and of the {n} test sentences, "
        f"shared by all units), its SE with a t reference on {df:.1f} df",
    )


def t_effect(
    effect: float, se: float, df: float, sizes: tuple[int, int, int], method: str
) -> Effect:
    """``effect`` with standard error ``se`` against a t distribution on ``df`` degrees of
    freedom: its 95% interval, two-sided p and smallest detectable effect (``sizes``: the units
    of the first and last side and the sentences)."""
    # Identical resamples: nothing varies, so any difference at all is certain.
    p = float(2 * stats.t.sf(abs(effect) / se, df)) if se > 0 else float(effect == 0)
    half = float(stats.t.ppf(1 - ALPHA / 2, df)) * se
    return Effect(
        effect,
        effect - half,
        effect + half,
        p,
        se,
        float(stats.t.ppf(1 - ALPHA / 2, df) + stats.t.ppf(POWER, df)) * se,
        df,
        *sizes,
        method,
    )


def _paired(sides: list[RunScores]) -> list[RunScores]:
    """``sides`` with the first's units in its order and its grouping (or another side's), or
    an error where the units or their groups differ."""
    first = sides[0]
    for side in sides[1:]:
        if set(side.units) != set(first.units):
            raise ElmolabError(
                f"paired units differ: {sorted(map(str, first.units))} and "
                f"{sorted(map(str, side.units))}"
            )
    ordered = [first] + [side.take(first.units) for side in sides[1:]]
    groupings = {side.groups for side in ordered if side.groups is not None}
    if len(groupings) > 1:
        raise ElmolabError("paired units are grouped differently on the two sides")
    grouping = next(iter(groupings), None)
    return [RunScores(s.numerators, s.denominators, s.units, grouping) for s in ordered]


def _unit_counts(rng: np.random.Generator, samples: int, side: RunScores) -> np.ndarray:
    """How often each unit is drawn in each resample, (samples, units). Ungrouped: the units
    with replacement. Grouped: the groups with replacement, then each drawn group's units
    with replacement, as many as it has."""
    k = len(side.units)
    if side.groups is None:
        draws = rng.integers(0, k, (samples, k)) + k * np.arange(samples)[:, None]
        return np.bincount(draws.ravel(), minlength=samples * k).reshape(samples, k)
    names = list(dict.fromkeys(side.groups))
    members = [[i for i, g in enumerate(side.groups) if g == name] for name in names]
    picked = rng.multinomial(len(names), np.full(len(names), 1 / len(names)), samples)
    counts = np.zeros((samples, k), dtype=np.int64)
    for rows, times in zip(members, picked.T, strict=True):
        size = len(rows)
        counts[:, rows] = rng.multinomial(times * size, np.full(size, 1 / size))
    return counts


def _sentence_weights(rng: np.random.Generator, samples: int, n: int) -> np.ndarray:
    """How often each sentence is drawn in each resample, (samples, sentences): a resample's sums
    are then one matrix product."""
    draws = rng.integers(0, n, (samples, n)) + n * np.arange(samples)[:, None]
    return np.bincount(draws.ravel(), minlength=samples * n).reshape(samples, n).astype(float)


def adjust(
    p_values: Sequence[float | None], method: Literal["holm", "fdr_bh"] = "holm"
) -> list[float | None]:
    """``p_values`` adjusted for their number (Holm's family-wise or Benjamini-Hochberg's false
    discovery rate), None (untestable) entries kept in place and left out of the count."""
    tested = [i for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    if tested:
        corrected = multipletests([p_values[i] for i in tested], method=method)[1]
        for i, p in zip(tested, corrected, strict=True):
            adjusted[i] = float(p)
    return adjusted


def verdict(
    effect: Effect,
    adjusted_p: float,
    claim: Literal["higher", "lower"],
    alpha: float = ALPHA,
) -> str:
    """A claim that b is ``higher`` (or ``lower``) than a: "supported" or "contradicted" where
    ``adjusted_p`` < ``alpha`` (by the effect's sign), else "inconclusive" with the smallest
    effect this design could have detected."""
    if adjusted_p < alpha and effect.effect != 0:
        return "supported" if (effect.effect > 0) == (claim == "higher") else "contradicted"
    return f"inconclusive (smallest detectable effect {effect.detectable:.3g})"
