"""The labels of the probing tasks: the label vocabulary, how a task is scored, the control task.

- :class:`LabelVocabulary` fixes the label ids from the training split and checks that dev and test
  use no label the probe cannot have learned (``unseen="raise"``, the default: an ElmolabError
  names the file and line) or keeps such labels as evaluation-only ids (``unseen="keep"``).
- :class:`TaskMetric` names a task's score (``elmolab.probing.metrics`` computes it).
- :class:`ControlTask` is Hewitt and Liang's (2019) control task; ``selectivity`` compares to it.
  With ``control_seed`` set, a token task becomes its control task: each word type's label is a
  random tag, fixed per type and drawn from the training tag distribution.

:func:`task_labels` gives a token, pair or sentence task's label ids for its three splits,
:func:`tree_splits` a tree task's heads and punctuation.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate
from os import PathLike
from typing import Literal

import torch

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import TaskConfig, TaskKind
from elmolab.data.catalogue import SplitSource
from elmolab.data.conll import TagScheme, spans_to_tags
from elmolab.data.wsd import instance_supersense

SUPERSENSE_FIELD = "supersense"  # the label field of token tasks on WSD datasets
# Tree tasks read the heads, and punctuation (excluded from UUAS) is UD's UPOS tag PUNCT.
TREE_FIELD, PUNCT_FIELD, PUNCT_TAG = "heads", "upos", "PUNCT"


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


@dataclass(frozen=True)
class TaskLabels:
    """A token or pair task's labels for its three splits (roles train, dev, test)."""

    vocabulary: LabelVocabulary
    labels: dict[str, list[list[int]]]  # role -> label ids, per sentence
    heads: dict[str, list[list[int]]] | None  # pair task: role -> 1-based heads (0: root)
    # what each run's record counts about the labels (supersense: the instances whose gold keys
    # lie in several lexicographer files, per role)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)


def task_labels(task: TaskConfig, sources: dict[str, SplitSource]) -> TaskLabels:
    """Label ids of every split; the vocabulary is train's (see ``LabelVocabulary``).

    A dev or test label never seen in train is an ElmolabError naming the file and line unless
    ``task.unseen`` is ``keep``. A control task draws each word type's tag from the training tags.
    The vocabulary carries the tag scheme test predictions are written in (:func:`_span_scheme`).
    """
    assert task.field is not None, "task.check() rejects token and pair tasks without a field"
    if TaskKind(task.kind) is TaskKind.SENTENCE:
        return _sentence_labels(task, sources)
    tags = {role: _field_values(source, task.field) for role, source in sources.items()}
    scheme = _span_scheme(task, sources)
    if task.control_seed is not None:
        control = ControlTask.from_sentences(tags["train"], task.control_seed)
        tags = {
            role: control.relabel(sentence.tokens for sentence in source.sentences)
            for role, source in sources.items()
        }
        vocabulary = LabelVocabulary(control.tags, scheme=scheme)
    else:
        vocabulary = LabelVocabulary.from_sentences(
            tags["train"],
            unseen=task.unseen,  # type: ignore[arg-type]
            scheme=scheme,
        )
    labels = {
        role: vocabulary.encode(tags[role], path=source.path, lines=source.token_lines)
        for role, source in sources.items()
    }
    heads = None
    if TaskKind(task.kind) is TaskKind.PAIR:
        heads = {role: _field_values(source, "heads") for role, source in sources.items()}
    counts = {
        f"n_{role}_instances_in_several_supersenses": _supersenses(source, task.field)[1]
        for role, source in sources.items()
        if source.format.is_wsd
    }
    return TaskLabels(vocabulary, labels, heads, counts)


def _sentence_labels(task: TaskConfig, sources: dict[str, SplitSource]) -> TaskLabels:
    """A sentence task's labels: per sentence ``[id]``, or ``[]`` where ``task.label_map`` maps
    its label to null (the sentence is no item of the task). A label that is no key of the map is
    an ElmolabError naming the sentence's file and line."""
    assert task.field is not None
    tags: dict[str, list[list[str]]] = {}
    for role, source in sources.items():
        values = _field_values(source, task.field, per_token=False)
        lines = source.token_lines or [[None]] * len(values)  # a sentence's tokens: one line
        tags[role] = []
        for value, (line, *_) in zip(values, lines, strict=True):
            label = str(value)
            if task.label_map is not None:
                if label not in task.label_map:
                    keys = ", ".join(task.label_map)
                    problem = f"label {label!r} is not a key of task.label_map ({keys})"
                    raise ElmolabError(problem, source.path, line)
                label = task.label_map[label]
            tags[role].append([] if label is None else [label])
    vocabulary = LabelVocabulary.from_sentences(
        tags["train"],
        unseen=task.unseen,  # type: ignore[arg-type]
    )
    labels = {
        role: vocabulary.encode(tags[role], path=source.path, lines=source.token_lines)
        for role, source in sources.items()
    }
    return TaskLabels(vocabulary, labels, None)


def _span_scheme(task: TaskConfig, sources: dict[str, SplitSource]) -> TagScheme | None:
    """The tag scheme a span F1 task writes its test predictions in: its test data's (None: not
    span F1, or data read without a scheme, written in IOB2). Span F1 counts conlleval's chunks,
    which every split's IOB2 labels keep from its own scheme, so the splits may differ."""
    if task.metric != TaskMetric.SPAN_F1:
        return None
    return sources["test"].scheme


@dataclass(frozen=True)
class TreeSplit:
    """One split's dependency trees: 1-based heads (0: root) and punctuation, per sentence."""

    heads: list[list[int]]
    punct: list[list[bool]]


def tree_splits(sources: dict[str, SplitSource]) -> dict[str, TreeSplit]:
    """Role -> the heads and punctuation of every sentence (CoNLL-U: HEAD, and UPOS PUNCT)."""
    return {
        role: TreeSplit(
            heads=_field_values(source, TREE_FIELD),
            punct=[[tag == PUNCT_TAG for tag in s] for s in _field_values(source, PUNCT_FIELD)],
        )
        for role, source in sources.items()
    }


def _field_values(source: SplitSource, name: str, per_token: bool = True) -> list:
    """Field ``name`` of every sentence: a list per sentence (``per_token``), else the value."""
    if source.format.is_wsd:
        return _supersenses(source, name)[0]
    if not source.sentences:
        return []
    record = type(source.sentences[0])
    names = [f.name for f in dataclasses.fields(record) if f.name != "tokens"]
    if name not in names:
        raise ElmolabError(
            f"task.field: {source.format.value} sentences ({source.dataset}) have no field"
            f" {name!r}; fields: {', '.join(names)}"
        )
    if not per_token:
        return [getattr(sentence, name) for sentence in source.sentences]
    return [list(getattr(sentence, name)) for sentence in source.sentences]


def _supersenses(source: SplitSource, name: str) -> tuple[list[list[str]], int]:
    """A WSD split's token-task labels: each sense-tagged instance's supersense
    (:func:`~elmolab.data.wsd.instance_supersense`), per sentence; and how many instances have
    gold keys in several lexicographer files. ``name`` must be :data:`SUPERSENSE_FIELD`."""
    if name != SUPERSENSE_FIELD:
        raise ElmolabError(
            f"task.field: {source.format.value} sentences ({source.dataset}) give a token task"
            f" one field, {SUPERSENSE_FIELD!r}, not {name!r}"
        )
    labels, several = [], 0
    for sentence in source.wsd_sentences():
        row = []
        for instance in sentence.instances:
            try:
                label, files = instance_supersense(instance)
            except ValueError as error:
                problem = f"instance {instance.instance_id}: {error}"
                raise ElmolabError(problem, source.path) from None
            row.append(label)
            several += files > 1
        labels.append(row)
    return labels, several
