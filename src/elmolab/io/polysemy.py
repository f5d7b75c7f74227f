"""The polysemy stage's table, ``neighbours.json``: its rows and their file, defined once for the
writer (:mod:`elmolab.polysemy.neighbours`, which runs the biLM) and the reader (the report,
which runs no model: nothing here imports one).

``contextual_layers`` (the biLM layers averaged for the contextual vectors), ``notes`` (what could
not be computed) and ``words``, one row per word: ``word``, ``static`` (``[vocabulary word,
cosine]`` pairs, the nearest out of context), ``semcor_occurrences`` (how many were searched),
``notes``, and ``examples``: each an ``example`` sentence (``tokens``, ``position`` of the word)
with its ``neighbours``, the nearest SemCor occurrences (``tokens``, ``position``, the gold
``sense_key``, ``cosine``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
class PolysemyTable:
    """The polysemy stage's result: a row per word, the layers of its contextual vectors, and
    what could not be computed (no SemCor: no contexts)."""

    contextual_layers: list[int]
    words: list[WordNeighbours]
    notes: list[str] = field(default_factory=list)


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
        return PolysemyTable(
            [int(j) for j in data["contextual_layers"]], words, list(data["notes"])
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ElmolabError(f"not a polysemy table: {err}", path) from err


def _target_json(target: Target) -> dict[str, Any]:
    return {"tokens": list(target.tokens), "position": target.position}


def _target(data: dict[str, Any]) -> Target:
    return Target(tuple(data["tokens"]), int(data["position"]))
