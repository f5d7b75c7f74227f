"""The scores of the probing tasks: accuracy and span F1 (the labels and metrics they score are
``elmolab.data.labels``').

- ``accuracy`` is torchmetrics' micro ``MulticlassAccuracy``; ``span_f1`` counts chunks as
  conlleval does (seqeval's default mode on IOB2 labels: ``B-X`` opens a chunk, and so does an
  ``I-X`` that does not continue an ``X`` chunk), the count the published CoNLL-2000 and
  CoNLL-2003 scores come from, for every dataset: a ``columns`` dataset's tags were converted to
  IOB2 keeping the chunks conlleval reads in the data's own scheme.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elmolab.data.labels import LabelVocabulary, TaskMetric


def accuracy(predicted: torch.Tensor, gold: torch.Tensor, num_classes: int) -> float:
    """Micro-averaged accuracy of label ids ``predicted`` against ``gold``, both ``(tokens,)``."""
    # Imported here: torchmetrics (and seqeval below) take seconds to import, and a probe cell
    # needs only one of them.
    from torchmetrics.functional.classification import multiclass_accuracy

    # The ids come from the probe's argmax and the vocabulary: torchmetrics' checks of their range
    # (a torch.unique of each side) took an eighth of a dev evaluation of 18 heads.
    return float(
        multiclass_accuracy(predicted, gold, num_classes, average="micro", validate_args=False)
    )


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Micro F1 over exactly matching chunks (type and boundaries) of IOB2 tags, counted as
    conlleval counts them (seqeval's default mode).

    ``2 P R / (P + R)`` with ``P = correct / predicted chunks`` and ``R = correct / gold chunks``;
    0 when there is no chunk on either side. Chunks never cross sentence boundaries. A chunk
    starts at ``B-X``, and at an ``I-X`` first in its sentence or after ``O`` or another type;
    it ends before the next start or ``O``.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for i, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(
                f"sentence {i}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted"
            )
    from seqeval.metrics import f1_score

    return float(
        f1_score([list(tags) for tags in gold], [list(tags) for tags in predicted], zero_division=0)
    )


def untyped_span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """:func:`span_f1` with every chunk type made one: the boundaries alone must match."""

    def untyped(sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        return [[tag if tag == "O" else f"{tag[:2]}SPAN" for tag in tags] for tags in sentences]

    return span_f1(untyped(gold), untyped(predicted))


def task_score(
    metric: TaskMetric | str,
    predicted: torch.Tensor,
    gold: torch.Tensor,
    sentence_lengths: Sequence[int],
    vocabulary: LabelVocabulary,
    *,
    untyped: bool = False,
) -> float:
    """``metric`` of label ids ``predicted`` ``(tokens,)`` against ``gold`` ``(tokens,)``.

    The tokens are the sentences of ``sentence_lengths`` one after the other (span F1 needs them);
    ``untyped``: span F1 of the boundaries alone (:func:`untyped_span_f1`). Span F1 is counted on
    the ids (:func:`span_f1_of_ids`) wherever the labels are ``O``, ``B-X`` and ``I-X``, as every
    reader's are: scoring the strings instead takes seconds per call on CoNLL-2003 dev, which the
    engine scores for every head every epoch.
    """
    if TaskMetric(metric) is TaskMetric.ACCURACY:
        return accuracy(predicted, gold, len(vocabulary))
    codes = conlleval_codes(vocabulary.labels, untyped=untyped)
    if codes is not None:
        return span_f1_of_ids(gold, predicted, sentence_lengths, codes)
    gold_tags = vocabulary.decode_sentences(gold, sentence_lengths)
    predicted_tags = vocabulary.decode_sentences(predicted, sentence_lengths)
    score = untyped_span_f1 if untyped else span_f1
    return score(gold_tags, predicted_tags)


# Span F1 on label ids, without strings: what the probe engine scores every epoch and every head
# with. seqeval's default mode reads each sentence tag by tag in Python (about 0.4 s for CoNLL-2000
# test, times every head of a fit, every epoch); this is the same count in a few tensor ops, and
# tests/probing/test_span_f1.py checks it against seqeval on random and real tag sequences.
_OUTSIDE, _BEGIN, _INSIDE = 0, 1, 2


def conlleval_codes(
    labels: Sequence[str], *, untyped: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per label id, its prefix (``O``, ``B``, ``I`` as 0, 1, 2) and its chunk type (a number;
    -1 for ``O``; every type the same with ``untyped``), or None when a label is not ``O``,
    ``B-<type>`` or ``I-<type>`` (those go through seqeval). A type may hold hyphens
    (WNUT-17's ``B-creative-work``): seqeval's type is everything after the first one too."""
    prefixes, types, numbers = [], [], {}
    for label in labels:
        if label == "O":
            prefixes.append(_OUTSIDE)
            types.append(-1)
            continue
        head, sep, kind = label.partition("-")
        if not sep or head not in ("B", "I") or not kind or kind == "_":
            return None
        prefixes.append(_BEGIN if head == "B" else _INSIDE)
        types.append(0 if untyped else numbers.setdefault(kind, len(numbers)))
    return torch.tensor(prefixes, dtype=torch.int64), torch.tensor(types, dtype=torch.int64)


def _chunk_keys(
    ids: torch.Tensor, first: torch.Tensor, last: torch.Tensor, codes: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """conlleval's chunks of ``ids`` ``(tokens,)``: each one's start token and one int64 key for
    (start, end, type), both ``(chunks,)``.

    A chunk starts at ``B-X``, at an ``I-X`` after ``O`` or after another type (or first in its
    sentence), and ends before the next start, ``O`` or the sentence end: seqeval's default mode
    (``get_entities``) restricted to IOB2 prefixes.
    """
    prefix, kind = codes[0][ids], codes[1][ids]
    inside = prefix != _OUTSIDE
    before_prefix, before_kind = prefix.roll(1), kind.roll(1)
    before_prefix[first], before_kind[first] = _OUTSIDE, -1
    start = inside & ((prefix == _BEGIN) | (before_prefix == _OUTSIDE) | (before_kind != kind))
    end = inside & (last | ~inside.roll(-1) | start.roll(-1))
    starts, ends = torch.nonzero(start).flatten(), torch.nonzero(end).flatten()
    n, n_types = len(ids), int(codes[1].max()) + 2
    return starts, (starts * n + ends) * n_types + kind[starts] + 1


def span_f1_of_ids(
    gold: torch.Tensor,
    predicted: torch.Tensor,
    sentence_lengths: Sequence[int],
    codes: tuple[torch.Tensor, torch.Tensor],
) -> float:
    """:func:`span_f1` (seqeval's default mode, micro) of label ids ``(tokens,)`` whose labels
    have the :func:`conlleval_codes` ``codes``; the same float, computed as seqeval does."""
    found_starts, correct, true_starts, _ = _chunks(gold, predicted, sentence_lengths, codes)
    return span_f1_of_counts(int(correct.sum()), len(found_starts), len(true_starts))


def span_f1_of_counts(correct: int, predicted: int, gold: int) -> float:
    """Micro span F1 of ``correct`` chunks out of ``predicted`` and ``gold`` ones, in seqeval's
    order of operations, so the float is :func:`span_f1`'s: precision and recall (0 without a
    chunk), then ``2 P R / (P + R)``. ``2 correct / (predicted + gold)`` is the same number, but
    its float differs in the last bits about a third of the time."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    denominator = precision + recall
    return 2 * precision * recall / denominator if denominator else 0.0


def sentence_span_counts(
    predicted: torch.Tensor,
    gold: torch.Tensor,
    sentence_lengths: Sequence[int],
    vocabulary: LabelVocabulary,
) -> dict[str, list[int]]:
    """Per sentence of ``sentence_lengths``, the typed chunks of label ids ``predicted``
    ``(tokens,)`` that are right (``tp``), its chunks (``pred``) and those of ``gold``
    (``gold``), counted as :func:`task_score`'s span F1 counts them: summed over any set of
    sentences, :func:`span_f1_of_counts` of the sums is their span F1."""
    codes = conlleval_codes(vocabulary.labels)
    if codes is not None:
        rows = _sentence_span_counts(gold, predicted, sentence_lengths, codes).tolist()
        return dict(zip(("tp", "pred", "gold"), rows, strict=True))
    from seqeval.metrics.sequence_labeling import get_entities

    gold_tags = vocabulary.decode_sentences(gold, sentence_lengths)
    predicted_tags = vocabulary.decode_sentences(predicted, sentence_lengths)
    counts: dict[str, list[int]] = {"tp": [], "pred": [], "gold": []}
    for gold_sentence, predicted_sentence in zip(gold_tags, predicted_tags, strict=True):
        true, found = set(get_entities(gold_sentence)), set(get_entities(predicted_sentence))
        counts["tp"].append(len(found & true))
        counts["pred"].append(len(found))
        counts["gold"].append(len(true))
    return counts


def _sentence_span_counts(
    gold: torch.Tensor,
    predicted: torch.Tensor,
    sentence_lengths: Sequence[int],
    codes: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """``(3, sentences)``: per sentence, the right chunks of ``predicted``, its chunks and those
    of ``gold`` (label ids ``(tokens,)`` whose labels have the :func:`conlleval_codes`
    ``codes``)."""
    found_starts, correct, true_starts, ends = _chunks(gold, predicted, sentence_lengths, codes)
    chunk_starts = (found_starts[correct], found_starts, true_starts)
    # a chunk's sentence: the one whose tokens [end - length, end) hold its start
    return torch.stack(
        [
            torch.bincount(torch.bucketize(starts, ends, right=True), minlength=len(ends))
            for starts in chunk_starts
        ]
    )  # (3, sentences)


def _chunks(
    gold: torch.Tensor,
    predicted: torch.Tensor,
    sentence_lengths: Sequence[int],
    codes: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunks of label ids ``predicted`` and ``gold`` ``(tokens,)``: the start tokens of
    ``predicted``'s ``(found,)``, which of them are right ``(found,)``, the start tokens of
    ``gold``'s ``(true,)``, and each sentence's end ``(sentences,)``."""
    if len(gold) != len(predicted) or len(gold) != sum(sentence_lengths):
        raise ValueError(
            f"{len(gold)} gold and {len(predicted)} predicted tags for sentences of "
            f"{sum(sentence_lengths)} tokens"
        )
    lengths = torch.tensor(list(sentence_lengths), dtype=torch.int64)
    ends = lengths.cumsum(0)
    first = torch.zeros(len(gold), dtype=torch.bool)
    last = torch.zeros(len(gold), dtype=torch.bool)
    first[(ends - lengths)[lengths > 0]] = True
    last[(ends - 1)[lengths > 0]] = True
    true_starts, true = _chunk_keys(gold, first, last, codes)
    found_starts, found = _chunk_keys(predicted, first, last, codes)
    return found_starts, torch.isin(found, true), true_starts, ends
