"""What a trained probe kind declares to be trained (:class:`ProbeKind`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from elmolab.core.schema import ProbeSettings, TaskKind
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.probing.heads import HeadProbes
from elmolab.probing.probes import LayerInput, Probe, ProbeData
from elmolab.probing.settings import Schedule

# A task's splits by role (train, dev, test): FeatureDataset or TreeDataset, as the kind reads.
Splits = dict[str, Any]


@dataclass(frozen=True)
class ProbeTask:
    """What a kind's builders read of a fit: its splits, the ``probe`` section, and (labelled
    kinds) the task's label vocabulary and metric."""

    splits: Splits
    settings: ProbeSettings
    vocabulary: LabelVocabulary | None = None
    metric: TaskMetric | str | None = None


@dataclass(frozen=True)
class ProbeKind:
    """A trained probe kind, as its module registers it under its ``task_kind``.

    ``reference`` is the kind's plain module (one probe, float32, trained by
    :func:`elmolab.probing.probes.fit`), ``batched`` its form for many heads at once (trained by
    :func:`elmolab.probing.engine.fit_heads`); tests hold each head of the one to train as the
    other. ``build_reference(input, generator, task)`` makes the reference probe reading
    ``input``, its parameters drawn from ``generator``, and its data; ``build_batched(heads, task,
    bits=, shared=)`` the batched probes of one fit (``bits``: the results give cross-entropies in
    bits; ``shared``: what ``shared`` made of the cell's splits, or None)."""

    task_kind: TaskKind
    reference: type[Probe]
    batched: type[HeadProbes]
    build_reference: Callable[[LayerInput, torch.Generator, ProbeTask], tuple[Probe, ProbeData]]
    build_batched: Callable[..., HeadProbes]
    schedule: Callable[[ProbeSettings], Schedule]  # its part of ``probe`` (lr, epochs, ...)
    labelled: bool = False  # reads the task's labels: a vocabulary, scored by the task's metric
    conditional: bool = False  # heads may read layer 0 beside their mode (conditional probing)
    learning_curve: bool = False  # fits on shares of the training set too (probe.train_fractions)
    # A head's arithmetic per training item grows with its input's width to this power (the
    # arc probe's bilinear map: its square); jobs are ordered by it.
    width_power: int = 1
    # What every fit of a cell shares, made once from the splits of one encoder before the
    # cell's workers fork (the structural probe's gold trees); None: nothing.
    shared: Callable[[Splits], Any] | None = None
