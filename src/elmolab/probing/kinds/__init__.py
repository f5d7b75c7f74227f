"""The trained probe kinds, one module each, and their registry (:data:`KINDS`).

Each kind's module holds its reference probe (one plain module, float32, trained by
:func:`elmolab.probing.probes.fit`), the data that probe reads, and its batched form (every head of
a fit together, a :class:`elmolab.probing.heads.HeadProbes`), and declares the
:class:`ProbeKind` of each task kind it trains: ``token`` (token and sentence tasks: a sentence
probe is the token probe on pooled sentences), ``pair``, ``arc`` and ``structural``; ``padded``
holds what the two tree kinds share. To add a kind: its module, its name in :data:`KINDS`, its
test. WSD is no trained probe (``elmolab.probing.wsd``).
"""

from __future__ import annotations

import torch

from elmolab.core.schema import ProbeSettings, TaskKind
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.probing.kinds import arc, pair, structural, token
from elmolab.probing.kinds.kind import ProbeKind, ProbeTask, Splits
from elmolab.probing.probes import Head, LayerInput, Probe, ProbeData

KINDS: dict[TaskKind, ProbeKind] = {
    kind.task_kind: kind for module in (token, pair, arc, structural) for kind in module.KINDS
}


def probe_kind(kind: str) -> ProbeKind:
    """The trained probe kind ``kind`` names (a :class:`TaskKind`'s value)."""
    try:
        return KINDS[TaskKind(kind)]
    except (KeyError, ValueError):
        raise ValueError(f"unknown probe kind {kind!r}") from None


def build(
    kind: str,
    head: Head,
    splits: Splits,
    settings: ProbeSettings,
    vocabulary: LabelVocabulary | None = None,
    metric: TaskMetric | str | None = None,
) -> tuple[Probe, ProbeData]:
    """The reference probe of ``kind`` for ``head``, as ``settings`` (the ``probe`` section) make
    it, and its data (labelled kinds: give ``vocabulary`` and ``metric``). The probe draws its
    parameters from a generator seeded with the head's seed, which
    :func:`elmolab.probing.probes.fit` also orders the data with."""
    train = splits["train"]
    input = LayerInput(
        head.mode,
        train.num_layers,
        train.dim,
        l2_lambda=settings.l2_lambda,
        layer_norm=settings.layer_norm,
        baseline=head.baseline,
    )
    generator = torch.Generator().manual_seed(head.seed)
    task = ProbeTask(splits, settings, vocabulary, metric)
    return probe_kind(kind).build_reference(input, generator, task)


__all__ = ["KINDS", "ProbeKind", "ProbeTask", "build", "probe_kind"]
