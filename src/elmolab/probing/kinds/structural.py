"""Hewitt and Manning's structural probe: squared distances under a projection fit the words'
distances in the tree.

L1 per sentence over all word pairs, divided by ``n^2``, averaged over sentences; selected on the
dev loss; scored as UUAS of the minimum spanning tree of the predicted distances (punctuation left
out) and distance Spearman. :class:`StructuralProbe` is the reference, :class:`StructuralProbes`
the batched heads, :class:`StructuralGold` the gold side a cell makes once for all its fits.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from elmolab.core.schema import EVAL_ROLES, ProbeSettings, TaskKind
from elmolab.probing.datasets import TreeDataset
from elmolab.probing.heads import (
    FitTrace,
    HeadEvaluation,
    ProbeResult,
    float32_region,
    probe_result,
    take_rows,
    uniform_heads,
)
from elmolab.probing.kinds.kind import ProbeKind, ProbeTask
from elmolab.probing.kinds.padded import TreeData, TreeProbes
from elmolab.probing.probes import Evaluation, Head, LayerInput, Probe, uniform
from elmolab.probing.settings import Schedule
from elmolab.probing.trees import GoldTrees, SentenceBatch, tree_distances

# --- The reference ------------------------------------------------------------------------------


def distance_losses(
    predicted: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """H&M's L1 loss per sentence, ``sum_{i,j} |d - tree| / n^2``: distances ``(..., b, n, n)``
    (a head axis or none), gold ``(b, n, n)``, mask ``(b, n)`` -> ``(..., b)``."""
    pairs = mask[:, :, None] & mask[:, None, :]  # (b, n, n)
    lengths = mask.sum(dim=1).float()  # (b,)
    errors = torch.where(pairs, (predicted - gold).abs(), 0.0)  # (..., b, n, n)
    return errors.sum(dim=(-2, -1)) / lengths**2


class StructuralProbe(Probe):
    """Squared distances ``|B (m_i - m_j)|^2`` ``(b, n, n)`` of the words of padded sentences,
    layers ``(L, b, n, dim)``; ``B`` ``(rank, width)`` uniform in (-0.05, 0.05), as Hewitt and
    Manning's. Selected on its dev loss."""

    lower_is_better = True

    def __init__(self, input: LayerInput, generator: torch.Generator, rank: int) -> None:
        super().__init__(input)
        self.proj = nn.Parameter(uniform(generator, (rank, input.width), 0.05))

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        p = self.input(layers, mask) @ self.proj.T  # (b, n, rank)
        return ((p[:, :, None, :] - p[:, None, :, :]) ** 2).sum(dim=-1)


class StructuralData(TreeData):
    """The structural probe's data: each sentence's tree distances; its evaluation keeps each
    sentence's predicted distances (scored by UUAS at the end)."""

    @functools.cached_property
    def distances(self) -> dict[str, list]:
        """Each sentence's tree distances per role: the structural probe's targets."""
        return {
            role: [tree_distances(heads) for heads in split.sentence_heads()]
            for role, split in self.splits.items()
        }

    def loss(
        self, output: torch.Tensor, role: str, batch: SentenceBatch
    ) -> tuple[torch.Tensor, int]:
        # per sentence, sum_{i,j} |d_ij - tree_ij| / n^2
        split = self.splits[role]
        gold = torch.zeros_like(output)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = split.sentence_lengths[sentence]
            gold[slot, :n, :n] = torch.from_numpy(self.distances[role][sentence])
        losses = distance_losses(output, gold, batch.mask)  # (b,)
        return losses.sum(), len(batch.sentences)

    def kept(self, output: torch.Tensor) -> torch.Tensor:
        return output

    def evaluation(self, role: str, outputs: list[torch.Tensor], total: float) -> Evaluation:
        split = self.splits[role]  # each sentence's (n, n) distances
        sentences = [torch.empty(0)] * len(split.sentence_lengths)
        for batch, output in zip(self.plans[role], outputs, strict=True):
            lengths = batch.mask.sum(dim=1).tolist()
            for slot, (s, n) in enumerate(zip(batch.sentences.tolist(), lengths, strict=True)):
                sentences[s] = output[slot, :n, :n]
        return Evaluation(float("nan"), total / len(sentences), sentences)


# --- The batched heads --------------------------------------------------------------------------


class HeadProjection(nn.Module):
    """Per head the structural probe's ``d(i, j) = |B (m_i - m_j)|^2``; ``B`` ``(rank, width)``
    uniform in (-0.05, 0.05) as in Hewitt and Manning."""

    def __init__(self, generators: Sequence[torch.Generator], width: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Parameter(uniform_heads(generators, (rank, width), 0.05))

    def forward(self, mixed: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """``(h, b, n, width)`` -> squared distances ``(h, b, n, n)``."""
        h, b, n, width = mixed.shape
        projected = torch.bmm(mixed.reshape(h, b * n, width), take_rows(self.proj, heads).mT)
        # the distances in float32: |a|^2 + |b|^2 - 2 a.b cancels what bf16 would round away
        projected = projected.float().view(h, b, n, -1)  # (h, b, n, rank)
        with float32_region():
            norms = (projected**2).sum(dim=-1)  # (h, b, n)
            gram = projected @ projected.transpose(2, 3)  # (h, b, n, n)
        return (norms[..., :, None] + norms[..., None, :] - 2 * gram).clamp(min=0)


class StructuralProbes(TreeProbes):
    """Hewitt and Manning's structural probe: squared distances under ``B`` fit the tree distances
    (L1 per sentence over all word pairs, divided by ``n^2``, averaged over sentences); selected on
    the dev loss; scored as UUAS of the minimum spanning tree of the predicted distances
    (punctuation left out) and distance Spearman."""

    lower_is_better = True

    def __init__(
        self,
        heads: Sequence[Head],
        splits: dict[str, TreeDataset],
        settings: ProbeSettings,
        gold: StructuralGold | None = None,
    ) -> None:
        rank = settings.tree.rank

        def build(generators: Sequence[torch.Generator], width: int) -> nn.Module:
            return HeadProjection(generators, width, rank)

        super().__init__(heads, splits, settings, build)
        if gold is None:
            gold = StructuralGold.of(splits)
        gold.check(splits)
        self.targets = {
            role: _padded_distances(gold.distances[role], self.plans[role]) for role in splits
        }
        self.scorers = gold.scorers

    def _batch_losses(self, part, mixed, batch, number, local) -> tuple[torch.Tensor, int]:
        predicted = part.probe(mixed, local)  # (h, b, n, n)
        losses = distance_losses(predicted, self.targets["train"][number], batch.mask)
        return losses.mean(dim=1), len(batch.sentences)

    def evaluate(self, role: str, active: torch.Tensor, distances: bool = False) -> HeadEvaluation:
        heads = len(self.heads)
        sentences = len(self.splits[role].sentence_lengths)
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        predicted: list = [[np.empty(0)] * sentences if distances else None for _ in range(heads)]
        for number, batch, layers in self._batches(role):
            for part in self.parts:
                local, numbers = self.members(part, active)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                squared = part.probe(mixed, local)  # (h, b, n, n)
                losses = distance_losses(squared, self.targets[role][number], batch.mask)
                loss_sum[numbers] += losses.sum(dim=1).double()
                if distances:
                    lengths = batch.mask.sum(dim=1).tolist()
                    array = squared.numpy()
                    for row, h in enumerate(numbers.tolist()):
                        for slot, (s, n) in enumerate(
                            zip(batch.sentences.tolist(), lengths, strict=True)
                        ):
                            predicted[h][s] = array[row, slot, :n, :n]
        losses = torch.where(active, loss_sum / sentences, float("nan"))
        return HeadEvaluation(torch.full((heads,), float("nan")), losses, predicted)

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        dev, test = self.final_evaluations(distances=True)
        results = []
        for h in range(len(self.heads)):
            dev_uuas = self.scorers["dev"].uuas(dev.predicted[h])
            test_uuas = self.scorers["test"].uuas(test.predicted[h])
            results.append(
                probe_result(
                    self,
                    fit,
                    h,
                    "uuas",
                    dev_uuas.score,
                    test_uuas.score,
                    [[f"{i + 1}-{j + 1}" for i, j in edges] for edges in test_uuas.predicted_edges],
                    {"correct": test_uuas.correct, "total": test_uuas.total},
                    {
                        "dev_dspr": self.scorers["dev"].spearman(dev.predicted[h]),
                        "test_dspr": self.scorers["test"].spearman(test.predicted[h]),
                    },
                )
            )
        return results


@dataclass(frozen=True)
class StructuralGold:
    """The gold side of the structural probe's splits: each sentence's tree distances, and for
    dev and test what scoring every head needs of the gold trees (:class:`GoldTrees`, its
    spanning trees and distance ranks computed). It depends on the trees alone, not on the
    features: a cell makes it once for every encoder and job, before its workers fork (on EWT
    about a second, which each of the cell's 18 jobs used to spend)."""

    distances: dict[str, list[np.ndarray]]  # role -> per sentence (n, n)
    scorers: dict[str, GoldTrees]  # dev and test

    @classmethod
    def of(cls, splits: dict[str, TreeDataset]) -> StructuralGold:
        distances = {
            role: [tree_distances(h) for h in split.sentence_heads()]
            for role, split in splits.items()
        }
        scorers = {
            role: GoldTrees(distances[role], splits[role].sentence_punct()).prepared()
            for role in EVAL_ROLES
        }
        return cls(distances, scorers)

    def check(self, splits: dict[str, TreeDataset]) -> None:
        """That these are the gold trees of ``splits``: every role's, as many sentences, each of
        its length (a gold side made for other splits would score against the wrong trees)."""
        for role, split in splits.items():
            lengths = [len(matrix) for matrix in self.distances.get(role, [])]
            if lengths != list(split.sentence_lengths):
                raise ValueError(f"the gold distances of {role} are not of its sentences")


def _padded_distances(
    gold: Sequence[np.ndarray], plan: Sequence[SentenceBatch]
) -> list[torch.Tensor]:
    """The gold distances of each batch of ``plan``, ``(b, n_max, n_max)`` float32, 0-padded."""
    targets = []
    for batch in plan:
        n_max = batch.mask.shape[1]
        padded = np.zeros((len(batch.sentences), n_max, n_max), dtype=np.float32)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = len(gold[sentence])
            padded[slot, :n, :n] = gold[sentence]
        targets.append(torch.from_numpy(padded))
    return targets


# --- The kind -----------------------------------------------------------------------------------


def _reference(input: LayerInput, generator: torch.Generator, task: ProbeTask):
    probe = StructuralProbe(input, generator, task.settings.tree.rank)
    return probe, StructuralData(task.splits, task.settings.tree.batch_tokens)


def _structural_probes(
    heads: Sequence[Head], task: ProbeTask, *, shared: StructuralGold | None = None, **_
) -> StructuralProbes:
    return StructuralProbes(heads, task.splits, task.settings, shared)


KINDS = (
    ProbeKind(
        TaskKind.STRUCTURAL,
        StructuralProbe,
        StructuralProbes,
        _reference,
        _structural_probes,
        Schedule.of_tree,
        shared=StructuralGold.of,
    ),
)
