"""The probing tasks and the datasets they read (docs/architecture.md §5).

A **dataset** (config ``extract.datasets.<name>``, :class:`DatasetConfig`) is a reader format and
one source file per split; ``carve_dev`` carves a dev split from train, deterministically, where the
dataset has none (CoNLL-2000). The ``columns`` format reads any file of tokens and span tags in
columns (CoNLL-2003 NER) as its ``columns`` options (:class:`ColumnsConfig`) say, converting the
tags from the data's scheme to IOB2 (keeping the chunks conlleval reads); span F1 counts them as
conlleval does, and test predictions are written back in the data's scheme. The extract stage
and the probe stage read splits through one :class:`DataCatalog` (the datasets and
``extract.max_sentences``), so both see the same sentences in the same order.

A **task** (config ``task``, :class:`TaskConfig`) names the ``<dataset>/<split>`` it trains on,
selects on (dev) and tests on, and its kind:

- ``token``: one label per token, the sentence records' field ``field`` (UPOS, XPOS, chunks, NER);
- ``pair``: the label of each word's arc to its gold head (``deprels``), from
  ``[h_dep; h_head; h_dep * h_head]``;
- ``wsd``: 1-nearest-neighbour over SemCor sense centroids, first-sense back-off, F1;
- ``sentence``: one label per sentence, the sentence records' field ``field`` (SST's
  ``sentiment``), from its tokens' features mean-pooled; ``label_map`` renames labels and drops
  the sentences of a label mapped to null (SST-2 from SST-5's five labels).

With ``control_seed`` set, a token task becomes its control task (Hewitt and Liang 2019): each word
type's label is a random tag, fixed per type and drawn from the training tag distribution.

**Feature units.** Token datasets get one feature vector per token, tokens exactly as the reader
gives them. WSD datasets get one vector per sense-tagged instance, and only sentences with at least
one instance are kept. Multiword tokens are written with a space in Raganato's sets (``belong to``)
and joined by ``_`` in SemCor (``New_York``); on both sides the biLM reads them as separate words
(split on spaces and underscores), as it read running text in pretraining, and the instance's
vector is the mean of its words' vectors. :meth:`SplitSource.units` names the units of each
sentence (tokens, or instance ids), which the extract stage writes beside the features and the
probe stage checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import numpy as np

from elmolab.core.errors import ElmolabError
from elmolab.io.features import check_units, feature_path, read_features, read_units, units_path
from elmolab.probing.metrics import ControlTask, LabelVocabulary, TaskMetric
from elmolab.core.schema import (
    AUTO_SCHEME,
    ColumnsConfig,
    DatasetConfig,
    ExtractConfig,
    TaskConfig,
    TaskKind,
)
from elmolab.data.conll import (
    Separator,
    TaggedSentence,
    TagScheme,
    carve_dev,
    column_scheme,
    is_docstart,
    read_columns,
    read_conll2000,
    read_conllu,
    read_lines,
    read_wnut17,
)
from elmolab.data.sst import read_sst
from elmolab.data.wsd import (
    WordNetSenseIndex,
    WsdSentence,
    instance_supersense,
    read_raganato,
    read_semcor,
)

RAGANATO_DATA_SUFFIX = ".data.xml"
RAGANATO_GOLD_SUFFIX = ".gold.key.txt"
MULTIWORD_SEPARATOR = re.compile(r"[ _]+")
SUPERSENSE_FIELD = "supersense"  # the label field of token tasks on WSD datasets
E = TypeVar("E", bound=StrEnum)


class DatasetFormat(StrEnum):
    """How a dataset's files are read (readers in ``elmolab.text``)."""

    CONLLU = "conllu"  # UD: tokens, upos, xpos, heads, deprels
    CONLL2000 = "conll2000"  # tokens, pos, chunks
    WNUT17 = "wnut17"  # tokens, tags
    COLUMNS = "columns"  # tokens, tags (IOB2, from any scheme): CoNLL-2003-style NER
    SEMCOR = "semcor"  # SemCor 3.0 TSV: sense-tagged sentences (WSD training side)
    RAGANATO = "raganato"  # NAME.data.xml beside NAME.gold.key.txt (WSD evaluation)
    SST = "sst"  # Stanford Sentiment Treebank: a bracketed tree a line, the root's label

    @property
    def is_wsd(self) -> bool:
        return self in (DatasetFormat.SEMCOR, DatasetFormat.RAGANATO)


class TaskFamily(StrEnum):
    """What a task probes, the report's grouping of the layer claim (ELMo: layer 1 syntax, layer 2
    semantics)."""

    SYNTACTIC = "syntactic"  # word classes, chunks, dependencies
    SEMANTIC = "semantic"  # word senses, supersenses, named entities, sentiment
    CONTROL = "control"  # a control task (random labels per word type): neither family


# The metric of each tree task (``elmolab.probing.trees``).
TREE_METRICS = {TaskKind.ARC: "uas", TaskKind.STRUCTURAL: "uuas"}
# Tree tasks read the heads, and punctuation (excluded from UUAS) is UD's UPOS tag PUNCT.
TREE_FIELD, PUNCT_FIELD, PUNCT_TAG = "heads", "upos", "PUNCT"


def check_task(task: TaskConfig) -> None:
    """Reject a task's inconsistent settings, naming the key."""
    kind = _parse(TaskKind, task.kind, "task.kind")
    family = _parse(TaskFamily, task.family, f"task.family (conf/tasks/{task.name}.yaml)")
    if (family is TaskFamily.CONTROL) != (task.control_of is not None):
        raise ElmolabError(
            f"task.control_of (conf/tasks/{task.name}.yaml): a control task (family control)"
            " names the task it controls, and no other task names one"
        )
    for key in ("mdl", "conditional"):
        if getattr(task, key) and kind is not TaskKind.TOKEN:
            raise ElmolabError(f"task.{key}: measured for token tasks, not {kind.value}")
    if kind is TaskKind.WSD:
        if task.metric != "f1":
            raise ElmolabError(f"task.metric: wsd is scored by f1, not {task.metric!r}")
        if task.wordnet is None:
            raise ElmolabError("task.wordnet: wsd needs WordNet's index.sense")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: wsd has no control task")
    elif kind.is_tree:
        if task.metric != TREE_METRICS[kind]:
            raise ElmolabError(
                f"task.metric: {kind.value} is scored by {TREE_METRICS[kind]}, not {task.metric!r}"
            )
        if task.field != TREE_FIELD:
            raise ElmolabError(f"task.field: {kind.value} reads {TREE_FIELD!r}")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
    else:
        _parse(TaskMetric, task.metric, "task.metric")
        if task.field is None:
            raise ElmolabError(f"task.field: a {kind.value} task needs the label field")
        if kind is TaskKind.PAIR and task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
    if kind is TaskKind.SENTENCE:
        if task.metric != TaskMetric.ACCURACY:
            raise ElmolabError(f"task.metric: sentence tasks score accuracy, not {task.metric!r}")
        if task.control_seed is not None:
            raise ElmolabError("task.control_seed: control tasks are token tasks")
        if task.label_map is not None and not any(task.label_map.values()):
            raise ElmolabError("task.label_map: every label is dropped (mapped to null)")
    elif task.label_map is not None:
        raise ElmolabError(f"task.label_map: for sentence tasks, not {kind.value}")
    if task.unseen not in ("raise", "keep"):
        raise ElmolabError(f"task.unseen must be 'raise' or 'keep', got {task.unseen!r}")


def _parse(enum: type[E], value: str, key: str, also: Sequence[str] = ()) -> E:
    """``value`` as a member of ``enum``; the error lists ``also`` (values the caller handles
    before it asks) with the members."""
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join([*also, *(member.value for member in enum)])
        raise ElmolabError(f"{key}: {value!r} is not one of {valid}") from None


@dataclass(frozen=True)
class SplitSource:
    """One split of a dataset as its reader gives it.

    ``token_lines[i][j]`` is the 1-based line of token ``j`` of sentence ``i`` in ``path`` (token
    datasets; None for WSD, whose readers name lines themselves). WSD splits keep only the
    sentences with at least one sense-tagged instance. ``scheme`` is the tag scheme of a
    ``columns`` dataset's files, whose tags the sentences hold converted to IOB2; ``counts``, what
    the reader read leniently in the whole file (``read_columns``' IOB1 ``B-`` tags after ``O``),
    which the extract stage records.
    """

    dataset: str
    split: str
    format: DatasetFormat
    path: Path  # the source file (train's for a carved dev)
    sentences: list[TaggedSentence]
    token_lines: list[list[int]] | None
    scheme: TagScheme | None = None
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def units(self) -> list[list[str]]:
        """What each feature vector stands for, per sentence: tokens, or WSD instance ids."""
        if self.format.is_wsd:
            return [[i.instance_id for i in s.instances] for s in self.wsd_sentences()]
        return [list(sentence.tokens) for sentence in self.sentences]

    def wsd_sentences(self) -> list[WsdSentence]:
        assert self.format.is_wsd, f"{self.dataset} is not a WSD dataset"
        return self.sentences  # type: ignore[return-value]


@dataclass(frozen=True)
class DataCatalog:
    """The probing datasets (``extract.datasets``) and how much of each split is used."""

    datasets: Mapping[str, DatasetConfig]
    max_sentences: int | None = None  # the first this-many sentences of each split (None: all)

    def read(
        self, dataset: str, split: str, wordnet: WordNetSenseIndex | None = None
    ) -> SplitSource:
        """Split ``split`` of ``dataset`` (see :func:`read_split`), cut to ``max_sentences``."""
        source = read_split(dataset, self.datasets[dataset], split, wordnet)
        if self.max_sentences is None or len(source.sentences) <= self.max_sentences:
            return source
        n = self.max_sentences
        lines = None if source.token_lines is None else source.token_lines[:n]
        return dataclasses.replace(source, sentences=source.sentences[:n], token_lines=lines)

    def sources(self) -> list[SplitSource]:
        """Every split of every dataset."""
        return [
            self.read(name, split)
            for name, config in self.datasets.items()
            for split in dataset_splits(config)
        ]


def data_catalog(extract: ExtractConfig) -> DataCatalog:
    """The datasets of ``extract`` as the probe stage must read them to match its features."""
    return DataCatalog(extract.datasets, extract.max_sentences)


def dataset_splits(config: DatasetConfig) -> list[str]:
    """The dataset's split names, ``dev`` included when it is carved from train."""
    names = list(config.splits)
    if config.carve_dev is not None and "dev" not in names:
        names.append("dev")
    return names


def dataset_digest(name: str, config: DatasetConfig) -> str:
    """SHA-256 of what a dataset's features and labels come from: its configuration and every
    file under its root (names and contents), which must hold every split (DVC's extract stage
    tracks the root). Stored in each feature file it yields, so that a probe cell tracking the
    feature files sees a changed label or setting even where the features come out the same."""
    root = Path(config.root)
    if not root.is_dir():
        raise ElmolabError(f"no such folder (extract.datasets.{name}.root)", root)
    for split, path in config.splits.items():
        if not Path(path).resolve().is_relative_to(root.resolve()):
            raise ElmolabError(
                f"extract.datasets.{name}.splits.{split}: {path} is not under the dataset's root"
                f" {root} (its extract stage tracks the root: keep every file of the dataset in it)"
            )
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def read_split(
    name: str,
    config: DatasetConfig,
    split: str,
    wordnet: WordNetSenseIndex | None = None,
) -> SplitSource:
    """Read split ``split`` of dataset ``name``; ``wordnet`` checks WSD sense keys against it."""
    fmt = _parse(DatasetFormat, config.format, f"extract.datasets.{name}.format")
    if config.columns is not None and fmt is not DatasetFormat.COLUMNS:
        raise ElmolabError(
            f"extract.datasets.{name}.columns: only format columns takes column options,"
            f" not {fmt.value}"
        )
    carve = config.carve_dev if split in ("train", "dev") else None
    if carve is not None and "dev" in config.splits:
        raise ElmolabError(f"extract.datasets.{name}: carve_dev is set but a dev split is given")
    source = "train" if carve is not None else split
    if source not in config.splits:
        raise ElmolabError(
            f"dataset {name!r} has no split {split!r} (splits: {', '.join(dataset_splits(config))})"
        )
    path = Path(config.splits[source])
    if fmt.is_wsd:
        sentences: list[TaggedSentence] = [s for s in _read_wsd(fmt, path, wordnet) if s.instances]
        return SplitSource(name, split, fmt, path, sentences, None)
    counts: Counter[str] = Counter()
    sentences, scheme = _read_tagged(name, config, fmt, path, counts)
    lines = _token_lines(fmt, path, sentences)
    if carve is not None:
        train, dev = carve_dev(sentences, carve.fraction, carve.seed)
        line_of = {id(s): s_lines for s, s_lines in zip(sentences, lines, strict=True)}
        sentences = train if split == "train" else dev
        lines = [line_of[id(s)] for s in sentences]
    return SplitSource(name, split, fmt, path, sentences, lines, scheme, dict(counts))


def _read_tagged(
    name: str, config: DatasetConfig, fmt: DatasetFormat, path: Path, counts: Counter[str]
) -> tuple[list[TaggedSentence], TagScheme | None]:
    """The sentences of a token dataset's file, and the tag scheme of a columns dataset's files
    (whose reader adds to ``counts``)."""
    if fmt is DatasetFormat.COLUMNS:
        return _read_columns(name, config, path, counts)
    readers = {
        DatasetFormat.CONLLU: read_conllu,
        DatasetFormat.CONLL2000: read_conll2000,
        DatasetFormat.WNUT17: read_wnut17,
        DatasetFormat.SST: read_sst,
    }
    return list(readers[fmt](path)), None


def _read_columns(
    name: str, config: DatasetConfig, path: Path, counts: Counter[str]
) -> tuple[list[TaggedSentence], TagScheme]:
    """A columns dataset's file read with its options, and its tag scheme.

    ``scheme: auto`` takes the scheme :func:`~elmolab.data.conll.detect_scheme` finds in the
    dataset's train split (in ``path`` itself when the dataset has none), so every split of the
    dataset is checked against, and converted from, the same scheme.
    """
    options = config.columns or ColumnsConfig()
    key = f"extract.datasets.{name}.columns"
    separator = _parse(Separator, options.separator, f"{key}.separator")
    if options.scheme == AUTO_SCHEME:
        scheme = column_scheme(
            config.splits.get("train", path),
            token_column=options.token_column,
            label_column=options.label_column,
            separator=separator,
        )
    else:
        scheme = _parse(TagScheme, options.scheme, f"{key}.scheme", also=(AUTO_SCHEME,))
    sentences = read_columns(
        path,
        scheme,
        token_column=options.token_column,
        label_column=options.label_column,
        separator=separator,
        counts=counts,
    )
    return list(sentences), scheme


def _read_wsd(
    fmt: DatasetFormat, path: Path, wordnet: WordNetSenseIndex | None
) -> list[WsdSentence]:
    if fmt is DatasetFormat.SEMCOR:
        return read_semcor(path, wordnet)
    if not path.name.endswith(RAGANATO_DATA_SUFFIX):
        raise ElmolabError(f"a Raganato split is a NAME{RAGANATO_DATA_SUFFIX} file", path)
    gold = path.with_name(path.name.removesuffix(RAGANATO_DATA_SUFFIX) + RAGANATO_GOLD_SUFFIX)
    return read_raganato(path, gold, wordnet)


def read_split_features(encoder_dir: Path, source: SplitSource) -> list[np.ndarray]:
    """The features of ``source`` extracted into ``encoder_dir`` (the extract stage's folder of
    one encoder): one array ``(n_layers + 1, n_units, dim)`` per sentence, in the stored dtype.

    The sidecar must hold exactly the units of the data, and the feature file one line per
    sentence with one vector per unit; every mismatch is an ElmolabError naming the file and line.
    """
    path = feature_path(encoder_dir, source.dataset, source.split)
    sidecar = units_path(path, source.format.is_wsd)
    expected = source.units()
    lines = source.token_lines
    check_units(
        read_units(sidecar),
        expected,
        sidecar,
        what="instances" if source.format.is_wsd else "tokens",
        data=f"{source.dataset}/{source.split} ({source.path})",
        first_lines=None if lines is None else [sentence[0] for sentence in lines],
    )
    return read_features(path, [len(units) for units in expected])


def _token_lines(
    fmt: DatasetFormat, path: Path, sentences: Sequence[TaggedSentence]
) -> list[list[int]]:
    """The line of every token: the token lines of each blank-line-separated block, without
    CoNLL-U comments, multiword-token ranges and empty nodes (the words the reader keeps); a
    ``-DOCSTART-`` line separates the blocks of a columns file as a blank line does. An SST
    sentence is one line, every token of it on that line."""
    if fmt is DatasetFormat.SST:
        numbers = [n for n, line in enumerate(read_lines(path), start=1) if line.strip()]
        return [[n] * len(s) for n, s in zip(numbers, sentences, strict=True)]
    blocks: list[list[int]] = []
    block: list[int] = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line or line.isspace() or (fmt is DatasetFormat.COLUMNS and is_docstart(line)):
            if block:
                blocks.append(block)
            block = []
            continue
        if fmt is DatasetFormat.CONLLU:
            word_id = line.partition("\t")[0]
            if line.startswith("#") or "-" in word_id or "." in word_id:
                continue
        block.append(number)
    if block:
        blocks.append(block)
    counts = [len(b) for b in blocks], [len(s) for s in sentences]
    assert counts[0] == counts[1], f"{path}: token lines do not match the reader's sentences"
    return blocks


def multiword_parts(token: str) -> list[str]:
    """The words the biLM reads for a WSD token: split on spaces and underscores."""
    return [part for part in MULTIWORD_SEPARATOR.split(token) if part] or [token]


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
