"""A probe cell's data, loaded once, before the cell runs: the task's splits and every encoder's
features of them, in memory (the stage loads it; :func:`elmolab.probing.runner.run_cell` reads
no file of the data or the features)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmolab.core.schema import SPLIT_ROLES, ProbeSettings, TaskConfig, TaskKind
from elmolab.data.catalogue import DataCatalog, SplitSource, read_split_features
from elmolab.data.labels import TaskLabels
from elmolab.data.tasks import LoadedTask, load_task
from elmolab.data.wsd import WordNetSenseIndex
from elmolab.io.features import feature_path
from elmolab.probing.datasets import (
    FeatureDataset,
    TreeDataset,
    pool_sentences,
    standardize_layers,
)
from elmolab.probing.settings import probe_dtype


@dataclass(frozen=True)
class ProbeData:
    """Token, pair, sentence and tree tasks: every encoder's splits, and the task's labels."""

    # encoder -> role -> FeatureDataset (token, pair, sentence) or TreeDataset (arc, structural)
    splits: dict[str, dict[str, Any]]
    labels: TaskLabels | None  # token, pair and sentence tasks


@dataclass(frozen=True)
class WsdData:
    """WSD: the splits' sentences, WordNet, and every encoder's instance vectors."""

    sources: dict[str, SplitSource]  # role -> its sentences (sense keys checked against WordNet)
    wordnet: WordNetSenseIndex
    layers: dict[str, dict[str, torch.Tensor]]  # encoder -> role -> (num_layers, instances, dim)


def load_cell(
    task: TaskConfig, settings: ProbeSettings, catalog: DataCatalog
) -> ProbeData | WsdData:
    """``task``'s data for every encoder of ``settings.encoders``, read once from ``catalog`` (the
    catalogue the features of ``settings.features_dir`` were extracted from); ``task`` and
    ``settings`` as the cell runs them (checked, the precision resolved).

    Every split is one contiguous array in its stored
    type (with ``probe.standardize``, each layer standardized by its train split's statistics;
    tree tasks' then in the type their probes read, :func:`probe_dtype`, which every job would
    otherwise convert on its own; sentence tasks' pooled, one float32 item per sentence,
    :func:`~elmolab.probing.datasets.pool_sentences`); WSD's, each split's instance vectors."""
    loaded = load_task(task, catalog)
    encoder_dirs = {encoder: Path(settings.features_dir) / encoder for encoder in settings.encoders}
    if TaskKind(task.kind) is TaskKind.WSD:
        assert loaded.wordnet is not None
        layers = {
            encoder: {
                role: _instance_layers(read_split_features(encoder_dir, source))
                for role, source in loaded.sources.items()
            }
            for encoder, encoder_dir in encoder_dirs.items()
        }
        return WsdData(loaded.sources, loaded.wordnet, layers)
    splits = {
        encoder: _encoder_splits(task, loaded, encoder_dir, settings)
        for encoder, encoder_dir in encoder_dirs.items()
    }
    return ProbeData(splits, loaded.labels)


def _encoder_splits(
    task: TaskConfig, loaded: LoadedTask, encoder_dir: Path, settings: ProbeSettings
) -> dict[str, Any]:
    """One encoder's train, dev and test split of ``task`` (see :func:`load_cell`)."""
    kind = TaskKind(task.kind)
    labels, trees = loaded.labels, loaded.trees
    splits: dict[str, Any] = {}
    for role in SPLIT_ROLES:
        source = loaded.sources[role]
        features = read_split_features(encoder_dir, source)
        path = feature_path(encoder_dir, source.dataset, source.split)
        if trees is not None:
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
        splits[role] = split
    if settings.standardize:
        standardize_layers(splits)
    if trees is not None:
        as_probed = probe_dtype(settings)
        converted: dict[int, torch.Tensor] = {}  # an array two roles share, converted once
        for role, split in splits.items():
            key = split.features.data_ptr()
            if key not in converted:
                converted[key] = split.features.to(as_probed)
            splits[role] = dataclasses.replace(split, features=converted[key])
    return splits


def _instance_layers(sentences: list[np.ndarray]) -> torch.Tensor:
    """Per-sentence ``(num_layers, n_i, dim)`` arrays -> ``(num_layers, instances, dim)``."""
    return torch.from_numpy(np.concatenate(sentences, axis=1))
