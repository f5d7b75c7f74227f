"""One cell of the probing grid: a task, every feature mode, every encoder and every seed.

The cell gets its data loaded (:func:`elmolab.probing.cell_data.load_cell`: the task's splits and
each encoder's features, one contiguous array per split, before the jobs fork, so workers share
them) and its settings resolved by the stage (each encoder's feature modes among them,
:class:`elmolab.probing.modes.CellModes`); it reads no file of the data. A job is an encoder and a
training set (the full one, or a learning-curve subset): the probe engine trains the encoder's
feature modes on it and every seed together (:mod:`elmolab.probing.engine`). Results, under
``<cell> = <probes>/<task>`` (the layout of ``elmolab.io.results``, which the report reads;
:mod:`elmolab.probing.writing` writes them all, once the cell's fits are done)::

    <cell>/<features>/<encoder>/seed<k>/metrics.json            token, pair and tree tasks
    <cell>/<features>/<encoder>/seed<k>/fraction_<f>/...        learning-curve runs (token tasks)
    <cell>/<features>/<encoder>/seed<k>/test_predictions.txt    one test sentence a line
    <cell>/<features>/<encoder>/seed<k>/online_code.json        the online code (task mdl)
    <cell>/layer0+<mode>/<encoder>/seed<k>/metrics.json         conditional probes (conditional)
    <cell>/<features>/<encoder>/metrics.json                    wsd: nothing is random, no seeds
    <cell>/<features>/<encoder>/test_predictions.txt            wsd: "instance_id sense_key source"

``metrics.json`` holds ``task, features, encoder, seed, train_fraction, metric, dev, test,
best_epoch, epochs, hit_epoch_cap, mix_weights, gamma, wall_seconds, precision, n_train_tokens,
n_dev_tokens, n_test_tokens, n_train_sentences, per_sentence_test`` (per-sentence correct/total
test counts for counted metrics, else null), the epoch ``history`` and the kind's further scores
(``dev_dspr``/``test_dspr``, ``dev_untyped_f1``/``test_untyped_f1`` and span F1's typed chunk
counts per test sentence, ``per_sentence_test_spans``; a task measuring information,
``mdl`` or ``conditional``, adds ``dev_bits``/``test_bits`` and ``per_sentence_test_bits``; a
sentence task adds ``majority_label``, the most frequent train label, and
``dev_majority_baseline``/``test_majority_baseline``, its accuracy on dev and test (the score of a
probe that always predicts it), and counts items, one per sentence, as ``n_*_tokens``). The
online code and conditional probing (Voita and Titov 2020; Hewitt et al. 2021) are
``elmolab.io.results``'s to define. WSD writes F1 on the test
set (``dev``: on the dev set) with precision, recall, the back-off count, per-sentence counts of
correct instances (``per_sentence_test``) and WordNet's first-sense baseline on the same
instances (``dev_first_sense``/``test_first_sense``, F1; the same in every file); the learned
``scalar_mix`` does not apply to 1-NN, so its folder holds ``{"applicable": false, ...}``. The
whole cell appears at once, or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elmolab.core.schema import (
    EVAL_ROLES,
    SPLIT_ROLES,
    ProbeSettings,
    TaskConfig,
    TaskKind,
)
from elmolab.core.tracking import TrackedRun
from elmolab.data.labels import TaskLabels
from elmolab.io.results import (
    FIRST_SENSE,
    FeatureMode,
    conditional_features,
)
from elmolab.probing.cell_data import ProbeData, WsdData
from elmolab.probing.datasets import majority_baseline
from elmolab.probing.engine import online_code_block, train_heads
from elmolab.probing.heads import ProbeResult
from elmolab.probing.jobs import (
    Job,
    layer0_twins,
    online_code_blocks,
    plan_jobs,
    run_jobs,
)
from elmolab.probing.kinds import KINDS
from elmolab.probing.modes import CellModes
from elmolab.probing.writing import (
    CodeFit,
    RunStarter,
    write_cell,
    write_wsd_cell,
    wsd_line,
)
from elmolab.probing.wsd import (
    SensePrediction,
    first_sense_keys,
    fit_sense_centroids,
    per_sentence_counts,
    predict_senses,
    score_senses,
    wsd_vectors,
)

log = logging.getLogger("elmolab.probe")

WSD_METRIC = "f1"


@contextlib.contextmanager
def no_tracking(fields: dict[str, Any]) -> Iterator[TrackedRun]:
    """A :data:`RunStarter` that tracks nothing."""
    yield TrackedRun()


def run_cell(
    task: TaskConfig,
    modes: CellModes,
    data: ProbeData | WsdData,
    settings: ProbeSettings,
    seeds: Sequence[int],
    cell_dir: Path,
    start_run: RunStarter = no_tracking,
) -> list[dict[str, Any]]:
    """Probe ``task`` on every encoder in its feature modes of ``modes``, every seed; write
    ``cell_dir`` (``<probes>/<task>``).

    ``task``, ``modes``, ``settings`` and ``seeds`` are the cell's as the stage checked and
    resolved them (``elmolab.stages.probe.resolve_cell``), ``data`` its data as
    :func:`~elmolab.probing.cell_data.load_cell` loaded it. Returns the metrics of every run, as
    written.
    """
    if isinstance(data, WsdData):
        return _wsd_cell(task, modes, data, settings, cell_dir, start_run)
    return _probe_cell(task, modes, data, settings, seeds, cell_dir, start_run)


def _probe_cell(
    task: TaskConfig,
    modes: CellModes,
    data: ProbeData,
    settings: ProbeSettings,
    seeds: Sequence[int],
    cell_dir: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Token, pair and tree tasks: every job, ``settings.workers`` at a time, largest first."""
    splits, labels = data.splits, data.labels
    kind = TaskKind(task.kind)
    datasets = task.datasets()
    train_sentences = len(next(iter(splits.values()))["train"].sentence_lengths)
    twins = layer0_twins(settings, modes, datasets)
    blocks = online_code_blocks(train_sentences, settings) if task.mdl else None
    num_layers = next(iter(splits.values()))["train"].num_layers
    # what the kind's fits share (the structural probe's gold side): the same trees for every
    # encoder, made once for all jobs
    make_shared = KINDS[kind].shared
    shared = None if make_shared is None else make_shared(next(iter(splits.values())))
    jobs = plan_jobs(
        kind,
        modes,
        seeds,
        settings,
        twins,
        conditional=task.conditional,
        online_blocks=blocks,
        num_layers=num_layers,
        train_sentences=train_sentences,
    )
    fits = run_jobs(
        [
            lambda job=job: _fit(task, kind, job, splits[job.encoder], labels, settings, shared)
            for job in jobs
        ],
        settings.workers,
    )
    codes = [(job, fit) for job, fit in zip(jobs, fits, strict=True) if job.block is not None]
    runs = [
        (job, result, counts)
        for job, (fit, counts) in zip(jobs, fits, strict=True)
        if job.block is None
        for result in fit
    ]
    results = write_cell(
        cell_dir, task, runs, codes, blocks, splits, labels, settings, twins, modes, start_run
    )
    order = {encoder: i for i, encoder in enumerate(settings.encoders)}
    # the grid's modes in order, then the conditional probes' (layer0+<mode>)
    grid = modes.grid
    mode_order = {mode: i for i, mode in enumerate(grid)}
    mode_order |= {conditional_features(m): len(grid) + i for i, m in enumerate(grid)}
    return sorted(
        results,
        key=lambda m: (
            mode_order[m["features"]],
            order[m["encoder"]],
            m["seed"],
            -m["train_fraction"],
        ),
    )


def _fit(
    task: TaskConfig,
    kind: TaskKind,
    job: Job,
    splits: dict[str, Any],
    labels: TaskLabels | None,
    settings: ProbeSettings,
    shared: Any = None,
) -> tuple[list[ProbeResult], dict[str, Any]] | CodeFit:
    """One job's results, and the counts of the splits it trained and scored on (``shared``: what
    the kind's fits share, made once for the cell; a sentence task's majority baseline too). An
    online-code job's is the code length of block ``job.block``'s labels under probes trained on
    the blocks before it (early stopping on dev, as every probe), and the fit's time."""
    started = time.perf_counter()
    train = splits["train"] if job.train is None else splits["train"].subset(job.train)
    fit_splits = {**splits, "train": train}
    majority = (
        majority_baseline(fit_splits, labels.vocabulary)
        if kind is TaskKind.SENTENCE and labels is not None
        else {}
    )
    if job.block is None:
        results = train_heads(
            job.heads,
            fit_splits,
            settings,
            kind=kind.value,
            metric=task.metric if KINDS[kind].labelled else None,
            vocabulary=None if labels is None else labels.vocabulary,
            bits=(task.mdl or task.conditional) and job.fraction == 1.0,
            shared=shared,
        )
        counts = {
            f"n_{role}_tokens": int(fit_splits[role].features.shape[1]) for role in SPLIT_ROLES
        }
        counts["n_train_sentences"] = len(train.sentence_lengths)
        if labels is not None:
            counts.update(labels.counts)
        counts.update(majority)
        for result in results:
            log.info(
                "%s/%s/%s/seed%d%s: dev %.4f, test %.4f (%s, best epoch %d of %d%s)",
                task.name,
                result.features,
                job.encoder,
                result.seed,
                "" if job.fraction == 1.0 else f"/fraction_{job.fraction:g}",
                result.dev,
                result.test,
                result.metric,
                result.best_epoch,
                result.epochs,
                ", epoch cap" if result.hit_epoch_cap else "",
            )
        return results, counts
    assert labels is not None
    if not job.coded:  # a share too small to add a sentence: nothing to code
        return [0.0] * len(job.heads), 0.0
    fit_splits["block"] = splits["train"].subset(job.coded)
    bits = online_code_block(
        job.heads, fit_splits, settings, metric=task.metric, vocabulary=labels.vocabulary
    )
    return bits, time.perf_counter() - started


def _wsd_cell(
    task: TaskConfig,
    modes: CellModes,
    data: WsdData,
    settings: ProbeSettings,
    cell_dir: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """1-NN word senses: each encoder's frozen modes scored on its instance vectors."""
    results = []
    for encoder in settings.encoders:
        if FeatureMode.SCALAR_MIX in modes.full[encoder]:
            results.append(
                {
                    "task": task.name,
                    "features": FeatureMode.SCALAR_MIX.value,
                    "encoder": encoder,
                    "seed": None,
                    "applicable": False,
                    "reason": "WSD 1-NN trains nothing: there is no scalar mix to learn",
                }
            )
    frozen = {
        encoder: [mode for mode in modes.full[encoder] if mode != FeatureMode.SCALAR_MIX]
        for encoder in settings.encoders
    }
    predictions: dict[tuple[str, str], list[str]] = {}
    if any(frozen.values()):
        sources, wordnet = data.sources, data.wordnet
        train_keys = [i.sense_keys for s in sources["train"].wsd_sentences() for i in s.instances]
        evaluation = {
            role: _WsdSplit.of(sources[role].wsd_sentences(), wordnet) for role in EVAL_ROLES
        }
        # The first-sense baseline reads no features: one score per split for every mode and
        # encoder.
        first_sense = {
            f"{role}_{FIRST_SENSE}": score_senses(
                first_sense_keys(split.lemma_pos, split.first_sense), split.gold
            ).f1
            for role, split in evaluation.items()
        }
        ids = [i.instance_id for i in evaluation["test"].instances]
        for encoder in settings.encoders:
            layers = data.layers[encoder]
            for mode in frozen[encoder]:
                fields = {"task": task.name, "features": mode, "encoder": encoder, "seed": None}
                metrics, test = _wsd_scores(fields, layers, mode, train_keys, evaluation)
                metrics.update(first_sense)
                if settings.save_predictions:
                    predictions[(mode, encoder)] = list(map(wsd_line, ids, test))
                log.info(
                    "%s/%s/%s: dev F1 %.4f, test F1 %.4f (first sense %.4f)",
                    task.name,
                    mode,
                    encoder,
                    metrics["dev"],
                    metrics["test"],
                    first_sense[f"test_{FIRST_SENSE}"],
                )
                results.append(metrics)
    write_wsd_cell(cell_dir, results, predictions, start_run)
    return results


@dataclass(frozen=True)
class _WsdSplit:
    """A WSD evaluation split: its instances in sentence order and what WordNet says of them."""

    instances: list[Any]
    sentence_sizes: list[int]  # instances per sentence
    lemma_pos: list[tuple[str, str]]  # per instance
    gold: list[Any]  # per instance: its gold sense keys
    candidates: dict[tuple[str, str], list[str]]  # (lemma, pos) -> WordNet's sense keys
    first_sense: dict[tuple[str, str], str]  # (lemma, pos) -> WordNet's sense 1, where it has one

    @classmethod
    def of(cls, sentences: Sequence[Any], wordnet: Any) -> _WsdSplit:
        instances = [i for s in sentences for i in s.instances]
        lemma_pos = [(i.lemma.lower(), i.pos) for i in instances]
        words = set(lemma_pos)
        return cls(
            instances,
            [len(s.instances) for s in sentences],
            lemma_pos,
            [i.sense_keys for i in instances],
            {word: wordnet.senses(*word) for word in words},
            {w: k for w in words if (k := wordnet.first_sense(*w)) is not None},
        )


def _wsd_scores(
    fields: dict[str, Any],
    layers: dict[str, torch.Tensor],
    mode: str,
    train_keys: list,
    evaluation: dict[str, _WsdSplit],
) -> tuple[dict[str, Any], list[SensePrediction]]:
    """One mode's sense centroids, dev and test predictions, and metrics.json content."""
    centroids = fit_sense_centroids(wsd_vectors(layers["train"], mode), train_keys)
    scores, predictions = {}, {}
    for role, split in evaluation.items():
        predictions[role] = predict_senses(
            centroids,
            wsd_vectors(layers[role], mode),
            split.lemma_pos,
            split.candidates,
            split.first_sense,
        )
        scores[role] = score_senses([p.key for p in predictions[role]], split.gold)
    test = evaluation["test"]
    correct, total = per_sentence_counts(
        [p.key for p in predictions["test"]], test.gold, test.sentence_sizes
    )
    metrics = {
        **fields,
        "metric": WSD_METRIC,
        "dev": scores["dev"].f1,
        "test": scores["test"].f1,
        "precision": scores["test"].precision,
        "recall": scores["test"].recall,
        "backed_off": sum(p.source == "first_sense" for p in predictions["test"]),
        "unanswered": sum(p.source == "unanswered" for p in predictions["test"]),
        "mix_weights": None,
        "gamma": None,
        "n_train_instances": len(train_keys),
        "n_senses": len(centroids.rows),
        "n_dev_instances": scores["dev"].total,
        "n_test_instances": scores["test"].total,
        # correct instances / instances per test sentence: recall's counts (the paired bootstrap)
        "per_sentence_test": {"correct": correct, "total": total},
    }
    return metrics, predictions["test"]
