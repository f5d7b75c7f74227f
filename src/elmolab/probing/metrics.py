"""The labels and scores of the probing tasks: label vocabulary, accuracy, span F1, control task.

- :class:`LabelVocabulary` fixes the label ids from the training split and checks that dev and test
  use no label the probe cannot have learned (``unseen="raise"``, the default: an ElmolabError
  names the file and line) or keeps such labels as evaluation-only ids (``unseen="keep"``).
- ``accuracy`` is torchmetrics' micro ``MulticlassAccuracy``; ``span_f1`` counts chunks as
  conlleval does (seqeval's default mode on IOB2 labels: ``B-X`` opens a chunk, and so does an
  ``I-X`` that does not continue an ``X`` chunk), the count the published CoNLL-2000 and
  CoNLL-2003 scores come from, for every dataset: a ``columns`` dataset's tags were converted to
  IOB2 keeping the chunks conlleval reads in the data's own scheme.
- :class:`ControlTask` is Hewitt and Liang's (2019) control task; ``selectivity`` compares to it.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum
from itertools import accumulate
from os import PathLike
from typing import Literal

import torch

from elmolab.core.errors import ElmolabError
from elmolab.data.conll import TagScheme, spans_to_tags


class LabelVocabulary:
    """Label strings <-> ids; ids ``0 .. num_train_labels - 1`` are the train labels, sorted.

    A probe has one output per train label. A dev or test label never seen in train cannot be
    predicted, so by default (``unseen="raise"``) encoding it raises an ElmolabError naming the
    file and line: it usually means a wrong file or tag set. With ``unseen="keep"`` it gets a new
    id after the train labels (its own string, not one shared ``<unk>`` id, so span F1 still sees
    the gold chunk and its type): the probe never predicts it, so the token counts as an error in
    accuracy and its chunk as missed in span F1.

    Parameters
    ----------
    train_labels : ``Iterable[str]``
        Every label the probe is trained on (duplicates are fine; the order is not used).
    unseen : ``"raise"`` or ``"keep"``, optional (default = ``"raise"``)
        What ``encode`` does with a label outside ``train_labels``.
    scheme : ``TagScheme``, optional (default = ``None``)
        The labels are IOB2 span tags converted from data in this scheme, in which predictions
        are written back (:meth:`decode_in_data_scheme`); span F1 counts conlleval's chunks
        whatever the scheme.
    """

    def __init__(
        self,
        train_labels: Iterable[str],
        unseen: Literal["raise", "keep"] = "raise",
        scheme: TagScheme | None = None,
    ) -> None:
        self.labels: list[str] = sorted(set(train_labels))
        self.num_train_labels = len(self.labels)
        self.unseen = unseen
        self.scheme = scheme
        self._ids = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def from_sentences(
        cls,
        sentences: Iterable[Sequence[str]],
        unseen: Literal["raise", "keep"] = "raise",
        scheme: TagScheme | None = None,
    ) -> LabelVocabulary:
        """The vocabulary of the labels of the training sentences."""
        return cls((label for sentence in sentences for label in sentence), unseen, scheme)

    def __len__(self) -> int:
        """Train labels plus the unseen labels kept so far."""
        return len(self.labels)

    def encode(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        path: str | PathLike[str] | None = None,
        lines: Sequence[Sequence[int]] | None = None,
    ) -> list[list[int]]:
        """The label ids of each sentence.

        ``path`` and ``lines`` (the 1-based line of every token in that file) locate an unseen
        label in the error; without ``lines`` the error gives the sentence and token index.
        """
        encoded = []
        for i, sentence in enumerate(sentences):
            ids = []
            for j, label in enumerate(sentence):
                label_id = self._ids.get(label)
                if label_id is None:
                    label_id = self._add_unseen(label, path, i, j, lines)
                ids.append(label_id)
            encoded.append(ids)
        return encoded

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The label strings of ``ids``."""
        return [self.labels[i] for i in ids]

    def decode_sentences(
        self, ids: torch.Tensor, sentence_lengths: Sequence[int]
    ) -> list[list[str]]:
        """The label strings of flat ``ids`` ``(tokens,)``, cut into sentences of those lengths."""
        boundaries = list(accumulate(sentence_lengths))[:-1]
        return [self.decode(sentence.tolist()) for sentence in torch.tensor_split(ids, boundaries)]

    def decode_in_data_scheme(
        self, ids: torch.Tensor, sentence_lengths: Sequence[int]
    ) -> list[list[str]]:
        """:meth:`decode_sentences`, written back in the tag scheme the data uses (``scheme``,
        other than IOB2): the chunks the span F1 reads (conlleval's), tagged as the data tags
        them (what a test predictions file should hold, so that conlleval run on it counts the
        same chunks). Labels not read from a tag scheme come out as they are."""
        sentences = self.decode_sentences(ids, sentence_lengths)
        if self.scheme is None or self.scheme is TagScheme.IOB2:
            return sentences
        return _in_scheme(sentences, self.scheme)

    def _add_unseen(
        self,
        label: str,
        path: str | PathLike[str] | None,
        sentence: int,
        token: int,
        lines: Sequence[Sequence[int]] | None,
    ) -> int:
        if self.unseen == "raise":
            where = "" if lines is not None else f" (sentence {sentence}, token {token})"
            raise ElmolabError(
                f"label {label!r}{where} never occurs in the training data"
                f" ({self.num_train_labels} labels)",
                path,
                None if lines is None else lines[sentence][token],
            )
        self._ids[label] = len(self.labels)
        self.labels.append(label)
        return self._ids[label]


class TaskMetric(StrEnum):
    """How a probing task is scored."""

    ACCURACY = "accuracy"  # UPOS, XPOS, dependency labels, control tasks
    SPAN_F1 = "span_f1"  # chunking, NER


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


def _in_scheme(sentences: list[list[str]], scheme: TagScheme) -> list[list[str]]:
    """IOB2 tags written in ``scheme``: the chunks conlleval reads from them (seqeval's
    ``get_entities``, sentence by sentence), so a stray ``I-X`` a probe predicts after ``O``
    comes out as the chunk it opens."""
    from seqeval.metrics.sequence_labeling import get_entities

    return [
        spans_to_tags(
            [(start, end + 1, kind) for kind, start, end in get_entities(tags)], len(tags), scheme
        )
        for tags in sentences
    ]


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
) -> torch.Tensor:
    """conlleval's chunks of ``ids`` ``(tokens,)``, one int64 key each for (start, end, type).

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
    return (starts * n + ends) * n_types + kind[starts] + 1


def span_f1_of_ids(
    gold: torch.Tensor,
    predicted: torch.Tensor,
    sentence_lengths: Sequence[int],
    codes: tuple[torch.Tensor, torch.Tensor],
) -> float:
    """:func:`span_f1` (seqeval's default mode, micro) of label ids ``(tokens,)`` whose labels
    have the :func:`conlleval_codes` ``codes``; the same float, computed as seqeval does."""
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
    true = _chunk_keys(gold, first, last, codes)
    found = _chunk_keys(predicted, first, last, codes)
    correct = int(torch.isin(found, true).sum())
    # seqeval's micro average: precision and recall (0 without a chunk), then 2 P R / (P + R).
    precision = correct / len(found) if len(found) else 0.0
    recall = correct / len(true) if len(true) else 0.0
    denominator = precision + recall
    return 2 * precision * recall / denominator if denominator else 0.0


class ControlTask:
    """Hewitt and Liang's (2019) control task: every word type gets one random tag.

    The tag of a word is drawn from the empirical tag distribution of the training split, with
    randomness that depends only on ``(seed, word)`` (a BLAKE2b hash): the same word gets the same
    tag in train, dev and test, in any run, whatever order the words come in. Word types are
    compared exactly (case-sensitive). A probe that scores well here memorises word identities
    rather than reading structure off the features; ``selectivity`` is the gap.

    Build the control task's :class:`LabelVocabulary` from ``tags`` (every tag can be drawn, even
    one that no training word happens to get).

    Parameters
    ----------
    tag_counts : ``Counter[str]``
        How often each tag occurs in the training split.
    seed : ``int``
        Chooses the mapping.
    """

    def __init__(self, tag_counts: Counter[str], seed: int) -> None:
        self.tags = sorted(tag for tag, count in tag_counts.items() if count > 0)
        if not self.tags:
            raise ValueError("a control task needs the counts of at least one tag")
        self.seed = seed
        self._cumulative = list(accumulate(tag_counts[tag] for tag in self.tags))

    @classmethod
    def from_sentences(cls, train_tags: Iterable[Sequence[str]], seed: int) -> ControlTask:
        """The control task for the gold tags of the training sentences."""
        return cls(Counter(tag for sentence in train_tags for tag in sentence), seed)

    def tag(self, word: str) -> str:
        """The control tag of ``word``: tag ``k`` with probability ``count_k / total``."""
        digest = hashlib.blake2b(f"{self.seed}\0{word}".encode(), digest_size=8).digest()
        draw = int.from_bytes(digest, "little") % self._cumulative[-1]  # in [0, total)
        return self.tags[bisect.bisect_right(self._cumulative, draw)]

    def relabel(self, sentences: Iterable[Sequence[str]]) -> list[list[str]]:
        """The control tags of the words of each sentence."""
        return [[self.tag(word) for word in sentence] for sentence in sentences]
