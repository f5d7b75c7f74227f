"""Probing splits in memory: every token's layers in one contiguous array per split.

A split's features are ``(num_layers, tokens, dim)``, the layer axis first as in feature files,
the sentences one after the other; float16 storage stays float16 in memory (batches become
float32). :class:`FeatureDataset` adds each token's label (and, for pair tasks, the flat index of
its head); :class:`TreeDataset` each word's CoNLL-U head and whether it is punctuation. A sentence
task's split is a :class:`FeatureDataset` of one item per sentence, its tokens' layers mean-pooled
(:func:`pool_sentences`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np
import torch
from torch import nn

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import EVAL_ROLES
from elmolab.data.labels import LabelVocabulary
from elmolab.io.results import MAJORITY_BASELINE


class _Layers:
    """What every split has: ``features`` ``(num_layers, tokens, dim)``, float32, float16 or
    bfloat16 (batches become float32)."""

    features: torch.Tensor

    @property
    def num_layers(self) -> int:
        return self.features.shape[0]

    @property
    def dim(self) -> int:
        return self.features.shape[2]


# standardize_layers: the smallest deviation a dimension is divided by, relative to its layer's
# median dimension (the default run's narrowest dimension is about half its layer's median).
MIN_RELATIVE_STD = 1e-3


def standardize_layers(
    splits: dict[str, _Layers], reference: str = "train"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardize every split's features in place, each layer's every dimension by the mean and
    standard deviation of that layer and dimension over the tokens of ``splits[reference]``;
    returns them, ``(mean, std)``, each ``(num_layers, dim)`` float32 (what was subtracted, and
    what the result was divided by).

    For a probe that reads one layer, or layers side by side, this changes no function it can
    express (an affine map per input dimension folds into its first map; a head's bilinear or
    distance score gains at most terms that are the same for every candidate), but it changes
    what Adam's steps are worth: a layer whose values vary by 0.05 around 0.2 (a random LSTM's)
    needs weights 20 times larger, and a probe at a fixed learning rate creeps towards them for
    many epochs and stops far from them. Mixes of layers (mean, scalar mix) then mix the
    standardized layers, each on the same scale.

    A dimension that varies less than ``MIN_RELATIVE_STD`` times its layer's median dimension is
    divided by that much instead (one that does not vary at all is only centred): dividing by a
    near-zero deviation would blow a dev value off the train value up beyond float16's range.
    """
    train = splits[reference].features
    means, stds = [], []
    # each array once, where two roles share one (a task scored on the data it trains on)
    arrays = {split.features.data_ptr(): split.features for split in splits.values()}.values()
    for layer in range(train.shape[0]):  # one layer in float32 at a time
        # Whether a dimension varies, from the stored values: a float32 mean of many equal values
        # need not come out equal to them, which would leave a constant a rounding error to
        # divide by.
        varies = train[layer].amax(dim=0) > train[layer].amin(dim=0)
        centred = train[layer].float()
        mean = torch.where(varies, centred.mean(dim=0), centred[0])
        centred -= mean
        # Two passes, the mean and then the centred squares (as torch.std_mean within 1e-6 of
        # the deviation, and over the tokens axis 10 times faster on one thread).
        deviation = centred.square().sum(dim=0).div_(len(centred) - 1).sqrt_()
        floor = MIN_RELATIVE_STD * float(deviation.median())
        std = torch.where(varies, deviation.clamp(min=floor), 1.0)
        for features in arrays:
            if features is train:
                features[layer].copy_(centred.div_(std))
            else:
                features[layer].copy_(features[layer].float().sub_(mean).div_(std))
        means.append(mean)
        stds.append(std.float())
    return torch.stack(means), torch.stack(stds)


def _check_features(features: torch.Tensor) -> int:
    """The number of tokens of float ``(num_layers, tokens, dim)`` features; ValueError else."""
    if features.dim() != 3 or not features.is_floating_point():
        raise ValueError(
            f"features must be float (layers, tokens, dim), got {features.dtype}"
            f" {tuple(features.shape)}"
        )
    return features.shape[1]


@dataclass(frozen=True)
class FeatureDataset(_Layers):
    """One split of a probing task in memory: each token's layers and label, sentence by sentence.

    Attributes (besides ``features``, see ``_Layers``)
    ----------
    labels : ``torch.Tensor``
        ``(tokens,)`` int64 label ids.
    sentence_lengths : ``tuple[int, ...]``
        Tokens per sentence, in order (they sum to ``tokens``).
    heads : ``torch.Tensor``, optional
        ``(tokens,)`` int64, for the pair task: the flat index of each token's head, -1 for root.
    """

    features: torch.Tensor
    labels: torch.Tensor
    sentence_lengths: tuple[int, ...]
    heads: torch.Tensor | None = None

    def __post_init__(self) -> None:
        tokens = _check_features(self.features)
        if self.labels.shape != (tokens,) or sum(self.sentence_lengths) != tokens:
            raise ValueError(
                f"{tokens} feature rows, {self.labels.numel()} labels and"
                f" {sum(self.sentence_lengths)} tokens in sentences"
            )
        if self.heads is not None and self.heads.shape != (tokens,):
            raise ValueError(f"{tokens} tokens but {self.heads.numel()} heads")

    @classmethod
    def from_sentences(
        cls,
        features: Sequence[np.ndarray | torch.Tensor],
        labels: Sequence[Sequence[int]],
        heads: Sequence[Sequence[int]] | None = None,
        *,
        path: str | PathLike[str] | None = None,
    ) -> FeatureDataset:
        """Concatenate per-sentence features ``(num_layers, n_i, dim)``, as in feature files.

        ``labels[i]`` holds the ``n_i`` label ids of sentence ``i``; ``heads[i]``, for the pair
        task, the 1-based head of each word (0 = root), as in CoNLL-U. ``path`` (the feature file)
        names the source in the ElmolabError raised when counts disagree.
        """
        if not features:
            raise ElmolabError("no sentences", path)
        if len(features) != len(labels) or (heads is not None and len(heads) != len(features)):
            heads_count = "" if heads is None else f", {len(heads)} of heads"
            raise ElmolabError(
                f"{len(features)} sentences of features but {len(labels)} of labels{heads_count}",
                path,
            )
        stacked, lengths = stack_sentences(features, path)
        flat_heads: list[int] = []
        for i, n in enumerate(lengths):
            if len(labels[i]) != n:
                raise ElmolabError(
                    f"sentence {i}: {n} feature vectors but {len(labels[i])} labels", path
                )
            if heads is not None:
                flat_heads.extend(_flat_heads(heads[i], n, len(flat_heads), i, path))
        return cls(
            features=stacked,
            labels=torch.from_numpy(
                np.concatenate([np.asarray(sentence, dtype=np.int64) for sentence in labels])
            ),
            sentence_lengths=lengths,
            heads=None if heads is None else torch.tensor(flat_heads),
        )

    def subset(self, sentences: Sequence[int]) -> FeatureDataset:
        """The sentences ``sentences`` (indices, kept in the order given) of a token split."""
        if self.heads is not None:
            raise ValueError("subsets of pair splits are not supported (heads would move)")
        starts = np.concatenate([[0], np.cumsum(self.sentence_lengths)])
        rows = torch.from_numpy(
            np.concatenate(
                [np.arange(starts[i], starts[i + 1]) for i in sentences] or [np.zeros(0, int)]
            ).astype(np.int64)
        )
        return FeatureDataset(
            features=self.features.index_select(1, rows),
            labels=self.labels[rows],
            sentence_lengths=tuple(self.sentence_lengths[i] for i in sentences),
        )


# pool_sentences: sentences per padded batch (bounds the padded copy's memory).
POOL_BATCH = 256


def mean_pool(padded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The mean over each sentence's tokens of a padded batch, padding ignored.

    ``padded`` is ``(batch, max_length, *rest)``, sentence ``b``'s tokens in its first
    ``lengths[b]`` positions (at least one) and anything after them; returns ``(batch, *rest)``
    in float32: ``sum_{t < n_b} x_bt / n_b``.
    """
    positions = torch.arange(padded.shape[1])  # (max_length,)
    mask = positions[None, :] < lengths[:, None]  # (batch, max_length)
    mask = mask.view(*mask.shape, *([1] * (padded.dim() - 2)))
    total = torch.where(mask, padded.float(), 0.0).sum(dim=1)  # (batch, *rest)
    return total / lengths.view(-1, *([1] * (total.dim() - 1))).float()


def pool_sentences(
    features: Sequence[np.ndarray | torch.Tensor],
    labels: Sequence[Sequence[int]],
    *,
    path: str | PathLike[str] | None = None,
) -> FeatureDataset:
    """A sentence task's split: every layer of each sentence mean-pooled over its tokens, one
    item per sentence, float32 ``(num_layers, items, dim)``.

    ``features[i]`` is sentence ``i``'s ``(num_layers, n_i, dim)``, as in feature files (``n_i``
    at least 1); ``labels[i]`` its label id as a one-element list, or ``[]`` for a sentence the
    task leaves out (a label its ``label_map`` drops): it is no item. Sentences are pooled in
    padded batches (:func:`mean_pool`). Each item is a sentence of length 1
    (``sentence_lengths``), so the engine trains and scores it as a token (accuracy = the share of
    sentences right). ``path`` names the feature file in the ElmolabError raised on bad input.
    """
    if not features:
        raise ElmolabError("no sentences", path)
    if len(features) != len(labels):
        raise ElmolabError(
            f"{len(features)} sentences of features but {len(labels)} of labels", path
        )
    for i, sentence in enumerate(labels):
        if len(sentence) > 1:
            raise ElmolabError(f"sentence {i}: {len(sentence)} labels, a sentence task has 1", path)
    kept = [i for i, sentence in enumerate(labels) if sentence]
    if not kept:
        raise ElmolabError("no sentence keeps a label", path)
    stacked, lengths = stack_sentences([features[i] for i in kept], path, min_length=1)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    pooled = []
    for first in range(0, len(kept), POOL_BATCH):
        batch = range(first, min(first + POOL_BATCH, len(kept)))
        tokens = [stacked[:, starts[i] : starts[i + 1]].transpose(0, 1) for i in batch]
        padded = nn.utils.rnn.pad_sequence(tokens, batch_first=True)  # (b, T, layers, dim)
        pooled.append(mean_pool(padded, torch.tensor([lengths[i] for i in batch])))
    return FeatureDataset(
        features=torch.cat(pooled).transpose(0, 1).contiguous(),  # (layers, items, dim)
        labels=torch.tensor([labels[i][0] for i in kept], dtype=torch.int64),
        sentence_lengths=(1,) * len(kept),
    )


def stack_sentences(
    features: Sequence[np.ndarray | torch.Tensor],
    path: str | PathLike[str] | None = None,
    *,
    min_length: int = 0,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Per-sentence features ``(num_layers, n_i, dim)``, as in feature files, concatenated to
    ``(num_layers, tokens, dim)``, and the ``n_i``. A sentence of another number of layers or
    width, or of fewer than ``min_length`` tokens, is an ElmolabError naming ``path``."""
    first_shape = tuple(torch.as_tensor(features[0]).shape)
    sentences = []
    for i, sentence in enumerate(features):
        layers = torch.as_tensor(sentence)  # (num_layers, n_i, dim)
        if layers.dim() != 3 or layers.shape[::2] != first_shape[::2]:
            raise ElmolabError(
                f"sentence {i}: features of shape {tuple(layers.shape)}, expected"
                f" (num_layers, n_tokens, dim) with the layers and dim of {first_shape}",
                path,
            )
        if layers.shape[1] < min_length:
            raise ElmolabError(
                f"sentence {i}: {layers.shape[1]} tokens, at least {min_length} expected", path
            )
        sentences.append(layers)
    return torch.cat(sentences, dim=1), tuple(layers.shape[1] for layers in sentences)


def _flat_heads(
    heads: Sequence[int], n: int, offset: int, sentence: int, path: str | PathLike[str] | None
) -> list[int]:
    if len(heads) != n:
        raise ElmolabError(f"sentence {sentence}: {n} feature vectors but {len(heads)} heads", path)
    flat = []
    for head in heads:
        if not 0 <= head <= n:
            raise ElmolabError(f"sentence {sentence}: head {head} outside 0..{n}", path)
        flat.append(offset + head - 1 if head > 0 else -1)
    return flat


@dataclass(frozen=True)
class TreeDataset(_Layers):
    """One split of a tree task in memory: each word's layers, its head and whether it is punct.

    Attributes (besides ``features``, see ``_Layers``)
    ----------
    sentence_lengths : ``tuple[int, ...]``
        Words per sentence, in order (they sum to ``tokens``; none is 0).
    heads : ``torch.Tensor``
        ``(tokens,)`` int64, each word's head as in CoNLL-U: its 1-based index within the
        sentence, 0 for the root.
    punct : ``torch.Tensor``
        ``(tokens,)`` bool, True at punctuation (left out of UUAS, as in H&M).
    """

    features: torch.Tensor
    sentence_lengths: tuple[int, ...]
    heads: torch.Tensor
    punct: torch.Tensor

    def __post_init__(self) -> None:
        tokens = _check_features(self.features)
        if sum(self.sentence_lengths) != tokens or min(self.sentence_lengths, default=0) < 1:
            raise ValueError(
                f"{tokens} feature rows but sentences of {sum(self.sentence_lengths)} words"
                f" (shortest {min(self.sentence_lengths, default=0)})"
            )
        if self.heads.shape != (tokens,) or self.heads.dtype != torch.int64:
            raise ValueError(
                f"{tokens} tokens but heads {self.heads.dtype} {tuple(self.heads.shape)}"
            )
        if self.punct.shape != (tokens,) or self.punct.dtype != torch.bool:
            raise ValueError(
                f"{tokens} tokens but punct {self.punct.dtype} {tuple(self.punct.shape)}"
            )

    @classmethod
    def from_sentences(
        cls,
        features: Sequence[np.ndarray | torch.Tensor],
        heads: Sequence[Sequence[int]],
        punct: Sequence[Sequence[bool]],
        *,
        path: str | PathLike[str] | None = None,
    ) -> TreeDataset:
        """Concatenate per-sentence features ``(num_layers, n_i, dim)``, as in feature files.

        ``heads[i]`` holds the CoNLL-U heads of the ``n_i`` words of sentence ``i`` (1-based,
        0 = root) and ``punct[i]`` whether each word is punctuation. The heads must form a tree
        (every word reaches the root; several root words are allowed and then meet at the root).
        ``path`` (the feature file) names the source in the ElmolabError raised on bad input.
        """
        if not features:
            raise ElmolabError("no sentences", path)
        if not len(features) == len(heads) == len(punct):
            raise ElmolabError(
                f"{len(features)} sentences of features but {len(heads)} of heads and"
                f" {len(punct)} of punct",
                path,
            )
        stacked, lengths = stack_sentences(features, path, min_length=1)
        for i, n in enumerate(lengths):
            _check_heads(heads[i], len(punct[i]), n, i, path)
        return cls(
            features=stacked,
            sentence_lengths=lengths,
            heads=torch.from_numpy(np.concatenate([np.asarray(h, dtype=np.int64) for h in heads])),
            punct=torch.from_numpy(np.concatenate([np.asarray(p, dtype=bool) for p in punct])),
        )

    def sentence_heads(self) -> list[np.ndarray]:
        """Each sentence's heads ``(n_i,)`` (CoNLL-U, 1-based, 0 = root)."""
        return [h.numpy() for h in self.heads.split(self.sentence_lengths)]

    def sentence_punct(self) -> list[np.ndarray]:
        """Each sentence's punctuation mask ``(n_i,)`` bool."""
        return [p.numpy() for p in self.punct.split(self.sentence_lengths)]


def _check_heads(
    heads: Sequence[int],
    punct_count: int,
    n: int,
    sentence: int,
    path: str | PathLike[str] | None,
) -> None:
    if len(heads) != n or punct_count != n:
        raise ElmolabError(
            f"sentence {sentence}: {n} feature vectors but {len(heads)} heads and"
            f" {punct_count} punct flags",
            path,
        )
    array = np.asarray(heads, dtype=np.int64)  # (n,)
    outside = np.flatnonzero((array < 0) | (array > n))
    if len(outside):
        raise ElmolabError(
            f"sentence {sentence}: head {array[outside[0]]} of word {outside[0] + 1}"
            f" outside 0..{n}",
            path,
        )
    # Pointer doubling: after ceil(log2 n) + 1 squarings each word points 2^k >= n steps up,
    # which is the root (index n, its own parent) unless the word is caught in a cycle.
    up = np.append(np.where(array == 0, n, array - 1), n)  # (n + 1,)
    for _ in range(math.ceil(math.log2(n)) + 1):
        up = up[up]
    stuck = np.flatnonzero(up[:n] != n)
    if len(stuck):
        raise ElmolabError(
            f"sentence {sentence}: the heads do not form a tree (word {stuck[0] + 1} never"
            " reaches the root)",
            path,
        )


def majority_baseline(
    splits: Mapping[str, FeatureDataset], vocabulary: LabelVocabulary
) -> dict[str, Any]:
    """The majority-class baseline: the most frequent label of ``splits["train"]`` (the first in
    the vocabulary's order among equals) and the share of dev's and test's items that hold it,
    the accuracy of a probe that always predicts it: ``majority_label``,
    ``dev_majority_baseline``, ``test_majority_baseline``."""
    train = splits["train"].labels  # (items,)
    label = int(torch.bincount(train, minlength=len(vocabulary)).argmax())
    shares = {role: float((splits[role].labels == label).double().mean()) for role in EVAL_ROLES}
    return {
        "majority_label": vocabulary.labels[label],
        **{f"{role}_{MAJORITY_BASELINE}": share for role, share in shares.items()},
    }
