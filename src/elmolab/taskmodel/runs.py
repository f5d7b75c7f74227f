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
count, in the data's tag scheme); each run also keeps every test sentence's chunk counts
(``per_sentence_test_spans``), so that sentences can be resampled. Each run trains until its dev
F1 has not improved for ``patience`` epochs (at most ``max_epochs``) and is scored at its best
dev epoch.

A control (the config's ``controls``: a name -> its instance encoders, e.g. three random
initialisations) is one input of the summary, ``elmo_<control>``, pooled over its instances
among ``mix_encoders``, each trained with ``control_seeds``. Every input is compared with the
baseline by the two-level bootstrap of ``elmolab.report.significance`` (units: seeds, or a
control's (instance, seed) runs drawn instance first; and the test sentences), the p-values
Holm-adjusted over the inputs compared (:func:`summarize`).
"""

from __future__ import annotations

import dataclasses
import functools
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
from elmolab.probing.jobs import run_jobs
from elmolab.probing.metrics import sentence_span_counts
from elmolab.report.format import gain_cells
from elmolab.report.significance import RunScores, adjust, compare, span_f1_counts
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
    test = splits["test"]
    flat = torch.tensor([t for s in predicted for t in s], dtype=torch.int64)
    spans = sentence_span_counts(flat, test.tags, test.sentence_lengths, data.vocabulary)
    mix = module.tagger.mix_summary()
    result = {
        "task": result_name(data.task),
        "input": label.split("/")[0],
        "seed": seed,
        "metric": METRIC,
        "dev_f1": float(best.best_model_score),
        "test_f1": sentence_f1(data.vocabulary, test.gold_sentences(), predicted),
        "per_sentence_test_spans": spans,
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


class InputSplits:
    """The tagging splits of one input at a time (:func:`input_splits`), and a fine-tuned input's
    maker of its biLM (:func:`fine_tuned_encoder`): runs of the same input in a row read its
    features once, and a process holds one input's features, however many it trains."""

    def __init__(
        self, config: TaskModelConfig, data: TaskData, encoders: Mapping[str, Any]
    ) -> None:
        self.config = config
        self.data = data
        self.encoders = encoders
        self._name: str | None = None
        self._loaded: tuple[dict[str, TaggingSplit], Callable[[], FineTunedLayers] | None]

    def __call__(
        self, name: str
    ) -> tuple[dict[str, TaggingSplit], Callable[[], FineTunedLayers] | None]:
        if name != self._name:
            self._name, self._loaded = None, ({}, None)  # the last input's features go first
            make_encoder = None
            if name.startswith(FINETUNE_PREFIX):
                make_encoder = fine_tuned_encoder(self.config, self.data, name, self.encoders)
            self._loaded = (input_splits(self.config, self.data, name), make_encoder)
            self._name = name
        return self._loaded


def run_input(
    config: TaskModelConfig, data: TaskData, loaded: InputSplits, name: str, seed: int
) -> tuple[dict[str, Any], list[list[int]]]:
    """One run of the stage: input ``name`` trained with ``seed`` (:func:`train_one`)."""
    splits, make_encoder = loaded(name)
    encoder = None if make_encoder is None else make_encoder()
    return train_one(config, data, splits, seed, f"{name}/seed{seed}", encoder)


def run_taskmodel(
    config: TaskModelConfig,
    task: TaskConfig,
    catalog: DataCatalog,
    out_dir: Path,
    encoders: Mapping[str, Any] | None = None,
    controls: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Every input and seed of ``config`` on ``task`` (:func:`tagging_task`); writes ``out_dir``
    (module docstring) and returns the summary. ``encoders`` (``extract.encoders``) locates the
    biLMs of ``finetune_encoders``; ``controls`` (the config's section: a control -> its
    instance encoders -> draw seed) pools instances in the summary (:func:`summary_inputs`).

    The runs are independent: ``config.workers`` forked processes train them, one torch thread
    each (``elmolab.probing.jobs.run_jobs``), each run as one process alone would train it. The
    runs with a mix go first and the baseline's, the shortest, last, so that the workers end
    close together."""
    config.check()
    pooled = summary_inputs(config.inputs, controls or {})
    instances = {run for name, runs in pooled.items() if runs != [name] for run in runs}
    torch.set_num_threads(config.num_threads)
    torch.set_flush_denormal(True)  # as run_jobs' workers do: a run's numbers whoever trains it
    start = time.perf_counter()
    data = load_task_data(config, task, catalog)
    loaded = InputSplits(config, data, encoders or {})
    order = [name for name in config.inputs if name != BASELINE] + [BASELINE]
    runs = [
        (name, seed)
        for name in order
        for seed in (config.control_seeds if name in instances else config.seeds)
    ]
    jobs = [functools.partial(run_input, config, data, loaded, *run) for run in runs]
    results = []
    with atomic_dir(out_dir) as tmp:
        for (name, seed), (result, predicted) in zip(
            runs, run_jobs(jobs, config.workers), strict=True
        ):
            run_dir = tmp / name / f"{SEED_PREFIX}{seed}"
            write_json(run_dir / METRICS_FILE, result)
            lengths = [len(s) for s in predicted]
            flat = torch.tensor([t for s in predicted for t in s], dtype=torch.int64)
            tags = data.vocabulary.decode_in_data_scheme(flat, lengths)
            text = "".join(" ".join(s) + "\n" for s in tags)
            (run_dir / PREDICTIONS_FILE).write_text(text, encoding="utf-8")
            results.append(result)
        summary = summarize(
            results, pooled, config.max_epochs, config.bootstrap_samples, config.bootstrap_seed
        )
        summary["wall_seconds"] = time.perf_counter() - start
        summary.update(peak_memory())
        write_json(tmp / METRICS_FILE, summary)
        (tmp / TABLE_FILE).write_text(markdown_table(summary), encoding="utf-8")
    return summary


def summary_inputs(
    inputs: Sequence[str], controls: Mapping[str, Mapping[str, int]]
) -> dict[str, list[str]]:
    """The summary's inputs -> the run inputs each pools, in ``inputs``' order: the instances of
    a control (``controls``: its name -> instance encoder -> draw seed) among the ``elmo_``
    inputs pool into ``elmo_<control>`` (where there are two or more); every other input is its
    own. An ElmolabError names a control that shares an instance with another or whose pooled
    name is another input's."""
    owner: dict[str, str] = {}
    for control, instances in controls.items():
        for instance in instances:
            if MIX_PREFIX + instance in owner:
                raise ElmolabError(
                    f"controls.{control}: {instance!r} is already an instance of "
                    f"{owner[MIX_PREFIX + instance].removeprefix(MIX_PREFIX)!r}"
                )
            owner[MIX_PREFIX + instance] = MIX_PREFIX + control
    for name in inputs:
        if name not in owner and name in owner.values():
            raise ElmolabError(
                f"controls.{name.removeprefix(MIX_PREFIX)}: its pooled input {name} is also an "
                "input of its own (taskmodel.mix_encoders)"
            )
    pooled: dict[str, list[str]] = {}
    for name in inputs:
        pooled.setdefault(owner.get(name, name), []).append(name)
    # A control with one instance among the inputs has nothing to pool: that encoder is its own
    # input, with every seed.
    return {runs[0] if len(runs) == 1 else name: runs for name, runs in pooled.items()}


def summarize(
    results: Sequence[dict[str, Any]],
    pooled: Mapping[str, Sequence[str]],
    max_epochs: int,
    samples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """The stage's summary of every run's ``results``, by summary input (``pooled``: each one's
    run inputs, :func:`summary_inputs`; ``baseline`` among them).

    ``inputs``, per input: the test F1 of each run (by instance, then seed), their mean and
    sample standard deviation (None for one run), the dev mean, the runs' epochs and best
    epochs (min, mean, max) and how many hit ``max_epochs``; a pooled control also its
    ``instances``. ``vs_baseline``, per input but the baseline, :func:`comparison` against the
    baseline, its p-values Holm-adjusted over that ``family``; ``vs_frozen`` (with
    ``frozen_family``) each ``finetune_<encoder>`` against ``elmo_<encoder>``, where both ran.
    ``samples`` and ``seed``: the bootstrap's. ``runs`` and ``hit_epoch_cap`` count all runs."""
    runs = {
        name: sorted(
            (r for r in results if r["input"] in members),
            key=lambda r: (list(members).index(r["input"]), r["seed"]),
        )
        for name, members in pooled.items()
    }
    table = {name: _row(name, runs[name], pooled[name]) for name in pooled}
    scores = {name: run_scores(runs[name]) for name in pooled}

    def family(pairs: dict[str, str]) -> dict[str, dict[str, Any]]:
        found = {
            name: comparison(scores[reference], scores[name], samples, seed)
            for name, reference in pairs.items()
        }
        adjusted = adjust([c["p_value"] for c in found.values()], "holm")
        for c, p in zip(found.values(), adjusted, strict=True):
            c["p_adjusted"] = p
        return found

    versus = family({name: BASELINE for name in pooled if name != BASELINE})
    twins = {
        name: MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX)
        for name in pooled
        if name.startswith(FINETUNE_PREFIX)
        and MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX) in pooled
    }
    summary = {
        "metric": METRIC,
        "inputs": table,
        "vs_baseline": versus,
        "family": _family("task model: input vs baseline", versus),
        "runs": len(results),
        "hit_epoch_cap": sum(bool(r["hit_epoch_cap"]) for r in results),
        "max_epochs": max_epochs,
    }
    if twins:
        frozen = family(twins)
        summary["vs_frozen"] = frozen
        summary["frozen_family"] = _family("task model: fine-tuned vs frozen", frozen)
    return summary


def _family(name: str, comparisons: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    tested = sum(c["p_value"] is not None for c in comparisons.values())
    return {"name": name, "tests": tested, "correction": "holm"}


def _row(name: str, runs: Sequence[dict[str, Any]], members: Sequence[str]) -> dict[str, Any]:
    """Summary input ``name``'s line (:func:`summarize`)."""
    test = [r["test_f1"] for r in runs]
    row: dict[str, Any] = {
        "seeds": sorted({r["seed"] for r in runs}),
        "units": len(runs),
        "test_f1": test,
        "mean": float(np.mean(test)),
        "std": float(np.std(test, ddof=1)) if len(test) > 1 else None,
        "dev_mean": float(np.mean([r["dev_f1"] for r in runs])),
        "epochs": _spread([r["epochs"] for r in runs]),
        "best_epoch": _spread([r["best_epoch"] for r in runs]),
        "hit_epoch_cap": sum(bool(r["hit_epoch_cap"]) for r in runs),
    }
    if list(members) != [name]:
        row["instances"] = list(members)
    return row


def _spread(values: Sequence[int]) -> dict[str, float]:
    return {"min": min(values), "mean": float(np.mean(values)), "max": max(values)}


def run_scores(runs: Sequence[dict[str, Any]]) -> RunScores:
    """The bootstrap's view of one summary input: per run, each test sentence's span F1
    numerator and denominator; a unit is a seed, or, pooling several instances, an (instance,
    seed) grouped by its instance."""
    counts = [r["per_sentence_test_spans"] for r in runs]
    numerators, denominators = span_f1_counts(
        *(np.array([c[key] for c in counts]) for key in ("tp", "pred", "gold"))
    )
    if len({r["input"] for r in runs}) == 1:
        return RunScores(numerators, denominators, tuple(r["seed"] for r in runs))
    units = tuple((r["input"], r["seed"]) for r in runs)
    return RunScores(numerators, denominators, units, tuple(r["input"] for r in runs))


def comparison(reference: RunScores, other: RunScores, samples: int, seed: int) -> dict[str, Any]:
    """``other`` against ``reference`` on the same test sentences, unpaired: ``effect`` (mean F1
    difference), its 95% interval ``low`` to ``high`` and the smallest ``detectable`` effect, all
    in F1 points; ``p_value`` (two-sided) and the test's ``method``
    (``elmolab.report.significance.compare``); ``relative``, the share of the reference's error
    ``100 - F1`` removed, a fraction. Fewer than 2 units (instances) a side: the effect alone,
    the rest None."""
    base = 100 * float(reference.scores.mean())
    effect = 100 * float(other.scores.mean()) - base
    found: dict[str, Any] = {
        "effect": effect,
        "low": None,
        "high": None,
        "p_value": None,
        "detectable": None,
        "standard_error": None,
        "df": None,
        "method": "not testable: fewer than 2 units (or instances) a side",
        "relative": effect / (100 - base) if base < 100 else None,
    }
    if reference.n_groups >= 2 and other.n_groups >= 2:
        test = compare(reference, other, paired=False, samples=samples, seed=seed)
        found.update(
            low=100 * test.low,
            high=100 * test.high,
            p_value=test.p_value,
            detectable=100 * test.detectable,
            standard_error=100 * test.standard_error,
            df=test.df,
            method=test.method,
        )
    return found


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table: input, test F1 mean ± std, runs, and against the
    baseline the gain with its 95% interval, the relative error reduction and the Holm-adjusted
    p-value."""
    lines = [
        "| input | test F1 (mean ± std) | runs | gain [95% CI] | relative | p (Holm) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary["inputs"].items():
        spread = "" if row["std"] is None else f" ± {row['std']:.2f}"
        cells = [name, f"{row['mean']:.2f}{spread}", str(row["units"])]
        versus = summary["vs_baseline"].get(name)
        cells += ["", "", ""] if versus is None else gain_cells(versus)
        lines.append("| " + " | ".join(cells) + " |")
    for name, versus in summary.get("vs_frozen", {}).items():
        twin = MIX_PREFIX + name.removeprefix(FINETUNE_PREFIX)
        gain, _, p_value = gain_cells(versus)
        lines.append(f"\n{name} against {twin} (fine-tuned against frozen): {gain} F1, p {p_value}")
    cap = f"{summary['hit_epoch_cap']} of {summary['runs']} runs hit the epoch cap"
    lines.append(f"\n{cap} ({summary['max_epochs']} epochs).")
    return "\n".join(lines) + "\n"
