"""One cell of the probing grid: a task, every feature mode, every encoder and every seed.

The cell gets its data loaded (:func:`elmolab.probing.cell_data.load_cell`: the task's splits and
each encoder's features, one contiguous array per split, before the jobs fork, so workers share
them) and its settings resolved by the stage; it reads no file of the data. A job is an encoder
and a training set (the full one, or a learning-curve subset): the probe engine trains every
feature mode and seed of it together (:mod:`elmolab.probing.engine`). Results, under
``<cell> = <probes>/<task>`` (the layout of ``elmolab.io.results``, which the report reads)::

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
(``dev_dspr``/``test_dspr``, ``dev_untyped_f1``/``test_untyped_f1``; a task measuring information,
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.core.schema import (
    EVAL_ROLES,
    SPLIT_ROLES,
    ProbeSettings,
    TaskConfig,
    TaskKind,
)
from elmolab.core.tracking import TrackedRun, metric_key
from elmolab.data.labels import LabelVocabulary, TaskLabels
from elmolab.io.results import (
    FIRST_SENSE,
    MAJORITY_BASELINE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    FeatureMode,
    conditional_features,
)
from elmolab.probing.cell_data import ProbeData, WsdData
from elmolab.probing.datasets import FeatureDataset
from elmolab.probing.engine import online_code_block, train_heads
from elmolab.probing.heads import ProbeResult
from elmolab.probing.jobs import (
    Job,
    layer0_twins,
    online_code_blocks,
    plan_jobs,
    run_jobs,
    training_subset,
)
from elmolab.probing.kinds import KINDS
from elmolab.probing.writing import (
    CodeFit,
    copy_runs,
    probe_metrics,
    track_run,
    write_lines,
    write_online_codes,
    write_run,
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

# Starts the tracking run of one probe run: its identifying fields -> a TrackedRun context.
RunStarter = Callable[[dict[str, Any]], AbstractContextManager[TrackedRun]]


@contextlib.contextmanager
def no_tracking(fields: dict[str, Any]) -> Iterator[TrackedRun]:
    """A :data:`RunStarter` that tracks nothing."""
    yield TrackedRun()


def run_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: ProbeData | WsdData,
    settings: ProbeSettings,
    seeds: Sequence[int],
    cell_dir: Path,
    start_run: RunStarter = no_tracking,
) -> list[dict[str, Any]]:
    """Probe ``task`` in every feature mode of ``modes`` on every encoder and seed; write
    ``cell_dir`` (``<probes>/<task>``).

    ``task``, ``modes``, ``settings`` and ``seeds`` are the cell's as the stage checked and
    resolved them (``elmolab.stages.probe.resolve_cell``), ``data`` its data as
    :func:`~elmolab.probing.cell_data.load_cell` loaded it. Returns the metrics of every run, as
    written.
    """
    with atomic_dir(cell_dir) as tmp:
        if isinstance(data, WsdData):
            results = _wsd_cell(task, modes, data, settings, tmp, start_run)
        else:
            results = _probe_cell(task, modes, data, settings, seeds, tmp, start_run)
    return results


def _probe_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: ProbeData,
    settings: ProbeSettings,
    seeds: Sequence[int],
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Token, pair and tree tasks: every job, ``settings.workers`` at a time, largest first."""
    splits, labels = data.splits, data.labels
    kind = TaskKind(task.kind)
    twins = layer0_twins(settings, modes, task.datasets())
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
        mdl=task.mdl,
        num_layers=num_layers,
    )
    fits = run_jobs(
        [
            lambda job=job: (
                _code_fit(job, splits[job.encoder], labels, settings, task.metric)
                if job.block is not None
                else _fit(task, kind, job, splits[job.encoder], labels, settings, shared)
            )
            for job in jobs
        ],
        settings.workers,
    )
    codes = [(job, fit) for job, fit in zip(jobs, fits, strict=True) if job.block is not None]
    if codes:
        assert labels is not None
        write_online_codes(task, codes, splits, labels, settings, twins, out)
    results = []
    for job, (fit, counts) in zip(jobs, fits, strict=True):
        if job.block is not None:
            continue
        for result in fit:
            fields = {
                "task": task.name,
                "features": result.features,
                "encoder": job.encoder,
                "seed": result.seed,
            }
            metrics = probe_metrics(fields, job.fraction, result, counts, settings.precision)
            write_run(out, metrics, result, settings)
            with start_run({**fields, "train_fraction": job.fraction}) as run:
                track_run(run, metrics, result)
            results.append(metrics)
    for encoder, twin in twins.items():
        results += copy_runs(results, twin, encoder, out)
    order = {encoder: i for i, encoder in enumerate(settings.encoders)}
    # the grid's modes in order, then the conditional probes' (layer0+<mode>)
    mode_order = {mode: i for i, mode in enumerate(modes)}
    mode_order |= {conditional_features(m): len(modes) + i for i, m in enumerate(modes)}
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
) -> tuple[list[ProbeResult], dict[str, Any]]:
    """One job's results, and the counts of the splits it trained and scored on (``shared``: what
    the kind's fits share, made once for the cell; a sentence task's majority baseline too)."""
    train = splits["train"]
    if job.fraction < 1.0:
        train = train.subset(training_subset(len(train.sentence_lengths), job.fraction, settings))
    fit_splits = {**splits, "train": train}
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
    counts = {f"n_{role}_tokens": int(fit_splits[role].features.shape[1]) for role in SPLIT_ROLES}
    counts["n_train_sentences"] = len(train.sentence_lengths)
    if labels is not None:
        counts.update(labels.counts)
    if kind is TaskKind.SENTENCE:
        assert labels is not None
        counts.update(majority_baseline(fit_splits, labels.vocabulary))
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


def majority_baseline(
    splits: Mapping[str, FeatureDataset], vocabulary: LabelVocabulary
) -> dict[str, Any]:
    """The majority-class baseline: the most frequent label of ``splits["train"]`` (the first in
    the vocabulary's order among equals) and the share of dev's and test's items that hold it,
    the accuracy of a probe that always predicts it: ``majority_label``,
    ``dev_majority_baseline``, ``test_majority_baseline``."""
    train = splits["train"].labels  # (items,)
    label = int(torch.bincount(train, minlength=len(vocabulary)).argmax())
    shares = {role: float((splits[role].labels == label).double().mean()) for role in EVAL_ROLES}
    return {
        "majority_label": vocabulary.labels[label],
        **{f"{role}_{MAJORITY_BASELINE}": share for role, share in shares.items()},
    }


def _code_fit(
    job: Job,
    splits: dict[str, Any],
    labels: TaskLabels | None,
    settings: ProbeSettings,
    metric: str,
) -> CodeFit:
    """The code length of block ``job.block``'s labels under probes trained on the blocks before
    it (early stopping on dev, as every probe)."""
    assert job.block is not None and labels is not None
    started = time.perf_counter()
    train = splits["train"]
    blocks = online_code_blocks(len(train.sentence_lengths), settings)
    if not blocks[job.block]:  # a share too small to add a sentence: nothing to code
        return [0.0] * len(job.heads), 0.0
    before = sorted(i for block in blocks[: job.block] for i in block)
    fit_splits = {**splits, "train": train.subset(before), "block": train.subset(blocks[job.block])}
    bits = online_code_block(
        job.heads, fit_splits, settings, metric=metric, vocabulary=labels.vocabulary
    )
    return bits, time.perf_counter() - started


def _wsd_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: WsdData,
    settings: ProbeSettings,
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """1-NN word senses: every frozen mode scored on each encoder's instance vectors."""
    results = []
    if FeatureMode.SCALAR_MIX.value in modes:
        for encoder in settings.encoders:
            metrics = {
                "task": task.name,
                "features": FeatureMode.SCALAR_MIX.value,
                "encoder": encoder,
                "seed": None,
                "applicable": False,
                "reason": "WSD 1-NN trains nothing: there is no scalar mix to learn",
            }
            write_json(out / FeatureMode.SCALAR_MIX.value / encoder / METRICS_FILE, metrics)
            results.append(metrics)
    frozen = [mode for mode in modes if mode != FeatureMode.SCALAR_MIX.value]
    if not frozen:
        return results
    sources, wordnet = data.sources, data.wordnet
    train_keys = [i.sense_keys for s in sources["train"].wsd_sentences() for i in s.instances]
    evaluation = {role: _WsdSplit.of(sources[role].wsd_sentences(), wordnet) for role in EVAL_ROLES}
    # The first-sense baseline reads no features: one score per split for every mode and encoder.
    first_sense = {
        f"{role}_{FIRST_SENSE}": score_senses(
            first_sense_keys(split.lemma_pos, split.first_sense), split.gold
        ).f1
        for role, split in evaluation.items()
    }
    for encoder in settings.encoders:
        layers = data.layers[encoder]
        for mode in frozen:
            fields = {"task": task.name, "features": mode, "encoder": encoder, "seed": None}
            with start_run(fields) as run:
                metrics, predictions = _wsd_scores(fields, layers, mode, train_keys, evaluation)
                run.summarize(
                    {
                        metric_key("val", WSD_METRIC): metrics["dev"],
                        metric_key("test", WSD_METRIC): metrics["test"],
                    }
                )
            metrics.update(first_sense)
            write_json(out / mode / encoder / METRICS_FILE, metrics)
            if settings.save_predictions:
                ids = [i.instance_id for i in evaluation["test"].instances]
                lines = map(wsd_line, ids, predictions)
                write_lines(out / mode / encoder / PREDICTIONS_FILE, lines)
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
