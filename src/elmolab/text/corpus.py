"""Readers of the raw pretraining corpora: documents of tokenized sentences, streamed.

Every source is read in place (zip members are streamed, never unpacked to disk) and yields
documents in a stable order, each a sequence of sentences, each a list of tokens with no
whitespace inside. The conventions of each source are kept and documented here:

- ``masc``: MASC, one sentence per line, tokens ``word_TAG``; the tag (after the last ``_``) is
  dropped. Tokens without a tag are kept whole.
- ``brown``: Brown, tokens ``word/tag``, one sentence per (tab-indented) line between blank lines;
  the tag (after the last ``/``) is dropped. Brown keeps clitics attached (``Atlanta's``).
- ``raw_text_zip``: plain-text addresses (State of the Union, Inaugural): each line is a paragraph,
  split into sentences and tokens by spaCy's rule-based English tokenizer and sentencizer, which
  need no model download (PTB-like: ``ca n't``, ``U.S.``).
- ``wikitext``: WikiText-2, already tokenized (``<unk>`` for rare words, ``@-@``, ``@,@``, ``@.@``
  for split hyphens and separators, kept as they are). ``= Title =`` lines start a new document
  (an article) and, like all ``= = Section = =`` heading lines, are dropped. A paragraph is split
  into sentences after each ``.``, ``!`` or ``?`` token.

Bytes that are not UTF-8 are replaced by U+FFFD and counted per file (:attr:`replacements`).
"""

from __future__ import annotations

import functools
import io
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path

from elmolab.core.errors import ElmolabError

Sentence = list[str]

_WIKI_HEADING = re.compile(r"^ ?(=( =)*) .* \1 ?$")  # group 1: "=", "= =", "= = =", ...
_SENTENCE_END = frozenset({".", "!", "?"})
_REPLACEMENT = "\ufffd"


class CorpusSource:
    """One raw source: a list of document ids and, per document, its sentences."""

    def __init__(self, name: str, path: str | Path) -> None:
        self.name = name
        self.path = Path(path)
        if not self.path.exists():
            raise ElmolabError(f"source {name!r}: no such file or folder", self.path)
        self.replacements: Counter[str] = Counter()  # U+FFFD substitutions per file

    def documents(self) -> list[str]:
        """The ids of the source's documents, in reading order."""
        raise NotImplementedError

    def iter_documents(self) -> Iterator[tuple[str, Iterator[Sentence]]]:
        """``(doc_id, sentences)`` for every document, in the order of :meth:`documents`.

        ``sentences`` is read lazily from the open source: consume it before the next document.
        """
        raise NotImplementedError

    def _decode(self, raw: bytes, where: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            self.replacements[where] += text.count(_REPLACEMENT) - raw.count(_REPLACEMENT.encode())
            return text


class _ZipSource(CorpusSource):
    """A source whose documents are the members of a zip archive matching ``member_pattern``."""

    member_pattern: re.Pattern[str]

    def _open(self) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as err:
            raise ElmolabError(f"not a readable zip archive ({err})", self.path) from err

    @cached_property
    def _members(self) -> list[str]:
        with self._open() as zf:
            members = sorted(n for n in zf.namelist() if self.member_pattern.search(n))
        if not members:
            raise ElmolabError(
                f"source {self.name!r}: the archive holds no document "
                f"(no member matches {self.member_pattern.pattern!r})",
                self.path,
            )
        return members

    def documents(self) -> list[str]:
        return self._members

    def iter_documents(self) -> Iterator[tuple[str, Iterator[Sentence]]]:
        with self._open() as zf:
            for member in self._members:
                yield member, self._read_member(zf, member)

    def _read_member(self, zf: zipfile.ZipFile, member: str) -> Iterator[Sentence]:
        where = f"{self.path}/{member}"
        try:
            with zf.open(member) as fh:
                for number, raw in enumerate(io.BufferedReader(fh), start=1):
                    yield from self._parse_line(self._decode(raw, where), where, number)
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
            raise ElmolabError(f"corrupt zip member ({err})", where) from err

    def _parse_line(self, line: str, where: str, number: int) -> Iterable[Sentence]:
        raise NotImplementedError


@functools.cache
def _english():  # type: ignore[no-untyped-def]
    """spaCy's rule-based English tokenizer and sentencizer, one for every source: its string
    store grows with the types seen, so sharing it keeps memory bound to the vocabulary."""
    from spacy.lang.en import English

    nlp = English()
    nlp.add_pipe("sentencizer")
    return nlp


def _strip_tag(token: str, sep: str) -> str:
    word, found, _tag = token.rpartition(sep)
    return word if found and word else token


class MascSource(_ZipSource):
    """MASC: ``word_TAG`` tokens, one sentence per line."""

    member_pattern = re.compile(r"^masc_tagged/(spoken|written)/[^/]+\.txt$")

    def _parse_line(self, line: str, where: str, number: int) -> Iterable[Sentence]:
        tokens = [_strip_tag(t, "_") for t in line.split()]
        return [tokens] if tokens else []


class BrownSource(_ZipSource):
    """Brown: ``word/tag`` tokens, one sentence per line; the 500 text files ``c[a-r]NN``."""

    member_pattern = re.compile(r"^brown/c[a-r]\d\d$")

    def _parse_line(self, line: str, where: str, number: int) -> Iterable[Sentence]:
        tokens = [_strip_tag(t, "/") for t in line.split()]
        return [tokens] if tokens else []


class RawTextZipSource(_ZipSource):
    """Plain-text ``*.txt`` members; each line a paragraph, split by spaCy's rules."""

    member_pattern = re.compile(r"\.txt$")

    def _parse_line(self, line: str, where: str, number: int) -> Iterable[Sentence]:
        if not line.strip():
            return []
        sentences = []
        for span in _english()(line.strip()).sents:
            tokens = [piece for tok in span if not tok.is_space for piece in tok.text.split()]
            if tokens:
                sentences.append(tokens)
        return sentences


class WikiTextSource(CorpusSource):
    """WikiText-2 (tokenized): one document per ``= Title =`` article, headings dropped."""

    def _lines(self) -> Iterator[tuple[int, str]]:
        try:
            with self.path.open("rb") as fh:
                for number, raw in enumerate(fh, start=1):
                    yield number, self._decode(raw, str(self.path))
        except OSError as err:
            raise ElmolabError(f"cannot read ({err})", self.path) from err

    @cached_property
    def _titles(self) -> list[tuple[str, int]]:
        titles = []
        for number, line in self._lines():
            match = _WIKI_HEADING.match(line.rstrip("\n"))
            if match and match.group(1) == "=":
                title = line.strip().strip("=").strip()
                titles.append((f"{len(titles):04d}-{title}", number))
        if not titles:
            raise ElmolabError(f"source {self.name!r}: no ' = Title = ' line found", self.path)
        return titles

    def documents(self) -> list[str]:
        return [doc_id for doc_id, _ in self._titles]

    def iter_documents(self) -> Iterator[tuple[str, Iterator[Sentence]]]:
        starts = {line: doc_id for doc_id, line in self._titles}
        current: list[Sentence] = []
        doc_id = None
        for number, line in self._lines():
            if number in starts:
                if doc_id is not None:
                    yield doc_id, iter(current)
                doc_id, current = starts[number], []
            elif doc_id is not None and not _WIKI_HEADING.match(line.rstrip("\n")):
                current.extend(_split_tokenized(line.split()))
        if doc_id is not None:
            yield doc_id, iter(current)


def _split_tokenized(tokens: list[str]) -> Iterator[Sentence]:
    start = 0
    for i, token in enumerate(tokens):
        if token in _SENTENCE_END:
            yield tokens[start : i + 1]
            start = i + 1
    if start < len(tokens):
        yield tokens[start:]


READERS: dict[str, type[CorpusSource]] = {
    "masc": MascSource,
    "brown": BrownSource,
    "raw_text_zip": RawTextZipSource,
    "wikitext": WikiTextSource,
}


def open_source(name: str, reader: str, path: str | Path) -> CorpusSource:
    """The source ``name`` read with ``reader`` (one of :data:`READERS`) from ``path``."""
    if reader not in READERS:
        raise ElmolabError(
            f"source {name!r}: unknown reader {reader!r}; readers: {', '.join(sorted(READERS))}"
        )
    return READERS[reader](name, path)
