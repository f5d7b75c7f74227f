"""Sentence batches and tree metrics for the tree probes (``deparc`` and the structural probe).

The tree probes read whole sentences, so training draws padded batches of sentences of similar
length (:func:`plan_batches`, :func:`padded_batches`); the probes themselves are heads of the
probe engine (:mod:`elmolab.probing.engine`). The structural probe (Hewitt and Manning 2019) is
scored by the undirected attachment score of the minimum spanning tree of its predicted
distances (UUAS, :func:`uuas`) and the distance Spearman correlation (DSpr,
:func:`distance_spearman`), both as in H&M's reporter; :func:`tree_distances` gives the gold
distances.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import rankdata

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


def minimum_spanning_tree(distances: np.ndarray) -> list[tuple[int, int]]:
    """Prim's minimum spanning tree of a complete graph: ``(n, n)`` -> ``n - 1`` edges ``(i, j)``.

    Edges are 0-based with ``i < j``, in the order Prim adds them. ``distances`` should be
    symmetric and finite; only its upper triangle is read. Ties go to the lowest index: the tree
    grows from word 0, adds the lowest-indexed of the nearest outside words, and links it to the
    lowest-indexed of its nearest tree words. ``O(n^2)``.
    """
    n = distances.shape[0]
    if distances.shape != (n, n) or not np.isfinite(distances).all():
        raise ValueError(f"expected a finite square matrix, got shape {distances.shape}")
    if n < 2:
        return []
    upper = np.triu(distances, 1)
    symmetric = (upper + upper.T).astype(np.float64)  # (n, n)
    in_tree = np.zeros(n, dtype=bool)  # (n,)
    in_tree[0] = True
    nearest = symmetric[0].copy()  # (n,) each word's distance to the tree
    link = np.zeros(n, dtype=np.int64)  # (n,) its nearest tree word
    edges = []
    for _ in range(n - 1):
        word = int(np.argmin(np.where(in_tree, np.inf, nearest)))
        edges.append((min(word, int(link[word])), max(word, int(link[word]))))
        in_tree[word] = True
        row = symmetric[word]  # (n,)
        closer = ~in_tree & ((row < nearest) | ((row == nearest) & (word < link)))  # (n,)
        nearest = np.where(closer, row, nearest)
        link = np.where(closer, word, link)
    return edges


def spanning_tree_edges(distances: np.ndarray, keep: np.ndarray) -> list[tuple[int, int]]:
    """The minimum spanning tree over the words where ``keep`` ``(n,)`` is True.

    Edges ``(i, j)`` index the whole sentence (0-based, ``i < j``); fewer than 2 kept words give
    no edges.
    """
    kept = np.flatnonzero(keep)  # (k,) ascending, so i < j survives the mapping
    return [
        (int(kept[i]), int(kept[j]))
        for i, j in minimum_spanning_tree(distances[np.ix_(kept, kept)])
    ]


@dataclass(frozen=True)
class UuasReport:
    """UUAS over a split and its parts."""

    score: float  # correct edges / gold edges over all sentences (micro); NaN without gold edges
    correct: list[int]  # per sentence: predicted edges that are gold edges
    total: list[int]  # per sentence: gold edges (non-punctuation words - 1, or 0)
    predicted_edges: list[list[tuple[int, int]]]  # per sentence, sorted, 0-based, i < j


def uuas(
    predicted: Sequence[np.ndarray],
    gold: Sequence[np.ndarray],
    punct: Sequence[np.ndarray],
) -> UuasReport:
    """Undirected unlabelled attachment score of the predicted distances, as H&M's reporter.

    Per sentence, among its non-punctuation words (``punct[s]`` ``(n,)`` False), the predicted
    edges are the minimum spanning tree of the predicted distances ``(n, n)`` and the gold edges
    that of the gold tree distances ``(n, n)`` (the gold arcs between those words when
    punctuation words are leaves); edges are undirected. Sentences with fewer than 2
    non-punctuation words have no edges.
    """
    if not len(predicted) == len(gold) == len(punct):
        raise ValueError(f"{len(predicted)} predicted, {len(gold)} gold, {len(punct)} punct")
    correct, total, predicted_edges = [], [], []
    for predicted_distances, gold_distances, is_punct in zip(predicted, gold, punct, strict=True):
        keep = ~np.asarray(is_punct, dtype=bool)  # (n,)
        edges = sorted(spanning_tree_edges(predicted_distances, keep))
        gold_edges = set(spanning_tree_edges(gold_distances, keep))
        correct.append(sum(edge in gold_edges for edge in edges))
        total.append(len(gold_edges))
        predicted_edges.append(edges)
    score = sum(correct) / sum(total) if sum(total) else float("nan")
    return UuasReport(score, correct, total, predicted_edges)


def distance_spearman(
    predicted: Sequence[np.ndarray],
    gold: Sequence[np.ndarray],
    lengths: tuple[int, int] = DSPR_LENGTHS,
) -> float:
    """DSpr, H&M's distance Spearman: a macro average over sentence lengths.

    For each sentence of ``lengths[0]..lengths[1]`` words (all words), each word's row of
    predicted distances ``(n,)`` is rank-correlated (Spearman, average ranks for ties) with its
    row of gold distances; these are averaged over the words of all sentences of one length, and
    the per-length means averaged over the lengths present. A constant predicted row, whose
    correlation is undefined, counts as 0. NaN when no sentence has a length in range.
    """
    by_length: dict[int, list[float]] = defaultdict(list)
    for predicted_distances, gold_distances in zip(predicted, gold, strict=True):
        n = len(gold_distances)
        if lengths[0] <= n <= lengths[1]:
            by_length[n].extend(_row_spearman(predicted_distances, gold_distances).tolist())
    if not by_length:
        return float("nan")
    return float(np.mean([np.mean(by_length[n]) for n in sorted(by_length)]))


def _row_spearman(predicted: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman's rho between matching rows of two ``(n, n)`` matrices: ``(n,)``."""
    ranks = [rankdata(matrix, axis=1) for matrix in (predicted, gold)]  # (n, n) each
    centered = [r - r.mean(axis=1, keepdims=True) for r in ranks]  # (n, n) each
    covariance = (centered[0] * centered[1]).sum(axis=1)  # (n,)
    scale = np.sqrt((centered[0] ** 2).sum(axis=1) * (centered[1] ** 2).sum(axis=1))  # (n,)
    return np.divide(covariance, scale, out=np.zeros_like(covariance), where=scale > 0)
