"""The prepare stage: raw corpora -> sentence shards per split, a vocabulary and statistics.

Output (``out_dir``, replaced whole and only when complete)::

    train/shard-<source>-00000.txt ...   one sentence per line, tokens separated by single spaces
    valid/shard-<source>-00000.txt ...
    test/shard-<source>-00000.txt ...
    vocab.txt                      <S>, </S>, <UNK>, then training tokens by descending frequency
    stats.json                     sentences, tokens, types, OOV rate per split and per source

Splits are made at document level: per source, a permutation seeded with ``seed`` holds out
``valid_fraction`` and ``test_fraction`` of the documents. Sentences are streamed from the sources
to the shards; what is kept in memory are token counts (one counter per split), so peak memory
grows with the vocabulary, not with the corpus."""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.core.schema import CorpusConfig
from elmolab.text.chars import SPECIAL_TOKENS
from elmolab.text.corpus import CorpusSource, open_source
from elmolab.text.vocab import build_vocabulary

log = logging.getLogger("elmolab.prepare")

SPLITS = ("train", "valid", "test")


@dataclass
class _Tally:
    sentences: int = 0
    tokens: int = 0
    documents: int = 0


@dataclass
class _ShardWriter:
    """Writes one source's sentences of one split into numbered shard files."""

    folder: Path
    source: str
    per_shard: int
    _fh: IO[str] | None = None
    _index: int = -1
    _lines: int = 0
    paths: list[Path] = field(default_factory=list)

    def write(self, tokens: list[str]) -> None:
        if self._fh is None or self._lines == self.per_shard:
            self.close()
            self._index += 1
            path = self.folder / f"shard-{self.source}-{self._index:05d}.txt"
            self._fh = path.open("w", encoding="utf-8", newline="\n")
            self.paths.append(path)
            self._lines = 0
        self._fh.write(" ".join(tokens) + "\n")
        self._lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def assign_splits(
    documents: list[str], valid_fraction: float, test_fraction: float, seed: int, source: str
) -> dict[str, str]:
    """Map each document id to ``train``/``valid``/``test``, deterministically from ``seed``.

    Each held-out split gets ``round(n * fraction)`` documents (at least one when its fraction is
    positive and there are enough documents), and train keeps at least one.
    """
    n = len(documents)
    order = list(range(n))
    random.Random(f"{seed}:{source}").shuffle(order)
    n_valid = _held_out(n, valid_fraction)
    n_test = _held_out(n, test_fraction)
    while n_valid + n_test >= n and (n_valid or n_test):
        if n_test >= n_valid:
            n_test -= 1
        else:
            n_valid -= 1
    split_of = {}
    for rank, index in enumerate(order):
        split = "valid" if rank < n_valid else "test" if rank < n_valid + n_test else "train"
        split_of[documents[index]] = split
    return split_of


def _held_out(n: int, fraction: float) -> int:
    return 0 if fraction <= 0 else max(1, round(n * fraction))


def prepare_corpus(cfg: CorpusConfig, out_dir: Path, seed: int) -> dict[str, Any]:
    """Run the prepare stage into ``out_dir`` (replaced atomically); return the statistics."""
    if (
        cfg.valid_fraction < 0
        or cfg.test_fraction < 0
        or cfg.valid_fraction + cfg.test_fraction >= 1
    ):
        raise ElmolabError(
            "corpus.valid_fraction and corpus.test_fraction must be >= 0 and sum to less than 1"
        )
    sources = [open_source(name, src.reader, src.path) for name, src in cfg.sources.items() if src]
    if not sources:
        raise ElmolabError("corpus.sources: every source is disabled (null)")
    started = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        for split in SPLITS:
            (tmp / split).mkdir()
        train_counts: Counter[str] = Counter()
        tallies: dict[tuple[str, str], _Tally] = {}
        dropped: Counter[str] = Counter()
        shards: dict[tuple[str, str], list[Path]] = {}
        for source in sources:
            shards.update(_read_source(source, cfg, seed, tmp, train_counts, tallies, dropped))
        if not train_counts:
            raise ElmolabError(
                "the training split is empty after filtering "
                f"(min_sentence_tokens={cfg.min_sentence_tokens}, "
                f"max_sentence_tokens={cfg.max_sentence_tokens})"
            )
        vocab = build_vocabulary(train_counts, cfg.vocab_max_size, cfg.vocab_min_count)
        (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        stats = _statistics(shards, sources, vocab, train_counts, tallies, dropped)
        # No timing in the corpus: the same corpus keeps the same hash, so DVC does not re-run
        # every later stage when this one re-runs (e.g. after a change to the schema).
        write_json(tmp / "stats.json", stats)
    log.info(
        "prepared %s training tokens, vocabulary %d, in %.1f s",
        f"{stats['splits']['train']['tokens']:,}",
        len(vocab),
        time.perf_counter() - started,
    )
    return stats


def _read_source(
    source: CorpusSource,
    cfg: CorpusConfig,
    seed: int,
    tmp: Path,
    train_counts: Counter[str],
    tallies: dict[tuple[str, str], _Tally],
    dropped: Counter[str],
) -> dict[tuple[str, str], list[Path]]:
    """Stream one source into its shards; return the shard files per ``(source, split)``."""
    documents = source.documents()
    if cfg.max_documents is not None:
        documents = documents[: cfg.max_documents]
    split_of = assign_splits(documents, cfg.valid_fraction, cfg.test_fraction, seed, source.name)
    writers = {s: _ShardWriter(tmp / s, source.name, cfg.shard_sentences) for s in SPLITS}
    for split in SPLITS:
        tallies[(source.name, split)] = _Tally()
    try:
        for doc_id, sentences in source.iter_documents():
            split = split_of.get(doc_id)
            if split is None:  # beyond max_documents
                continue
            tally = tallies[(source.name, split)]
            tally.documents += 1
            for tokens in sentences:
                if not cfg.min_sentence_tokens <= len(tokens) <= cfg.max_sentence_tokens:
                    dropped[source.name] += 1
                    continue
                writers[split].write(tokens)
                tally.sentences += 1
                tally.tokens += len(tokens)
                if split == "train":
                    train_counts.update(tokens)
    finally:
        for writer in writers.values():
            writer.close()
    if sum(tallies[(source.name, s)].sentences for s in SPLITS) == 0 and not dropped[source.name]:
        raise ElmolabError(f"source {source.name!r} has no sentence", source.path)
    for where, count in source.replacements.items():
        log.warning("%s: %d undecodable bytes replaced by U+FFFD", where, count)
    return {(source.name, split): writer.paths for split, writer in writers.items()}


def _statistics(
    shards: dict[tuple[str, str], list[Path]],
    sources: list[CorpusSource],
    vocab: list[str],
    train_counts: Counter[str],
    tallies: dict[tuple[str, str], _Tally],
    dropped: Counter[str],
) -> dict[str, Any]:
    """Counts per split and per source, from the shards just written (one source at a time)."""
    in_vocab = set(vocab) - set(SPECIAL_TOKENS)
    train_sentences = sum(t.sentences for (_, split), t in tallies.items() if split == "train")
    unigram = _UnigramModel(train_counts, in_vocab, train_sentences)
    splits: dict[str, Any] = {}
    by_source: dict[str, Any] = {s.name: {} for s in sources}
    for split in SPLITS:
        split_types: set[str] = set()
        split_oov = 0
        nll = 0.0
        for source in sources:
            counts: Counter[str] = Counter()
            for shard in shards[(source.name, split)]:
                with shard.open(encoding="utf-8") as fh:
                    for line in fh:
                        counts.update(line.split())
            tally = tallies[(source.name, split)]
            oov = sum(c for t, c in counts.items() if t not in in_vocab)
            by_source[source.name][split] = _entry(tally, len(counts), oov)
            split_types.update(counts)
            split_oov += oov
            if split != "train":
                nll += unigram.nll(counts, tally.sentences)
        tally = _Tally(
            sum(tallies[(s.name, split)].sentences for s in sources),
            sum(tallies[(s.name, split)].tokens for s in sources),
            sum(tallies[(s.name, split)].documents for s in sources),
        )
        splits[split] = _entry(tally, len(split_types), split_oov)
        if split != "train" and tally.tokens:
            # Tokens the LM predicts: every word and </S>, OOV words as <UNK>.
            splits[split]["unigram_perplexity"] = round(
                math.exp(nll / (tally.tokens + tally.sentences)), 2
            )
    return {
        "splits": splits,
        "sources": by_source,
        "vocabulary": {
            "size": len(vocab),
            "train_types": len(train_counts),
            "dropped_sentences": dict(dropped),
        },
        "undecodable_bytes_replaced": {
            where: n for s in sources for where, n in sorted(s.replacements.items())
        },
    }


def _entry(tally: _Tally, types: int, oov: int) -> dict[str, Any]:
    return {
        "documents": tally.documents,
        "sentences": tally.sentences,
        "tokens": tally.tokens,
        "types": types,
        "oov_rate": round(oov / tally.tokens, 6) if tally.tokens else 0.0,
    }


class _UnigramModel:
    """Add-one unigram LM of the training split: vocabulary words, <UNK> for the rest, and </S>.

    Its perplexity on valid and test is the floor a neural LM must beat by a wide margin.
    """

    def __init__(self, train_counts: Counter[str], in_vocab: set[str], sentences: int) -> None:
        self.counts = {t: c for t, c in train_counts.items() if t in in_vocab}
        unk = sum(train_counts.values()) - sum(self.counts.values())
        denom = sum(train_counts.values()) + sentences + len(self.counts) + 2
        self.log_denom = math.log(denom)
        self.log_unk = math.log(unk + 1)
        self.log_eos = math.log(sentences + 1)

    def nll(self, counts: Counter[str], sentences: int) -> float:
        """Total negative log-likelihood of the tokens in ``counts`` and ``sentences`` </S>."""
        total = sentences * (self.log_denom - self.log_eos)
        for token, count in counts.items():
            known = self.counts.get(token)
            log_p = (math.log(known + 1) if known else self.log_unk) - self.log_denom
            total -= count * log_p
        return total
