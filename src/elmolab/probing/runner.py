"""One cell of the probing grid: a task, every feature mode, every encoder and every seed.

The task's data is read once per cell and each encoder's features once per cell, into one
contiguous array per split, before the jobs fork (so workers share them). A job is an encoder and a
training set (the full one, or a learning-curve subset): the probe engine trains every feature
mode and seed of it together (:mod:`elmolab.probing.engine`). Results, under
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
import dataclasses
import json
import logging
import math
import multiprocessing as mp
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from elmolab.config import section
from elmolab.errors import ElmolabError
from elmolab.fsutil import atomic_dir, write_json
from elmolab.hardware import peak_memory
from elmolab.io.features import feature_path, summary_path
from elmolab.io.results import (
    CONDITIONAL_MODES,
    FIRST_SENSE,
    MAJORITY_BASELINE,
    METRICS_FILE,
    ONLINE_CODE_FILE,
    PREDICTIONS_FILE,
    conditional_features,
    run_folder,
)
from elmolab.models.scalar_mix import FeatureMode
from elmolab.probing.datasets import (
    FeatureDataset,
    TreeDataset,
    pool_sentences,
    standardize_layers,
)
from elmolab.probing.engine import (
    EVAL_ROLES,
    Head,
    ProbeResult,
    ProbeSettings,
    StructuralGold,
    online_code_block,
    probe_dtype,
    probe_precision,
    train_heads,
)
from elmolab.probing.metrics import LabelVocabulary, TaskMetric
from elmolab.probing.tasks import (
    TREE_METRICS,
    DataCatalog,
    SplitSource,
    TaskConfig,
    TaskKind,
    TaskLabels,
    read_split_features,
    task_labels,
    tree_splits,
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
from elmolab.text.wsd import read_wordnet_sense_index
from elmolab.tracking import TrackedRun, metric_key

log = logging.getLogger("elmolab.probe")

WSD_METRIC = "f1"
# Metrics that are a share of counted items (tokens, heads, edges): metrics.json keeps the
# per-sentence counts, so the report can run a paired bootstrap over test sentences.
COUNTED_METRICS = (TaskMetric.ACCURACY.value, *TREE_METRICS.values())
ROLES = ("train", "dev", "test")

# Starts the tracking run of one probe run: its identifying fields -> a TrackedRun context.
RunStarter = Callable[[dict[str, Any]], AbstractContextManager[TrackedRun]]


@dataclass
class FeaturesConfig:
    """Schema of the ``features`` section (``conf/features/<mode>.yaml``)."""

    mode: str  # a FeatureMode: layer0, layer1, layer2, mean, scalar_mix, concat


def feature_modes(conf_dir: Path, names: Sequence[str]) -> list[str]:
    """The feature mode of each ``conf/features/<name>.yaml`` of ``names`` (``grid.features``);
    an ElmolabError names a missing file and the choices."""
    modes = []
    for name in names:
        path = Path(conf_dir) / "features" / f"{name}.yaml"
        if not path.is_file():
            choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise ElmolabError(f"grid.features: no {path} (choices: {', '.join(choices)})")
        modes.append(section(OmegaConf.load(path), "", FeaturesConfig, where=str(path)).mode)
    return modes


@dataclass
class GridConfig:
    """Schema of the ``grid`` section: the axes of the probe stage."""

    tasks: dict[str, TaskConfig]  # conf/task/<name>.yaml under its name: one DVC cell each
    features: list[str]  # conf/features/<name>.yaml: every one inside each cell
    seeds: list[int]  # every seed runs inside each cell under DVC


@contextlib.contextmanager
def no_tracking(fields: dict[str, Any]) -> Iterator[TrackedRun]:
    """A :data:`RunStarter` that tracks nothing."""
    yield TrackedRun()


def run_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: DataCatalog,
    settings: ProbeSettings,
    seeds: Sequence[int],
    cell_dir: Path,
    start_run: RunStarter = no_tracking,
) -> list[dict[str, Any]]:
    """Probe ``task`` in every feature mode of ``modes`` on every encoder and seed; write
    ``cell_dir`` (``<probes>/<task>``).

    ``data`` must be the catalogue the features were extracted from. Returns the metrics of
    every run, as written.
    """
    if settings.unseen is not None:
        task = dataclasses.replace(task, unseen=settings.unseen)
    task.check()
    settings.check()
    modes = [FeatureMode.parse(mode).value for mode in modes]
    if not modes:
        raise ElmolabError("no feature modes to run (grid.features is empty)")
    if not seeds:
        raise ElmolabError("no seeds to run (grid.seeds is empty)")
    torch.set_num_threads(settings.num_threads)
    torch.set_flush_denormal(True)
    kind = TaskKind(task.kind)
    if kind is not TaskKind.WSD:
        precision = probe_precision(settings)
        log.info("probe precision %s: %s", precision.precision, precision.reason)
        settings = dataclasses.replace(settings, precision=precision.precision)
    with atomic_dir(cell_dir) as tmp:
        if kind is TaskKind.WSD:
            results = _wsd_cell(task, modes, data, settings, tmp, start_run)
        else:
            results = _probe_cell(task, modes, data, settings, seeds, tmp, start_run)
    return results


def task_sources(
    task: TaskConfig, data: DataCatalog, wordnet: Any = None
) -> dict[str, SplitSource]:
    """The task's train, dev and test splits, read from ``data``."""
    sources = {}
    for role, (dataset, split) in task.split_refs().items():
        if dataset not in data.datasets:
            raise ElmolabError(
                f"task.{role}: no dataset {dataset!r} in extract.datasets"
                f" ({', '.join(data.datasets)})"
            )
        sources[role] = data.read(dataset, split, wordnet)
    return sources


@dataclass(frozen=True)
class Job:
    """One fit of the engine: an encoder, a training set and the heads (modes x seeds) on it.

    An online-code job (``block`` set) trains on the first ``fraction`` of the training sentences,
    the blocks before ``block``, and measures the code length of block ``block``'s labels."""

    encoder: str
    fraction: float  # 1.0: the full training split
    heads: tuple[Head, ...]
    block: int | None = None  # online code: the index in probe.online_code_fractions it codes


def _probe_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: DataCatalog,
    settings: ProbeSettings,
    seeds: Sequence[int],
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Token, pair and tree tasks: every job, ``settings.workers`` at a time, largest first."""
    splits, labels = load_splits(task, data, settings)
    kind = TaskKind(task.kind)
    twins = layer0_twins(settings, modes, task.datasets())
    num_layers = next(iter(splits.values()))["train"].num_layers
    # the structural probe's gold side: the same trees for every encoder, made once for all jobs
    gold = StructuralGold.of(next(iter(splits.values()))) if kind is TaskKind.STRUCTURAL else None
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
    fits = _run_jobs(
        [
            lambda job=job: (
                _code_fit(job, splits[job.encoder], labels, settings, task.metric)
                if job.block is not None
                else _fit(task, kind, job, splits[job.encoder], labels, settings, gold)
            )
            for job in jobs
        ],
        settings.workers,
    )
    codes = [(job, fit) for job, fit in zip(jobs, fits, strict=True) if job.block is not None]
    if codes:
        assert labels is not None
        _write_online_codes(task, codes, splits, labels, settings, twins, out)
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
            metrics = _probe_metrics(fields, job.fraction, result, counts, settings.precision)
            _write_run(out, metrics, result, settings)
            with start_run({**fields, "train_fraction": job.fraction}) as run:
                _track(run, metrics, result)
            results.append(metrics)
    for encoder, twin in twins.items():
        results += _copy_runs(results, twin, encoder, out)
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


def plan_jobs(
    kind: TaskKind,
    modes: Sequence[str],
    seeds: Sequence[int],
    settings: ProbeSettings,
    twins: Mapping[str, str],
    *,
    conditional: bool = False,
    mdl: bool = False,
    num_layers: int,
) -> list[Job]:
    """The jobs of a cell, the big ones first: per training set (token tasks: the full one and
    each learning-curve share) and encoder, one fit of every mode and seed (but ``layer0`` of an
    encoder in ``twins``, :func:`layer0_twins`: its runs are copied).

    ``conditional`` adds to each full fit the heads on layer 0 beside each mode of
    ``CONDITIONAL_MODES`` among ``modes``; ``mdl`` adds the online code's jobs, one per block
    after the first and encoder, with the full fits' modes and seeds.

    A cell without learning-curve jobs (pair and tree tasks) splits each fit by seed, and each
    seed's heads into the concatenation's and the others' (each part of a fit computes apart from
    the others, so the split changes no result), and orders the jobs by their arithmetic, the
    largest first: three encoders' fits on two workers would leave one worker idle for a third of
    the cell, nine fits of a seed each for a ninth (the last alone), eighteen unequal ones end
    within a fraction of the smallest. In a token cell the small learning-curve fits fill the
    gaps instead, and its bigger fits amortize a step's overhead over more heads (its heads share
    one product, so they stay together)."""
    fractions = [1.0, *settings.train_fractions] if kind is TaskKind.TOKEN else [1.0]
    for fraction in fractions:
        if not 0.0 < fraction <= 1.0:
            raise ElmolabError(f"probe.train_fractions: {fraction} is not in (0, 1]")
    by_seed = set(fractions) == {1.0} and not mdl and settings.workers > 1

    def heads_of(encoder: str, shard: Sequence[int]) -> tuple[Head, ...]:
        return tuple(
            Head(FeatureMode(mode), seed)
            for mode in modes
            if not (mode == FeatureMode.LAYER0.value and encoder in twins)
            for seed in shard
        )

    conditioned = [mode for mode in CONDITIONAL_MODES if mode in modes] if conditional else []
    jobs = []
    for fraction in sorted(set(fractions), reverse=True):
        for encoder in settings.encoders:
            for shard in [[seed] for seed in seeds] if by_seed else [list(seeds)]:
                heads = heads_of(encoder, shard)
                if fraction == 1.0:
                    heads += tuple(
                        Head(FeatureMode(mode), seed, baseline=True)
                        for mode in conditioned
                        for seed in shard
                    )
                # split by seed: the concatenation's heads apart from the others'
                groups = (
                    [
                        tuple(h for h in heads if (h.mode is FeatureMode.CONCAT) is concat)
                        for concat in (True, False)
                    ]
                    if by_seed
                    else [heads]
                )
                jobs += [Job(encoder, fraction, group) for group in groups if group]
    if mdl:
        blocks = settings.online_code_fractions
        for block in range(1, len(blocks)):
            for encoder in settings.encoders:
                if heads := heads_of(encoder, list(seeds)):
                    jobs.append(Job(encoder, blocks[block - 1], heads, block))
    if by_seed:
        return sorted(jobs, key=lambda job: -job_arithmetic(kind, job, num_layers))  # stable
    return sorted(jobs, key=lambda job: -job.fraction)  # stable: the order above within a size


def job_arithmetic(kind: TaskKind, job: Job, num_layers: int) -> float:
    """A job's arithmetic per training token, in units of one layer-wide head: a head's products
    grow with its input's width (a concatenation: ``num_layers`` layers; layer 0 beside a mix:
    two), the arc probe's bilinear map with its square."""
    total = 0.0
    for head in job.heads:
        width = num_layers if head.mode is FeatureMode.CONCAT else 2 if head.baseline else 1
        total += width**2 if kind is TaskKind.ARC else width
    return total


def load_splits(
    task: TaskConfig, data: DataCatalog, settings: ProbeSettings
) -> tuple[dict[str, dict[str, Any]], TaskLabels | None]:
    """Every encoder's train, dev and test split of ``task``, each one contiguous array in its
    stored type (with ``probe.standardize``, each layer standardized by its train split's
    statistics; tree tasks' then in the type their probes read, :func:`probe_dtype`, which
    every job would otherwise convert on its own; sentence tasks' pooled, one float32 item per
    sentence, :func:`~elmolab.probing.datasets.pool_sentences`), and (token, pair and sentence
    tasks) the task's labels."""
    sources = task_sources(task, data)
    kind = TaskKind(task.kind)
    splits: dict[str, dict[str, Any]] = {}
    labels = None
    if kind.is_tree:
        trees = tree_splits(sources)
        as_probed = probe_dtype(settings)
    else:
        labels = task_labels(task, sources)
    for encoder in settings.encoders:
        encoder_dir = Path(settings.features_dir) / encoder
        splits[encoder] = {}
        for role in ROLES:
            source = sources[role]
            path = feature_path(encoder_dir, source.dataset, source.split)
            features = read_split_features(encoder_dir, source)
            if kind.is_tree:
                split: Any = TreeDataset.from_sentences(
                    features, trees[role].heads, trees[role].punct, path=path
                )
            elif kind is TaskKind.SENTENCE:
                assert labels is not None
                split = pool_sentences(features, labels.labels[role], path=path)
            else:
                assert labels is not None
                split = FeatureDataset.from_sentences(
                    features,
                    labels.labels[role],
                    None if labels.heads is None else labels.heads[role],
                    path=path,
                )
            splits[encoder][role] = split
        if settings.standardize:
            standardize_layers(splits[encoder])
        if kind.is_tree:
            converted: dict[int, torch.Tensor] = {}  # an array two roles share, converted once
            for role, split in splits[encoder].items():
                key = split.features.data_ptr()
                if key not in converted:
                    converted[key] = split.features.to(as_probed)
                splits[encoder][role] = dataclasses.replace(split, features=converted[key])
    return splits, labels


def _fit(
    task: TaskConfig,
    kind: TaskKind,
    job: Job,
    splits: dict[str, Any],
    labels: TaskLabels | None,
    settings: ProbeSettings,
    gold: StructuralGold | None = None,
) -> tuple[list[ProbeResult], dict[str, Any]]:
    """One job's results, and the counts of the splits it trained and scored on (``gold``: the
    structural probe's, made once for the cell; a sentence task's majority baseline too)."""
    train = splits["train"]
    if job.fraction < 1.0:
        train = train.subset(training_subset(len(train.sentence_lengths), job.fraction, settings))
    fit_splits = {**splits, "train": train}
    results = train_heads(
        job.heads,
        fit_splits,
        settings,
        kind=kind.value,
        metric=None if kind.is_tree else task.metric,
        vocabulary=None if labels is None else labels.vocabulary,
        bits=(task.mdl or task.conditional) and job.fraction == 1.0,
        gold=gold,
    )
    counts = {f"n_{role}_tokens": int(fit_splits[role].features.shape[1]) for role in ROLES}
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


def online_code_blocks(sentences: int, settings: ProbeSettings) -> list[list[int]]:
    """The online code's blocks of training sentences: block ``i`` holds the sentences of the
    first ``probe.online_code_fractions[i]`` share (:func:`training_subset`, nested) that the
    share before it lacks."""
    blocks, before = [], set[int]()
    for fraction in settings.online_code_fractions:
        upto = training_subset(sentences, fraction, settings)
        blocks.append([i for i in upto if i not in before])
        before.update(upto)
    return blocks


# An online-code job's result: each head's code length of its block (bits), and the fit's time.
CodeFit = tuple[list[float], float]


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


def _write_online_codes(
    task: TaskConfig,
    codes: list[tuple[Job, CodeFit]],
    splits: dict[str, dict[str, Any]],
    labels: TaskLabels,
    settings: ProbeSettings,
    twins: Mapping[str, str],
    out: Path,
) -> None:
    """One ``online_code.json`` per encoder, feature mode and seed (``elmolab.io.results``): the
    first block under the uniform code, each later one as its job measured it."""
    classes = labels.vocabulary.num_train_labels
    fractions = list(settings.online_code_fractions)
    per_run: dict[tuple[str, str, int], dict[int, float]] = {}
    seconds: dict[tuple[str, str, int], float] = {}
    for job, (bits, wall) in codes:
        assert job.block is not None
        for head, head_bits in zip(job.heads, bits, strict=True):
            key = (job.encoder, head.features, head.seed)
            per_run.setdefault(key, {})[job.block] = head_bits
            seconds[key] = seconds.get(key, 0.0) + wall / len(job.heads)
    written = []
    for (encoder, features, seed), blocks_bits in per_run.items():
        train = splits[encoder]["train"]
        blocks = online_code_blocks(len(train.sentence_lengths), settings)
        block_tokens = [sum(train.sentence_lengths[i] for i in block) for block in blocks]
        block_bits = [block_tokens[0] * math.log2(classes)]
        block_bits += [blocks_bits[i] for i in range(1, len(blocks))]
        uniform = sum(block_tokens) * math.log2(classes)
        online = sum(block_bits)
        code = {
            "task": task.name,
            "features": features,
            "encoder": encoder,
            "seed": seed,
            "labels": classes,
            "fractions": fractions,
            "block_tokens": block_tokens,
            "block_bits": [round(b, 3) for b in block_bits],
            "uniform_bits": round(uniform, 3),
            "online_bits": round(online, 3),
            "compression": uniform / online if online > 0 else math.inf,
            "wall_seconds": round(seconds[(encoder, features, seed)], 3),
        }
        write_json(out / features / encoder / run_folder(seed) / ONLINE_CODE_FILE, code)
        written.append(code)
        log.info(
            "%s/%s/%s/seed%d: online code %.1f kbits, uniform %.1f kbits, compression %.2f",
            task.name,
            features,
            encoder,
            seed,
            online / 1000,
            uniform / 1000,
            code["compression"],
        )
    layer0 = FeatureMode.LAYER0.value
    for encoder, source in twins.items():
        for code in written:
            if code["encoder"] == source and code["features"] == layer0:
                copy = {**code, "encoder": encoder, "same_features_as": source}
                folder = out / layer0 / encoder / run_folder(code["seed"])
                write_json(folder / ONLINE_CODE_FILE, copy)


def _write_run(
    out: Path, metrics: dict[str, Any], result: ProbeResult, settings: ProbeSettings
) -> None:
    run_dir = (
        out
        / metrics["features"]
        / metrics["encoder"]
        / run_folder(metrics["seed"], metrics["train_fraction"])
    )
    metrics.update(peak_memory())  # kept in the run's results: a layer-0 twin copies them
    write_json(run_dir / METRICS_FILE, metrics)
    if settings.save_predictions:
        _write_lines(run_dir / PREDICTIONS_FILE, map(" ".join, result.test_predictions))


def layer0_twins(
    settings: ProbeSettings, modes: Sequence[str], datasets: Sequence[str]
) -> dict[str, str]:
    """Encoder -> an earlier encoder with the same token layer, by the digests in the extract.json
    of each of ``datasets`` (the token-layer control and the trained biLM): their layer-0
    features are identical, so their layer-0 probes would be too, run for run, and are run once.
    None without ``layer0`` among ``modes``."""
    if FeatureMode.LAYER0.value not in modes:
        return {}
    first_with: dict[tuple[str, ...], str] = {}
    twins = {}
    for encoder in settings.encoders:
        digests = []
        for dataset in datasets:
            summary = summary_path(Path(settings.features_dir) / encoder, dataset)
            try:
                digests.append(
                    json.loads(summary.read_text(encoding="utf-8"))["token_layer_sha256"]
                )
            except (OSError, ValueError, KeyError):
                break  # features without a digest (older extractions) are probed as they are
        else:
            key = tuple(digests)
            if key in first_with:
                twins[encoder] = first_with[key]
            else:
                first_with[key] = encoder
    return twins


def _copy_runs(
    results: list[dict[str, Any]], source: str, encoder: str, out: Path
) -> list[dict[str, Any]]:
    """``source``'s layer-0 runs as ``encoder``'s, marked ``same_features_as``, with predictions."""
    copies = []
    layer0 = FeatureMode.LAYER0.value
    for metrics in results:
        if metrics["encoder"] != source or metrics["features"] != layer0:
            continue
        copy = {**metrics, "encoder": encoder, "same_features_as": source}
        run_dir = run_folder(metrics["seed"], metrics["train_fraction"])
        write_json(out / layer0 / encoder / run_dir / METRICS_FILE, copy)
        predictions = out / layer0 / source / run_dir / PREDICTIONS_FILE
        if predictions.is_file():
            shutil.copyfile(predictions, out / layer0 / encoder / run_dir / PREDICTIONS_FILE)
        copies.append(copy)
    return copies


def training_subset(sentences: int, fraction: float, settings: ProbeSettings) -> list[int]:
    """The training sentences of a learning-curve point: the first ``ceil(fraction * n)`` of a
    permutation fixed by ``probe.subset_seed``, in corpus order. The same for every encoder,
    feature mode and probe seed (so their scores pair up), and nested: 1% lies inside 10%."""
    if not 0.0 < fraction <= 1.0:
        raise ElmolabError(f"probe.train_fractions: {fraction} is not in (0, 1]")
    order = np.random.default_rng(settings.subset_seed).permutation(sentences)
    return sorted(order[: max(1, math.ceil(fraction * sentences))].tolist())


# The jobs of the running _run_jobs call: forked workers inherit them, so only an index and the
# results cross the process boundary, never the features or the task data.
_JOBS: list[Callable[[], Any]] = []


def _run_job(index: int) -> Any:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    return _JOBS[index]()


def _run_jobs(jobs: list[Callable[[], Any]], workers: int) -> list[Any]:
    """``[job() for job in jobs]``, with up to ``workers`` jobs at a time in forked processes.

    Each worker uses one torch thread and takes the next job when it finishes one. Results come
    back in the order of ``jobs``; the first failing job's exception is raised (an ElmolabError
    keeps its file and line).
    """
    if workers < 1:
        raise ElmolabError(f"probe.workers must be at least 1, got {workers}")
    if workers == 1 or len(jobs) < 2 or "fork" not in mp.get_all_start_methods():
        return [job() for job in jobs]
    _JOBS[:] = jobs
    try:
        context = mp.get_context("fork")
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            return list(pool.map(_run_job, range(len(jobs))))
    finally:
        _JOBS.clear()


def _probe_metrics(
    fields: dict[str, Any],
    fraction: float,
    result: ProbeResult,
    counts: dict[str, Any],
    precision: str,
) -> dict[str, Any]:
    counted = result.metric in COUNTED_METRICS
    return {
        **fields,
        "train_fraction": fraction,
        "metric": result.metric,
        "dev": result.dev,
        "test": result.test,
        "best_epoch": result.best_epoch,
        "epochs": result.epochs,
        "hit_epoch_cap": result.hit_epoch_cap,
        "mix_weights": result.mix_weights,
        "gamma": result.gamma,
        "wall_seconds": round(result.wall_seconds, 3),
        "precision": precision,
        **counts,
        **result.extra,
        "per_sentence_test": result.per_sentence_test if counted else None,
        # The tokens that per_sentence_test's totals give elsewhere: bits per token per sentence.
        **(
            {"per_sentence_test_tokens": result.per_sentence_test["total"]}
            if not counted and "per_sentence_test_bits" in result.extra
            else {}
        ),
        "history": [dataclasses.asdict(record) for record in result.history],
    }


def _track(run: TrackedRun, metrics: dict[str, Any], result: ProbeResult) -> None:
    for record in result.history:
        run.log(
            {
                metric_key("train", "loss"): record.train_loss,
                metric_key("val", result.metric): record.dev_metric,
            },
            step=record.epoch,
        )
    run.summarize(
        {
            metric_key("val", result.metric): result.dev,
            metric_key("test", result.metric): result.test,
        }
    )
    if metrics["features"] == FeatureMode.SCALAR_MIX.value and result.mix_weights is not None:
        run.log_mix_weights(result.mix_weights, result.gamma)


def _wsd_cell(
    task: TaskConfig,
    modes: Sequence[str],
    data: DataCatalog,
    settings: ProbeSettings,
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """1-NN word senses: each encoder's features read once, every frozen mode scored on them."""
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
    assert task.wordnet is not None, "task.check() requires wordnet for wsd"
    wordnet = read_wordnet_sense_index(task.wordnet)
    sources = task_sources(task, data, wordnet)
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
        encoder_dir = Path(settings.features_dir) / encoder
        layers = {
            role: _instance_layers(read_split_features(encoder_dir, sources[role]))
            for role in ROLES
        }
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
                lines = map(_wsd_line, ids, predictions)
                _write_lines(out / mode / encoder / PREDICTIONS_FILE, lines)
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


def _instance_layers(sentences: list[np.ndarray]) -> torch.Tensor:
    """Per-sentence ``(num_layers, n_i, dim)`` arrays -> ``(num_layers, instances, dim)``."""
    return torch.from_numpy(np.concatenate(sentences, axis=1))


def _wsd_line(instance_id: str, prediction: SensePrediction) -> str:
    return f"{instance_id} {prediction.key or '-'} {prediction.source}"


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)
