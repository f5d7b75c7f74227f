"""The labelled datasets the probing tasks read (docs/architecture.md §5).

A **dataset** (config ``extract.datasets.<name>``, :class:`DatasetConfig`) is a reader format and
one source file per split; ``carve_dev`` carves a dev split from train, deterministically, where the
dataset has none (CoNLL-2000). The ``columns`` format reads any file of tokens and span tags in
columns (CoNLL-2003 NER) as its ``columns`` options (:class:`ColumnsConfig`) say, converting the
tags from the data's scheme to IOB2 (keeping the chunks conlleval reads); span F1 counts them as
conlleval does, and test predictions are written back in the data's scheme. The extract stage
and the probe stage read splits through one :class:`DataCatalog` (the datasets and
``extract.max_sentences``), so both see the same sentences in the same order. What a task reads
of them, and its labels, are :mod:`elmolab.data.tasks`' and :mod:`elmolab.data.labels`'.

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
from elmolab.core.schema import AUTO_SCHEME, ColumnsConfig, DatasetConfig, ExtractConfig
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
from elmolab.data.wsd import WordNetSenseIndex, WsdSentence, read_raganato, read_semcor
from elmolab.io.features import check_units, feature_path, read_features, read_units, units_path

RAGANATO_DATA_SUFFIX = ".data.xml"
RAGANATO_GOLD_SUFFIX = ".gold.key.txt"
MULTIWORD_SEPARATOR = re.compile(r"[ _]+")
E = TypeVar("E", bound=StrEnum)


class DatasetFormat(StrEnum):
    """How a dataset's files are read (readers in ``elmolab.data``)."""

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


def parse_choice(enum: type[E], value: str, key: str, also: Sequence[str] = ()) -> E:
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
    fmt = parse_choice(DatasetFormat, config.format, f"extract.datasets.{name}.format")
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
    separator = parse_choice(Separator, options.separator, f"{key}.separator")
    if options.scheme == AUTO_SCHEME:
        scheme = column_scheme(
            config.splits.get("train", path),
            token_column=options.token_column,
            label_column=options.label_column,
            separator=separator,
        )
    else:
        scheme = parse_choice(TagScheme, options.scheme, f"{key}.scheme", also=(AUTO_SCHEME,))
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
    expected = source.units()
    lines = source.token_lines
    path = feature_path(encoder_dir, source.dataset, source.split)
    sidecar = units_path(path, source.format.is_wsd)
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
