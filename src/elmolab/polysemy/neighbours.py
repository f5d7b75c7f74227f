"""Nearest neighbours of polysemous words (ELMo paper, Table 4) on our biLM.

For each configured word:

- context-free: the cosine nearest words to its layer-0 (char CNN) vector among the layer-0
  vectors of the ``vocab_top_n`` most frequent vocabulary words. One vector per spelling, so all
  senses are mixed.
- in context: for each example sentence, the cosine nearest SemCor occurrences of the word's
  lemma, comparing contextual vectors (the mean of the biLM layers ``contextual_layers``; the
  top layer by default). Each neighbour shows its gold SemCor sense key and WordNet lexicographer
  file (``noun.communication``), so one sees whether the neighbours share the example's sense.

The search covers the first ``semcor_max_sentences`` SemCor sentences that contain the lemma.
Examples mark the target token in brackets: ``"The children [play] football ."``.

- sense agreement: how well a vector separates the word's senses, one number per SemCor
  occurrence i of the word (words with a single occurrence have none): the share of i's nearest
  neighbours by cosine among the *other* occurrences of the word (all those within
  ``TIE_TOLERANCE`` of the highest cosine) whose gold sense key is i's, with the contextual
  vector and with the token layer's (layer 0). Layer 0 is context-free: occurrences spelled
  alike have the same vector and tie, so its share is the chance that an occurrence spelled like
  i has i's sense, the baseline the contextual vectors are measured against.

The polysemy stage (:mod:`elmolab.stages.polysemy`) computes the table with :func:`table` and
writes it with :func:`elmolab.io.polysemy.write_table` (``neighbours.json``); the report reads it
with :func:`elmolab.io.polysemy.read_table`, which imports no model.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import PolysemyConfig
from elmolab.data.wsd import WsdSentence, read_semcor
from elmolab.embed import embed_sentences
from elmolab.io.polysemy import (
    ExampleNeighbours,
    PolysemyTable,
    SenseAgreement,
    SenseNeighbour,
    Target,
    WordNeighbours,
)
from elmolab.models.bilm import BiLM
from elmolab.models.bilm_tf import load_bilm
from elmolab.models.encoder_files import OPTIONS, WEIGHTS
from elmolab.text.chars import SPECIAL_TOKENS, char_ids_for_sentences
from elmolab.text.vocab import Vocabulary

log = logging.getLogger(__name__)

MAX_SENTENCE_TOKENS = 60  # longer SemCor sentences cost the most biLM time and read worst
LAYER0_BATCH = 512  # words per char CNN call
# Neighbours this close to the highest cosine tie with it: identical vectors have cosines equal
# only up to float rounding.
TIE_TOLERANCE = 1e-6


def parse_example(text: str, key: str = "example") -> Target:
    """A whitespace-tokenized sentence with exactly one ``[target]`` token; errors name ``key``."""
    tokens = text.split()
    marked = [i for i, token in enumerate(tokens) if token.startswith("[") and token.endswith("]")]
    if len(marked) != 1 or len(tokens[marked[0]]) < 3:
        raise ElmolabError(f"{key}: {text!r} must mark exactly one token as [word]")
    tokens[marked[0]] = tokens[marked[0]][1:-1]
    return Target(tuple(tokens), marked[0])


def nearest_neighbours(
    model: BiLM,
    vocabulary: Sequence[str],
    semcor: Sequence[WsdSentence] | None,
    config: PolysemyConfig,
) -> tuple[list[WordNeighbours], SenseAgreement | None]:
    """The table's rows for every configured word and their sense agreement (see the module
    docstring); ``semcor`` None skips the contextual part and the agreement."""
    n_layers = model.options.lstm.n_layers + 1
    if not config.contextual_layers or not all(0 <= j < n_layers for j in config.contextual_layers):
        raise ElmolabError(
            f"polysemy.contextual_layers: {config.contextual_layers} is not a non-empty "
            f"list of layers in 0..{n_layers - 1}"
        )
    parsed = [
        [
            parse_example(text, f"polysemy.words[{i}].examples[{j}]")
            for j, text in enumerate(entry.examples)
        ]
        for i, entry in enumerate(config.words)
    ]
    words = [w for w in vocabulary if w not in SPECIAL_TOKENS][: config.vocab_top_n]
    with _one_thread():
        static = _layer0(model, words)  # (words, proj)
        rows = [
            _word_neighbours(model, entry.word, examples, words, static, semcor, config)
            for entry, examples in zip(config.words, parsed, strict=True)
        ]
    if semcor is None:
        return [row for row, _ in rows], None
    scored = [(row.word, *scores) for row, word_scores in rows for scores in word_scores]
    scored_words, keys, contextual, token_layer = zip(*scored, strict=True) if scored else [()] * 4
    agreement = SenseAgreement(
        scored_words,
        keys,
        np.array(contextual, dtype=np.float64),
        np.array(token_layer, dtype=np.float64),
        list(config.contextual_layers),
    )
    return [row for row, _ in rows], agreement


def sense_agreement(vectors: torch.Tensor, sense_keys: Sequence[str]) -> torch.Tensor:
    """Leave-one-out nearest-neighbour sense agreement of ``vectors`` (occurrences, D), one
    occurrence of a word each, with gold ``sense_keys``: per occurrence i, the share of its
    nearest other occurrences by cosine (all within ``TIE_TOLERANCE`` of the highest) whose sense
    key is i's; (occurrences,) float64, empty for fewer than two occurrences."""
    if len(sense_keys) != len(vectors):
        raise ValueError(f"{len(vectors)} vectors but {len(sense_keys)} sense keys")
    if len(vectors) < 2:
        return torch.zeros(0, dtype=torch.float64)
    unit = F.normalize(vectors.double(), dim=1)  # (occurrences, D)
    cosine = (unit @ unit.T).fill_diagonal_(-math.inf)  # (occurrences, occurrences)
    highest = cosine.max(dim=1, keepdim=True).values  # (occurrences, 1)
    nearest = cosine >= highest - TIE_TOLERANCE  # (occurrences, occurrences)
    codes = {key: code for code, key in enumerate(dict.fromkeys(sense_keys))}
    sense = torch.tensor([codes[key] for key in sense_keys])  # (occurrences,)
    same = sense[:, None] == sense[None, :]  # (occurrences, occurrences)
    return (nearest & same).sum(dim=1) / nearest.sum(dim=1).double()  # (occurrences,)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one thread: these are small batches, and on a shared 2-core machine
    multi-threaded small matmuls lost 10x to contention (measured with other jobs running)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _word_neighbours(
    model: BiLM,
    word: str,
    examples: list[Target],
    words: list[str],
    static: torch.Tensor,
    semcor: Sequence[WsdSentence] | None,
    config: PolysemyConfig,
) -> tuple[WordNeighbours, list[tuple[str, float, float]]]:
    """One word's row, and (sense key, contextual share, token-layer share) per SemCor occurrence
    scored for sense agreement; ``static`` (words, proj) are the layer-0 vectors of ``words``."""
    similarity = F.cosine_similarity(static, _layer0(model, [word]), dim=1)  # (words,)
    ranked = [i for i in similarity.argsort(descending=True).tolist() if words[i] != word]
    nearest = [(words[i], float(similarity[i])) for i in ranked[: config.neighbours]]
    occurrences = [] if semcor is None else _occurrences(semcor, word, config)
    if not occurrences:
        notes = [] if semcor is None else [f"no SemCor occurrence of the lemma {word!r}"]
        empty = [ExampleNeighbours(example, []) for example in examples]
        return WordNeighbours(word, nearest, empty, 0, notes), []
    layers = _layers(model, [t for t, _ in occurrences])  # (occ, n_layers + 1, D)
    pool = layers[:, config.contextual_layers].mean(dim=1)  # (occ, D)
    queries = _layers(model, examples)[:, config.contextual_layers].mean(dim=1)  # (examples, D)
    rows = []
    for example, vector in zip(examples, queries, strict=True):
        sims = F.cosine_similarity(pool, vector[None], dim=1)  # (occurrences,)
        top = sims.argsort(descending=True)[: config.neighbours].tolist()
        neighbours = [SenseNeighbour(*occurrences[i], float(sims[i])) for i in top]
        rows.append(ExampleNeighbours(example, neighbours))
    scores = []
    if len(occurrences) > 1:  # a single occurrence has no other to be its nearest
        keys = [key for _, key in occurrences]
        contextual = sense_agreement(pool, keys).tolist()
        token_layer = sense_agreement(layers[:, 0], keys).tolist()
        scores = list(zip(keys, contextual, token_layer, strict=True))
    return WordNeighbours(word, nearest, rows, len(occurrences)), scores


def _occurrences(
    semcor: Sequence[WsdSentence], lemma: str, config: PolysemyConfig
) -> list[tuple[Target, str]]:
    """(occurrence, its first gold sense key) in the first sentences that have the lemma
    (long sentences skipped)."""
    found: list[tuple[Target, str]] = []
    sentences = 0
    for sentence in semcor:
        instances = [i for i in sentence.instances if i.lemma == lemma]
        if not instances or len(sentence.tokens) > MAX_SENTENCE_TOKENS:
            continue
        found += [(Target(sentence.tokens, i.position), i.sense_keys[0]) for i in instances]
        sentences += 1
        if sentences == config.semcor_max_sentences:
            break
    return found


def _layer0(model: BiLM, words: Sequence[str]) -> torch.Tensor:
    """Context-free vectors (words, proj): the char CNN's output, which layer 0 is twice
    (``[x; x]``: the same cosine similarities). No LSTM runs, so 5000 words take seconds."""
    max_chars = model.options.char_cnn.max_characters_per_token
    vectors = []
    with torch.inference_mode():
        for start in range(0, len(words), LAYER0_BATCH):
            batch = [[word] for word in words[start : start + LAYER0_BATCH]]
            ids = char_ids_for_sentences(batch, add_sentence_marks=False, max_chars=max_chars)
            vectors.append(model.token_encoder(ids)[:, 0])  # (batch, proj)
    return torch.cat(vectors)  # (words, proj)


def _layers(model: BiLM, targets: Sequence[Target]) -> torch.Tensor:
    """Every biLM layer at each target's position, (targets, n_layers + 1, 2 * proj); each
    distinct sentence runs through the biLM once."""
    sentences = list(dict.fromkeys(target.tokens for target in targets))
    outputs = dict(embed_sentences(model, sentences))  # index -> (n_layers + 1, n, 2 * proj)
    row = {tokens: index for index, tokens in enumerate(sentences)}
    return torch.stack(
        [outputs[row[t.tokens]][:, t.position] for t in targets]
    )  # (targets, n_layers + 1, 2 * proj)


def table(config: PolysemyConfig) -> PolysemyTable:
    """The table of ``config``'s words on the biLM of ``config.bilm`` (its ``options.json`` and
    ``weights.hdf5``) over the vocabulary ``config.vocab``; without SemCor (``config.semcor``) the
    contextual neighbours and the sense agreement are left out and a note says so."""
    options, weights = Path(config.bilm) / OPTIONS, Path(config.bilm) / WEIGHTS
    for path in (options, weights, Path(config.vocab)):
        if not path.is_file():
            raise ElmolabError("no such file: the polysemy table needs the trained biLM", path)
    notes = []
    semcor = None
    if Path(config.semcor).is_file():
        log.info("reading SemCor for the polysemy table: %s", config.semcor)
        semcor = read_semcor(config.semcor)
    else:
        notes.append(f"no SemCor ({config.semcor}): polysemy table without contexts")
    model = load_bilm(options, weights)
    vocabulary = Vocabulary.from_file(config.vocab).tokens
    words, agreement = nearest_neighbours(model, vocabulary, semcor, config)
    return PolysemyTable(list(config.contextual_layers), words, notes, agreement)
