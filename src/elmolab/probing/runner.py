"""One cell of the probing grid: a task and a feature mode, for every encoder and every seed.

The task's data is read once per cell, each encoder's cached features once per encoder, and every
seed trains on them. Results, under ``<cell> = <probes>/<task>/<features>`` (the layout
``elmolab.report.collect`` reads)::

    <cell>/<encoder>/seed<k>/metrics.json            token and pair tasks, one per seed
    <cell>/<encoder>/seed<k>/test_predictions.txt    predicted labels, one test sentence a line
    <cell>/<encoder>/metrics.json                    wsd: nothing is random, so no seeds
    <cell>/<encoder>/test_predictions.txt            wsd: "instance_id sense_key source" lines

``metrics.json`` holds ``task, features, encoder, seed, metric, dev, test, best_epoch, epochs,
mix_weights, gamma, wall_seconds, n_train_tokens, n_dev_tokens, n_test_tokens, per_sentence_test``
(per-sentence correct/total test counts for accuracy tasks, else null) and the epoch ``history``.
WSD writes F1 on the test set (``dev``: on the dev set) with precision, recall and the back-off
count; the learned ``scalar_mix`` does not apply to 1-NN, so that cell writes
``{"applicable": false, ...}``. The whole cell appears at once, or not at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import multiprocessing as mp
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmolab.errors import ElmolabError
from elmolab.extract import SUMMARY as EXTRACT_SUMMARY
from elmolab.extract import feature_path, read_split_features
from elmolab.fsutil import atomic_dir, write_json
from elmolab.models.scalar_mix import FeatureMode
from elmolab.probing.metrics import TaskMetric
from elmolab.probing.tasks import (
    TREE_METRICS,
    DataCatalog,
    SplitSource,
    TaskConfig,
    TaskKind,
    TaskLabels,
    TreeSplit,
    task_labels,
    tree_splits,
)
from elmolab.probing.train import FeatureDataset, ProbeConfig, ProbeResult, train_probe
from elmolab.probing.trees import (
    TreeDataset,
    TreeProbeConfig,
    train_arc_probe,
    train_structural_probe,
)
from elmolab.probing.wsd import (
    SensePrediction,
    fit_sense_centroids,
    predict_senses,
    score_senses,
    wsd_vectors,
)
from elmolab.text.wsd import WordNetSenseIndex, read_wordnet_sense_index
from elmolab.tracking import TrackedRun, metric_key

log = logging.getLogger("elmolab.probe")

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "test_predictions.txt"
WSD_METRIC = "f1"
# Metrics that are a share of counted items (tokens, heads, edges): metrics.json keeps the
# per-sentence counts, so the report can run a paired bootstrap over test sentences.
COUNTED_METRICS = (TaskMetric.ACCURACY.value, *TREE_METRICS.values())
ROLES = ("train", "dev", "test")

# Starts the tracking run of one (encoder, seed): its identifying fields -> a TrackedRun context.
RunStarter = Callable[[dict[str, Any]], AbstractContextManager[TrackedRun]]
# One finished probe run: its metrics.json content, the result, and its folder under the encoder's.
Run = tuple[dict[str, Any], ProbeResult, Path]


@dataclass
class FeaturesConfig:
    """Schema of the ``features`` section (``conf/features/<mode>.yaml``)."""

    mode: str  # a FeatureMode: layer0, layer1, layer2, mean, scalar_mix, concat


@dataclass
class GridConfig:
    """Schema of the ``grid`` section: the axes of the probe stage's DVC matrix."""

    tasks: list[str]  # conf/task/<name>.yaml
    features: list[str]  # conf/features/<name>.yaml
    seeds: list[int]  # every seed runs inside each cell under DVC


@dataclass
class TreeSettings:
    """Schema of ``probe.tree``: the tree probes' own optimisation (deparc, structural)."""

    lr: float  # Adam
    lr_decay: float  # lr factor after an epoch without a better dev score
    batch_tokens: int  # whole sentences per step, about this many words
    max_epochs: int
    patience: int  # epochs without a better dev score (structural: dev loss) before stopping
    rank: int  # structural probe: rows of the linear map B


@dataclass
class ProbeSettings:
    """Schema of the ``probe`` section (``conf/probe/default.yaml`` gives every value and why)."""

    features_dir: str  # the extract stage's output: <features_dir>/<encoder>/<dataset>/<split>
    encoders: list[str]  # names of extract.encoders, each probed in every cell
    kind: str  # linear | mlp
    hidden_dim: int  # mlp only
    dropout: float  # mlp only
    root: str  # pair task: the head vector of root attachments, learned | zeros
    lr: float  # Adam
    weight_decay: float  # on the classifier
    batch_size: int  # tokens per step
    max_epochs: int
    patience: int  # epochs without a better dev score before stopping
    layer_norm: bool  # normalize each layer before mixing
    l2_lambda: float  # L2 penalty on the learned scalar-mix logits
    num_threads: int  # torch intra-op threads (of the cell's process; workers use one each)
    workers: int  # encoders probed side by side, one process each
    save_predictions: bool  # write test_predictions.txt beside metrics.json
    unseen: str | None  # raise | keep for every task (presets that cut the data); None: the task's
    train_fractions: list[float]  # token tasks: learning-curve points below the full train set
    subset_seed: int  # fixes the learning-curve subsets (never the probe seed)
    min_epoch_tokens: int  # an epoch cycles a small training set up to this many tokens
    tree: TreeSettings

    def tree_config(self) -> TreeProbeConfig:
        """The tree probes' hyperparameters (the mix settings and root vector are shared)."""
        return TreeProbeConfig(
            lr=self.tree.lr,
            lr_decay=self.tree.lr_decay,
            batch_tokens=self.tree.batch_tokens,
            max_epochs=self.tree.max_epochs,
            patience=self.tree.patience,
            layer_norm=self.layer_norm,
            l2_lambda=self.l2_lambda,
            rank=self.tree.rank,
            root=self.root,  # type: ignore[arg-type]
        )

    def probe_config(self) -> ProbeConfig:
        """The training hyperparameters, checked."""
        if self.kind not in ("linear", "mlp"):
            raise ElmolabError(f"probe.kind must be 'linear' or 'mlp', got {self.kind!r}")
        if self.root not in ("learned", "zeros"):
            raise ElmolabError(f"probe.root must be 'learned' or 'zeros', got {self.root!r}")
        if not self.encoders:
            raise ElmolabError("probe.encoders is empty: nothing to probe")
        return ProbeConfig(
            probe=self.kind,  # type: ignore[arg-type]
            hidden_dim=self.hidden_dim,
            dropout=self.dropout,
            root=self.root,  # type: ignore[arg-type]
            lr=self.lr,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            max_epochs=self.max_epochs,
            patience=self.patience,
            layer_norm=self.layer_norm,
            l2_lambda=self.l2_lambda,
            min_epoch_tokens=self.min_epoch_tokens,
        )


@contextlib.contextmanager
def no_tracking(fields: dict[str, Any]) -> Iterator[TrackedRun]:
    """A :data:`RunStarter` that tracks nothing."""
    yield TrackedRun()


def run_cell(
    task: TaskConfig,
    mode: str,
    data: DataCatalog,
    settings: ProbeSettings,
    seeds: Sequence[int],
    cell_dir: Path,
    start_run: RunStarter = no_tracking,
) -> list[dict[str, Any]]:
    """Probe ``task`` with feature mode ``mode`` on every encoder and seed; write ``cell_dir``.

    ``data`` must be the catalogue the features were extracted from. Returns the metrics of
    every run, as written.
    """
    if settings.unseen is not None:
        task = dataclasses.replace(task, unseen=settings.unseen)
    task.check()
    mode = FeatureMode.parse(mode).value
    config = settings.probe_config()
    if not seeds:
        raise ElmolabError("no seeds to run (grid.seeds is empty)")
    torch.set_num_threads(settings.num_threads)
    kind = TaskKind(task.kind)
    with atomic_dir(cell_dir) as tmp:
        if kind is TaskKind.WSD:
            results = _wsd_cell(task, mode, data, settings, tmp, start_run)
        else:
            results = _probe_cell(task, mode, data, settings, config, seeds, tmp, start_run)
    return results


def task_sources(
    task: TaskConfig, data: DataCatalog, wordnet: WordNetSenseIndex | None = None
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


def _probe_cell(
    task: TaskConfig,
    mode: str,
    data: DataCatalog,
    settings: ProbeSettings,
    config: ProbeConfig,
    seeds: Sequence[int],
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Token, pair and tree tasks: one job per encoder and seed, ``settings.workers`` at a time.

    Jobs are ordered by encoder and each worker keeps the features of the last encoder it
    loaded, so an encoder's features are read about once per worker, not once per seed.
    """
    sources = task_sources(task, data)
    kind = TaskKind(task.kind)
    if kind.is_tree:
        loader: Callable[[str], dict[str, Any]] = functools.partial(
            _tree_datasets, settings, sources, tree_splits(sources)
        )
        train: Callable[..., Iterator[Run]] = functools.partial(_train_tree, kind)
    else:
        loader = functools.partial(_feature_datasets, settings, sources, task_labels(task, sources))
        train = functools.partial(_train_token, TaskMetric(task.metric))
    twins = _layer0_twins(settings) if mode == FeatureMode.LAYER0.value else {}
    trained = [encoder for encoder in settings.encoders if encoder not in twins]
    _ENCODER_SPLITS.clear()
    jobs = [
        functools.partial(
            _probe_seed, train, loader, task, mode, encoder, seed, settings, config, out, start_run
        )
        for encoder in trained
        for seed in seeds
    ]
    try:
        results = [metrics for runs in _run_jobs(jobs, settings.workers) for metrics in runs]
    finally:
        _ENCODER_SPLITS.clear()
    for encoder, twin in twins.items():
        results += _copy_runs(results, twin, encoder, out)
    order = {encoder: i for i, encoder in enumerate(settings.encoders)}
    return sorted(results, key=lambda metrics: order[metrics["encoder"]])


def _layer0_twins(settings: ProbeSettings) -> dict[str, str]:
    """Encoder -> an earlier encoder with the same token layer, by the digests in extract.json
    (the token-layer control and the trained biLM): their layer-0 features are identical, so
    their layer-0 probes would be too, run for run, and are run once."""
    first_with: dict[str, str] = {}
    twins = {}
    for encoder in settings.encoders:
        summary = Path(settings.features_dir) / encoder / EXTRACT_SUMMARY
        try:
            digest = json.loads(summary.read_text(encoding="utf-8")).get("token_layer_sha256")
        except (OSError, ValueError):
            continue  # features without a digest (older extractions) are probed as they are
        if digest in first_with:
            twins[encoder] = first_with[digest]
        elif digest:
            first_with[digest] = encoder
    return twins


def _copy_runs(
    results: list[dict[str, Any]], source: str, encoder: str, out: Path
) -> list[dict[str, Any]]:
    """``source``'s runs as ``encoder``'s, marked ``same_features_as``, with their predictions."""
    copies = []
    for metrics in results:
        if metrics["encoder"] != source:
            continue
        copy = {**metrics, "encoder": encoder, "same_features_as": source}
        run_dir = _run_dir(metrics["seed"], metrics.get("train_fraction", 1.0))
        write_json(out / encoder / run_dir / METRICS_FILE, copy)
        predictions = out / source / run_dir / PREDICTIONS_FILE
        if predictions.is_file():
            shutil.copyfile(predictions, out / encoder / run_dir / PREDICTIONS_FILE)
        copies.append(copy)
    return copies


# The splits of the encoder a process last loaded: (encoder, role -> dataset), at most one.
_ENCODER_SPLITS: dict[str, dict[str, Any]] = {}


def _encoder_splits(encoder: str, loader: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    if encoder not in _ENCODER_SPLITS:
        _ENCODER_SPLITS.clear()
        _ENCODER_SPLITS[encoder] = loader(encoder)
    return _ENCODER_SPLITS[encoder]


def _feature_datasets(
    settings: ProbeSettings, sources: dict[str, SplitSource], labels: TaskLabels, encoder: str
) -> dict[str, Any]:
    encoder_dir = Path(settings.features_dir) / encoder
    splits: dict[str, Any] = {
        role: feature_dataset(encoder_dir, sources[role], labels, role) for role in ROLES
    }
    splits["vocabulary"] = labels.vocabulary
    return splits


def _tree_datasets(
    settings: ProbeSettings,
    sources: dict[str, SplitSource],
    trees: dict[str, TreeSplit],
    encoder: str,
) -> dict[str, Any]:
    encoder_dir = Path(settings.features_dir) / encoder
    return {
        role: TreeDataset.from_sentences(
            read_split_features(encoder_dir, sources[role]),
            trees[role].heads,
            trees[role].punct,
            path=feature_path(encoder_dir, sources[role].dataset, sources[role].split),
        )
        for role in ROLES
    }


def _probe_seed(
    train: Callable[..., Iterator[Run]],
    loader: Callable[[str], dict[str, Any]],
    task: TaskConfig,
    mode: str,
    encoder: str,
    seed: int,
    settings: ProbeSettings,
    config: ProbeConfig,
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """One encoder and seed: every run of it (learning-curve subsets too), written to ``out``."""
    splits = _encoder_splits(encoder, loader)
    fields = {"task": task.name, "features": mode, "encoder": encoder, "seed": seed}
    results = []
    for metrics, result, run_dir in train(splits, fields, settings, config, start_run):
        write_json(out / encoder / run_dir / METRICS_FILE, metrics)
        if settings.save_predictions:
            lines = map(" ".join, result.test_predictions)
            _write_lines(out / encoder / run_dir / PREDICTIONS_FILE, lines)
        log.info(
            "%s/%s/%s/%s: dev %.4f, test %.4f (%s, best epoch %d of %d, %.1f s)",
            task.name,
            mode,
            encoder,
            run_dir,
            result.dev,
            result.test,
            result.metric,
            result.best_epoch,
            result.epochs,
            result.wall_seconds,
        )
        results.append(metrics)
    return results


def _train_token(
    metric: TaskMetric,
    splits: dict[str, Any],
    fields: dict[str, Any],
    settings: ProbeSettings,
    config: ProbeConfig,
    start_run: RunStarter,
) -> Iterator[Run]:
    """The full training split, then (token tasks) each learning-curve subset of it."""
    full = splits["train"]
    fractions = [1.0] if full.heads is not None else [1.0, *settings.train_fractions]
    for fraction in fractions:
        train = full
        if fraction < 1.0:
            train = full.subset(training_subset(len(full.sentence_lengths), fraction, settings))
        run_fields = fields if fraction == 1.0 else {**fields, "train_fraction": fraction}
        with start_run(run_fields) as run:
            result = train_probe(
                train,
                splits["dev"],
                splits["test"],
                splits["vocabulary"],
                mode=fields["features"],
                metric=metric,
                seed=fields["seed"],
                config=config,
            )
            metrics = _probe_metrics(fields, result, {**splits, "train": train})
            metrics["train_fraction"] = fraction
            metrics["n_train_sentences"] = len(train.sentence_lengths)
            _track(run, metrics, result)
        yield metrics, result, _run_dir(fields["seed"], fraction)


def _train_tree(
    kind: TaskKind,
    splits: dict[str, Any],
    fields: dict[str, Any],
    settings: ProbeSettings,
    config: ProbeConfig,
    start_run: RunStarter,
) -> Iterator[Run]:
    trainer = train_arc_probe if kind is TaskKind.ARC else train_structural_probe
    with start_run(fields) as run:
        result = trainer(
            splits["train"],
            splits["dev"],
            splits["test"],
            mode=fields["features"],
            seed=fields["seed"],
            config=settings.tree_config(),
        )
        metrics = _probe_metrics(fields, result, splits)
        metrics["n_train_sentences"] = len(splits["train"].sentence_lengths)
        _track(run, metrics, result)
    yield metrics, result, _run_dir(fields["seed"], 1.0)


def training_subset(sentences: int, fraction: float, settings: ProbeSettings) -> list[int]:
    """The training sentences of a learning-curve point: the first ``ceil(fraction * n)`` of a
    permutation fixed by ``probe.subset_seed``, in corpus order. The same for every encoder,
    feature mode and probe seed (so their scores pair up), and nested: 1% lies inside 10%."""
    if not 0.0 < fraction <= 1.0:
        raise ElmolabError(f"probe.train_fractions: {fraction} is not in (0, 1]")
    order = np.random.default_rng(settings.subset_seed).permutation(sentences)
    return sorted(order[: max(1, math.ceil(fraction * sentences))].tolist())


def _run_dir(seed: int, fraction: float) -> Path:
    seed_dir = Path(f"seed{seed}")
    return seed_dir if fraction == 1.0 else seed_dir / f"fraction_{fraction:g}"


# The jobs of the running _run_jobs call: forked workers inherit them, so only an index and the
# (small) results cross the process boundary, never the features or the task data.
_JOBS: list[Callable[[], Any]] = []


def _run_job(index: int) -> Any:
    torch.set_num_threads(1)
    return _JOBS[index]()


def _run_jobs(jobs: list[Callable[[], Any]], workers: int) -> list[Any]:
    """``[job() for job in jobs]``, with up to ``workers`` jobs at a time in forked processes.

    Each worker uses one torch thread. Results come back in the order of ``jobs``; the first
    failing job's exception is raised (an ElmolabError keeps its file and line).
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


def feature_dataset(
    encoder_dir: Path, source: SplitSource, labels: TaskLabels, role: str
) -> FeatureDataset:
    """One split's features (float32 in memory, whatever the storage type) and labels."""
    dataset = FeatureDataset.from_sentences(
        read_split_features(encoder_dir, source),
        labels.labels[role],
        None if labels.heads is None else labels.heads[role],
        path=feature_path(encoder_dir, source.dataset, source.split),
    )
    return dataclasses.replace(dataset, features=dataset.features.float())


def _probe_metrics(
    fields: dict[str, Any], result: ProbeResult, splits: dict[str, FeatureDataset]
) -> dict[str, Any]:
    counted = result.metric in COUNTED_METRICS
    return {
        **fields,
        "metric": result.metric,
        "dev": result.dev,
        "test": result.test,
        "best_epoch": result.best_epoch,
        "epochs": result.epochs,
        "mix_weights": result.mix_weights,
        "gamma": result.gamma,
        "wall_seconds": round(result.wall_seconds, 3),
        **{f"n_{role}_tokens": int(splits[role].features.shape[1]) for role in ROLES},
        **result.extra,
        "per_sentence_test": result.per_sentence_test if counted else None,
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
    mode: str,
    data: DataCatalog,
    settings: ProbeSettings,
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    results = []
    if mode == FeatureMode.SCALAR_MIX.value:
        for encoder in settings.encoders:
            metrics = {
                "task": task.name,
                "features": mode,
                "encoder": encoder,
                "seed": None,
                "applicable": False,
                "reason": "WSD 1-NN trains nothing: there is no scalar mix to learn",
            }
            write_json(out / encoder / METRICS_FILE, metrics)
            results.append(metrics)
        return results
    assert task.wordnet is not None, "task.check() requires wordnet for wsd"
    wordnet = read_wordnet_sense_index(task.wordnet)
    sources = task_sources(task, data, wordnet)
    train_keys = [i.sense_keys for s in sources["train"].wsd_sentences() for i in s.instances]
    for encoder in settings.encoders:
        encoder_dir = Path(settings.features_dir) / encoder
        fields = {"task": task.name, "features": mode, "encoder": encoder, "seed": None}
        with start_run(fields) as run:
            train_layers = _instance_layers(read_split_features(encoder_dir, sources["train"]))
            centroids = fit_sense_centroids(wsd_vectors(train_layers, mode), train_keys)
            scores, predictions = {}, {}
            for role in ("dev", "test"):
                instances = [i for s in sources[role].wsd_sentences() for i in s.instances]
                lemma_pos = [(i.lemma.lower(), i.pos) for i in instances]
                layers = _instance_layers(read_split_features(encoder_dir, sources[role]))
                predictions[role] = predict_senses(
                    centroids,
                    wsd_vectors(layers, mode),
                    lemma_pos,
                    {word: wordnet.senses(*word) for word in set(lemma_pos)},
                    {w: k for w in set(lemma_pos) if (k := wordnet.first_sense(*w)) is not None},
                )
                scores[role] = score_senses(
                    [p.key for p in predictions[role]], [i.sense_keys for i in instances]
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
                "per_sentence_test": None,
            }
            run.summarize(
                {
                    metric_key("val", WSD_METRIC): metrics["dev"],
                    metric_key("test", WSD_METRIC): metrics["test"],
                }
            )
        write_json(out / encoder / METRICS_FILE, metrics)
        if settings.save_predictions:
            ids = [i.instance_id for s in sources["test"].wsd_sentences() for i in s.instances]
            _write_lines(out / encoder / PREDICTIONS_FILE, map(_wsd_line, ids, predictions["test"]))
        log.info(
            "%s/%s/%s: dev F1 %.4f, test F1 %.4f",
            task.name,
            mode,
            encoder,
            metrics["dev"],
            metrics["test"],
        )
        results.append(metrics)
    return results


def _instance_layers(sentences: list[np.ndarray]) -> torch.Tensor:
    """Per-sentence ``(num_layers, n_i, dim)`` arrays -> ``(num_layers, instances, dim)``."""
    return torch.from_numpy(np.concatenate(sentences, axis=1))


def _wsd_line(instance_id: str, prediction: SensePrediction) -> str:
    return f"{instance_id} {prediction.key or '-'} {prediction.source}"


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)
