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
import logging
import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmolab.errors import ElmolabError
from elmolab.extract import feature_path, read_split_features
from elmolab.fsutil import atomic_dir, write_json
from elmolab.models.scalar_mix import FeatureMode
from elmolab.probing.metrics import TaskMetric
from elmolab.probing.tasks import (
    DataCatalog,
    SplitSource,
    TaskConfig,
    TaskKind,
    TaskLabels,
    task_labels,
)
from elmolab.probing.train import FeatureDataset, ProbeConfig, ProbeResult, train_probe
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
ROLES = ("train", "dev", "test")

# Starts the tracking run of one (encoder, seed): its identifying fields -> a TrackedRun context.
RunStarter = Callable[[dict[str, Any]], AbstractContextManager[TrackedRun]]


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
    sources = task_sources(task, data)
    labels = task_labels(task, sources)
    jobs = [
        functools.partial(
            _probe_encoder,
            task,
            mode,
            encoder,
            sources,
            labels,
            settings,
            config,
            seeds,
            out,
            start_run,
        )
        for encoder in settings.encoders
    ]
    return [metrics for results in _run_jobs(jobs, settings.workers) for metrics in results]


def _probe_encoder(
    task: TaskConfig,
    mode: str,
    encoder: str,
    sources: dict[str, SplitSource],
    labels: TaskLabels,
    settings: ProbeSettings,
    config: ProbeConfig,
    seeds: Sequence[int],
    out: Path,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Every seed of one encoder: load its features once, train, write ``out/<encoder>/``."""
    encoder_dir = Path(settings.features_dir) / encoder
    splits = {role: feature_dataset(encoder_dir, sources[role], labels, role) for role in ROLES}
    results = []
    for seed in seeds:
        fields = {"task": task.name, "features": mode, "encoder": encoder, "seed": seed}
        with start_run(fields) as run:
            result = train_probe(
                splits["train"],
                splits["dev"],
                splits["test"],
                labels.vocabulary,
                mode=mode,
                metric=task.metric,
                seed=seed,
                config=config,
            )
            metrics = _probe_metrics(fields, result, splits)
            _track(run, metrics, result)
        run_dir = out / encoder / f"seed{seed}"
        write_json(run_dir / METRICS_FILE, metrics)
        if settings.save_predictions:
            _write_lines(run_dir / PREDICTIONS_FILE, map(" ".join, result.test_predictions))
        log.info(
            "%s/%s/%s/seed%d: dev %.4f, test %.4f (%s, best epoch %d of %d, %.1f s)",
            *fields.values(),
            result.dev,
            result.test,
            result.metric,
            result.best_epoch,
            result.epochs,
            result.wall_seconds,
        )
        results.append(metrics)
    return results


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
    accuracy = result.metric == TaskMetric.ACCURACY.value
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
        **{f"n_{role}_tokens": len(splits[role].labels) for role in ROLES},
        "per_sentence_test": result.per_sentence_test if accuracy else None,
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
