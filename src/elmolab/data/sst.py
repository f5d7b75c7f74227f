"""Reader of the Stanford Sentiment Treebank (Socher et al. 2013), SST-5's PTB-bracketed trees.

Each non-blank line of ``train.txt``, ``dev.txt`` and ``test.txt`` is one sentence, a labelled
binary tree ``(label (label word) (label (label word) (label word)))``: every node carries the
sentiment of its phrase, ``0`` (very negative) to ``4`` (very positive), and the root's label is the
sentence's. :func:`read_sst` keeps the leaves' words in order and the root's label.

**Tokens.** The treebank's words are PTB-tokenized, with PTB's escapes: ``-LRB-`` and ``-RRB-``
for round brackets, a backslash before ``/`` and ``*`` (``\\/``, ``\\*``). The biLM was pretrained
on running text with the characters themselves, so the reader gives it those
(:data:`PTB_ESCAPES`): ``-LRB-`` -> ``(``, ``-RRB-`` -> ``)``, ``\\/`` -> ``/``, ``\\*`` -> ``*``.
Quotes stay PTB's ````` and ``''``, as the treebank writes them. Three leaves of train hold a
word with a no-break space inside (``8\\xa01\\/2``, the film *8 1/2*): the biLM reads its two parts
as separate tokens, as it read such text in pretraining, so train's 163,563 leaves give 163,566
tokens (dev and test: one token a leaf).

Bad input raises :class:`~elmolab.core.errors.ElmolabError` naming the file, the 1-based line and
what is wrong: unbalanced brackets, a label outside 0-4, a node that is neither a leaf
``(label word)`` nor a label over subtrees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from elmolab.core.errors import ElmolabError
from elmolab.data.conll import PathArg, TaggedSentence, read_lines

SENTIMENT_LABELS = ("0", "1", "2", "3", "4")  # very negative .. very positive
# PTB's escaped words -> the text the biLM reads (the module docstring says why).
PTB_ESCAPES = {"-LRB-": "(", "-RRB-": ")"}
_BACKSLASH_ESCAPE = re.compile(r"\\([/*])")
# A tree's pieces: a bracket, or a run of characters that are neither brackets nor ASCII spaces
# and tabs (a leaf's word may hold a no-break space: ``8\xa01\/2``).
_PIECE = re.compile(r"[()]|[^() \t]+")


@dataclass(frozen=True, slots=True)
class SentimentSentence(TaggedSentence):
    """An SST sentence: its words (PTB escapes undone) and its root label, ``"0"``..``"4"``."""

    sentiment: str


def unescape_ptb(word: str) -> str:
    """A PTB-escaped word as written text: ``-LRB-`` -> ``(``, ``-RRB-`` -> ``)``, ``\\/`` -> ``/``,
    ``\\*`` -> ``*``; every other word unchanged."""
    return PTB_ESCAPES.get(word) or _BACKSLASH_ESCAPE.sub(r"\1", word)


def read_sst(path: PathArg) -> list[SentimentSentence]:
    """Read one SST split, one :class:`SentimentSentence` per non-blank line (blank lines are
    skipped; the sentence of line ``n`` is the ``n``-th non-blank line's)."""
    sentences = []
    for number, line in enumerate(read_lines(path), start=1):
        if line.strip():
            sentences.append(parse_tree(line, path, number))
    if not sentences:
        raise ElmolabError("no sentences: the file is empty or blank", path)
    return sentences


def parse_tree(line: str, path: PathArg, number: int) -> SentimentSentence:
    """One line's tree: its leaves' words (unescaped) and its root label.

    The grammar: ``tree := "(" label (word | tree tree*) ")"``, with ``label`` one of
    :data:`SENTIMENT_LABELS`; the line holds exactly one tree.
    """
    pieces = _PIECE.findall(line)
    words: list[str] = []
    # Per open node: whether it holds a word (a leaf) or subtrees so far (None: only its label).
    open_nodes: list[str | None] = []
    root_label = None
    position = 0

    def fail(problem: str) -> ElmolabError:
        return ElmolabError(f"{problem} (SST tree, piece {position + 1})", path, number)

    while position < len(pieces):
        piece = pieces[position]
        if piece == "(":
            if root_label is not None and not open_nodes:
                raise fail("text after the tree's closing bracket")
            if open_nodes:
                if open_nodes[-1] == "leaf":
                    raise fail("a node holds both a word and subtrees")
                open_nodes[-1] = "inner"
            label = pieces[position + 1] if position + 1 < len(pieces) else None
            if label is None or label in ("(", ")"):
                raise fail("a node without a label (expected 0-4 after '(')")
            if label not in SENTIMENT_LABELS:
                raise fail(f"label {label!r} is not one of 0-4")
            if root_label is None:
                root_label = label
            open_nodes.append(None)
            position += 2
            continue
        if piece == ")":
            if not open_nodes:
                raise fail("unbalanced brackets: ')' closes no node")
            if open_nodes.pop() is None:
                raise fail("an empty node: a label with neither a word nor subtrees")
        elif not open_nodes:
            raise fail(f"{piece!r} outside the tree's brackets")
        elif open_nodes[-1] is not None:
            raise fail(f"a node holds more than one word or a word beside subtrees ({piece!r})")
        else:
            open_nodes[-1] = "leaf"
            words.extend(unescape_ptb(piece).split())  # a no-break space parts the word
        position += 1
    if open_nodes:
        raise ElmolabError(
            f"unbalanced brackets: {len(open_nodes)} node(s) not closed at the end of the line",
            path,
            number,
        )
    if root_label is None:
        raise ElmolabError("expected an SST tree '(label ...)'", path, number)
    return SentimentSentence(tokens=tuple(words), sentiment=root_label)
