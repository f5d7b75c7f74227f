"""Polysemy: the polysemy stage's nearest neighbours of each word (context-free on layer 0, and
in context among SemCor occurrences) as the ``polysemy`` block of ``summary.json``; the templates
render the words from :class:`~elmolab.report.data.ReportData` directly."""

from __future__ import annotations

from typing import Any

from elmolab.report.data import ReportData


def summary(data: ReportData) -> dict[str, Any]:
    """The contextual layers compared, and per word its layer-0 neighbours and, per example
    sentence, its nearest SemCor occurrences with their senses."""
    return {
        "contextual_layers": data.polysemy_layers,
        "words": [
            {
                "word": w.word,
                "layer0_neighbours": [{"word": n, "cosine": s} for n, s in w.static],
                "semcor_occurrences": w.semcor_occurrences,
                "examples": [
                    {
                        "sentence": " ".join(e.example.tokens),
                        "position": e.example.position,
                        "neighbours": [
                            {
                                "sentence": " ".join(n.target.tokens),
                                "position": n.target.position,
                                "sense_key": n.sense_key,
                                "lexname": n.lexname,
                                "cosine": n.similarity,
                            }
                            for n in e.neighbours
                        ],
                    }
                    for e in w.examples
                ],
            }
            for w in data.polysemy
        ],
    }
