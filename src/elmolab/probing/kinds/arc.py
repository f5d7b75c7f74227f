"""The arc probe (``deparc``): each word's head among the root and the sentence's words.

A bilinear score of each (word, candidate head) pair, the candidates the root (a vector per probe)
and the sentence's words; cross-entropy with the gold head; UAS of the argmax (no tree decoding)
over every word, punctuation included. :class:`ArcProbe` is the reference, :class:`ArcProbes`
the batched heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.schema import ProbeSettings, TaskKind
from elmolab.probing.datasets import TreeDataset
from elmolab.probing.heads import (
    FitTrace,
    HeadEvaluation,
    Part,
    ProbeResult,
    per_sentence_sums,
    probe_result,
    take_rows,
)
from elmolab.probing.kinds.kind import ProbeKind, ProbeTask
from elmolab.probing.kinds.padded import TreeData, TreeProbes
from elmolab.probing.probes import Evaluation, Head, LayerInput, Probe
from elmolab.probing.settings import Schedule
from elmolab.probing.trees import SentenceBatch

PADDING_LABEL = -100  # the target of a padded slot: no loss

# --- The reference ------------------------------------------------------------------------------


def invalid_arcs(mask: torch.Tensor) -> torch.Tensor:
    """Where a batch's arc scores ``(b, n, 1 + n)`` (the root, then the words, as candidate
    heads) must be ``-inf``: a word heading itself, or a padded slot heading; ``mask`` ``(b, n)``
    the batch's words."""
    n = mask.shape[1]
    self_arc = F.pad(torch.eye(n, dtype=torch.bool), (1, 0))  # (n, 1 + n)
    padding = F.pad(~mask, (1, 0))  # (b, 1 + n)
    return self_arc | padding[:, None, :]


class ArcProbe(Probe):
    """Each word's head: layers ``(L, b, n, dim)`` of padded sentences, ``mask`` ``(b, n)`` ->
    scores ``(b, n, 1 + n)`` over the candidates (the root, then the words),
    ``score(i, j) = m_i^T W m_j + b^T m_j``, ``-inf`` for a word heading itself or a padded slot.
    ``W`` starts random with standard deviation ``1 / width`` (zero is a saddle), ``b`` at zero."""

    def __init__(self, input: LayerInput, generator: torch.Generator, root: str) -> None:
        super().__init__(input, root)
        width = input.width
        self.weight = nn.Parameter(torch.randn((width, width), generator=generator) / width)
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.input(layers, mask)  # (b, n, width)
        b, _, width = m.shape
        candidates = torch.cat([self.root.expand(b, 1, width), m], dim=1)  # (b, 1 + n, width)
        scores = (m @ self.weight + self.bias) @ candidates.mT
        return scores.masked_fill(invalid_arcs(mask), float("-inf"))


class ArcData(TreeData):
    """The arc probe's data: each word's gold head, scored by UAS."""

    def loss(
        self, output: torch.Tensor, role: str, batch: SentenceBatch
    ) -> tuple[torch.Tensor, int]:
        split = self.splits[role]  # cross-entropy of each word's gold head
        gold = torch.where(batch.mask, split.heads[batch.tokens], 0)
        losses = -torch.log_softmax(output, dim=-1).gather(-1, gold[..., None])[..., 0]
        return losses[batch.mask].sum(), int(batch.mask.sum())

    def kept(self, output: torch.Tensor) -> torch.Tensor:
        return output.argmax(dim=-1)

    def evaluation(self, role: str, outputs: list[torch.Tensor], total: float) -> Evaluation:
        split = self.splits[role]
        heads = torch.zeros_like(split.heads)
        for batch, best in zip(self.plans[role], outputs, strict=True):
            heads[batch.tokens[batch.mask]] = best[batch.mask]
        uas = float((heads == split.heads).double().mean())
        return Evaluation(uas, total / len(heads), [heads])


# --- The batched heads --------------------------------------------------------------------------


class HeadBilinear(nn.Module):
    """Per head ``score(i, j) = m_i^T W m_j + b^T m_j`` over the candidates ``j`` (the root's vector
    first, then the words), computed as ``(m_i^T W + b^T) m_j``. ``W`` starts small and random
    (standard deviation ``1 / width``: a zero start is a saddle where every head is alike), ``b``
    at zero."""

    def __init__(self, generators: Sequence[torch.Generator], width: int) -> None:
        super().__init__()
        weights = [torch.randn((width, width), generator=g) / width for g in generators]
        self.weight = nn.Parameter(torch.stack(weights))
        self.bias = nn.Parameter(torch.zeros(len(generators), width))

    def forward(
        self, mixed: torch.Tensor, root: torch.Tensor, invalid: torch.Tensor, heads: torch.Tensor
    ) -> torch.Tensor:
        """``mixed`` ``(h, b, n, width)``, ``root`` ``(h, width)``, ``invalid`` ``(b, n, 1 + n)``
        (:func:`invalid_arcs`) -> ``(h, b, n, 1 + n)``, ``-inf`` where ``invalid``."""
        h, b, n, width = mixed.shape
        root = root.to(mixed.dtype)[:, None, None, :].expand(h, b, 1, width)
        candidates = torch.cat([root, mixed], dim=2)
        # (m_i^T W + b^T) m_j: the prior b^T m_j rides along in the bilinear product
        flat = mixed.reshape(h, b * n, width)
        left = torch.baddbmm(
            take_rows(self.bias, heads)[:, None, :], flat, take_rows(self.weight, heads)
        )
        scores = (left.view(h, b, n, width) @ candidates.transpose(2, 3)).float()  # (h, b, n, 1+n)
        return scores.masked_fill(invalid, float("-inf"))


class ArcProbes(TreeProbes):
    """``deparc``: each word's head among the root and the sentence's words, the argmax of a
    bilinear score (no tree decoding); cross-entropy with the gold head; UAS over every word,
    punctuation included."""

    def __init__(
        self, heads: Sequence[Head], splits: dict[str, TreeDataset], settings: ProbeSettings
    ) -> None:
        super().__init__(heads, splits, settings, HeadBilinear, root=True)
        # per role and batch of its plan, :func:`invalid_arcs`
        self.invalid = {
            role: [invalid_arcs(batch.mask) for batch in plan] for role, plan in self.plans.items()
        }

    def _scores(self, part: Part, mixed, role: str, number: int, local) -> torch.Tensor:
        """The scores of the part's heads ``local`` on batch ``number`` of split ``role``:
        ``(h, b, n, 1 + n)``."""
        assert part.root is not None
        root = take_rows(part.root.vector, local)
        return part.probe(mixed, root, self.invalid[role][number], local)

    def _batch_losses(self, part, mixed, batch, number, local) -> tuple[torch.Tensor, int]:
        scores = self._scores(part, mixed, "train", number, local)  # (h, b, n, 1 + n)
        gold = _slot_heads(self.splits["train"], batch)
        losses = self._word_losses(scores, gold)  # (h, b * n)
        words = int(batch.mask.sum())
        return losses.sum(dim=1) / words, words

    @staticmethod
    def _word_losses(scores: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """Each slot's cross-entropy with its gold head (``gold``, :func:`_slot_heads`)
        ``(h, b * n)``, 0 at padding (the padded slots are left out by the loss, not cut out of
        the scores first: no copy of the scores and its scatter back in the backward pass). The
        softmax runs along the candidates, the scores' last axis (every slot has the root's
        finite score)."""
        log_probs = torch.log_softmax(scores.flatten(1, 2), dim=-1)  # (h, b * n, 1 + n)
        padded = gold == PADDING_LABEL  # (b * n,)
        slots = gold.masked_fill(padded, 0).expand(len(log_probs), -1)
        picked = log_probs.gather(2, slots[..., None])[..., 0]  # (h, b * n)
        return -picked.masked_fill(padded, 0.0)

    def evaluate(self, role: str, active: torch.Tensor) -> HeadEvaluation:
        split = self.splits[role]
        heads, tokens = len(self.heads), len(split.heads)
        predicted = torch.zeros(heads, tokens, dtype=torch.long)
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        for number, batch, layers in self._batches(role):
            words = batch.tokens[batch.mask]  # (words,)
            gold = _slot_heads(split, batch)
            for part in self.parts:
                local, numbers = self.members(part, active)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                scores = self._scores(part, mixed, role, number, local)  # (h, b, n, 1 + n)
                best = scores.argmax(dim=-1)[:, batch.mask]  # (h, words)
                predicted[numbers[:, None], words[None, :]] = best
                losses = self._word_losses(scores, gold)
                loss_sum[numbers] += losses.sum(dim=1).double()
        correct = (predicted == split.heads).double()  # (heads, tokens)
        scores = torch.where(active, correct.mean(dim=1), float("nan"))
        return HeadEvaluation(scores, loss_sum / tokens, list(predicted))

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        dev, test = self.final_evaluations()
        split = self.splits["test"]
        results = []
        for h in range(len(self.heads)):
            predicted = test.predicted[h]
            results.append(
                probe_result(
                    self,
                    fit,
                    h,
                    "uas",
                    float(dev.scores[h]),
                    float(test.scores[h]),
                    [
                        [str(head) for head in sentence.tolist()]
                        for sentence in predicted.split(list(split.sentence_lengths))
                    ],
                    {
                        "correct": per_sentence_sums(
                            predicted == split.heads, split.sentence_lengths
                        ),
                        "total": list(split.sentence_lengths),
                    },
                    {},
                )
            )
        return results


def _slot_heads(split: TreeDataset, batch: SentenceBatch) -> torch.Tensor:
    """Each slot's gold head ``(b * n,)``, ``PADDING_LABEL`` at padding."""
    return torch.where(batch.mask, split.heads[batch.tokens], PADDING_LABEL).flatten()


# --- The kind -----------------------------------------------------------------------------------


def _reference(input: LayerInput, generator: torch.Generator, task: ProbeTask):
    probe = ArcProbe(input, generator, task.settings.root)
    return probe, ArcData(task.splits, task.settings.tree.batch_tokens)


def _arc_probes(heads: Sequence[Head], task: ProbeTask, **_) -> ArcProbes:
    return ArcProbes(heads, task.splits, task.settings)


KINDS = (
    ProbeKind(
        TaskKind.ARC,
        ArcProbe,
        ArcProbes,
        _reference,
        _arc_probes,
        Schedule.of_tree,
        width_power=2,
    ),
)
