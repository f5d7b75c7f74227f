"""What a probing cell writes: each run's ``metrics.json`` and predictions, the online code's
files, the copies of layer-0 twins, and what a run tracks (the layout is ``elmolab.io.results``'s,
which the report reads)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from elmolab.core.fsutil import atomic_dir, write_json, write_lines
from elmolab.core.hardware import peak_memory
from elmolab.core.schema import ProbeSettings, TaskConfig
from elmolab.core.tracking import TrackedRun, metric_key
from elmolab.data.labels import TaskLabels, TaskMetric
from elmolab.data.tasks import TREE_METRICS
from elmolab.io.results import (
    METRICS_FILE,
    ONLINE_CODE_FILE,
    PREDICTIONS_FILE,
    FeatureMode,
    run_folder,
)
from elmolab.probing.heads import ProbeResult
from elmolab.probing.jobs import Job
from elmolab.probing.modes import CellModes
from elmolab.probing.wsd import SensePrediction

log = logging.getLogger("elmolab.probe")

# Starts the tracking run of one probe run: its identifying fields -> a TrackedRun context.
RunStarter = Callable[[dict[str, Any]], AbstractContextManager[TrackedRun]]


# Metrics that are a share of counted items (tokens, heads, edges): metrics.json keeps the
# per-sentence counts, so the report can run a paired bootstrap over test sentences.
COUNTED_METRICS = (TaskMetric.ACCURACY.value, *TREE_METRICS.values())


# An online-code job's result: each head's code length of its block (bits), and the fit's time.
CodeFit = tuple[list[float], float]


def write_cell(
    cell_dir: Path,
    task: TaskConfig,
    runs: list[tuple[Job, ProbeResult, dict[str, Any]]],
    codes: list[tuple[Job, CodeFit]],
    blocks: list[list[int]] | None,
    splits: dict[str, dict[str, Any]],
    labels: TaskLabels | None,
    settings: ProbeSettings,
    twins: Mapping[str, str],
    modes: CellModes,
    start_run: RunStarter,
) -> list[dict[str, Any]]:
    """Every file of a token, pair or tree cell in ``cell_dir`` (all at once, or none), and each
    run tracked: a run's
    ``metrics.json`` (and test predictions) per fit result of ``runs`` (a job, one of its results
    and the counts of its splits), the online code of ``codes`` over ``blocks`` (the online
    code's blocks of training sentences), and the layer-0 runs of each
    encoder of ``twins`` copied from its twin's (those of its ``modes``: a control's instance
    may have no layer-0 learning curve). Returns every run's metrics, as written."""
    results = [
        probe_metrics(task.name, job, result, counts, settings.precision)
        for job, result, counts in runs
    ]
    memory = peak_memory()  # kept in each run's results: a layer-0 twin copies them
    files: dict[Path, Any] = {}  # path -> its JSON content
    texts: dict[Path, list[str]] = {}  # path -> its lines
    if codes:
        assert labels is not None and blocks is not None
        _online_codes(files, task, codes, blocks, splits, labels, settings, twins)
    layer0 = FeatureMode.LAYER0.value
    copies = []
    for metrics, (_, result, _) in zip(results, runs, strict=True):
        metrics.update(memory)
        run_dir = run_folder(metrics["seed"], metrics["train_fraction"])
        folder = Path(metrics["features"]) / metrics["encoder"] / run_dir
        files[folder / METRICS_FILE] = metrics
        if settings.save_predictions:
            texts[folder / PREDICTIONS_FILE] = [" ".join(s) for s in result.test_predictions]
        for encoder, source in twins.items():
            if (
                metrics["encoder"] == source
                and metrics["features"] == layer0
                and layer0 in modes.modes(encoder, metrics["train_fraction"])
            ):
                copy = {**metrics, "encoder": encoder, "same_features_as": source}
                twin_dir = Path(layer0, encoder) / run_dir
                files[twin_dir / METRICS_FILE] = copy
                if folder / PREDICTIONS_FILE in texts:
                    texts[twin_dir / PREDICTIONS_FILE] = texts[folder / PREDICTIONS_FILE]
                copies.append(copy)
    _write_files(cell_dir, files, texts)
    for metrics, (job, result, _) in zip(results, runs, strict=True):
        fields = {k: metrics[k] for k in ("task", "features", "encoder", "seed")}
        with start_run({**fields, "train_fraction": job.fraction}) as run:
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
            if fields["features"] == FeatureMode.SCALAR_MIX and result.mix_weights is not None:
                run.log_mix_weights(result.mix_weights, result.gamma)
    return results + copies


def write_wsd_cell(
    cell_dir: Path,
    results: list[dict[str, Any]],
    predictions: dict[tuple[str, str], list[str]],
    start_run: RunStarter,
) -> None:
    """A WSD cell's files in ``cell_dir`` (all at once, or none): each of ``results``'
    ``metrics.json``, the test predictions of ``predictions`` ((features, encoder) -> one line an
    instance), and each scored run tracked (a mode that does not apply is not)."""
    files = {Path(m["features"], m["encoder"], METRICS_FILE): m for m in results}
    texts = {Path(mode, enc, PREDICTIONS_FILE): p for (mode, enc), p in predictions.items()}
    _write_files(cell_dir, files, texts)
    for metrics in results:
        if metrics.get("applicable", True):
            fields = {k: metrics[k] for k in ("task", "features", "encoder", "seed")}
            with start_run(fields) as run:
                run.summarize(
                    {
                        metric_key("val", metrics["metric"]): metrics["dev"],
                        metric_key("test", metrics["metric"]): metrics["test"],
                    }
                )


def _write_files(
    cell_dir: Path, files: Mapping[Path, Any], texts: Mapping[Path, list[str]]
) -> None:
    """``files`` (relative path -> JSON content) and ``texts`` (-> lines) in ``cell_dir``, which
    appears with all of them at once, or not at all."""
    with atomic_dir(cell_dir) as tmp:
        for path, content in files.items():
            write_json(tmp / path, content)
        for path, lines in texts.items():
            write_lines(tmp / path, lines)


def _online_codes(
    files: dict[Path, Any],
    task: TaskConfig,
    codes: list[tuple[Job, CodeFit]],
    blocks: list[list[int]],
    splits: dict[str, dict[str, Any]],
    labels: TaskLabels,
    settings: ProbeSettings,
    twins: Mapping[str, str],
) -> None:
    """One ``online_code.json`` per encoder, feature mode and seed (``elmolab.io.results``) into
    ``files``: the first block under the uniform code, each later one as its job measured it."""
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
        files[Path(features, encoder) / run_folder(seed) / ONLINE_CODE_FILE] = code
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
                folder = Path(layer0, encoder) / run_folder(code["seed"])
                files[folder / ONLINE_CODE_FILE] = copy


def probe_metrics(
    task: str, job: Job, result: ProbeResult, counts: dict[str, Any], precision: str
) -> dict[str, Any]:
    """A probe run's ``metrics.json`` content (``elmolab.probing.runner``'s module docstring)."""
    counted = result.metric in COUNTED_METRICS
    return {
        "task": task,
        "features": result.features,
        "encoder": job.encoder,
        "seed": result.seed,
        "train_fraction": job.fraction,
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


def wsd_line(instance_id: str, prediction: SensePrediction) -> str:
    return f"{instance_id} {prediction.key or '-'} {prediction.source}"
