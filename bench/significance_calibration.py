"""How often each significance test rejects a true null, and how often its 95% interval covers
the true effect, over simulated probe studies: elmolab.report.significance against the tests
it replaces.

A study: a and b (accuracy) scored by ``--seeds`` seeds on ``--sentences`` test sentences of 5-40
tokens, correct tokens binomial per sentence; each sentence has a difficulty shared by both
(sd 10 points) and a sentence-by-model part (half to b, half from a), each seed its own shift.
Regimes (seed sd, sentence-by-model sd, in points): seeds (1, 0), sentences (0, 15), both
(0.6, 10), neither (0, 0). Rejection: over null studies (no effect), at 0.05; coverage: over
studies with a true effect of 2 points, the share of 95% intervals holding it (the sentence
bootstrap of report.stats has no interval: it "covers" where it does not reject the true effect,
b's counts shifted by it).

Methods, paired design: the report's test before (sentences resampled, seed-averaged); the paired
t-test over seeds; two-level percentile bootstraps with sentences nested in seeds and crossed
with them; report.significance.compare.

Clustered controls: a control of 3 instances x ``--seeds`` seeds (instance sd 1 point, seed sd
0.5, no sentence-by-model part) against a trained encoder's seeds, as good on average:
compare's rejection with and without ``groups``.

Run: .venv/bin/python bench/significance_calibration.py [--studies 400 --seeds 5
--sentences 300 --resamples 1000 --seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from elmolab.core.hardware import cpu_model
from elmolab.report.significance import RunScores, compare


def seed_averaged_bootstrap(
    correct_a: np.ndarray, correct_b: np.ndarray, total: np.ndarray, samples: int, seed: int
) -> float:
    """The report's test before the two-level bootstrap: each sentence's b - a averaged over the
    seeds (correct_*: (seeds, sentences); total: (sentences,)), then only the sentences
    resampled; the two-sided p-value of the accuracy difference."""
    d = (correct_b - correct_a).mean(axis=0)  # (sentences,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(total), size=(samples, len(total)))  # (samples, sentences)
    delta = d[idx].sum(axis=1) / np.maximum(total[idx].sum(axis=1), 1)  # (samples,)
    tail = min(int((delta <= 0).sum()), int((delta >= 0).sum()))
    return min(1.0, 2 * (1 + tail) / (samples + 1))


REGIMES = {"seeds": (0.01, 0.0), "sentences": (0.0, 0.15), "both": (0.006, 0.1), "neither": (0, 0)}
EFFECT = 0.02
METHODS = ("sentence bootstrap (stats.py)", "paired t over seeds", "nested percentile")
METHODS += ("crossed percentile", "this module")


def study(
    rng: np.random.Generator,
    units_a: int,
    units_b: int,
    sentences: int,
    *,
    effect: float,
    seed_sd: float,
    sentence_sd: float,
    instances: int = 0,
    instance_sd: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correct tokens of a and b, (units, sentences) each, and the tokens, (sentences,). With
    ``instances``, a's units are that many instances' seeds in turn, each instance shifted
    (sd ``instance_sd``)."""
    tokens = rng.integers(5, 40, sentences)  # (sentences,)
    base = 0.75 + rng.normal(0, 0.1, sentences)  # (sentences,)
    favour = rng.normal(0, sentence_sd, sentences) / 2  # (sentences,)
    shift_a = rng.normal(0, seed_sd, (units_a, 1))  # (units_a, 1)
    if instances:
        shift_a += np.repeat(rng.normal(0, instance_sd, instances), units_a // instances)[:, None]
    p_a = np.clip(base - favour + shift_a, 0, 1)  # (units_a, sentences)
    p_b = np.clip(base + favour + effect + rng.normal(0, seed_sd, (units_b, 1)), 0, 1)
    return rng.binomial(tokens, p_a), rng.binomial(tokens, p_b), tokens


def percentile(reps: np.ndarray) -> tuple[float, float]:
    """The percentile bootstrap's 95% interval."""
    low, high = np.quantile(reps, [0.025, 0.975])
    return float(low), float(high)


def two_level(
    rng: np.random.Generator, ratios: list[np.ndarray], tokens: np.ndarray, resamples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Resampled mean paired differences, nested (each drawn seed its own sentence draw) and
    crossed (one sentence draw for all seeds); ``ratios``: a's and b's correct tokens."""
    correct_a, correct_b = ratios
    seeds, n = correct_a.shape
    pick = rng.integers(0, seeds, (resamples, seeds))  # (resamples, seeds)
    rows = rng.integers(0, n, (resamples, seeds, n))  # (resamples, seeds, sentences)
    total = tokens[rows].sum(axis=-1)  # (resamples, seeds)
    diff = correct_b - correct_a  # (seeds, sentences)
    nested = (diff[pick[:, :, None], rows].sum(axis=-1) / total).mean(axis=1)  # (resamples,)
    weights = np.stack([np.bincount(r, minlength=n) for r in rows[:, 0]])  # (resamples, n)
    per_seed = (weights @ diff.T) / (weights @ tokens)[:, None]  # (resamples, seeds)
    crossed = np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)  # (resamples,)
    return nested, crossed


def paired_methods(
    rng: np.random.Generator, args: argparse.Namespace, regime: tuple, effect: float, index: int
) -> list[bool]:
    """Per method, for one study with a true ``effect``: whether it rejects that effect (its
    interval misses it)."""
    a, b, tokens = study(
        rng,
        args.seeds,
        args.seeds,
        args.sentences,
        effect=effect,
        seed_sd=regime[0],
        sentence_sd=regime[1],
    )
    total = np.broadcast_to(tokens, a.shape)  # (seeds, sentences)
    seeds = tuple(range(args.seeds))
    runs = RunScores(a, total, seeds), RunScores(b, total, seeds)
    missed = [seed_averaged_bootstrap(a, b - effect * tokens, tokens, args.resamples, index) < 0.05]
    low, high = stats.ttest_1samp(runs[1].scores - runs[0].scores, 0).confidence_interval(0.95)
    missed.append(not low <= effect <= high)
    for reps in two_level(rng, [a, b], tokens, args.resamples):
        low, high = percentile(reps)
        missed.append(not low <= effect <= high)
    result = compare(*runs, paired=True, samples=args.resamples, seed=index)
    missed.append(not result.low <= effect <= result.high)
    return missed


def clustered(rng: np.random.Generator, args: argparse.Namespace, index: int) -> list[bool]:
    """Whether compare rejects a null control-versus-trained study without and with
    ``groups``."""
    instances = 3
    control, trained, tokens = study(
        rng,
        instances * args.seeds,
        args.seeds,
        args.sentences,
        effect=0.0,
        seed_sd=0.005,
        sentence_sd=0.0,
        instances=instances,
        instance_sd=0.01,
    )
    units = tuple((i, s) for i in range(instances) for s in range(args.seeds))
    side_b = RunScores(trained, np.broadcast_to(tokens, trained.shape), tuple(range(args.seeds)))
    total = np.broadcast_to(tokens, control.shape)
    return [
        compare(
            RunScores(control, total, units, groups),
            side_b,
            paired=False,
            samples=args.resamples,
            seed=index,
        ).p_value
        < 0.05
        for groups in (None, tuple(i for i, _ in units))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=400, help="per regime and table")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    print(
        f"{args.studies} studies per cell, {args.seeds} seeds, {args.sentences} sentences, "
        f"{args.resamples} resamples, seed {args.seed}"
    )
    print(f"{'rejected at 0.05 / covered (95%)':32}" + "".join(f"{r:>14}" for r in REGIMES))
    cells = {}
    for name, regime in REGIMES.items():
        for effect in (0.0, EFFECT):
            runs = [paired_methods(rng, args, regime, effect, i) for i in range(args.studies)]
            cells[name, effect] = np.mean(runs, axis=0)  # (methods,)
    for m, method in enumerate(METHODS):
        row = "".join(f"{cells[r, 0.0][m]:>7.3f}/{1 - cells[r, EFFECT][m]:.3f}" for r in REGIMES)
        print(f"{method:32}{row}")
    rejected = np.mean([clustered(rng, args, i) for i in range(args.studies)], axis=0)
    print(
        f"control of 3 instances (sd 1 point) x {args.seeds} seeds against {args.seeds} seeds, "
        f"null: rejected {rejected[0]:.3f} without groups, {rejected[1]:.3f} with"
    )
    print(f"{cpu_model()}, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
