"""Sentence batches and tree metrics for the tree probes (``deparc`` and the structural probe).

The tree probes read whole sentences, so training draws padded batches of sentences of similar
length (:func:`plan_batches`, :func:`padded_batches`); the probes themselves are heads of the
probe engine (:mod:`elmolab.probing.engine`). The structural probe (Hewitt and Manning 2019) is
scored by the undirected attachment score of the minimum spanning tree of its predicted
distances (UUAS, :meth:`GoldTrees.uuas`, over :func:`minimum_spanning_trees`) and the distance
Spearman correlation (DSpr, :meth:`GoldTrees.spearman`), both as in H&M's reporter;
:func:`tree_distances` gives the gold distances.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

DSPR_LENGTHS = (5, 50)  # sentence lengths that DSpr averages over, as H&M's reporter


# --- Batches of whole sentences -----------------------------------------------------------------


@dataclass(frozen=True)
class SentenceBatch:
    """Sentences padded to a common length: where each slot's word sits in the split."""

    sentences: torch.Tensor  # (batch,) int64 indices of the sentences in the split
    tokens: torch.Tensor  # (batch, n_max) int64 flat token index of each slot, 0 at padding
    mask: torch.Tensor  # (batch, n_max) bool, True at real words


def plan_batches(sentence_lengths: Sequence[int], batch_tokens: int) -> list[SentenceBatch]:
    """Cut the sentences, sorted by length, into batches of at most ``batch_tokens`` padded words.

    Sorting (stable, so ties keep their order) keeps the padding small; a sentence longer than
    ``batch_tokens`` gets a batch of its own. The plan is fixed; :func:`padded_batches` shuffles
    the order in which its batches are visited.
    """
    lengths = np.asarray(sentence_lengths, dtype=np.int64)  # (sentences,)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])  # (sentences,)
    order = np.argsort(lengths, kind="stable")
    groups: list[list[int]] = [[]]
    for sentence in order.tolist():
        # Sorted ascending, so this sentence is the longest of its batch.
        if groups[-1] and (len(groups[-1]) + 1) * lengths[sentence] > batch_tokens:
            groups.append([])
        groups[-1].append(sentence)
    plan = []
    for group in groups:
        n_max = int(lengths[group].max())
        slots = np.arange(n_max)  # (n_max,)
        mask = slots[None, :] < lengths[group, None]  # (batch, n_max)
        tokens = np.where(mask, offsets[group, None] + slots[None, :], 0)  # (batch, n_max)
        plan.append(
            SentenceBatch(
                sentences=torch.tensor(group),
                tokens=torch.from_numpy(tokens),
                mask=torch.from_numpy(mask),
            )
        )
    return plan


def padded_batches(
    rows: torch.Tensor,
    plan: Sequence[SentenceBatch],
    generator: torch.Generator | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(batch number in plan, padded float32 features)`` for each batch of ``plan``.

    ``rows`` are a split's layers ``(num_layers, tokens, dim)``, giving
    ``(num_layers, batch, n_max, dim)``, or its mixed features ``(tokens, mixed_dim)``, giving
    ``(batch, n_max, mixed_dim)``. Padding slots hold the split's first word (finite, masked by
    ``plan[number].mask``). With a ``generator`` the batches come in a random order, else in plan
    order.
    """
    if rows.dim() not in (2, 3):
        raise ValueError(f"rows must be (layers, tokens, dim) or (tokens, dim), got {rows.shape}")
    token_axis = rows.dim() - 2
    order = (
        torch.randperm(len(plan), generator=generator).tolist()
        if generator is not None
        else range(len(plan))
    )
    for number in order:
        tokens = plan[number].tokens  # (batch, n_max)
        gathered = rows.index_select(token_axis, tokens.flatten()).float()  # (.., batch * n_max, d)
        yield number, gathered.unflatten(token_axis, tokens.shape)  # (.., batch, n_max, d)


# --- Trees, spanning trees and the structural probe's metrics -----------------------------------


def tree_distances(heads: Sequence[int] | np.ndarray) -> np.ndarray:
    """Path lengths between all words in the undirected dependency tree: ``(n, n)`` int64.

    ``heads`` are CoNLL-U heads ``(n,)`` (1-based, 0 = root). With the ancestors-or-self of
    each word as rows of a boolean matrix ``A``, ``depth = A 1`` and the depth of the lowest
    common ancestor of ``i`` and ``j`` is ``(A A^T)_{ij}``, so
    ``d(i, j) = depth_i + depth_j - 2 (A A^T)_{ij}``. Words under different root words meet at
    the root, as in H&M's code. Raises ValueError when the heads do not form a tree.
    """
    heads = np.asarray(heads, dtype=np.int64)  # (n,)
    n = len(heads)
    if ((heads < 0) | (heads > n)).any():
        raise ValueError(f"heads must lie in 0..{n}, got {heads.tolist()}")
    parent = heads - 1  # (n,) 0-based, -1 at root words
    ancestors = np.eye(n, dtype=np.float32)  # (n, n): [i, k] = 1 if k is i or above i
    words, above = np.arange(n), parent.copy()  # (n,), (n,): one ancestor per word per step
    for _ in range(n):
        climbing = above >= 0
        if not climbing.any():
            break
        ancestors[words[climbing], above[climbing]] = 1.0
        above[climbing] = parent[above[climbing]]
    if (above >= 0).any():
        raise ValueError(f"heads do not form a tree: {heads.tolist()}")
    depth = ancestors.sum(axis=1)  # (n,)
    common = ancestors @ ancestors.T  # (n, n)
    return (depth[:, None] + depth[None, :] - 2 * common).round().astype(np.int64)  # (n, n)


def minimum_spanning_trees(distances: np.ndarray, keep: np.ndarray) -> list[list[tuple[int, int]]]:
    """Prim's minimum spanning tree over the kept words of each of ``k`` complete graphs.

    ``distances`` ``(k, n, n)``, ``keep`` ``(k, n)`` bool -> per graph its edges ``(i, j)``,
    ``i < j``, indexing all ``n`` words, in the order Prim adds them (none for fewer than 2 kept
    words). Only the upper triangle is read; kept pairs must be finite. Ties go to the lowest
    index: a tree grows from its first kept word, adds the lowest-indexed of the nearest outside
    words and links it to the lowest-indexed of its nearest tree words. The ``k`` graphs grow side
    by side, one word each per step: ``O(n^2)`` array work per step for all of them.
    """
    k, n = keep.shape
    if distances.shape != (k, n, n):
        raise ValueError(f"expected distances of shape {(k, n, n)}, got {distances.shape}")
    pairs = keep[:, :, None] & keep[:, None, :] & np.triu(np.ones((n, n), dtype=bool), 1)
    if not np.isfinite(distances[pairs]).all():  # pairs: (k, n, n), the kept upper triangle
        raise ValueError("distances between kept words must be finite")
    edges: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    if n < 2 or k == 0:
        return edges
    upper = np.where(pairs, distances, 0.0)  # left-out words: never read
    symmetric = (upper + upper.transpose(0, 2, 1)).astype(np.float64)  # (k, n, n)
    graphs = np.arange(k)
    sizes = keep.sum(axis=1)  # (k,)
    start = keep.argmax(axis=1)  # (k,) the first kept word
    in_tree = ~keep  # (k, n) left-out words never join
    in_tree[graphs, start] = True
    nearest = symmetric[graphs, start]  # (k, n) each word's distance to its tree
    link = np.repeat(start[:, None], n, axis=1)  # (k, n) its nearest tree word
    for step in range(int(sizes.max()) - 1):
        growing = sizes - 1 > step  # (k,)
        word = np.argmin(np.where(in_tree, np.inf, nearest), axis=1)  # (k,)
        linked = link[graphs, word]  # (k,)
        for g in np.flatnonzero(growing).tolist():
            a, b = int(word[g]), int(linked[g])
            edges[g].append((min(a, b), max(a, b)))
        in_tree[graphs[growing], word[growing]] = True
        row = symmetric[graphs, word]  # (k, n)
        closer = ~in_tree & ((row < nearest) | ((row == nearest) & (word[:, None] < link)))
        closer &= growing[:, None]
        nearest = np.where(closer, row, nearest)
        link = np.where(closer, word[:, None], link)
    return edges


@dataclass(frozen=True)
class UuasReport:
    """UUAS over a split and its parts."""

    score: float  # correct edges / gold edges over all sentences (micro); NaN without gold edges
    correct: list[int]  # per sentence: predicted edges that are gold edges
    total: list[int]  # per sentence: gold edges (non-punctuation words - 1, or 0)
    predicted_edges: list[list[tuple[int, int]]]  # per sentence, sorted, 0-based, i < j


class GoldTrees:
    """A split's gold trees, scoring predicted distances as H&M's reporter (:meth:`uuas`,
    :meth:`spearman`). What the gold side of a score needs (its spanning-tree edges, its centred
    distance ranks) is computed once, for every probe scored against the split; sentences of
    one length are scored together.

    ``distances``: per sentence the gold tree distances ``(n, n)``; ``punct``: per sentence
    ``(n,)`` bool, True at punctuation (left out of UUAS); DSpr averages over sentences of
    ``lengths`` words.
    """

    def __init__(
        self,
        distances: Sequence[np.ndarray],
        punct: Sequence[np.ndarray],
        lengths: tuple[int, int] = DSPR_LENGTHS,
    ) -> None:
        if len(distances) != len(punct):
            raise ValueError(f"{len(distances)} gold trees, {len(punct)} punctuation masks")
        self.distances = list(distances)
        self.keep = [~np.asarray(is_punct, dtype=bool) for is_punct in punct]
        self.lengths = lengths
        self.by_length: dict[int, list[int]] = defaultdict(list)  # sentence numbers per length
        for number, matrix in enumerate(self.distances):
            self.by_length[len(matrix)].append(number)

    def prepared(self) -> GoldTrees:
        """This, with what every score needs (:attr:`edges`, :attr:`ranks`) computed now: made
        before a cell's workers fork, each of them reads it."""
        self.edges, self.ranks  # noqa: B018  (cached properties: computed on first read)
        return self

    @cached_property
    def edges(self) -> list[set[tuple[int, int]]]:
        """Per sentence the gold edges among its non-punctuation words (the gold arcs when
        punctuation words are leaves)."""
        return [set(edges) for edges in self._spanning_trees(self.distances)]

    @cached_property
    def ranks(self) -> dict[int, np.ndarray]:
        """Per sentence length in DSpr's range: the centred gold ranks of every word's row of
        distances, the sentences of that length stacked: ``(sentences * n, n)``."""
        return {
            n: _centered_ranks(np.stack([self.distances[s] for s in numbers]).reshape(-1, n))
            for n, numbers in self.by_length.items()
            if self.lengths[0] <= n <= self.lengths[1]
        }

    def _stacked(self, matrices: Sequence[np.ndarray], numbers: list[int], n: int) -> np.ndarray:
        stacked = [np.asarray(matrices[s]) for s in numbers]
        for s, matrix in zip(numbers, stacked, strict=True):
            if matrix.shape != (n, n):
                raise ValueError(f"sentence {s}: predicted distances {matrix.shape}, gold {(n, n)}")
        return np.stack(stacked)  # (k, n, n)

    def _spanning_trees(self, matrices: Sequence[np.ndarray]) -> list[list[tuple[int, int]]]:
        trees: list[list[tuple[int, int]]] = [[] for _ in matrices]
        for n, numbers in self.by_length.items():
            keep = np.stack([self.keep[s] for s in numbers])
            found = minimum_spanning_trees(self._stacked(matrices, numbers, n), keep)
            for s, edges in zip(numbers, found, strict=True):
                trees[s] = sorted(edges)
        return trees

    def uuas(self, predicted: Sequence[np.ndarray]) -> UuasReport:
        """Undirected unlabelled attachment score of the predicted distances.

        Per sentence, among its non-punctuation words, the predicted edges are the minimum
        spanning tree of the predicted distances ``(n, n)`` and the gold edges that of the gold
        tree distances; edges are undirected. Sentences with fewer than 2 non-punctuation words
        have no edges.
        """
        if len(predicted) != len(self.distances):
            raise ValueError(f"{len(predicted)} predicted, {len(self.distances)} gold")
        predicted_edges = self._spanning_trees(predicted)
        correct = [
            sum(edge in gold for edge in edges)
            for edges, gold in zip(predicted_edges, self.edges, strict=True)
        ]
        total = [len(gold) for gold in self.edges]
        score = sum(correct) / sum(total) if sum(total) else float("nan")
        return UuasReport(score, correct, total, predicted_edges)

    def spearman(self, predicted: Sequence[np.ndarray]) -> float:
        """DSpr, H&M's distance Spearman: a macro average over sentence lengths.

        For each sentence in the length range (all words), each word's row of predicted
        distances ``(n,)`` is rank-correlated (Spearman, average ranks for ties) with its row of
        gold distances; these are averaged over the words of all sentences of one length, and the
        per-length means averaged over the lengths present. A constant row, whose correlation is
        undefined, counts as 0. NaN when no sentence has a length in range.
        """
        if len(predicted) != len(self.distances):
            raise ValueError(f"{len(predicted)} predicted, {len(self.distances)} gold")
        means = []
        for n in sorted(self.ranks):
            rows = self._stacked(predicted, self.by_length[n], n).reshape(-1, n)
            means.append(_correlation(_centered_ranks(rows), self.ranks[n]).mean())
        return float(np.mean(means)) if means else float("nan")


def _centered_ranks(rows: np.ndarray) -> np.ndarray:
    """Each row's average ranks (ties share their mean rank), minus the row's mean: ``(r, n)``."""
    # imported here: scipy.stats takes half a second to import, in every probe cell's process
    from scipy.stats import rankdata

    ranks = rankdata(rows, axis=1)
    return ranks - ranks.mean(axis=1, keepdims=True)


def _correlation(centered: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Pearson correlation of matching centred rows ``(r, n)``: ``(r,)``, 0 where a row is
    constant."""
    covariance = (centered * gold).sum(axis=1)
    scale = np.sqrt((centered**2).sum(axis=1) * (gold**2).sum(axis=1))
    return np.divide(covariance, scale, out=np.zeros_like(covariance), where=scale > 0)
