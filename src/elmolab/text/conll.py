"""Readers for the column-format probing data: UD CoNLL-U, CoNLL-2000 chunking and WNUT-17 NER.

Every reader returns a list of frozen sentence records whose per-token fields are tuples as long as
``tokens``. Bad input raises :class:`~elmolab.errors.ElmolabError` naming the file, the 1-based
line and what is wrong (``en_ewt-ud-train.conllu:1234: expected 10 tab-separated columns, got 9``).
Files are read as strict UTF-8 (gzip-compressed when the name ends in ``.gz``); a line that is
empty or holds only whitespace ends a sentence, and the last sentence needs no blank line after it.

CoNLL-2000 has no dev split: :func:`carve_dev` carves one from train, deterministically.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TypeVar

from elmolab.errors import ElmolabError

PathArg = str | PathLike[str]

CONLL2000_CHUNK_TYPES = frozenset(
    {"ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR", "UCP", "VP"}
)
WNUT17_ENTITY_TYPES = frozenset(
    {"corporation", "creative-work", "group", "location", "person", "product"}
)


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
    """A WNUT-17 sentence: IOB2 entity tags (``B-person``, ``I-location``, ``O``)."""

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


def _blocks(path: PathArg) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(number of its first line, lines)`` for each run of non-blank lines."""
    block: list[str] = []
    first = 0
    for number, line in enumerate(read_lines(path), start=1):
        if line and not line.isspace():
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


def _check_iob2(tag: str, previous: str, types: frozenset[str], path: PathArg, line: int) -> None:
    """Raise unless ``tag`` is ``O``, ``B-TYPE`` or ``I-TYPE`` continuing a TYPE span."""
    if tag == "O":
        return
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I") or not kind:
        raise ElmolabError(f"tag {tag!r} is not IOB2 (expected O, B-TYPE or I-TYPE)", path, line)
    if kind not in types:
        known = ", ".join(sorted(types))
        raise ElmolabError(f"unknown type {kind!r} in tag {tag!r} (known: {known})", path, line)
    if prefix == "I" and previous not in (f"B-{kind}", f"I-{kind}"):
        raise ElmolabError(
            f"tag {tag!r} follows {previous!r}: IOB2 opens every span with B-{kind}", path, line
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
            _check_iob2(chunk, previous, CONLL2000_CHUNK_TYPES, path, number)
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
    sentences = []
    for first, block in _blocks(path):
        tokens, tags = [], []
        previous = "O"
        for number, line in enumerate(block, start=first):
            columns = line.split("\t")
            if len(columns) != 2:
                raise ElmolabError(
                    f"expected 2 tab-separated columns (token, tag), got {len(columns)}",
                    path,
                    number,
                )
            token, tag = columns
            if not token:
                raise ElmolabError("empty token", path, number)
            _check_iob2(tag, previous, WNUT17_ENTITY_TYPES, path, number)
            previous = tag
            tokens.append(token)
            tags.append(tag)
        sentences.append(NerSentence(tuple(tokens), tuple(tags)))
    if not sentences:
        raise _no_sentences(path)
    return sentences


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
