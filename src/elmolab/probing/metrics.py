"""The labels and scores of the probing tasks: label vocabulary, accuracy, span F1, control task.

- :class:`LabelVocabulary` fixes the label ids from the training split and checks that dev and test
  use no label the probe cannot have learned (``unseen="raise"``, the default: an ElmolabError
  names the file and line) or keeps such labels as evaluation-only ids (``unseen="keep"``).
- ``accuracy`` is torchmetrics' micro ``MulticlassAccuracy``; ``span_f1`` is seqeval's default
  mode, which counts chunks as conlleval does (IOB2 input; an ``I-X`` that does not continue an
  ``X`` chunk starts one), or, for data read in a tag scheme (``columns`` datasets), seqeval's
  strict mode in that scheme.
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

from elmolab.errors import ElmolabError
from elmolab.text.conll import TagScheme, spans_to_tags

# The seqeval scheme (``seqeval.scheme``) that reads each TagScheme. seqeval has no IO: IO tags are
# IOB1 tags that never use B-, and IOB1 reads the same spans from them.
SEQEVAL_SCHEMES = {
    TagScheme.IO: "IOB1",
    TagScheme.IOB1: "IOB1",
    TagScheme.IOB2: "IOB2",
    TagScheme.BIOES: "IOBES",
}


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
        The labels are IOB2 span tags converted from data in this scheme, and span F1 scores in it
        (see :func:`span_f1`); None: scored as conlleval does.
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
        other than IOB2): the chunks the span F1 reads, tagged as the data tags them (what a test
        predictions file should hold). Labels not read from a tag scheme come out as they are."""
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

    return float(multiclass_accuracy(predicted, gold, num_classes, average="micro"))


def span_f1(
    gold: Sequence[Sequence[str]],
    predicted: Sequence[Sequence[str]],
    scheme: TagScheme | None = None,
) -> float:
    """Micro F1 over exactly matching chunks (type and boundaries) of IOB2 tags.

    ``2 P R / (P + R)`` with ``P = correct / predicted chunks`` and ``R = correct / gold chunks``;
    0 when there is no chunk on either side. Chunks never cross sentence boundaries.

    Without ``scheme``, chunks are counted as conlleval does (seqeval's default mode). With it, the
    tags came from data in ``scheme``: both sides are written back in it (:func:`_in_scheme`) and
    seqeval's strict mode scores them in it, so the score is seqeval's on the data as written.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for i, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(
                f"sentence {i}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted"
            )
    as_lists = [list(tags) for tags in gold], [list(tags) for tags in predicted]
    from seqeval.metrics import f1_score

    if scheme is None:
        return float(f1_score(*as_lists, zero_division=0))
    import seqeval.scheme

    written = [_in_scheme(tags, scheme) for tags in as_lists]
    reader = getattr(seqeval.scheme, SEQEVAL_SCHEMES[scheme])
    return float(f1_score(*written, mode="strict", scheme=reader, zero_division=0))


def untyped_span_f1(
    gold: Sequence[Sequence[str]],
    predicted: Sequence[Sequence[str]],
    scheme: TagScheme | None = None,
) -> float:
    """:func:`span_f1` with every chunk type made one: the boundaries alone must match."""

    def untyped(sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        return [[tag if tag == "O" else f"{tag[:2]}SPAN" for tag in tags] for tags in sentences]

    return span_f1(untyped(gold), untyped(predicted), scheme)


def _in_scheme(sentences: list[list[str]], scheme: TagScheme) -> list[list[str]]:
    """IOB2 tags written in ``scheme``: the chunks seqeval's strict IOB2 mode reads from them.

    That reading opens a chunk only at ``B-X``: an ``I-X`` that continues no X chunk (which a
    probe may predict) is outside every chunk, whatever ``scheme`` the data uses.
    """
    from seqeval.scheme import IOB2, Entities

    return [
        spans_to_tags([(e.start, e.end, e.tag) for e in entities], len(tags), scheme)
        for entities, tags in zip(Entities(sentences, IOB2).entities, sentences, strict=True)
    ]


def task_score(
    metric: TaskMetric | str,
    predicted: torch.Tensor,
    gold: torch.Tensor,
    sentence_lengths: Sequence[int],
    vocabulary: LabelVocabulary,
) -> float:
    """``metric`` of label ids ``predicted`` ``(tokens,)`` against ``gold`` ``(tokens,)``.

    The tokens are the sentences of ``sentence_lengths`` one after the other (span F1 needs them,
    and scores in ``vocabulary.scheme``).
    """
    if TaskMetric(metric) is TaskMetric.ACCURACY:
        return accuracy(predicted, gold, len(vocabulary))
    gold_tags = vocabulary.decode_sentences(gold, sentence_lengths)
    predicted_tags = vocabulary.decode_sentences(predicted, sentence_lengths)
    return span_f1(gold_tags, predicted_tags, vocabulary.scheme)


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
