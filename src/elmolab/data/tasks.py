"""A probing task: its settings checked, and its three splits loaded from the catalogue.

A **task** (config ``task``, :class:`TaskConfig`) names the ``<dataset>/<split>`` it trains on,
selects on (dev) and tests on, and its kind:

- ``token``: one label per token, the sentence records' field ``field`` (UPOS, XPOS, chunks, NER);
- ``pair``: the label of each word's arc to its gold head (``deprels``), from
  ``[h_dep; h_head; h_dep * h_head]``;
- ``arc``, ``structural``: the gold dependency tree (``elmolab.probing.trees``);
- ``wsd``: 1-nearest-neighbour over SemCor sense centroids, first-sense back-off, F1;
- ``sentence``: one label per sentence, the sentence records' field ``field`` (SST's
  ``sentiment``), from its tokens' features mean-pooled; ``label_map`` renames labels and drops
  the sentences of a label mapped to null (SST-2 from SST-5's five labels).

:func:`load_task` reads a checked task's splits once, with what its kind needs of them (labels,
trees, WordNet); :func:`~elmolab.data.catalogue.read_split_features` reads each split's features
from an encoder's folder, checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import TaskConfig, TaskKind
from elmolab.data.catalogue import DataCatalog, SplitSource, parse_choice, read_split_features
from elmolab.data.labels import (
    TREE_FIELD,
    TaskLabels,
    TaskMetric,
    TreeSplit,
    task_labels,
    tree_splits,
)
from elmolab.data.wsd import WordNetSenseIndex, read_wordnet_sense_index


class TaskFamily(StrEnum):
    """What a task probes, the report's grouping of the layer claim (ELMo: layer 1 syntax, layer 2
    semantics)."""

    SYNTACTIC = "syntactic"  # word classes, chunks, dependencies
    SEMANTIC = "semantic"  # word senses, supersenses, named entities, sentiment
    CONTROL = "control"  # a control task (random labels per word type): neither family


# The metric of each tree task (``elmolab.probing.trees``).
TREE_METRICS = {TaskKind.ARC: "uas", TaskKind.STRUCTURAL: "uuas"}


def check_task(task: TaskConfig) -> None:
    """Reject a task's inconsistent settings, naming the key."""
    kind = parse_choice(TaskKind, task.kind, "task.kind")
    family = parse_choice(TaskFamily, task.family, f"task.family (conf/tasks/{task.name}.yaml)")
    if (family is TaskFamily.CONTROL) != (task.control_of is not None):
        raise ElmolabError(
            f"task.control_of (conf/tasks/{task.name}.yaml): a control task (family control)"
            " names the task it controls, and no other task names one"
        )
    for key in ("mdl", "conditional"):
        if getattr(task, key) and kind is not TaskKind.TOKEN:
            raise ElmolabError(f"task.{key}: measured for token tasks, not {kind.value}")
    if kind is TaskKind.WSD:
        if task.metric != "f1":
            raise ElmolabError(f"task.metric: wsd is scored by f1, not {task.metric!r}")
        if task.wordnet is None:
            raise ElmolabError("task.wordnet: wsd needs WordNet's index.sense")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: wsd has no control task")
    elif kind.is_tree:
        if task.metric != TREE_METRICS[kind]:
            raise ElmolabError(
                f"task.metric: {kind.value} is scored by {TREE_METRICS[kind]}, not {task.metric!r}"
            )
        if task.field != TREE_FIELD:
            raise ElmolabError(f"task.field: {kind.value} reads {TREE_FIELD!r}")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
    else:
        parse_choice(TaskMetric, task.metric, "task.metric")
        if task.field is None:
            raise ElmolabError(f"task.field: a {kind.value} task needs the label field")
        if kind is TaskKind.PAIR and task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
    if kind is TaskKind.SENTENCE:
        if task.metric != TaskMetric.ACCURACY:
            raise ElmolabError(f"task.metric: sentence tasks score accuracy, not {task.metric!r}")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
        if task.label_map is not None and not any(task.label_map.values()):
            raise ElmolabError("task.label_map: every label is dropped (mapped to null)")
    elif task.label_map is not None:
        raise ElmolabError(f"task.label_map: for sentence tasks, not {kind.value}")
    if task.unseen not in ("raise", "keep"):
        raise ElmolabError(f"task.unseen must be 'raise' or 'keep', got {task.unseen!r}")


@dataclass(frozen=True)
class LoadedTask:
    """A task's train, dev and test splits as read, with what its kind needs of them."""

    sources: dict[str, SplitSource]  # role -> the split's sentences
    labels: TaskLabels | None  # token, pair and sentence tasks
    trees: dict[str, TreeSplit] | None  # tree tasks: role -> heads and punctuation
    wordnet: WordNetSenseIndex | None  # wsd: the index the sense keys were checked against


def load_task(task: TaskConfig, catalog: DataCatalog) -> LoadedTask:
    """``task``'s splits read from ``catalog`` (the catalogue its features were extracted from),
    once: a wsd task's sense keys checked against WordNet (``task.wordnet``), a token, pair or
    sentence task's labels (:func:`~elmolab.data.labels.task_labels`), a tree task's trees.
    ``task`` must have passed :func:`check_task`; a split of a dataset the catalogue lacks, or bad
    data, is an ElmolabError (naming the file and line where there is one)."""
    kind = TaskKind(task.kind)
    wordnet = None
    if kind is TaskKind.WSD:
        assert task.wordnet is not None, "check_task requires wordnet for wsd"
        wordnet = read_wordnet_sense_index(task.wordnet)
    sources = {}
    for role, (dataset, split) in task.split_refs().items():
        if dataset not in catalog.datasets:
            raise ElmolabError(
                f"task.{role}: no dataset {dataset!r} in extract.datasets"
                f" ({', '.join(catalog.datasets)})"
            )
        sources[role] = catalog.read(dataset, split, wordnet)
    labels = None if kind.is_tree or kind is TaskKind.WSD else task_labels(task, sources)
    trees = tree_splits(sources) if kind.is_tree else None
    return LoadedTask(sources, labels, trees, wordnet)
