"""The polysemy stage's table, ``neighbours.json``: its rows and their file, defined once for the
writer (:mod:`elmolab.polysemy.neighbours`, which runs the biLM) and the reader (the report,
which runs no model: nothing here imports one).

``contextual_layers`` (the biLM layers averaged for the contextual vectors), ``notes`` (what could
not be computed) and ``words``, one row per word: ``word``, ``static`` (``[vocabulary word,
cosine]`` pairs, the nearest out of context), ``semcor_occurrences`` (how many were searched),
``notes``, and ``examples``: each an ``example`` sentence (``tokens``, ``position`` of the word)
with its ``neighbours``, the nearest SemCor occurrences (``tokens``, ``position``, the gold
``sense_key``, ``cosine``). ``sense_agreement`` (null without SemCor; absent in files older
than it): the leave-one-out nearest-neighbour sense agreement of every scored SemCor occurrence
(see :mod:`elmolab.polysemy.neighbours`), its ``contextual_layers``, ``occurrences`` (``word``,
``sense_key``, ``contextual`` and ``token_layer``, each a share in [0, 1]) and ``words``, each
word's ``occurrences`` scored and the means of the two shares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_path
from elmolab.data.wsd import LEXICOGRAPHER_FILES

TABLE_FILE = "neighbours.json"  # in the polysemy stage's folder
CONTEXT_WINDOW = 8  # tokens shown on each side of a neighbour's target word


@dataclass(frozen=True)
class Target:
    """A token in a sentence: ``tokens[position]`` is the word of interest."""

    tokens: tuple[str, ...]
    position: int

    def window(self, size: int = CONTEXT_WINDOW) -> tuple[str, str, str]:
        """(left context, the word, right context), each side cut to ``size`` tokens."""
        start, end = max(0, self.position - size), self.position + 1 + size
        left = ("… " if start > 0 else "") + " ".join(self.tokens[start : self.position])
        right = " ".join(self.tokens[self.position + 1 : end])
        return left, self.tokens[self.position], right + (" …" if end < len(self.tokens) else "")


@dataclass(frozen=True)
class SenseNeighbour:
    target: Target
    sense_key: str
    similarity: float

    @property
    def lexname(self) -> str:
        return lexname(self.sense_key)


@dataclass(frozen=True)
class ExampleNeighbours:
    example: Target
    neighbours: list[SenseNeighbour]


@dataclass(frozen=True)
class WordNeighbours:
    word: str
    static: list[tuple[str, float]]  # (vocabulary word, cosine similarity)
    examples: list[ExampleNeighbours]
    semcor_occurrences: int  # how many occurrences of the lemma were searched
    notes: list[str] = field(default_factory=list)


def lexname(sense_key: str) -> str:
    """The lexicographer file of a sense key (``play%1:10:01::`` -> ``noun.communication``)."""
    try:
        return LEXICOGRAPHER_FILES[int(sense_key.split("%", 1)[1].split(":")[1])]
    except (IndexError, ValueError):
        return "?"


@dataclass(frozen=True)
class SenseAgreement:
    """Leave-one-out nearest-neighbour sense agreement, one entry per scored SemCor occurrence:
    the share of its nearest other occurrences of the same word that have its gold sense, with
    the contextual vector (the mean of ``contextual_layers``) and with the token layer's
    (layer 0). Entries are grouped by word, in the order of the configured words."""

    words: tuple[str, ...]  # (occurrences,)
    sense_keys: tuple[str, ...]  # (occurrences,)
    contextual: np.ndarray  # (occurrences,) float64 in [0, 1]
    token_layer: np.ndarray  # (occurrences,) float64 in [0, 1]
    contextual_layers: list[int]

    def __post_init__(self) -> None:
        lengths = {len(self.words), len(self.sense_keys), len(self.contextual)}
        if lengths != {len(self.token_layer)}:
            raise ValueError(
                f"sense_agreement: {len(self.words)} words, {len(self.sense_keys)} sense keys, "
                f"{len(self.contextual)} contextual and {len(self.token_layer)} token-layer "
                "shares: one of each per occurrence"
            )
        for name in ("contextual", "token_layer"):
            shares = getattr(self, name)
            outside = np.flatnonzero(~((shares >= 0) & (shares <= 1)))  # NaN too
            if len(outside):
                i = int(outside[0])
                raise ValueError(
                    f"sense_agreement: occurrence {i} ({self.words[i]!r}) has a {name} share "
                    f"{shares[i]}, not in [0, 1]"
                )

    def word_means(self) -> dict[str, tuple[int, float, float]]:
        """Per word, in order: (occurrences scored, mean contextual share, mean token-layer
        share)."""
        words = np.array(self.words)
        return {
            word: (
                int((words == word).sum()),
                float(self.contextual[words == word].mean()),
                float(self.token_layer[words == word].mean()),
            )
            for word in dict.fromkeys(self.words)
        }


@dataclass(frozen=True)
class PolysemyTable:
    """The polysemy stage's result: a row per word, the layers of its contextual vectors, what
    could not be computed (no SemCor: no contexts), and the sense agreement (None without
    SemCor, or read from a file older than it)."""

    contextual_layers: list[int]
    words: list[WordNeighbours]
    notes: list[str] = field(default_factory=list)
    agreement: SenseAgreement | None = None


def write_table(result: PolysemyTable, path: Path) -> None:
    """``result`` as JSON at ``path`` (written whole, then renamed into place)."""
    data = {
        "contextual_layers": result.contextual_layers,
        "notes": result.notes,
        "words": [
            {
                "word": w.word,
                "static": [[word, cosine] for word, cosine in w.static],
                "semcor_occurrences": w.semcor_occurrences,
                "notes": w.notes,
                "examples": [
                    {
                        "example": _target_json(e.example),
                        "neighbours": [
                            {
                                **_target_json(n.target),
                                "sense_key": n.sense_key,
                                "cosine": n.similarity,
                            }
                            for n in e.neighbours
                        ],
                    }
                    for e in w.examples
                ],
            }
            for w in result.words
        ],
        "sense_agreement": None if result.agreement is None else _agreement_json(result.agreement),
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def read_table(path: Path) -> PolysemyTable:
    """The table :func:`write_table` wrote; a file that is not one is an ElmolabError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        words = [
            WordNeighbours(
                w["word"],
                [(word, float(cosine)) for word, cosine in w["static"]],
                [
                    ExampleNeighbours(
                        _target(e["example"]),
                        [
                            SenseNeighbour(_target(n), n["sense_key"], float(n["cosine"]))
                            for n in e["neighbours"]
                        ],
                    )
                    for e in w["examples"]
                ],
                int(w["semcor_occurrences"]),
                list(w["notes"]),
            )
            for w in data["words"]
        ]
        agreement = data.get("sense_agreement")
        return PolysemyTable(
            [int(j) for j in data["contextual_layers"]],
            words,
            list(data["notes"]),
            None if agreement is None else _agreement(agreement),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ElmolabError(f"not a polysemy table: {err}", path) from err


def _agreement_json(agreement: SenseAgreement) -> dict[str, Any]:
    return {
        "contextual_layers": agreement.contextual_layers,
        "occurrences": [
            {"word": word, "sense_key": key, "contextual": contextual, "token_layer": token}
            for word, key, contextual, token in zip(
                agreement.words,
                agreement.sense_keys,
                agreement.contextual.tolist(),
                agreement.token_layer.tolist(),
                strict=True,
            )
        ],
        "words": [
            {"word": word, "occurrences": n, "contextual": contextual, "token_layer": token}
            for word, (n, contextual, token) in agreement.word_means().items()
        ],
    }


def _agreement(data: dict[str, Any]) -> SenseAgreement:
    """The ``sense_agreement`` block; ValueError where its shares are not numbers in [0, 1] or
    its per-word means are not those of its occurrences."""
    where = "sense_agreement.occurrences"
    occurrences = list(enumerate(data["occurrences"]))
    agreement = SenseAgreement(
        tuple(_string(o["word"], f"{where}[{i}].word") for i, o in occurrences),
        tuple(_string(o["sense_key"], f"{where}[{i}].sense_key") for i, o in occurrences),
        np.array([_number(o["contextual"], f"{where}[{i}].contextual") for i, o in occurrences]),
        np.array([_number(o["token_layer"], f"{where}[{i}].token_layer") for i, o in occurrences]),
        [int(j) for j in data["contextual_layers"]],
    )
    stated = [
        (
            _string(w["word"], f"sense_agreement.words[{i}].word"),
            w["occurrences"],
            _number(w["contextual"], f"sense_agreement.words[{i}].contextual"),
            _number(w["token_layer"], f"sense_agreement.words[{i}].token_layer"),
        )
        for i, w in enumerate(data["words"])
    ]
    computed = [(word, *values) for word, values in agreement.word_means().items()]
    if [row[0] for row in stated] != [row[0] for row in computed]:
        raise ValueError(
            f"sense_agreement.words: {[row[0] for row in stated]} are not the words of its "
            f"occurrences, {[row[0] for row in computed]}"
        )
    for (word, n, *means), (_, count, *expected) in zip(stated, computed, strict=True):
        if n != count or not np.allclose(means, expected, rtol=0, atol=1e-9):
            raise ValueError(
                f"sense_agreement.words: {word!r} says {n} occurrences with means {means}, "
                f"its occurrences are {count} with means {expected}"
            )
    return agreement


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: {value!r} is not a string")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{where}: {value!r} is not a number")
    return float(value)


def _target_json(target: Target) -> dict[str, Any]:
    return {"tokens": list(target.tokens), "position": target.position}


def _target(data: dict[str, Any]) -> Target:
    return Target(tuple(data["tokens"]), int(data["position"]))
