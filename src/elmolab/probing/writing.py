"""What a probing cell writes: each run's ``metrics.json`` and predictions, the online code's
files, the copies of layer-0 twins, and what a run tracks (the layout is ``elmolab.io.results``'s,
which the report reads)."""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elmolab.core.fsutil import write_json
from elmolab.core.hardware import peak_memory
from elmolab.core.schema import ProbeSettings, TaskConfig
from elmolab.core.tracking import TrackedRun, metric_key
from elmolab.data.labels import TaskLabels
from elmolab.data.tasks import TREE_METRICS
from elmolab.io.results import (
    METRICS_FILE,
    ONLINE_CODE_FILE,
    PREDICTIONS_FILE,
    FeatureMode,
    run_folder,
)
from elmolab.probing.heads import ProbeResult
from elmolab.probing.jobs import Job, online_code_blocks
from elmolab.probing.metrics import TaskMetric
from elmolab.probing.wsd import SensePrediction

log = logging.getLogger("elmolab.probe")


# Metrics that are a share of counted items (tokens, heads, edges): metrics.json keeps the
# per-sentence counts, so the report can run a paired bootstrap over test sentences.
COUNTED_METRICS = (TaskMetric.ACCURACY.value, *TREE_METRICS.values())


# An online-code job's result: each head's code length of its block (bits), and the fit's time.
CodeFit = tuple[list[float], float]


def write_online_codes(
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


def write_run(
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
        write_lines(run_dir / PREDICTIONS_FILE, map(" ".join, result.test_predictions))


def copy_runs(
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


def probe_metrics(
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


def track_run(run: TrackedRun, metrics: dict[str, Any], result: ProbeResult) -> None:
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


def wsd_line(instance_id: str, prediction: SensePrediction) -> str:
    return f"{instance_id} {prediction.key or '-'} {prediction.source}"


def write_lines(path: Path, lines: Iterable[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)
