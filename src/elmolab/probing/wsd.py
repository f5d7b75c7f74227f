"""Word sense disambiguation by 1-nearest neighbour over sense centroids (ELMo paper, section 5.3).

1. The centroid of a sense key is the mean contextual vector of its SemCor occurrences (an
   occurrence tagged with several keys counts for each of them).
2. An evaluation instance gets, among the candidate senses of its ``(lemma, pos)`` in WordNet, the
   one whose centroid is nearest by cosine similarity ``x . c / (|x| |c|)`` (ties: the earlier
   candidate); candidates without a centroid are skipped.
3. When no candidate has a centroid, the instance backs off to the WordNet first sense; with no
   first sense either it stays unanswered.

The baseline beside it reads no features: every instance gets its WordNet first sense
(:func:`first_sense_keys`), scored the same way on the same instances.

Scoring follows Raganato et al. (2017): ``P = correct / answered``, ``R = correct / total``,
``F1 = 2 P R / (P + R)``; a prediction is correct if it is any of the instance's gold keys. With the
back-off every instance that WordNet knows is answered, so usually ``P = R = F1``.

Nothing is trained: the features come from a fixed mode (a layer, ``mean`` or ``concat``), the
learned ``scalar_mix`` does not apply, and neither do seeds. The probe stage's WSD cell
(``elmolab.probing.runner``) runs these steps for every encoder and mode.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn import functional as F

from elmolab.core.errors import ElmolabError
from elmolab.io.results import FeatureMode
from elmolab.models.scalar_mix import mix_layers

LemmaPos = tuple[str, str]
CHUNK = 16384  # instances mixed at a time, to bound the float32 copies
PredictionSource = Literal["nearest", "first_sense", "unanswered"]


def wsd_vectors(layers: torch.Tensor, mode: FeatureMode) -> torch.Tensor:
    """Each instance's fixed feature: ``(num_layers, instances, dim)`` -> ``(instances, D)``."""
    if mode is FeatureMode.SCALAR_MIX:
        raise ElmolabError("WSD 1-NN trains nothing: the learned scalar_mix does not apply")
    chunks = layers.split(CHUNK, dim=1)  # (num_layers, <= CHUNK, dim) each
    return torch.cat([mix_layers(chunk.float(), mode) for chunk in chunks])  # (instances, D)


@dataclass(frozen=True)
class SenseCentroids:
    """Unit-length mean vectors of the sense keys seen in training."""

    rows: dict[str, int]  # sense key -> its row of directions and counts
    directions: torch.Tensor  # (senses, D), each row the centroid divided by its norm
    counts: torch.Tensor  # (senses,) occurrences averaged


def fit_sense_centroids(
    vectors: torch.Tensor, sense_keys: Sequence[Collection[str]]
) -> SenseCentroids:
    """``c_k = mean of vectors[i] over the occurrences i tagged with key k``.

    ``vectors`` is ``(occurrences, D)``; ``sense_keys[i]`` holds the keys of occurrence ``i``.
    """
    if len(sense_keys) != vectors.shape[0]:
        raise ValueError(f"{vectors.shape[0]} vectors but {len(sense_keys)} sets of sense keys")
    rows = {key: i for i, key in enumerate(sorted({k for keys in sense_keys for k in keys}))}
    pairs = torch.tensor(
        [(rows[key], i) for i, keys in enumerate(sense_keys) for key in keys], dtype=torch.long
    ).reshape(-1, 2)  # (pairs, 2): sense row, occurrence
    tagging = torch.sparse_coo_tensor(
        pairs.T, torch.ones(len(pairs)), (len(rows), vectors.shape[0]), check_invariants=True
    )  # (senses, occurrences), 1 where the occurrence is tagged with the sense
    sums = torch.sparse.mm(tagging, vectors.float())  # (senses, D)
    counts = torch.bincount(pairs[:, 0], minlength=len(rows))  # (senses,)
    centroids = sums / counts[:, None]  # (senses, D)
    return SenseCentroids(rows, F.normalize(centroids, dim=1), counts)


@dataclass(frozen=True)
class SensePrediction:
    key: str | None  # None when unanswered
    source: PredictionSource


def predict_senses(
    centroids: SenseCentroids,
    vectors: torch.Tensor,
    lemma_pos: Sequence[LemmaPos],
    candidates: Mapping[LemmaPos, Sequence[str]],
    first_sense: Mapping[LemmaPos, str],
) -> list[SensePrediction]:
    """The sense of each evaluation instance: nearest candidate centroid, else the first sense.

    ``vectors`` is ``(instances, D)``; ``lemma_pos[i]`` is instance ``i``'s ``(lemma, pos)``, the
    key of ``candidates`` (its WordNet sense keys) and ``first_sense`` (its WordNet sense 1).
    """
    if len(lemma_pos) != vectors.shape[0]:
        raise ValueError(f"{vectors.shape[0]} vectors but {len(lemma_pos)} lemma/pos pairs")
    directions = F.normalize(vectors.float(), dim=1)  # (instances, D)
    predictions = []
    for direction, word in zip(directions, lemma_pos, strict=True):
        known = [
            (key, row)
            for key in candidates.get(word, ())
            if (row := centroids.rows.get(key)) is not None
        ]
        if known:
            rows = torch.tensor([row for _, row in known])
            similarity = centroids.directions[rows] @ direction  # (known candidates,)
            predictions.append(SensePrediction(known[int(similarity.argmax())][0], "nearest"))
        elif word in first_sense:
            predictions.append(SensePrediction(first_sense[word], "first_sense"))
        else:
            predictions.append(SensePrediction(None, "unanswered"))
    return predictions


def first_sense_keys(
    lemma_pos: Sequence[LemmaPos], first_sense: Mapping[LemmaPos, str]
) -> list[str | None]:
    """The first-sense baseline: each instance's WordNet sense 1 (None: WordNet has none)."""
    return [first_sense.get(word) for word in lemma_pos]


@dataclass(frozen=True)
class WsdScores:
    precision: float  # correct / answered
    recall: float  # correct / total
    f1: float
    correct: int
    answered: int
    total: int


def score_senses(predicted: Sequence[str | None], gold: Sequence[Collection[str]]) -> WsdScores:
    """Raganato et al.'s scores; ``predicted[i]`` is correct if it is in ``gold[i]``."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predictions but {len(gold)} gold instances")
    answered = sum(key is not None for key in predicted)
    correct = sum(
        key is not None and key in keys for key, keys in zip(predicted, gold, strict=True)
    )
    precision = correct / answered if answered else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return WsdScores(precision, recall, f1, correct, answered, len(gold))


def per_sentence_counts(
    predicted: Sequence[str | None], gold: Sequence[Collection[str]], sentence_sizes: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Correct predictions and instances per sentence, for the report's paired bootstrap.

    ``sentence_sizes[s]`` is the number of instances of sentence ``s``; the instances are in
    sentence order. ``sum(correct) / sum(total)`` is the recall (F1 when every instance is
    answered).
    """
    if sum(sentence_sizes) != len(predicted) or len(predicted) != len(gold):
        raise ValueError(
            f"{len(predicted)} predictions, {len(gold)} gold instances, "
            f"{sum(sentence_sizes)} instances in the sentences"
        )
    hits = iter(key is not None and key in keys for key, keys in zip(predicted, gold, strict=True))
    correct = [sum(next(hits) for _ in range(size)) for size in sentence_sizes]
    return correct, list(sentence_sizes)
