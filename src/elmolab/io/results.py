"""The result files the stages hand to the report: names, folder layout and columns, defined once
for the writers (``elmolab.training.pretrain``, ``elmolab.probing.runner``) and the reader
(``elmolab.report.collect``, which validates every field it reads).

Pretraining (``artifacts/bilm/``, the random control ``artifacts/bilm_random/``)::

    metrics.json    steps, tokens, perplexities per split and direction, precision, ...
    curve.csv       the learning curve, CURVE_COLUMNS (empty cells: no validation at that row)

Probes, one folder per run under ``<probes>/<task>/<features>/<encoder>/`` (:func:`run_folder`)::

    seed<k>/metrics.json                    a seeded run on all the training data
    seed<k>/fraction_<f>/metrics.json       a learning-curve run: a share f (0 < f < 1) of them
    metrics.json                            a run without seeds (wsd 1-NN: nothing is random)
    .../test_predictions.txt                beside it: one test sentence a line

A probe run's ``metrics.json`` holds its identity (``task, features, encoder, seed``, which must
agree with its path, and ``train_fraction``), ``metric, dev, test`` (``applicable: false`` and no
scores where a mode does not apply), the training record (``best_epoch, epochs, hit_epoch_cap,
history, wall_seconds``), the mix (``mix_weights, gamma``), the split sizes (``n_train_tokens``,
..., ``n_train_sentences``), further scores as ``dev_<name>``/``test_<name>`` and, for counted
metrics, ``per_sentence_test`` ``{correct, total}`` (the report's paired bootstrap); for span F1,
``per_sentence_test_spans`` ``{tp, pred, gold}``: each test sentence's right, predicted and gold
typed chunks, whose sums over any resample of sentences give its F1
(``elmolab.probing.metrics.span_f1_of_counts``; on all of them, ``test`` itself, the same float).

WSD 1-NN adds WordNet's first-sense baseline on the same instances (``dev_first_sense``,
``test_first_sense``: F1, the same in each of its files) and counts, as ``per_sentence_test``,
correct instances of each test sentence (recall's counts). A sentence task adds its majority-class
baseline (``dev_majority_baseline``, ``test_majority_baseline``: the accuracy of the most frequent
training label, a fraction like every accuracy). The report shows both beside the task's score.

Tasks that measure information (a token task with ``conditional`` or ``mdl`` set) add, to every run
on all the training data, its cross-entropy in bits per token with the best dev state
(``dev_bits``, ``test_bits``) and each test sentence's summed bits (``per_sentence_test_bits``;
where the metric is not counted, such as span F1, each test sentence's tokens beside them,
``per_sentence_test_tokens``).
Conditional probing (``conditional``) adds runs whose features are layer 0 beside another mode,
named by :func:`conditional_features` (``layer0+layer1``, ``layer0+layer2``,
``layer0+scalar_mix``). The online code (``mdl``) of a feature mode, encoder and seed is
``seed<k>/online_code.json`` beside that run's folder entries: ``task, features, encoder, seed``,
``labels`` (the label count of the uniform code), ``fractions`` (the nested shares of training
sentences ending each block, the last 1.0), ``block_tokens`` and ``block_bits`` (per block: its
labels' code length in bits, the first block's under the uniform code, each later one's under a
probe trained on every block before it), ``uniform_bits``, ``online_bits``, ``compression``
(uniform / online), ``wall_seconds`` (the block probes' training time) and, where the run was
copied from an encoder with identical features, ``same_features_as``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

from elmolab.core.errors import ElmolabError
from elmolab.io.features import ENCODER_SUMMARY

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "test_predictions.txt"
CURVE_FILE = "curve.csv"
# curve.csv: training step and tokens, then logged metrics (Lightning's "val/ppl" -> "val_ppl")
CURVE_COLUMNS = (
    "step",
    "tokens",
    "train_loss",
    "val_ppl",
    "val_ppl_fwd",
    "val_ppl_bwd",
    "val_stateless_ppl",
    "val_stateless_ppl_fwd",
    "val_stateless_ppl_bwd",
)
CURVE_REQUIRED = CURVE_COLUMNS[:6]  # what the report reads (curves from before stateless ones)
SEED_PREFIX = "seed"
FRACTION_PREFIX = "fraction_"
ONLINE_CODE_FILE = "online_code.json"
# Baselines that read no features, beside a task's score as dev_<name> and test_<name>.
FIRST_SENSE = "first_sense"  # WSD: WordNet's first sense of every instance
MAJORITY_BASELINE = "majority_baseline"  # sentence tasks: the most frequent training label
# Conditional probing: the baseline the other modes are conditioned on, and the modes that join it.
CONDITIONAL_BASE = "layer0"
CONDITIONAL_MODES = ("layer1", "layer2", "scalar_mix")


class FeatureMode(StrEnum):
    """The probing feature modes (docs/architecture.md §5; ``elmolab.models.scalar_mix`` computes
    them); ``layer0`` is the char CNN's output. A probe run's folder and the ``features`` of its
    ``metrics.json`` name one, so the report reads them here without the model code."""

    LAYER0 = "layer0"
    LAYER1 = "layer1"
    LAYER2 = "layer2"
    MEAN = "mean"  # frozen uniform weights
    SCALAR_MIX = "scalar_mix"  # learned weights and gamma
    CONCAT = "concat"  # the three layers side by side

    @classmethod
    def parse(cls, name: str) -> FeatureMode:
        """The mode called ``name``; an ElmolabError lists the valid names otherwise."""
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(mode.value for mode in cls)
            raise ElmolabError(f"unknown feature mode {name!r} (expected one of {valid})") from None


def conditional_features(mode: str) -> str:
    """The ``features`` name of layer 0 beside ``mode`` (``layer0+layer1``)."""
    return f"{CONDITIONAL_BASE}+{mode}"


def run_folder(seed: int | None, fraction: float = 1.0) -> Path:
    """A probe run's folder relative to ``<task>/<features>/<encoder>/``."""
    if seed is None:
        if fraction != 1.0:
            raise ValueError("a learning-curve run has a seed")
        return Path()
    folder = Path(f"{SEED_PREFIX}{seed}")
    return folder if fraction == 1.0 else folder / f"{FRACTION_PREFIX}{fraction:g}"


def probe_run_paths(probes_dir: Path) -> list[Path]:
    """Every probe run on all the training data under ``probes_dir``, seeded or not."""
    return sorted(
        [
            *probes_dir.glob(f"*/*/*/{SEED_PREFIX}*/{METRICS_FILE}"),
            *probes_dir.glob(f"*/*/*/{METRICS_FILE}"),
        ]
    )


def learning_curve_paths(probes_dir: Path) -> list[Path]:
    """Every learning-curve run under ``probes_dir``."""
    return sorted(probes_dir.glob(f"*/*/*/{SEED_PREFIX}*/{FRACTION_PREFIX}*/{METRICS_FILE}"))


def online_code_paths(probes_dir: Path) -> list[Path]:
    """Every online code result under ``probes_dir``."""
    return sorted(probes_dir.glob(f"*/*/*/{SEED_PREFIX}*/{ONLINE_CODE_FILE}"))


# Fields that record how long a computation took, how much memory it held, or whether it
# resumed, not what it computed.
TIMING_FIELDS = frozenset(
    {
        "wall_seconds",
        "tokens_per_second",
        "resumed",
        "seconds",
        "words_per_second",
        "peak_rss_bytes",
        "peak_rss_children_bytes",
    }
)


def without_timings(value: Any) -> Any:
    """A JSON value with every :data:`TIMING_FIELDS` key left out, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def reproducible_results(artifacts: Path) -> dict[str, Any]:
    """What a finished pipeline under ``artifacts`` computed, by path: the biLM's and the random
    control's metrics, every probe run's metrics and online code, every extraction record
    (``ENCODER_SUMMARY``), every task model run's metrics, the polysemy table, without timings,
    and every test prediction file's text. Two runs of the same code on the same data and machine
    must agree on all of it."""
    probes = artifacts / "probes"
    single = [
        *(artifacts / name / METRICS_FILE for name in ("bilm", "bilm_random", "taskmodel")),
        artifacts / "polysemy" / "neighbours.json",
    ]
    files = [
        *(path for path in single if path.is_file()),  # a stage the study did not run: none
        *sorted(probes.rglob(METRICS_FILE)),
        *sorted(probes.rglob(ONLINE_CODE_FILE)),
        *sorted((artifacts / "features").glob(f"*/*/{ENCODER_SUMMARY}")),
        *sorted((artifacts / "taskmodel").glob(f"*/*/{METRICS_FILE}")),
    ]
    results: dict[str, Any] = {
        str(path.relative_to(artifacts)): without_timings(json.loads(path.read_text()))
        for path in files
    }
    for path in sorted(probes.rglob(PREDICTIONS_FILE)):
        results[str(path.relative_to(artifacts))] = path.read_text(encoding="utf-8")
    return results
