"""Readers for word sense disambiguation data, all with WordNet 3.0 sense keys.

- Raganato et al. (2017) evaluation sets: ``NAME.data.xml`` with ``NAME.gold.key.txt``.
- SemCor 3.0 as distributed in TSV (``semcor30.tsv.gz``), the 1-nearest-neighbour training side.
- WordNet 3.0's ``index.sense``: sense numbers, and the first (most frequent) sense of a lemma,
  the usual back-off.

A sense key reads ``lemma%ss_type:lex_filenum:lex_id:head_word:head_id``, e.g.
``peculiar%5:00:00:strange:00``; the lemma is lowercase with ``_`` between words. ``ss_type`` is
1 noun, 2 verb, 3 adjective, 4 adverb, 5 adjective satellite; here it maps to the Raganato part of
speech NOUN, VERB, ADJ (3 and 5) or ADV.

Bad input raises :class:`~elmolab.core.errors.ElmolabError` naming the file, the 1-based line and
what is wrong. A sense key missing from WordNet is an error too, not skipped (every key in the
shipped SemCor and Raganato files is in WordNet 3.0): pass ``wordnet=`` to a reader to check.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple
from xml.parsers import expat

from elmolab.core.errors import ElmolabError
from elmolab.data.conll import PathArg, TaggedSentence, read_lines

WORDNET_POS = ("NOUN", "VERB", "ADJ", "ADV")
SS_TYPE_POS = {"1": "NOUN", "2": "VERB", "3": "ADJ", "4": "ADV", "5": "ADJ"}


@dataclass(frozen=True, slots=True)
class SenseInstance:
    """A sense-annotated token: its 0-based ``position`` in the sentence and its gold sense keys.

    ``lemma`` and ``pos`` (NOUN, VERB, ADJ or ADV) are the ones WordNet files the senses under.
    Several keys mean each of them is correct.
    """

    position: int
    instance_id: str
    lemma: str
    pos: str
    sense_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WsdSentence(TaggedSentence):
    """A sentence with its sense-annotated tokens (``instances``, in token order)."""

    sentence_id: str
    instances: tuple[SenseInstance, ...]


def sense_key_lemma_pos(key: str) -> tuple[str, str]:
    """The lemma and part of speech (NOUN, VERB, ADJ, ADV) a sense key encodes.

    Raises ValueError for a string that is not a sense key.
    """
    lemma, percent, rest = key.partition("%")
    fields = rest.split(":")
    if not lemma or not percent or len(fields) != 5 or fields[0] not in SS_TYPE_POS:
        raise ValueError(
            f"malformed sense key {key!r} (expected lemma%ss_type:lex_filenum:lex_id:head_word:"
            "head_id with ss_type 1-5)"
        )
    return lemma, SS_TYPE_POS[fields[0]]


class WordNetSenseIndex:
    """WordNet's sense index: each key's sense number, and each lemma's senses in that order.

    Sense numbers count per lemma and part of speech from 1, the most frequent sense (by tag
    counts in semantically tagged text): the first-sense back-off of WSD. Adjectives and
    adjective satellites are numbered together, under ADJ. Lemmas are given as in sense keys
    (lowercase, ``_`` between words).
    """

    def __init__(
        self,
        path: PathArg,
        sense_numbers: Mapping[str, int],
        senses: Mapping[tuple[str, str], tuple[str, ...]],
    ) -> None:
        """Wrap the index read from ``path`` (use :func:`read_wordnet_sense_index`).

        ``sense_numbers`` maps each sense key to its number; ``senses`` maps ``(lemma, pos)``
        to its sense keys in sense-number order.
        """
        self.path = str(path)
        self._sense_numbers = sense_numbers
        self._senses = senses

    def __len__(self) -> int:
        return len(self._sense_numbers)

    def __contains__(self, key: object) -> bool:
        return key in self._sense_numbers

    def __repr__(self) -> str:
        return f"WordNetSenseIndex({self.path!r}, {len(self)} sense keys)"

    def sense_number(self, key: str) -> int:
        """The sense number of ``key`` (1 = most frequent); KeyError if WordNet lacks it."""
        return self._sense_numbers[key]

    def senses(self, lemma: str, pos: str) -> tuple[str, ...]:
        """The sense keys of ``lemma`` as ``pos``, by sense number; empty if WordNet has none."""
        if pos not in WORDNET_POS:
            raise ValueError(f"pos must be one of {', '.join(WORDNET_POS)}, got {pos!r}")
        return self._senses.get((lemma, pos), ())

    def first_sense(self, lemma: str, pos: str) -> str | None:
        """The sense key numbered 1 for ``lemma`` as ``pos``, or None if WordNet has none."""
        senses = self.senses(lemma, pos)
        if senses and self._sense_numbers[senses[0]] == 1:
            return senses[0]
        return None


def read_wordnet_sense_index(path: PathArg) -> WordNetSenseIndex:
    """Read WordNet's ``index.sense``: one ``sense_key offset sense_number tag_cnt`` line per key.

    Checks: four space-separated fields, a well-formed and unique sense key, a sense number >= 1.
    """
    sense_numbers: dict[str, int] = {}
    by_lemma: defaultdict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split(" ")
        if len(fields) != 4:
            raise ElmolabError(
                f"expected 4 space-separated fields (sense_key offset sense_number tag_cnt), "
                f"got {len(fields)}",
                path,
                number,
            )
        key, _, sense_text, _ = fields
        lemma_pos = _check_sense_key(key, None, path, number)
        if not sense_text.isdecimal() or int(sense_text) < 1:
            raise ElmolabError(
                f"sense number {sense_text!r} is not a positive integer", path, number
            )
        if key in sense_numbers:
            raise ElmolabError(f"sense key {key!r} appears twice", path, number)
        sense_numbers[key] = int(sense_text)
        by_lemma[lemma_pos].append((sense_numbers[key], key))
    if not sense_numbers:
        raise ElmolabError("no sense keys: the file is empty", path)
    senses = {
        lemma_pos: tuple(key for _, key in sorted(numbered))
        for lemma_pos, numbered in by_lemma.items()
    }
    return WordNetSenseIndex(path, sense_numbers, senses)


# WordNet 3.0's 45 lexicographer files (lexnames(5WN)), by the lex_filenum of a sense key: the
# supersenses. Each file holds one part of speech, named before its dot (satellites: adj).
LEXICOGRAPHER_FILES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal",  # 00-05
    "noun.artifact", "noun.attribute", "noun.body", "noun.cognition",  # 06-09
    "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",  # 10-14
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon",  # 15-19
    "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",  # 20-24
    "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body",  # 25-29
    "verb.change", "verb.cognition", "verb.communication", "verb.competition",  # 30-33
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",  # 34-38
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",  # 39-43
    "adj.ppl",  # 44
)  # fmt: skip


def supersense(key: str) -> str:
    """The supersense of a sense key: the lexicographer file its ``lex_filenum`` names
    (``dog%1:05:00::`` -> ``noun.animal``).

    Raises ValueError for a key without a two-digit lexicographer field, a number outside
    00-44, or a file of another part of speech than the key's ``ss_type``.
    """
    _, pos = sense_key_lemma_pos(key)
    number = key.partition("%")[2].split(":")[1]
    if not (len(number) == 2 and number.isdigit()):
        raise ValueError(f"sense key {key!r} has no lexicographer file number (lex_filenum)")
    if int(number) >= len(LEXICOGRAPHER_FILES):
        raise ValueError(
            f"sense key {key!r} names lexicographer file {number}, but WordNet has 00-"
            f"{len(LEXICOGRAPHER_FILES) - 1}"
        )
    name = LEXICOGRAPHER_FILES[int(number)]
    if name.partition(".")[0].upper() != pos:
        raise ValueError(
            f"sense key {key!r}: lexicographer file {number} ({name}) is not a {pos} file"
        )
    return name


def instance_supersense(instance: SenseInstance) -> tuple[str, int]:
    """The supersense an instance is labelled with, and how many lexicographer files its gold
    keys name.

    Several gold keys (each correct) may lie in several files: the instance then gets the file
    most of its keys name, ties going to the file of the earliest such key (the first key's,
    for two keys in two files): the label agrees with as many correct senses as one label can,
    and stays deterministic. Raises ValueError as :func:`supersense` does.
    """
    files = [supersense(key) for key in instance.sense_keys]
    counts = {name: files.count(name) for name in files}  # insertion order: first occurrence
    return max(counts, key=counts.__getitem__), len(counts)


def _check_sense_key(
    key: str, wordnet: WordNetSenseIndex | None, path: PathArg, line: int
) -> tuple[str, str]:
    """The key's lemma and pos; ElmolabError if it is malformed or (given ``wordnet``) unknown."""
    try:
        lemma_pos = sense_key_lemma_pos(key)
    except ValueError as error:
        raise ElmolabError(str(error), path, line) from None
    if wordnet is not None and key not in wordnet:
        raise ElmolabError(f"sense key {key!r} is not in WordNet ({wordnet.path})", path, line)
    return lemma_pos


class _GoldKeys(NamedTuple):
    keys: dict[str, tuple[str, ...]]  # instance id -> sense keys
    lines: dict[str, int]  # instance id -> its line in the file


def _read_gold_keys_with_lines(path: PathArg, wordnet: WordNetSenseIndex | None) -> _GoldKeys:
    gold = _GoldKeys({}, {})
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise ElmolabError(
                f"expected an instance id and at least one sense key, got {line!r}", path, number
            )
        instance_id, *keys = fields
        if instance_id in gold.keys:
            raise ElmolabError(
                f"instance {instance_id!r} already has gold keys (line {gold.lines[instance_id]})",
                path,
                number,
            )
        for key in keys:
            _check_sense_key(key, wordnet, path, number)
        gold.keys[instance_id] = tuple(keys)
        gold.lines[instance_id] = number
    if not gold.keys:
        raise ElmolabError("no gold keys: the file is empty or blank", path)
    return gold


def read_gold_keys(
    path: PathArg, wordnet: WordNetSenseIndex | None = None
) -> dict[str, tuple[str, ...]]:
    """Read a gold key file: one ``instance_id key [key ...]`` line per instance, space-separated.

    Returns instance id -> sense keys (several keys: each is correct). Checks: at least one key
    per line, no instance twice, well-formed keys, and with ``wordnet`` that each key is in it.
    """
    return _read_gold_keys_with_lines(path, wordnet).keys


class _XmlInstance(NamedTuple):
    position: int
    instance_id: str
    lemma: str
    pos: str
    line: int


class _XmlSentence(NamedTuple):
    sentence_id: str
    tokens: list[str]
    instances: list[_XmlInstance]


class _RaganatoParser:
    """Parses a Raganato ``*.data.xml`` with expat, which knows the line of every element."""

    def __init__(self, path: PathArg) -> None:
        self.path = path
        self.sentences: list[_XmlSentence] = []
        self._sentence: _XmlSentence | None = None
        self._word: dict[str, str] | None = None  # attributes of the open <wf> or <instance>
        self._word_line = 0
        self._text: list[str] = []
        self._instance_ids: set[str] = set()
        self._expat = expat.ParserCreate()
        self._expat.buffer_text = True
        self._expat.StartElementHandler = self._start
        self._expat.EndElementHandler = self._end
        self._expat.CharacterDataHandler = self._characters

    def parse(self) -> list[_XmlSentence]:
        try:
            with open(self.path, "rb") as file:
                self._expat.ParseFile(file)
        except expat.ExpatError as error:
            raise ElmolabError(
                f"malformed XML: {expat.ErrorString(error.code)} (column {error.offset + 1})",
                self.path,
                error.lineno,
            ) from None
        except OSError as error:
            raise ElmolabError(f"cannot read: {error.strerror or error}", self.path) from error
        if not self.sentences:
            raise ElmolabError("no <sentence> elements", self.path)
        return self.sentences

    def _fail(self, problem: str) -> ElmolabError:
        return ElmolabError(problem, self.path, self._expat.CurrentLineNumber)

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        if name in ("corpus", "text"):
            return
        if name == "sentence":
            if self._sentence is not None:
                raise self._fail("<sentence> inside another <sentence>")
            if "id" not in attributes:
                raise self._fail("<sentence> without an id attribute")
            self._sentence = _XmlSentence(attributes["id"], [], [])
        elif name in ("wf", "instance"):
            if self._sentence is None:
                raise self._fail(f"<{name}> outside a <sentence>")
            if self._word is not None:
                raise self._fail(f"<{name}> inside another word element")
            if name == "instance":
                self._check_instance(attributes)
            self._word = attributes
            self._word_line = self._expat.CurrentLineNumber
            self._text = []
        else:
            raise self._fail(f"unexpected element <{name}>")

    def _check_instance(self, attributes: dict[str, str]) -> None:
        missing = [name for name in ("id", "lemma", "pos") if name not in attributes]
        if missing:
            raise self._fail(f"<instance> without {', '.join(missing)} attribute")
        if attributes["pos"] not in WORDNET_POS:
            raise self._fail(
                f"instance {attributes['id']!r}: pos {attributes['pos']!r} is not one of "
                f"{', '.join(WORDNET_POS)}"
            )
        if attributes["id"] in self._instance_ids:
            raise self._fail(f"instance id {attributes['id']!r} appears twice")
        self._instance_ids.add(attributes["id"])

    def _end(self, name: str) -> None:
        if name in ("wf", "instance"):
            assert self._sentence is not None and self._word is not None  # expat nests elements
            token = "".join(self._text).strip()
            if not token:
                raise ElmolabError(f"empty <{name}>", self.path, self._word_line)
            if name == "instance":
                word = self._word
                self._sentence.instances.append(
                    _XmlInstance(
                        len(self._sentence.tokens),
                        word["id"],
                        word["lemma"],
                        word["pos"],
                        self._word_line,
                    )
                )
            self._sentence.tokens.append(token)
            self._word = None
        elif name == "sentence":
            assert self._sentence is not None
            if not self._sentence.tokens:
                raise self._fail(f"sentence {self._sentence.sentence_id!r} has no words")
            self.sentences.append(self._sentence)
            self._sentence = None

    def _characters(self, text: str) -> None:
        if self._word is not None:
            self._text.append(text)


def read_raganato(
    data_path: PathArg, gold_key_path: PathArg, wordnet: WordNetSenseIndex | None = None
) -> list[WsdSentence]:
    """Read a Raganato et al. (2017) WSD evaluation set into sentences with gold senses.

    ``data_path`` (``NAME.data.xml``) holds ``<corpus><text id><sentence id>`` with one child per
    token: ``<wf lemma pos>word</wf>``, or ``<instance id lemma pos>word</instance>`` for a token
    to disambiguate (pos NOUN, VERB, ADJ or ADV). A token may contain spaces (``belong to``, lemma
    ``belong_to``); it stays one token. ``gold_key_path`` (``NAME.gold.key.txt``) is read with
    :func:`read_gold_keys`. Every instance must have gold keys and every gold key an instance.
    """
    xml_sentences = _RaganatoParser(data_path).parse()
    gold = _read_gold_keys_with_lines(gold_key_path, wordnet)
    sentences = []
    for xml_sentence in xml_sentences:
        instances = []
        for position, instance_id, lemma, pos, line in xml_sentence.instances:
            if instance_id not in gold.keys:
                raise ElmolabError(
                    f"instance {instance_id!r} has no gold key in {gold_key_path}", data_path, line
                )
            instances.append(
                SenseInstance(position, instance_id, lemma, pos, gold.keys[instance_id])
            )
        sentences.append(
            WsdSentence(tuple(xml_sentence.tokens), xml_sentence.sentence_id, tuple(instances))
        )
    known = {instance.instance_id for sentence in xml_sentences for instance in sentence.instances}
    unknown = [instance_id for instance_id in gold.keys if instance_id not in known]
    if unknown:
        first = unknown[0]  # gold keys are in file order
        raise ElmolabError(
            f"gold key for unknown instance id {first!r} (not in {data_path})"
            + (f"; {len(unknown) - 1} more" if len(unknown) > 1 else ""),
            gold_key_path,
            gold.lines[first],
        )
    return sentences


def read_semcor(path: PathArg, wordnet: WordNetSenseIndex | None = None) -> list[WsdSentence]:
    """Read SemCor 3.0 in its TSV distribution (``semcor30.tsv.gz``) into sense-tagged sentences.

    Format: a ``#`` header line, then one line per token with 6 tab-separated columns
    ``id word lemma pos sense_keys_wn30_valid sense_keys_raw``. The id is ``dDOC.sSENT.tTOK``
    (``d000.s000.t001``; ``semcor30.docs.tsv`` maps ``dDOC`` to the Brown file) and a sentence is
    the run of lines whose ids share ``dDOC.sSENT``. Sense keys are ``;``-joined, ``_`` for an
    untagged token. Only the valid WordNet 3.0 keys are used: a token tagged only with raw keys
    that WordNet 3.0 lacks is untagged, as in ``semcor30.gold.key.txt``. Multiword expressions are
    single tokens joined by ``_`` (``Fulton_County_Grand_Jury``). An instance's id is its token
    id, and its lemma and pos are those its sense keys encode (they must agree).
    """
    lines = read_lines(path)
    first = 2 if lines and lines[0].startswith("#") else 1
    sentences: list[WsdSentence] = []
    ended: dict[str, int] = {}  # id of each finished sentence -> its last line
    lemma_pos_of: dict[str, tuple[str, str]] = {}  # each distinct sense key is checked once
    sentence_id = ""
    tokens: list[str] = []
    instances: list[SenseInstance] = []
    for number, line in enumerate(lines[first - 1 :], start=first):
        columns = line.split("\t")
        if len(columns) != 6:
            raise ElmolabError(
                f"expected 6 tab-separated columns, got {len(columns)}", path, number
            )
        token_id, word, _, _, valid_keys, _ = columns
        token_sentence = token_id.rpartition(".")[0]
        if token_sentence != sentence_id:
            if "" in token_id.split(".") or token_id.count(".") != 2:
                raise ElmolabError(f"token id {token_id!r} is not dDOC.sSENT.tTOK", path, number)
            if token_sentence in ended:
                raise ElmolabError(
                    f"sentence {token_sentence!r} resumes after other sentences "
                    f"(it ended at line {ended[token_sentence]})",
                    path,
                    number,
                )
            if tokens:
                sentences.append(WsdSentence(tuple(tokens), sentence_id, tuple(instances)))
                ended[sentence_id] = number - 1
            sentence_id, tokens, instances = token_sentence, [], []
        if valid_keys != "_":
            keys = tuple(valid_keys.split(";"))
            for key in keys:
                if key not in lemma_pos_of:
                    lemma_pos_of[key] = _check_sense_key(key, wordnet, path, number)
            lemma, pos = lemma_pos_of[keys[0]]
            if len(keys) > 1 and any(lemma_pos_of[key] != (lemma, pos) for key in keys):
                raise ElmolabError(
                    f"the sense keys of {token_id!r} disagree on lemma or part of speech",
                    path,
                    number,
                )
            instances.append(SenseInstance(len(tokens), token_id, lemma, pos, keys))
        tokens.append(word)
    if not tokens:
        raise ElmolabError("no sentences: the file has no token lines", path)
    sentences.append(WsdSentence(tuple(tokens), sentence_id, tuple(instances)))
    return sentences
