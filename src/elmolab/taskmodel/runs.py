"""The ``taskmodel`` stage: a BiLSTM-CRF tagger trained on every input and seed, and the summary.

The task is a token task of ``grid.tasks`` scored by span F1, named by ``taskmodel.task``
(:func:`tagging_task`). The inputs, as the ELMo paper's Table 1 compares them (config
``taskmodel``, a :class:`TaskModelConfig`):

- ``baseline``: the context-free vector (the ``token_encoder``'s layer 0) and the task model's own
  word embedding;
- ``elmo_<encoder>``, for each of ``mix_encoders``: the same with the learned scalar mix of that
  encoder's layers beside them, frozen (the extract stage's cached features). With the trained
  biLM it is ELMo; the random and token_only encoders are controls of where the gain comes from;
- ``finetune_<encoder>``, for each of ``finetune_encoders``: the same mix, its biLM run inside the
  tagger and trained with it (``elmolab.taskmodel.model.FineTunedLayers``, at ``finetune_lr``).

Output (``<out>``, written whole or not at all)::

    <input>/seed<k>/metrics.json            dev_f1, test_f1, best_epoch, history, the mix, ...
    <input>/seed<k>/test_predictions.txt    one test sentence a line, tags in the data's scheme
    metrics.json                            the summary (:func:`summarize`)
    table.md                                the summary as a Markdown table

F1 is span F1 in percent, scored as ``elmolab.probing.metrics`` scores the probes (conlleval's
count, in the data's tag scheme). The error is ``100 - F1``; ``elmo_<encoder>`` against the
baseline reports the absolute error reduction ``F1_x - F1_b`` (points) and the relative one
``(F1_x - F1_b) / (100 - F1_b)``, of the means over seeds, with a paired t-test over seeds
(``elmolab.report.stats.paired_t_test``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, Sampler

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.core.hardware import peak_memory
from elmolab.core.schema import (
    BASELINE,
    FINETUNE_PREFIX,
    MIX_PREFIX,
    SPLIT_ROLES,
    TaskConfig,
    TaskKind,
    TaskModelConfig,
)
from elmolab.data.catalogue import DataCatalog, SplitSource, read_split_features
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.data.tasks import check_task, load_task
from elmolab.elmo import batch_to_ids
from elmolab.io.features import feature_path
from elmolab.io.results import METRICS_FILE, PREDICTIONS_FILE, SEED_PREFIX
from elmolab.models.encoder_files import encoder_files
from elmolab.probing.datasets import FeatureDataset, standardize_layers
from elmolab.taskmodel.data import (
    LengthSortedBatches,
    PadBatch,
    TaggingSplit,
    WordVocabulary,
)
from elmolab.taskmodel.model import (
    BiLstmCrfTagger,
    FineTunedLayers,
    TaggerModule,
    TaggerShape,
    sentence_f1,
)
from elmolab.training.quiet import quiet_lightning

log = logging.getLogger("elmolab.taskmodel")

TABLE_FILE = "table.md"
# Batches of similar length are cut from runs of this many batches' sentences (less padding).
BUCKET_BATCHES = 50
# The tagger's score: span F1, chunks counted as conlleval counts them.
METRIC = TaskMetric.SPAN_F1


def tagging_task(config: TaskModelConfig, tasks: Mapping[str, TaskConfig]) -> TaskConfig:
    """The task ``config.task`` names among ``tasks`` (``grid.tasks``), with the task model's own
    ``unseen`` where it sets one: a token task scored by span F1, else an ElmolabError naming the
    key."""
    if config.task not in tasks:
        raise ElmolabError(
            f"taskmodel.task: {config.task!r} is not a task of grid.tasks ({', '.join(tasks)})"
        )
    task = tasks[config.task]
    if task.kind != TaskKind.TOKEN or task.metric != METRIC:
        raise ElmolabError(
            f"taskmodel.task: the tagger labels tokens and is scored by {METRIC}; {config.task!r}"
            f" is a {task.kind} task scored by {task.metric}"
        )
    if config.unseen is not None:
        task = dataclasses.replace(task, unseen=config.unseen)
    check_task(task)
    return task


def result_name(task: TaskConfig) -> str:
    """The task as each run's ``metrics.json`` names it: ``<task>_<the dataset it trains on>``
    (``ner_conll2003``), since the stage's folder names neither."""
    dataset, _ = task.split_refs()["train"]
    return f"{task.name}_{dataset}"


@dataclass(frozen=True)
class TaskData:
    """What every input shares: the task, its split sources, tag and word ids, context-free
    vectors."""

    task: TaskConfig
    sources: dict[str, SplitSource]
    vocabulary: LabelVocabulary
    tags: dict[str, list[list[int]]]  # role -> per sentence
    words: WordVocabulary
    word_ids: dict[str, torch.Tensor]  # role -> (tokens,)
    token: dict[str, torch.Tensor]  # role -> (tokens, token_dim)


def load_task_data(config: TaskModelConfig, task: TaskConfig, catalog: DataCatalog) -> TaskData:
    """Read ``task``'s splits, their tags and the token encoder's layer 0 (standardized as
    configured)."""
    loaded = load_task(task, catalog)
    sources, labels = loaded.sources, loaded.labels
    assert labels is not None, "tagging_task gives a token task"
    words = WordVocabulary((s.tokens for s in sources["train"].sentences), config.min_word_count)
    word_ids = {
        role: torch.tensor(
            [i for s in words.encode(x.tokens for x in source.sentences) for i in s],
            dtype=torch.int64,
        )
        for role, source in sources.items()
    }
    layers, _ = encoder_layers(config, config.token_encoder, sources, labels.labels)
    token = {role: split.features[0].clone() for role, split in layers.items()}
    return TaskData(task, sources, labels.vocabulary, labels.labels, words, word_ids, token)


def encoder_layers(
    config: TaskModelConfig,
    encoder: str,
    sources: dict[str, SplitSource],
    tags: dict[str, list[list[int]]],
) -> tuple[dict[str, FeatureDataset], tuple[torch.Tensor, torch.Tensor] | None]:
    """Role -> an encoder's cached layers ``(num_layers, tokens, dim)`` of that split, checked
    against the data (tokens, counts: an ElmolabError names the file and line), standardized by
    the train split's statistics if ``config.standardize``; and those statistics (mean, std),
    each ``(num_layers, dim)`` (None without standardizing)."""
    encoder_dir = Path(config.features_dir) / encoder
    splits = {
        role: FeatureDataset.from_sentences(
            read_split_features(encoder_dir, source),
            tags[role],
            path=feature_path(encoder_dir, source.dataset, source.split),
        )
        for role, source in sources.items()
    }
    return splits, standardize_layers(splits) if config.standardize else None


class BucketBatches(Sampler[list[int]]):
    """Training batches: a fresh permutation each epoch (from ``seed``), cut into runs of
    :data:`BUCKET_BATCHES` batches, each run sorted by length and cut into batches, the batches
    shuffled; similar lengths pad little, and every epoch's batches differ."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.rng.permutation(len(self.lengths))
        run = self.batch_size * BUCKET_BATCHES
        batches = []
        for start in range(0, len(order), run):
            chunk = order[start : start + run]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [
                chunk[i : i + self.batch_size].tolist()
                for i in range(0, len(chunk), self.batch_size)
            ]
        yield from (batches[i] for i in self.rng.permutation(len(batches)))


class EpochRecord(Callback):
    """Each epoch's mean training loss and dev F1 (``history``), logged as a line."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.history: list[dict[str, float]] = []
        self._start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = trainer.callback_metrics
        entry = {"epoch": trainer.current_epoch + 1, "dev_f1": float(metrics["dev/f1"])}
        if "train/loss" in metrics:
            entry["train_loss"] = float(metrics["train/loss"])
        self.history.append(entry)
        log.info(
            "%s: epoch %d, dev F1 %.2f, %.0f s",
            self.label,
            entry["epoch"],
            entry["dev_f1"],
            time.perf_counter() - self._start,
        )


def train_one(
    config: TaskModelConfig,
    data: TaskData,
    splits: dict[str, TaggingSplit],
    seed: int,
    label: str,
    encoder: FineTunedLayers | None = None,
) -> tuple[dict[str, Any], list[list[int]]]:
    """Train the tagger on ``splits`` with ``seed`` (and ``encoder``'s biLM inside it, whose
    layers the mix then reads); its record and test predictions (the best dev epoch's state,
    restored from Lightning's checkpoint)."""
    torch.manual_seed(seed)
    train = splits["train"]
    layers = train.layers
    mix_layers, mix_dim = (0, 0) if layers is None else (layers.shape[0], layers.shape[2])
    if encoder is not None:
        mix_layers, mix_dim = encoder.num_layers, encoder.dim
    shape = TaggerShape(
        num_tags=len(data.vocabulary),
        token_dim=train.token.shape[1],
        num_words=len(data.words),
        word_dim=config.word_dim,
        mix_layers=mix_layers,
        mix_dim=mix_dim,
        hidden_dim=config.hidden_dim,
        lstm_layers=config.lstm_layers,
        dropout=config.dropout,
        l2_lambda=config.l2_lambda,
    )
    dev_gold = splits["dev"].gold_sentences()
    module = TaggerModule(
        BiLstmCrfTagger(shape, encoder),
        data.vocabulary,
        dev_gold,
        config.lr,
        config.mix_lr,
        config.finetune_lr,
    )
    loaders = {
        role: DataLoader(
            range(len(split)),
            batch_sampler=(
                BucketBatches(split.sentence_lengths, config.batch_size, seed)
                if role == "train"
                else LengthSortedBatches(split, config.eval_batch_size)
            ),
            collate_fn=PadBatch(split),
        )
        for role, split in splits.items()
    }
    record = EpochRecord(label)
    quiet_lightning()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="taskmodel-") as checkpoints:
        best = ModelCheckpoint(checkpoints, "best", monitor="dev/f1", mode="max", save_top_k=1)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=config.max_epochs,
            gradient_clip_val=config.gradient_clip,
            callbacks=[best, EarlyStopping("dev/f1", mode="max", patience=config.patience), record],
            logger=False,
            enable_progress_bar=sys.stdout.isatty(),
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=checkpoints,
        )
        trainer.fit(module, loaders["train"], loaders["dev"])
        state = torch.load(best.best_model_path, map_location="cpu", weights_only=False)
        module.load_state_dict(state["state_dict"])
        found: dict[int, list[int]] = {}
        for batch in trainer.predict(module, loaders["test"]) or []:
            found.update(batch)  # type: ignore[arg-type]
    predicted = [found[i] for i in range(len(splits["test"]))]
    mix = module.tagger.mix_summary()
    result = {
        "task": result_name(data.task),
        "input": label.split("/")[0],
        "seed": seed,
        "metric": METRIC,
        "dev_f1": float(best.best_model_score),
        "test_f1": sentence_f1(data.vocabulary, splits["test"].gold_sentences(), predicted),
        "best_epoch": max(record.history, key=lambda e: e["dev_f1"])["epoch"],
        "epochs": len(record.history),
        "hit_epoch_cap": len(record.history) == config.max_epochs,
        "history": record.history,
        "mix_weights": None if mix is None else mix[0],
        "gamma": None if mix is None else mix[1],
        "parameters": sum(p.numel() for p in module.tagger.parameters()),
        "wall_seconds": time.perf_counter() - start,
    }
    return result, predicted


def input_splits(config: TaskModelConfig, data: TaskData, name: str) -> dict[str, TaggingSplit]:
    """Role -> the tagging split of input ``name``: baseline; elmo_<encoder> with its cached
    layers; finetune_<encoder> with the tokens' character ids."""
    layers = chars = None
    if name.startswith(MIX_PREFIX):
        encoder = name.removeprefix(MIX_PREFIX)
        loaded, _ = encoder_layers(config, encoder, data.sources, data.tags)
        layers = {role: split.features for role, split in loaded.items()}
    elif name.startswith(FINETUNE_PREFIX):
        chars = {
            role: batch_to_ids([[t for s in source.sentences for t in s.tokens]], truncate=True)[
                0
            ].to(torch.int16)  # (tokens, 50): ids < 262
            for role, source in data.sources.items()
        }
    return {
        role: TaggingSplit(
            token=data.token[role],
            layers=None if layers is None else layers[role],
            words=data.word_ids[role],
            tags=torch.tensor([t for s in data.tags[role] for t in s], dtype=torch.int64),
            sentence_lengths=tuple(len(s) for s in data.tags[role]),
            chars=None if chars is None else chars[role],
        )
        for role in SPLIT_ROLES
    }


def fine_tuned_encoder(
    config: TaskModelConfig, data: TaskData, name: str, encoders: Mapping[str, Any]
) -> Callable[[], FineTunedLayers]:
    """A maker of input ``name``'s (finetune_<encoder>) biLM, a fresh trainable copy of the
    encoder (any encoder folder: bilm-tf files or an elmolab ``model.pt``, read once) for every
    seed, standardized by the statistics of its cached train layers (as elmo_<encoder>'s are)."""
    encoder = name.removeprefix(FINETUNE_PREFIX)
    if encoder not in encoders:
        raise ElmolabError(
            f"taskmodel.finetune_encoders: {encoder!r} is not one of extract.encoders "
            f"({', '.join(encoders)})"
        )
    files = encoder_files(encoders[encoder], f"extract.encoders.{encoder}")
    if config.standardize:  # the train split's statistics: only its features are read
        train = {"train": data.sources["train"]}
        _, stats = encoder_layers(config, encoder, train, {"train": data.tags["train"]})
    else:  # the layers as they are
        options = files.options_only()
        shape = (options.lstm.n_layers + 1, 2 * options.lstm.projection_dim)
        stats = (torch.zeros(shape), torch.ones(shape))
    assert stats is not None
    mean, std = stats
    source = files.load()
    return lambda: FineTunedLayers.of(source, mean, std)


def run_taskmodel(
    config: TaskModelConfig,
    task: TaskConfig,
    catalog: DataCatalog,
    out_dir: Path,
    encoders: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every input and seed of ``config`` on ``task`` (:func:`tagging_task`); writes ``out_dir``
    (module docstring) and returns the summary. ``encoders`` (``extract.encoders``) locates the
    biLMs of ``finetune_encoders``."""
    config.check()
    torch.set_num_threads(config.num_threads)
    start = time.perf_counter()
    data = load_task_data(config, task, catalog)
    results = []
    with atomic_dir(out_dir) as tmp:
        for name in config.inputs:
            splits = input_splits(config, data, name)
            make_encoder = None
            if name.startswith(FINETUNE_PREFIX):
                make_encoder = fine_tuned_encoder(config, data, name, encoders or {})
            for seed in config.seeds:
                encoder = None if make_encoder is None else make_encoder()
                label = f"{name}/seed{seed}"
                result, predicted = train_one(config, data, splits, seed, label, encoder)
                run_dir = tmp / name / f"{SEED_PREFIX}{seed}"
                write_json(run_dir / METRICS_FILE, result)
                lengths = [len(s) for s in predicted]
                flat = torch.tensor([t for s in predicted for t in s], dtype=torch.int64)
                tags = data.vocabulary.decode_in_data_scheme(flat, lengths)
                text = "".join(" ".join(s) + "\n" for s in tags)
                (run_dir / PREDICTIONS_FILE).write_text(text, encoding="utf-8")
                results.append(result)
            del splits
        summary = summarize(results, config.inputs)
        summary["wall_seconds"] = time.perf_counter() - start
        summary.update(peak_memory())
        write_json(tmp / METRICS_FILE, summary)
        (tmp / TABLE_FILE).write_text(markdown_table(summary), encoding="utf-8")
    return summary


def summarize(results: Sequence[dict[str, Any]], inputs: Sequence[str]) -> dict[str, Any]:
    """Per input: the test F1 of each seed, their mean and sample standard deviation (None for one
    seed), the dev mean; per input but the baseline: its comparison (:func:`error_reduction`)."""
    by_input: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in inputs}
    for result in results:
        by_input[result["input"]][result["seed"]] = result
    table = {}
    for name, runs in by_input.items():
        test = [runs[seed]["test_f1"] for seed in sorted(runs)]
        table[name] = {
            "seeds": sorted(runs),
            "test_f1": test,
            "mean": float(np.mean(test)),
            "std": float(np.std(test, ddof=1)) if len(test) > 1 else None,
            "dev_mean": float(np.mean([runs[seed]["dev_f1"] for seed in sorted(runs)])),
        }
    comparisons = {name: _paired(by_input, BASELINE, name) for name in inputs[1:]}
    frozen = {  # finetune_<encoder> against elmo_<encoder>, where both ran
        name: _paired(by_input, MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX), name)
        for name in inputs
        if name.startswith(FINETUNE_PREFIX)
        and MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX) in by_input
    }
    summary = {"metric": METRIC, "inputs": table, "vs_baseline": comparisons}
    if frozen:
        summary["vs_frozen"] = frozen
    return summary


def _paired(
    by_input: dict[str, dict[int, dict[str, Any]]], reference: str, name: str
) -> dict[str, Any]:
    """Input ``name`` against input ``reference`` (:func:`error_reduction`) on their common
    seeds."""
    seeds = [seed for seed in sorted(by_input[name]) if seed in by_input[reference]]
    return error_reduction(
        [by_input[reference][seed]["test_f1"] for seed in seeds],
        [by_input[name][seed]["test_f1"] for seed in seeds],
    )


def error_reduction(baseline: Sequence[float], other: Sequence[float]) -> dict[str, Any]:
    """``other`` against ``baseline``, F1 in percent of the same seeds in the same order.

    ``absolute``: ``mean(other) - mean(baseline)`` in points, the error ``100 - F1`` reduced by
    that much; ``relative``: that over the baseline's error ``100 - mean(baseline)``, in percent;
    ``p_value``: a two-sided paired t-test over the seeds (None for fewer than 2)."""
    base, mean = float(np.mean(baseline)), float(np.mean(other))
    absolute = mean - base
    return {
        "absolute": absolute,
        "relative": 100.0 * absolute / (100.0 - base) if base < 100.0 else None,
        "p_value": paired_t_test(list(baseline), list(other)) if len(baseline) > 1 else None,
        "test": f"paired t-test over {len(baseline)} seeds" if len(baseline) > 1 else "none",
    }


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table: input, test F1 mean ± std (seeds), and against the
    baseline the absolute and relative error reduction and the p-value."""
    lines = [
        "| input | test F1 (mean ± std) | seeds | error reduction, absolute | relative | p |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary["inputs"].items():
        spread = "" if row["std"] is None else f" ± {row['std']:.2f}"
        cells = [name, f"{row['mean']:.2f}{spread}", str(len(row["seeds"]))]
        versus = summary["vs_baseline"].get(name)
        if versus is None:
            cells += ["", "", ""]
        else:
            relative = versus["relative"]
            cells += [
                f"{versus['absolute']:+.2f}",
                "" if relative is None else f"{relative:+.1f}%",
                "" if versus["p_value"] is None else f"{versus['p_value']:.3g}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for name, versus in summary.get("vs_frozen", {}).items():
        twin = MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX)
        p_value = "" if versus["p_value"] is None else f", p = {versus['p_value']:.3g}"
        lines.append(
            f"\n{name} against {twin} (fine-tuned against frozen): "
            f"{versus['absolute']:+.2f} F1{p_value}"
        )
    return "\n".join(lines) + "\n"


def paired_t_test(a: list[float], b: list[float]) -> float:
    """Two-sided paired t-test p-value; identical differences give 0 (or 1 when all zero)."""
    diff = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    if np.allclose(diff, diff[0]):
        return 1.0 if math.isclose(diff[0], 0.0, abs_tol=1e-12) else 0.0
    from scipy import stats

    return float(stats.ttest_rel(b, a).pvalue)
