"""What the tree kinds (arc, structural) share: whole sentences in padded batches.

A tree task's splits (:class:`TreeDataset`) are read in padded batches of sentences of similar
length (:func:`plan_batches`): a fixed plan per split, whose train batches each seed visits in its
own order. :class:`TreeData` is the reference's reading, :class:`TreeProbes` the batched heads'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from elmolab.core.schema import ProbeSettings
from elmolab.probing.datasets import TreeDataset
from elmolab.probing.heads import HeadProbes, Part, StepLoss, check_widths, scatter_heads
from elmolab.probing.probes import EVAL_TOKENS, Evaluation, Head, Probe
from elmolab.probing.trees import SentenceBatch, plan_batches

# --- The reference ------------------------------------------------------------------------------


class TreeData:
    """The splits of a tree task (:class:`TreeDataset`) in padded batches of whole sentences
    (:func:`plan_batches`): the train plan's batches visited in a shuffled order each epoch. A
    kind defines the loss of a batch's output, what it keeps of it, and the evaluation of those."""

    def __init__(self, splits: dict[str, TreeDataset], batch_tokens: int) -> None:
        self.splits = splits
        sizes = {"train": batch_tokens, "dev": EVAL_TOKENS, "test": EVAL_TOKENS}
        self.plans = {
            role: plan_batches(split.sentence_lengths, sizes[role])
            for role, split in splits.items()
        }

    def _batch_loss(self, probe: Probe, role: str, batch: SentenceBatch):
        """The batch's output, its summed loss and its items (words, or sentences)."""
        split = self.splits[role]
        layers = split.features[:, batch.tokens].float()  # (L, b, n, dim)
        output = probe(layers, batch.mask)
        loss, items = self.loss(output, role, batch)
        return output, loss, items

    def loss(
        self, output: torch.Tensor, role: str, batch: SentenceBatch
    ) -> tuple[torch.Tensor, int]:
        """The summed loss of the probe's ``output`` on ``batch`` of split ``role``, its items."""
        raise NotImplementedError

    def kept(self, output: torch.Tensor) -> torch.Tensor:
        """What an evaluation keeps of a batch's output."""
        raise NotImplementedError

    def evaluation(self, role: str, outputs: list[torch.Tensor], total: float) -> Evaluation:
        """The evaluation of split ``role`` from what it kept of each batch of its plan, and its
        summed loss."""
        raise NotImplementedError

    def steps(self, probe: Probe, shuffle: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
        plan = self.plans["train"]
        for number in torch.randperm(len(plan), generator=shuffle).tolist():
            _, loss, items = self._batch_loss(probe, "train", plan[number])
            yield loss / items, items

    def evaluate(self, probe: Probe, role: str) -> Evaluation:
        total, outputs = 0.0, []
        for batch in self.plans[role]:
            output, loss, _ = self._batch_loss(probe, role, batch)
            total += float(loss)
            outputs.append(self.kept(output))
        return self.evaluation(role, outputs, total)


# --- The batched heads --------------------------------------------------------------------------


class TreeProbes(HeadProbes):
    """Whole sentences in padded batches: a fixed plan of batches of similar length
    (:func:`plan_batches`), which each seed visits in its own order."""

    def __init__(
        self,
        heads: Sequence[Head],
        splits: dict[str, TreeDataset],
        settings: ProbeSettings,
        build: Callable[[Sequence[torch.Generator], int], nn.Module],
        *,
        root: bool = False,
    ) -> None:
        train = splits["train"]
        check_widths(splits)
        super().__init__(heads, train.num_layers, train.dim, settings, build, root=root)
        self.splits = splits
        # Each split's features in the probes' type, converted once (by the runner, before its
        # workers fork: then this is the same array): a batch's gather then reads half the bytes
        # in bf16, and no step converts its batch (a millisecond of a 15-20 ms step).
        self.features = {role: split.features.to(self.dtype) for role, split in splits.items()}
        self.plans = {
            "train": plan_batches(train.sentence_lengths, settings.tree.batch_tokens),
            "dev": plan_batches(splits["dev"].sentence_lengths, EVAL_TOKENS),
            "test": plan_batches(splits["test"].sentence_lengths, EVAL_TOKENS),
        }

    def epoch_steps(self, shuffles: Sequence[torch.Generator]) -> Iterator[list[int]]:
        batches = len(self.plans["train"])
        orders = [torch.randperm(batches, generator=g).tolist() for g in shuffles]
        return (list(step) for step in zip(*orders, strict=True))

    def _batches(self, role: str, numbers: Sequence[int] | None = None):
        """``(number, batch, layers (num_layers, 1, b, n, dim))`` of the role's plan."""
        plan = self.plans[role]
        features = self.features[role]
        for number in range(len(plan)) if numbers is None else numbers:
            batch = plan[number]
            layers = features.index_select(1, batch.tokens.flatten())
            yield number, batch, layers.view(layers.shape[0], 1, *batch.tokens.shape, -1)

    def _mixed(self, part: Part, layers: torch.Tensor, batch: SentenceBatch, local: torch.Tensor):
        groups = torch.zeros(len(local), dtype=torch.long)
        blocks = self.inputs(part, layers, groups, local, batch.mask[None])
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)  # (h, b, n, width)

    def step_loss(self, step: list[int], active: torch.Tensor) -> StepLoss:
        heads = len(self.heads)
        total, pieces = torch.zeros(()), []
        counts = torch.zeros(heads, dtype=torch.float64)
        for group, number in enumerate(step):
            _, batch, layers = next(self._batches("train", [number]))
            in_group = active & (self.seed_group == group)
            for part in self.parts:
                local, numbers = self.members(part, in_group)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                losses, items = self._batch_losses(part, mixed, batch, number, local)
                losses = losses + self.penalty(part, local)
                total = total + losses.sum()
                pieces.append((numbers, losses))
                counts[numbers] = float(items)
        return total, scatter_heads(heads, pieces), counts

    def _batch_losses(
        self, part: Part, mixed: torch.Tensor, batch: SentenceBatch, number: int, local
    ) -> tuple[torch.Tensor, int]:
        raise NotImplementedError
