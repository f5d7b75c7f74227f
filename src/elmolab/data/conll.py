"""Readers for the column-format probing data: UD CoNLL-U, CoNLL-2000 chunking, WNUT-17 NER, and
any file of tokens and span tags in columns (CoNLL-2003 NER style, :func:`read_columns`).

Every reader returns a list of frozen sentence records whose per-token fields are tuples as long as
``tokens``. Bad input raises :class:`~elmolab.core.errors.ElmolabError` naming the file, the 1-based
line and what is wrong (``en_ewt-ud-train.conllu:1234: expected 10 tab-separated columns, got 9``).
Files are read as strict UTF-8 (gzip-compressed when the name ends in ``.gz``); a line that is
empty or holds only whitespace ends a sentence, and the last sentence needs no blank line after it.

**Span tags.** A span of type X is tagged in one of the schemes of :class:`TagScheme` (IO, IOB1,
IOB2, BIOES); the records always hold IOB2, the one scheme the probes train on. A column file's
tags are checked against its scheme, given or found by :func:`detect_scheme`, and converted;
:func:`spans_to_tags` writes spans back in any scheme (span F1 scores in the data's scheme).

CoNLL-2000 has no dev split: :func:`carve_dev` carves one from train, deterministically.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from os import PathLike
from typing import TypeVar

from elmolab.core.errors import ElmolabError

PathArg = str | PathLike[str]

CONLL2000_CHUNK_TYPES = frozenset(
    {"ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR", "UCP", "VP"}
)
WNUT17_ENTITY_TYPES = frozenset(
    {"corporation", "creative-work", "group", "location", "person", "product"}
)
# A line whose first field is this separates documents (CoNLL-2003: ``-DOCSTART- -X- -X- O``).
DOCSTART = "-DOCSTART-"
Span = tuple[int, int, str]  # tokens [start, end) of a sentence, and the span's type
# read_columns' count of IOB1 B- tags that open a span where I- would (conlleval reads them so).
LOOSE_BEGINS = "B- tags after O or another type"


class TagScheme(StrEnum):
    """How the tags of a sentence mark its spans; ``O`` is outside every span, X a span type."""

    IO = "IO"  # I-X on every token of a span: two adjacent spans of one type read as one
    IOB1 = "IOB1"  # I-X on every token; B-X opens a span right after another X span
    IOB2 = "IOB2"  # B-X opens every span and I-X continues it (the records' scheme)
    BIOES = "BIOES"  # B-X opens, I-X continues and E-X ends a span; S-X is a one-token span


# The prefixes of each scheme's tags.
_SCHEME_PREFIXES = {
    TagScheme.IO: ("I",),
    TagScheme.IOB1: ("I", "B"),
    TagScheme.IOB2: ("B", "I"),
    TagScheme.BIOES: ("B", "I", "E", "S"),
}


class Separator(StrEnum):
    """How the fields of a line of a column file are separated."""

    WHITESPACE = "whitespace"  # any run of spaces and tabs (CoNLL-2000, CoNLL-2003)
    TAB = "tab"  # each single tab: fields may hold spaces, and an empty token is an error


@dataclass(frozen=True, slots=True)
class TaggedSentence:
    """One sentence: its tokens; subclasses add per-token tuples of the same length."""

    tokens: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class UDSentence(TaggedSentence):
    """A CoNLL-U sentence: syntactic words only (multiword-token ranges and empty nodes dropped).

    ``heads[i]`` is the 1-based position of word ``i``'s head as written in the file, 0 for the
    root; ``sent_id`` comes from the ``# sent_id = ...`` comment when there is one.
    """

    upos: tuple[str, ...]
    xpos: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    sent_id: str | None = None


@dataclass(frozen=True, slots=True)
class ChunkSentence(TaggedSentence):
    """A CoNLL-2000 sentence: PTB part-of-speech tags and IOB2 chunk tags (``B-NP``, ``O``)."""

    pos: tuple[str, ...]
    chunks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NerSentence(TaggedSentence):
    """A sentence of span tags in IOB2 (``B-person``, ``I-location``, ``O``): WNUT-17's, or a
    column file's converted from its scheme."""

    tags: tuple[str, ...]


def _read_bytes(path: PathArg) -> bytes:
    """The file's bytes, gunzipped when the name ends in ``.gz``.

    Truncated or corrupt gzip data is reported at the line where the good data ends.
    """
    try:
        with open(path, "rb") as file:
            if not str(path).endswith(".gz"):
                return file.read()
            parts: list[bytes] = []
            with gzip.GzipFile(fileobj=file) as unzipped:
                try:
                    # read1 returns what one raw read yields, so little good data is lost to the
                    # error and the line number stays close to the damage
                    while chunk := unzipped.read1(1 << 16):
                        parts.append(chunk)
                except (EOFError, gzip.BadGzipFile, zlib.error) as error:
                    line = sum(part.count(b"\n") for part in parts) + 1
                    raise ElmolabError(
                        f"truncated or corrupt gzip data ({error})", path, line
                    ) from None
            return b"".join(parts)
    except OSError as error:
        raise ElmolabError(f"cannot read: {error.strerror or error}", path) from error


def read_lines(path: PathArg) -> list[str]:
    """The lines of a UTF-8 text file without their line ends: line ``i + 1`` is element ``i``.

    A name ending in ``.gz`` is decompressed first. Undecodable bytes, a truncated or corrupt
    gzip stream and an unreadable file raise ElmolabError. Only ``\\n`` (and a ``\\r`` before
    it) ends a line: tokens may contain other Unicode line separators.
    """
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        column = error.start - data.rfind(b"\n", 0, error.start)
        raise ElmolabError(
            f"not valid UTF-8: byte {data[error.start]:#04x} at column {column}",
            path,
            data.count(b"\n", 0, error.start) + 1,
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    return lines


def is_docstart(line: str) -> bool:
    """Whether a non-blank line is a document separator: its first field is :data:`DOCSTART`."""
    return line.split(maxsplit=1)[0] == DOCSTART


def _blocks(path: PathArg, docstart: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(number of its first line, lines)`` for each run of non-blank lines.

    With ``docstart``, a ``-DOCSTART-`` line (:func:`is_docstart`) separates runs as a blank line
    does, so it starts no sentence of its own however many blank lines surround it.
    """
    block: list[str] = []
    first = 0
    for number, line in enumerate(read_lines(path), start=1):
        if line and not line.isspace() and not (docstart and is_docstart(line)):
            if not block:
                first = number
            block.append(line)
        elif block:
            yield first, block
            block = []
    if block:
        yield first, block


def _no_sentences(path: PathArg) -> ElmolabError:
    return ElmolabError("no sentences: the file is empty or blank", path)


def _check_tag(
    tag: str,
    previous: str,
    scheme: TagScheme,
    path: PathArg,
    line: int,
    types: frozenset[str] | None = None,
) -> str:
    """Raise unless ``tag`` may follow ``previous`` (``O`` at a sentence start) in ``scheme``;
    return ``tag`` in IOB2. ``types`` are the span types allowed (None: any).

    IOB2 and BIOES open every span explicitly (an ``I-X`` or ``E-X`` must continue an X span),
    and BIOES closes every span it opens. IOB1 is read as conlleval reads it: ``B-X`` always
    opens a span, even where IOB1 has no need of one (after ``O`` or another type; see
    :func:`loose_begin`), and ``I-X`` opens one unless it continues an X span.
    """
    prefix, dash, kind = tag.partition("-")
    if tag != "O" and (prefix not in _SCHEME_PREFIXES[scheme] or not dash or not kind):
        forms = ["O", *(f"{allowed}-TYPE" for allowed in _SCHEME_PREFIXES[scheme])]
        expected = ", ".join(forms[:-1]) + " or " + forms[-1]
        raise ElmolabError(f"tag {tag!r} is not {scheme} (expected {expected})", path, line)
    if tag == "O" or prefix in ("B", "S"):
        _check_closed(previous, scheme, path, line, f"tag {tag!r} follows")
    if tag == "O":
        return tag
    if types is not None and kind not in types:
        known = ", ".join(sorted(types))
        raise ElmolabError(f"unknown type {kind!r} in tag {tag!r} (known: {known})", path, line)
    inside = previous in (f"B-{kind}", f"I-{kind}")  # ``previous`` leaves an X span open
    if prefix in ("I", "E") and scheme in (TagScheme.IOB2, TagScheme.BIOES) and not inside:
        single = f" or S-{kind}" if scheme is TagScheme.BIOES else ""
        raise ElmolabError(
            f"tag {tag!r} follows {previous!r}: {scheme} opens every span with B-{kind}{single}",
            path,
            line,
        )
    return f"{'B' if prefix in ('B', 'S') or not inside else 'I'}-{kind}"


def loose_begin(tag: str, previous: str) -> bool:
    """Whether ``tag`` is a ``B-X`` that IOB1 does not need: one after ``previous`` ``O``, the
    sentence start (``O``) or a tag of another type, where ``I-X`` would open the span as well.

    The CoNLL-2003 release has two (``eng.train`` line 152428: ``Atlanta NNP I-NP B-MISC`` after
    ``the DT I-NP O``); conlleval opens a span at them, and so does :func:`read_columns`.
    """
    prefix, dash, kind = tag.partition("-")
    return prefix == "B" and bool(dash) and previous not in (f"B-{kind}", f"I-{kind}")


def _check_closed(previous: str, scheme: TagScheme, path: PathArg, line: int, what: str) -> None:
    """Raise if ``previous`` leaves a BIOES span open where ``what`` (a new span, ``O``, the
    sentence end) follows it."""
    if scheme is TagScheme.BIOES and previous[:2] in ("B-", "I-"):
        kind = previous[2:]
        raise ElmolabError(
            f"{what} {previous!r}: BIOES ends every span with E-{kind} (S-{kind} for one token)",
            path,
            line,
        )


def read_conllu(path: PathArg) -> list[UDSentence]:
    """Read a CoNLL-U file (Universal Dependencies) into one :class:`UDSentence` per sentence.

    Format: ``#`` comment lines, then one line per word with 10 tab-separated columns
    ``ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC``, a blank line after each sentence.
    Lines whose ID is a range (``3-4``, a multiword token) or decimal (``5.1``, an empty node) are
    skipped. Checks: the column count, word IDs ``1..n`` in order, HEAD an integer in ``0..n``.
    """
    sentences = []
    for first, block in _blocks(path):
        sent_id = None
        rows: list[list[str]] = []
        numbers: list[int] = []
        for number, line in enumerate(block, start=first):
            if line[0] == "#":
                if rows:
                    raise ElmolabError("comment line inside a sentence", path, number)
                key, _, value = line[1:].partition("=")
                if key.strip() == "sent_id":
                    sent_id = value.strip()
                continue
            columns = line.split("\t")
            if len(columns) != 10:
                raise ElmolabError(
                    f"expected 10 tab-separated columns, got {len(columns)}", path, number
                )
            if "-" not in columns[0] and "." not in columns[0]:
                rows.append(columns)
                numbers.append(number)
        if not rows:
            raise ElmolabError("sentence has no words", path, first + len(block) - 1)
        ids, tokens, _, upos, xpos, _, head_texts, deprels, _, _ = zip(*rows, strict=True)
        sentences.append(
            UDSentence(tokens, upos, xpos, _heads(ids, head_texts, numbers, path), deprels, sent_id)
        )
    if not sentences:
        raise _no_sentences(path)
    return sentences


def _heads(
    ids: tuple[str, ...], head_texts: tuple[str, ...], numbers: list[int], path: PathArg
) -> tuple[int, ...]:
    """Check word IDs ``1..n`` and HEADs in ``0..n``; return the heads as integers.

    The checks run over whole columns at C speed; only a failing sentence is walked word by word
    to find the line to report.
    """
    n = len(ids)
    expected = tuple(map(str, range(1, n + 1)))
    if ids != expected:
        word_id, want, number = next(
            item for item in zip(ids, expected, numbers, strict=True) if item[0] != item[1]
        )
        raise ElmolabError(f"expected word ID {want}, got {word_id!r}", path, number)
    try:
        heads = tuple(map(int, head_texts))
    except ValueError:
        text, number = next(
            item for item in zip(head_texts, numbers, strict=True) if not _is_integer(item[0])
        )
        raise ElmolabError(f"HEAD {text!r} is not an integer", path, number) from None
    if min(heads) < 0 or max(heads) > n:
        head, number = next(
            item for item in zip(heads, numbers, strict=True) if not 0 <= item[0] <= n
        )
        raise ElmolabError(f"HEAD {head} outside 0..{n} (the sentence has {n} words)", path, number)
    return heads


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def read_conll2000(path: PathArg) -> list[ChunkSentence]:
    """Read CoNLL-2000 chunking data into one :class:`ChunkSentence` per sentence.

    Format: one ``word POS chunk`` line per token (space-separated), a blank line after each
    sentence; chunk tags are IOB2 over :data:`CONLL2000_CHUNK_TYPES`, and an ``I-X`` must continue
    a ``B-X``/``I-X``.
    """
    sentences = []
    for first, block in _blocks(path):
        tokens, pos, chunks = [], [], []
        previous = "O"
        for number, line in enumerate(block, start=first):
            columns = line.split()
            if len(columns) != 3:
                raise ElmolabError(
                    f"expected 3 space-separated columns (word POS chunk), got {len(columns)}",
                    path,
                    number,
                )
            word, tag, chunk = columns
            _check_tag(chunk, previous, TagScheme.IOB2, path, number, CONLL2000_CHUNK_TYPES)
            previous = chunk
            tokens.append(word)
            pos.append(tag)
            chunks.append(chunk)
        sentences.append(ChunkSentence(tuple(tokens), tuple(pos), tuple(chunks)))
    if not sentences:
        raise _no_sentences(path)
    return sentences


def read_wnut17(path: PathArg) -> list[NerSentence]:
    """Read WNUT-17 emerging-entity data into one :class:`NerSentence` per sentence.

    Format: one ``token<TAB>tag`` line per token, a blank line after each sentence (the train file
    also separates sentences with lines holding a lone tab). Tags are IOB2 over
    :data:`WNUT17_ENTITY_TYPES`. The test gold file is ``emerging.test.annotated``.
    """
    return read_columns(
        path,
        TagScheme.IOB2,
        token_column=0,
        label_column=1,
        separator=Separator.TAB,
        names=("token", "tag"),
        types=WNUT17_ENTITY_TYPES,
    )


def read_columns(
    path: PathArg,
    scheme: TagScheme,
    *,
    token_column: int = 0,
    label_column: int = -1,
    separator: Separator = Separator.WHITESPACE,
    names: tuple[str, ...] | None = None,
    types: frozenset[str] | None = None,
    counts: Counter[str] | None = None,
) -> list[NerSentence]:
    """Read a column file of tokens and span tags into one :class:`NerSentence` per sentence.

    Format (CoNLL-2003 NER: ``EU NNP I-NP I-ORG``): one line per token, its fields split by
    ``separator``; the token and the tag are the fields at ``token_column`` and ``label_column``
    (Python indices: -1 is the last), and every line has as many fields as the first (given
    ``names``, one per field: exactly that many). A blank line ends a sentence, and so does a
    ``-DOCSTART-`` line, which is skipped. The tags are checked against ``scheme`` (and, given,
    the span ``types``) and converted to IOB2, keeping the spans conlleval reads.

    ``counts``, given, gains :data:`LOOSE_BEGINS`: the IOB1 ``B-`` tags read where IOB1 has no
    need of one (:func:`loose_begin`), each opening a span as conlleval opens one.
    """
    sentences = []
    loose = 0
    for numbers, tokens, tags in _column_sentences(
        path, token_column, label_column, separator, names
    ):
        iob2 = []
        previous = "O"
        for tag, number in zip(tags, numbers, strict=True):
            iob2.append(_check_tag(tag, previous, scheme, path, number, types))
            loose += scheme is TagScheme.IOB1 and loose_begin(tag, previous)
            previous = tag
        _check_closed(previous, scheme, path, numbers[-1], "the sentence ends after")
        sentences.append(NerSentence(tuple(tokens), tuple(iob2)))
    if not sentences:
        raise _no_sentences(path)
    if counts is not None and scheme is TagScheme.IOB1:
        counts[LOOSE_BEGINS] += loose
    return sentences


def column_scheme(
    path: PathArg,
    *,
    token_column: int = 0,
    label_column: int = -1,
    separator: Separator = Separator.WHITESPACE,
) -> TagScheme:
    """The tag scheme of a column file (:func:`detect_scheme` over its tags)."""
    sentences = _column_sentences(path, token_column, label_column, separator)
    return detect_scheme(tags for _, _, tags in sentences)


def _column_sentences(
    path: PathArg,
    token_column: int,
    label_column: int,
    separator: Separator,
    names: tuple[str, ...] | None = None,
) -> Iterator[tuple[list[int], list[str], list[str]]]:
    """Yield ``(line numbers, tokens, tags)`` for each sentence of a column file (see
    :func:`read_columns`), checking the field counts; the tags are left as written."""
    split_on = None if separator is Separator.WHITESPACE else "\t"
    width = width_line = 0  # the field count of every line, set by the first one
    for first, block in _blocks(path, docstart=True):
        numbers, tokens, tags = [], [], []
        for number, line in enumerate(block, start=first):
            fields = line.split(split_on)
            if names is not None and len(fields) != len(names):
                raise ElmolabError(
                    f"expected {len(names)} {separator}-separated columns"
                    f" ({', '.join(names)}), got {len(fields)}",
                    path,
                    number,
                )
            if not width:
                width, width_line = len(fields), number
                _check_columns(width, token_column, label_column, separator, path, number)
            elif len(fields) != width:
                raise ElmolabError(
                    f"expected {width} {separator}-separated columns as on line {width_line},"
                    f" got {len(fields)}",
                    path,
                    number,
                )
            token = fields[token_column]
            if not token:
                raise ElmolabError("empty token", path, number)
            numbers.append(number)
            tokens.append(token)
            tags.append(fields[label_column])
        yield numbers, tokens, tags


def _check_columns(
    width: int,
    token_column: int,
    label_column: int,
    separator: Separator,
    path: PathArg,
    line: int,
) -> None:
    """Raise unless both column indices fit lines of ``width`` fields and differ."""
    for key, index in (("token_column", token_column), ("label_column", label_column)):
        if not -width <= index < width:
            raise ElmolabError(
                f"{key} {index} is past the end of the line ({width} {separator}-separated"
                " columns)",
                path,
                line,
            )
    if token_column % width == label_column % width:
        raise ElmolabError(
            f"token_column {token_column} and label_column {label_column} are the same column"
            f" of {width}",
            path,
            line,
        )


def detect_scheme(sentences: Iterable[Sequence[str]]) -> TagScheme:
    """The tag scheme of the tag sequences ``sentences``, from the tags that open spans.

    A tag opens a span when it is first in its sentence or follows ``O`` or a tag of another
    type. The first rule that holds decides:

    1. an ``E-`` or ``S-`` tag anywhere: BIOES;
    2. more spans opened by ``I-X`` than by ``B-X``: IOB1 if any ``B-`` tag occurs (IOB1's
       ``B-X`` separates two adjacent X spans), else IO;
    3. any ``B-`` tag: IOB2;
    4. no tag but ``O`` (and malformed ones): IO.

    A majority, not any one tag, decides rule 2, so that a stray tag does not flip the scheme:
    the CoNLL-2003 release (IOB1) opens two of its 23,499 training spans with ``B-``, and IOB2
    data with a stray ``I-X`` after ``O`` stays IOB2, whose check then reports that tag's line.
    IOB1 data that never has two adjacent spans of one type has no ``B-`` tag and is IO; both
    read the same spans from it. Malformed tags are left to the check against the scheme.
    """
    opened_by = Counter[str]()  # prefix (B, I) -> spans it opens
    begins = False
    for tags in sentences:
        previous = "O"
        for tag in tags:
            prefix, dash, kind = tag.partition("-")
            if dash and kind:
                if prefix in ("E", "S"):
                    return TagScheme.BIOES
                begins = begins or prefix == "B"
                if previous not in (f"B-{kind}", f"I-{kind}"):
                    opened_by[prefix] += 1
            previous = tag
    if opened_by["I"] > opened_by["B"]:
        return TagScheme.IOB1 if begins else TagScheme.IO
    return TagScheme.IOB2 if begins else TagScheme.IO


def spans_to_tags(spans: Iterable[Span], length: int, scheme: TagScheme) -> list[str]:
    """The ``length`` tags that write ``spans`` (disjoint, in order) in ``scheme``.

    IO cannot separate two adjacent spans of one type: they come out as one.
    """
    tags = ["O"] * length
    previous_end = (-1, "")  # where the last span ended, and its type
    for start, end, kind in spans:
        tags[start:end] = [f"I-{kind}"] * (end - start)
        if scheme is TagScheme.BIOES:
            if end - start == 1:
                tags[start] = f"S-{kind}"
            else:
                tags[start], tags[end - 1] = f"B-{kind}", f"E-{kind}"
        elif scheme is TagScheme.IOB2 or (
            scheme is TagScheme.IOB1 and previous_end == (start, kind)
        ):
            tags[start] = f"B-{kind}"
        previous_end = (end, kind)
    return tags


SentenceT = TypeVar("SentenceT", bound=TaggedSentence)


def _unit_interval_hash(tokens: Sequence[str], seed: int) -> float:
    """A stable pseudo-random number in [0, 1) from the seed and the sentence's tokens."""
    text = f"{seed}\x1e" + "\x1f".join(tokens)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def carve_dev(
    sentences: Sequence[SentenceT], fraction: float = 0.1, seed: int = 0
) -> tuple[list[SentenceT], list[SentenceT]]:
    """Split ``sentences`` into ``(train, dev)``, about ``fraction`` of them going to dev.

    A sentence goes to dev when a BLAKE2 hash of ``seed`` and its tokens, read as a number in
    [0, 1), falls below ``fraction``. The split is therefore the same in every run and process
    (no ``hash()`` randomisation), a sentence's side does not depend on the others, identical
    sentences always land on the same side (no train/dev leakage through duplicates), and both
    parts keep the input order. The dev size is ``fraction`` of the input up to sampling noise.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    train, dev = [], []
    for sentence in sentences:
        side = dev if _unit_interval_hash(sentence.tokens, seed) < fraction else train
        side.append(sentence)
    return train, dev
