"""The word vocabulary of the language model's softmax, in bilm-tf's order and file format.

``vocab.txt`` holds one token per line: ``<S>``, ``</S>``, ``<UNK>`` first, then the corpus words
by descending frequency. A token's id is its 0-based line index, so the frequency rank the
log-uniform sampler of the sampled softmax assumes is simply the id. Inputs to the biLM are always
characters; the vocabulary only names the softmax classes, with ``<UNK>`` for every other word.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_path
from elmolab.text.chars import BOS_TOKEN, EOS_TOKEN, SPECIAL_TOKENS, UNK_TOKEN


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a token (empty, or containing whitespace), or None if it can.

    Whitespace means what ``str.split()`` splits on, so a valid token never splits further.
    """
    if not token:
        return "empty token"
    if token.split() == [token]:
        return None
    space = next(char for char in token if char.isspace())
    return f"token {token!r} contains whitespace U+{ord(space):04X}"


def _check_tokens(tokens: Sequence[str], source: str | os.PathLike[str] | None) -> None:
    """Raise ElmolabError at the first bad entry; lines are counted from 1 like an editor does."""

    def fail(index: int, problem: str) -> ElmolabError:
        if source is None:
            return ElmolabError(f"vocabulary entry {index + 1}: {problem}")
        return ElmolabError(problem, source, index + 1)

    for index, special in enumerate(SPECIAL_TOKENS):
        if index >= len(tokens) or tokens[index] != special:
            found = "nothing" if index >= len(tokens) else repr(tokens[index])
            raise fail(
                index,
                f"expected {special!r} here (a vocabulary starts with "
                f"{', '.join(SPECIAL_TOKENS)}), found {found}",
            )
    first_index: dict[str, int] = {}
    for index, token in enumerate(tokens):
        problem = token_problem(token)
        if problem is not None:
            raise fail(index, problem)
        if token in first_index:
            where = "entry" if source is None else "line"
            raise fail(index, f"{token!r} already appears at {where} {first_index[token] + 1}")
        first_index[token] = index


class Vocabulary:
    """Token <-> id map: ``<S>`` = 0, ``</S>`` = 1, ``<UNK>`` = 2, then words by frequency.

    ``token_to_id`` maps every out-of-vocabulary token to ``unk_id``. Construction validates the
    list (specials first and in order, no duplicates, no empty tokens, no whitespace inside a
    token) and raises ElmolabError naming the offending entry: ``source:line`` when ``source``
    names the file the tokens were read from.
    """

    def __init__(self, tokens: Iterable[str], source: str | os.PathLike[str] | None = None) -> None:
        self._tokens = tuple(tokens)
        _check_tokens(self._tokens, source)
        self._ids = {token: index for index, token in enumerate(self._tokens)}
        self.bos_id = self._ids[BOS_TOKEN]
        self.eos_id = self._ids[EOS_TOKEN]
        self.unk_id = self._ids[UNK_TOKEN]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Vocabulary:
        """Read ``vocab.txt`` (UTF-8, one token per line, ``\\n`` line ends).

        Errors name the file and line: a missing or misplaced special token, a duplicate, an empty
        line, whitespace inside a token (a ``\\r`` from Windows line ends included), bad UTF-8.
        """
        lines = Path(path).read_bytes().split(b"\n")
        if lines[-1] == b"":  # the newline that ends the last line
            lines.pop()
        tokens = []
        for index, raw in enumerate(lines):
            try:
                tokens.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise ElmolabError(f"not valid UTF-8 ({error.reason})", path, index + 1) from None
        return cls(tokens, source=path)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the vocabulary in the ``vocab.txt`` format, atomically."""
        with atomic_path(path) as tmp:
            tmp.write_bytes("".join(f"{token}\n" for token in self._tokens).encode("utf-8"))

    @property
    def tokens(self) -> tuple[str, ...]:
        """All tokens, in id order."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def token_to_id(self, token: str) -> int:
        """The id of ``token``, ``unk_id`` if it is not in the vocabulary."""
        return self._ids.get(token, self.unk_id)

    def id_to_token(self, token_id: int) -> str:
        """The token with id ``token_id``."""
        return self._tokens[token_id]

    def ids(self, tokens: Iterable[str]) -> list[int]:
        """The ids of ``tokens`` (``unk_id`` for unknown ones)."""
        get, unk_id = self._ids.get, self.unk_id
        return [get(token, unk_id) for token in tokens]


def build_vocabulary(counts: Counter[str], max_size: int | None, min_count: int = 1) -> list[str]:
    """The ordered token list of a vocabulary built from word counts.

    ``<S>``, ``</S>``, ``<UNK>`` come first, then every word counted at least ``min_count``
    times by descending count, ties broken by the token string so the order is deterministic.
    ``max_size`` bounds the whole list, the three special tokens included (None: no bound).
    Counts of the special tokens themselves are ignored. Pass the result to ``Vocabulary``,
    which validates the tokens.
    """
    if max_size is not None and max_size < len(SPECIAL_TOKENS):
        raise ValueError(f"max_size must be at least {len(SPECIAL_TOKENS)}, got {max_size}")
    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    words = [
        (count, word)
        for word, count in counts.items()
        if count >= min_count and word not in SPECIAL_TOKENS
    ]
    words.sort(key=lambda count_word: (-count_word[0], count_word[1]))
    if max_size is not None:
        words = words[: max_size - len(SPECIAL_TOKENS)]
    return [*SPECIAL_TOKENS, *(word for _, word in words)]
