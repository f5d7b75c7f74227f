"""The two-level bootstrap of elmolab.report.significance on synthetic probe runs: seed variance
is not mistaken for an effect (the old sentence bootstrap's mistake), a known effect is found and
covered, the test holds its level over many simulated null studies, span F1 and the unpaired
design, the multiple-testing adjustments by hand, and the errors."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from elmolab.core.errors import ElmolabError
from elmolab.report.significance import (
    RunScores,
    adjust,
    compare,
    contrast,
    span_f1_counts,
    verdict,
)


def _bench(name: str):
    """A script of bench/ (it holds the report's old test, the calibration's reference)."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


seed_averaged_bootstrap = _bench("significance_calibration").seed_averaged_bootstrap


SEEDS = (1, 2, 3, 4, 5)


def accuracy_runs(
    rng: np.random.Generator,
    units: tuple,
    sentences: int,
    *,
    effect: float = 0.0,
    seed_sd: float = 0.0,
    sentence_sd: float = 0.0,
    other: tuple | None = None,
    instance_sd: float = 0.0,
) -> tuple[RunScores, RunScores]:
    """Correct tokens of a and b (b's accuracy ``effect`` higher), binomial per sentence: each
    sentence has a difficulty shared by both, and a sentence-by-model part (sd ``sentence_sd``,
    half added to b, half taken from a, so the true effect stays ``effect``); each unit has its
    own shift (sd ``seed_sd``). ``other``: b's units where they differ from a's (unpaired).
    ``instance_sd``: a's units are (instance, seed) pairs, each instance shifted by that sd, and
    a's groups are the instances."""
    other = units if other is None else other
    tokens = rng.integers(5, 40, sentences)  # (sentences,)
    base = 0.75 + rng.normal(0, 0.05, sentences)  # (sentences,)
    favour = rng.normal(0, sentence_sd, sentences) / 2  # (sentences,)

    def side(ids: tuple, shift: np.ndarray, groups: tuple | None = None) -> RunScores:
        p = np.clip(base + shift + rng.normal(0, seed_sd, (len(ids), 1)), 0, 1)
        total = np.broadcast_to(tokens, p.shape)  # (units, sentences)
        return RunScores(rng.binomial(total, p), total, ids, groups)

    if not instance_sd:
        return side(units, -favour), side(other, effect + favour)
    instances = tuple(instance for instance, _ in units)
    names = sorted(set(instances))
    shifts = dict(zip(names, rng.normal(0, instance_sd, len(names)), strict=True))
    instance_shift = np.array([shifts[i] for i in instances])[:, None]  # (units, 1)
    return side(units, instance_shift - favour, instances), side(other, effect + favour)


def test_seed_variance_is_not_an_effect() -> None:
    """Five seeds whose b - a shifts scatter widely (sd 2.4 points) around a small mean (0.6
    points), each shift the same on every sentence: the sentence bootstrap over seed-averaged
    differences sees 400 sentences agreeing and calls it significant; the two-level bootstrap
    sees 5 scattered seeds and does not."""
    rng = np.random.default_rng(0)
    shifts = np.array([0.03, -0.02, 0.025, -0.015, 0.01])  # b - a per seed, mean 0.006
    tokens = np.full(400, 50.0)
    correct_a = 40 + rng.normal(0, 0.2, (5, 400))  # (seeds, sentences); tiny sentence spread
    correct_b = correct_a + shifts[:, None] * tokens
    total = np.broadcast_to(tokens, (5, 400))
    assert seed_averaged_bootstrap(correct_a, correct_b, tokens, 2000, 0) < 0.05
    result = compare(
        RunScores(correct_a, total, SEEDS), RunScores(correct_b, total, SEEDS), paired=True
    )
    assert result.effect == pytest.approx(0.006)
    assert result.p_value > 0.3
    assert result.low < 0 < result.high
    assert verdict(result, result.p_value, "higher").startswith("inconclusive")


def test_a_known_effect_is_found_and_covered() -> None:
    rng = np.random.default_rng(1)
    a, b = accuracy_runs(rng, SEEDS, 300, effect=0.03, seed_sd=0.005, sentence_sd=0.05)
    result = compare(a, b, paired=True)
    assert result.p_value < 0.05
    assert result.low < 0.03 < result.high
    assert result.detectable < 0.03
    assert (result.units_a, result.units_b, result.sentences) == (5, 5, 300)
    assert "5 paired units" in result.method and "300 test sentences" in result.method
    assert verdict(result, result.p_value, "higher") == "supported"
    assert verdict(result, result.p_value, "lower") == "contradicted"


def test_null_studies_reject_at_the_nominal_rate() -> None:
    """400 simulated studies without an effect (5 seeds, 200 sentences, seed sd 1 point and
    sentence-by-model sd 15 points, both present; measured: 0.0325 rejected, 0.9675 covered).
    A calibrated test rejects in Binomial(400, 0.05) studies: mean 20, sd
    sqrt(400 * 0.05 * 0.95) = 4.4, so 0.02-0.08 (8 to 32 rejections) is the mean +- 2.75 sd,
    missed by chance in under 1% of seeds; a test at 0.10 (the percentile bootstrap with
    sentences nested in seeds measured 0.15 in such a design) would give 40 +- 6 and fall
    outside. The interval covers the true effect, 0, in 1 - that rate of
    the studies: 0.92-0.98."""
    rng = np.random.default_rng(2)
    studies = 400
    results = [
        compare(
            *accuracy_runs(rng, SEEDS, 200, seed_sd=0.01, sentence_sd=0.15),
            paired=True,
            samples=500,
            seed=study,
        )
        for study in range(studies)
    ]
    rejected = np.mean([r.p_value < 0.05 for r in results])
    covered = np.mean([r.low <= 0 <= r.high for r in results])
    assert 0.02 <= rejected <= 0.08
    assert 0.92 <= covered <= 0.98


def test_span_f1_is_the_ratio_of_summed_counts() -> None:
    """Three sentences with (tp, predicted, gold) = (2, 3, 2), (0, 1, 0), (1, 1, 2): TP 3,
    predicted 5, gold 4; precision 3/5, recall 3/4, F1 = 2 * 0.6 * 0.75 / 1.35 = 2/3."""
    numerators, denominators = span_f1_counts(
        np.array([2, 0, 1]), np.array([3, 1, 1]), np.array([2, 0, 2])
    )
    run = RunScores(numerators[None], denominators[None], (1,))
    assert run.scores[0] == pytest.approx(2 / 3)


def test_unpaired_units_three_instances_by_five_seeds_against_five() -> None:
    rng = np.random.default_rng(3)
    control_units = tuple((instance, seed) for instance in range(3) for seed in SEEDS)
    control, trained = accuracy_runs(
        rng, control_units, 250, effect=0.05, seed_sd=0.01, other=SEEDS
    )
    result = compare(control, trained, paired=False)
    assert result.effect == pytest.approx(trained.scores.mean() - control.scores.mean())
    assert (result.units_a, result.units_b, result.sentences) == (15, 5, 250)
    assert "(15 and 5)" in result.method
    assert result.p_value < 0.05 and result.low < 0.05 < result.high


def test_grouped_control_instances_hold_the_level() -> None:
    """A control's 3 instances x 5 seeds against 5 trained seeds, no effect, the instances
    shifted with sd 3 points (seeds 0.5): 200 null studies. As 15 independent units the
    control's mean looks surer than it is, and the test rejects too often (measured 0.27 of
    studies); drawing the instances first holds the level (measured 0.04). Binomial(200, 0.05)
    has mean 10 and sd 3.1: a calibrated test rejects at most 20 studies (0.10, mean + 3.2 sd)
    but for about 1 seed in 1000, and 30 (0.15) is 6.5 sd beyond its mean; a test at the
    ungrouped 0.27 (54 +- 6.3) falls under 30 only 3.8 sd below its mean."""
    rng = np.random.default_rng(6)
    control_units = tuple((instance, seed) for instance in range(3) for seed in SEEDS)
    rejected = np.zeros(2)
    for study in range(200):
        control, trained = accuracy_runs(
            rng, control_units, 100, seed_sd=0.005, other=SEEDS, instance_sd=0.03
        )
        ungrouped = RunScores(control.numerators, control.denominators, control.units)
        for column, side in enumerate((ungrouped, control)):
            result = compare(side, trained, paired=False, samples=200, seed=study)
            rejected[column] += result.p_value < 0.05
    assert rejected[0] >= 30
    assert rejected[1] <= 20


def test_paired_units_pair_by_id_not_by_row() -> None:
    rng = np.random.default_rng(4)
    a, b = accuracy_runs(rng, SEEDS, 100, seed_sd=0.02)
    shuffled = b.take((3, 1, 5, 2, 4))
    assert compare(a, shuffled, paired=True) == compare(a, b, paired=True)


def test_adjust_by_hand() -> None:
    """p = 0.01, 0.04, 0.03, untestable, 0.5: four tests. Holm, ascending, times 4, 3, 2, 1:
    0.01 * 4 = 0.04, 0.03 * 3 = 0.09, 0.04 * 2 = 0.08 -> 0.09 (never below the one before),
    0.5 * 1 = 0.5. Benjamini-Hochberg, p * 4 / rank: 0.04, 0.06, 0.0533, 0.5, then each the
    minimum of itself and those above: 0.04, 0.0533, 0.0533, 0.5."""
    p = [0.01, 0.04, 0.03, None, 0.5]
    assert adjust(p, "holm") == pytest.approx([0.04, 0.09, 0.09, None, 0.5])
    assert adjust(p, "fdr_bh") == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, None, 0.5])
    assert adjust([None, None]) == [None, None]


def test_inconclusive_names_the_smallest_detectable_effect() -> None:
    rng = np.random.default_rng(5)
    result = compare(*accuracy_runs(rng, SEEDS, 100, seed_sd=0.02), paired=True)
    assert verdict(result, 0.2, "higher") == (
        f"inconclusive (smallest detectable effect {result.detectable:.3g})"
    )


def test_bad_inputs_are_one_line_errors() -> None:
    ones = np.ones((5, 10))
    a = RunScores(ones, ones, SEEDS)
    with pytest.raises(ElmolabError, match="the sides have 9 and 10 test sentences"):
        compare(a, RunScores(ones[:, :9], ones[:, :9], SEEDS), paired=True)
    with pytest.raises(ElmolabError, match=r"numerators \(5, 10\) and denominators \(5, 9\)"):
        RunScores(ones, ones[:, :9], SEEDS)
    with pytest.raises(ElmolabError, match="4 unit ids"):
        RunScores(ones, ones, SEEDS[:4])
    with pytest.raises(ElmolabError, match="paired units differ"):
        compare(a, RunScores(ones, ones, (1, 2, 3, 4, 6)), paired=True)
    with pytest.raises(ElmolabError, match="at least 2 units"):
        compare(RunScores(ones[:1], ones[:1], (1,)), a, paired=False)
    with pytest.raises(ElmolabError, match="2 group ids for 5 units"):
        RunScores(ones, ones, SEEDS, (1, 1))
    with pytest.raises(ElmolabError, match=r"side\(s\) 0 need at least 2 units"):
        compare(RunScores(ones, ones, SEEDS, (0,) * 5), a, paired=False)
    with pytest.raises(ElmolabError, match="grouped differently"):
        compare(
            RunScores(ones, ones, SEEDS, (0, 0, 1, 1, 1)),
            RunScores(ones, ones, SEEDS, SEEDS),
            paired=True,
        )
    with pytest.raises(ElmolabError, match=r"units \[2\] have no denominator"):
        RunScores(ones[:2], np.array([np.ones(10), np.zeros(10)]), (1, 2))


def test_a_contrast_of_four_sides_is_their_weighted_effect_and_two_sides_are_compare() -> None:
    rng = np.random.default_rng(3)
    sides = [
        RunScores(rng.binomial(20, p, (5, 60)), np.full((5, 60), 20), SEEDS)
        for p in (0.5, 0.7, 0.4, 0.45)
    ]
    net = contrast(
        [(-1, sides[0]), (1, sides[1]), (1, sides[2]), (-1, sides[3])], paired=True, seed=1
    )
    expected = sum(w * side.scores.mean() for w, side in zip((-1, 1, 1, -1), sides, strict=True))
    assert net.effect == pytest.approx(expected)
    assert net.low < net.effect < net.high
    assert contrast([(-1, sides[0]), (1, sides[1])], paired=True, seed=1) == compare(
        sides[0], sides[1], paired=True, seed=1
    )


def test_a_deterministic_method_may_have_one_unit_a_side() -> None:
    rng = np.random.default_rng(4)
    total = np.ones((1, 400))
    a = RunScores(rng.binomial(1, 0.6, (1, 400)), total, (None,))
    b = RunScores(rng.binomial(1, 0.6, (1, 400)), total, (None,))
    with pytest.raises(ElmolabError, match="at least 2 units"):
        compare(a, b, paired=True)
    effect = compare(a, b, paired=True, deterministic=True)
    assert effect.df == pytest.approx(399)  # the sentences alone
    assert effect.effect == pytest.approx(b.scores[0] - a.scores[0])
