"""The language-model batches of bilm-tf: ``batch_size`` streams of packed sentences, both ways.

Packing (bilm-tf's ``_get_batch``). Each row of a batch is one stream. A stream reads sentences
one after another; the sentence ``<S> w1 .. wn </S>`` contributes the ``n + 1`` (input, target)
pairs ``(<S>, w1), (w1, w2), .., (wn, </S>)``, and a row takes exactly ``unroll_steps``
consecutive pairs, so a sentence may go on in the same row of the next batch (the LSTM state
carries over between batches). Along a stream the targets are the inputs shifted by one, except
that a target ``</S>`` is followed by the input ``<S>`` of the next sentence: ``</S>`` is never an
input and ``<S>`` never a target, as in bilm-tf.

Backward direction. The same stream with every sentence reversed, ``</S> wn .. w1 <S>``
(bilm-tf's ``reverse=True`` encoding), sentences in the same order. bilm-tf gives its backward
stream an independent shuffle; with sentences shuffled, the order across sentence boundaries
carries no information either way, and reusing the forward order reads each sentence once for
both directions. A reversed sentence has the same ``n + 1`` pairs, so row ``r`` of both
directions covers the same sentences at the same positions and one mask serves both.

Inputs are the +1-shifted character ids the BiLM takes (0 = padding, ``chars.py``) and the
vocabulary ids of the input tokens; targets are vocabulary ids (``<UNK>`` for unknown words,
whose inputs keep their real characters). Char ids of vocabulary words come from a ``(V, 50)``
table built once; those of other words are computed when met.

Order. Per data epoch (one pass over the corpus), every sentence of every shard in one
permutation by ``numpy.random.default_rng([seed, epoch])`` (bilm-tf reads shard by shard, which
suits its shards, random slices of one corpus, but not the prepare stage's, one source each:
docs/pretraining.md). Global stream ``g`` of ``G = world_size * batch_size`` reads the epoch's
sentences ``g, g + G, g + 2G, ..`` and then goes on into the next epoch, forever. Row ``i`` of
rank ``r`` is global stream ``r * batch_size + i``: ranks read disjoint sentences, and the
streams do not depend on how they are split among ranks.

Position. Every stream advances exactly ``unroll_steps`` pairs per batch, so the data position
after ``n`` batches is ``n`` itself: ``seek(n)`` recovers each stream's sentence and offset from
per-sentence pair counts (a cumulative sum and a binary search, no replay). The state is
``{"next_batch": n, "seed", "global_streams", "unroll_steps"}``; every rank consumes the same
number of batches, so the state rank 0 writes into a checkpoint resumes every rank.

Sentence starts. ``sentence_start`` marks the pair whose input is ``<S>`` (forward) and ``</S>``
(backward): the same positions in both directions. Training may restart the LSTMs from zero
there, and the stateless evaluation always does.

Evaluation. A single pass in file order, sentence ``j`` going to global stream ``j mod G``,
packed the same way and meant to be run with the state carried, as in training. A stream that
runs out is padded (ids 0, ``mask`` False); every rank yields as many batches as the longest
global stream needs, so DDP ranks stay in step. Each pass starts afresh from the first sentence.

Corpus files: ``<corpus_dir>/{train,valid,test}/shard-*.txt`` (one sentence per line, tokens
separated by single spaces, UTF-8) and ``<corpus_dir>/vocab.txt``. Shards are indexed once (a
byte offset and a token count per sentence, validated line by line) and read on demand.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

import lightning.pytorch as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from elmolab.core.errors import ElmolabError
from elmolab.text.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARACTERS_PER_TOKEN, char_ids_for_token
from elmolab.text.vocab import Vocabulary, token_problem


class LMBatch(TypedDict):
    """One batch of both directions; rows are streams, row ``r`` continues row ``r`` of the last.

    All tensors are long except ``mask`` (bool). The backward tensors are already in the order
    the backward LSTM reads (``</S> wn .. w1 <S>``), not to be reversed again.
    """

    forward_char_ids: torch.Tensor  # (batch, unroll, 50) +1-shifted char ids of the inputs
    forward_token_ids: torch.Tensor  # (batch, unroll) vocabulary ids of the inputs
    forward_targets: torch.Tensor  # (batch, unroll) vocabulary ids of the next tokens
    backward_char_ids: torch.Tensor  # (batch, unroll, 50) the same for the reversed sentences
    backward_token_ids: torch.Tensor  # (batch, unroll)
    backward_targets: torch.Tensor  # (batch, unroll)
    mask: torch.Tensor  # (batch, unroll) True where a pair is real (False only as eval padding)
    sentence_start: torch.Tensor  # (batch, unroll) True at a sentence's first pair (input <S>)
    batch_index: int  # how many batches the streams produced before this one


def _split_line(raw: bytes, path: Path, line: int) -> list[str]:
    """The tokens of one shard line, or ElmolabError naming ``path:line``."""
    try:
        text = raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError as error:
        raise ElmolabError(f"not valid UTF-8 ({error.reason})", path, line) from None
    if not text:
        raise ElmolabError("empty line; every line must hold one sentence", path, line)
    tokens = text.split(" ")
    if text.split() != tokens:
        if "" in tokens:
            problem = "two spaces in a row, or a space at the start or end of the line"
        else:
            problem = next(p for p in map(token_problem, tokens) if p is not None)
        raise ElmolabError(f"{problem}; tokens are separated by single spaces", path, line)
    if (BOS_TOKEN in text or EOS_TOKEN in text) and (BOS_TOKEN in tokens or EOS_TOKEN in tokens):
        raise ElmolabError(
            f"{BOS_TOKEN} and {EOS_TOKEN} are added around each sentence by the data pipeline "
            "and cannot appear in the text",
            path,
            line,
        )
    return tokens


def _index_shard(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets of the lines of ``path`` with the end offset, int64 ``(lines + 1,)``, and
    their token counts, int32 ``(lines,)``; validates every line."""
    offsets = array("q", [0])
    lengths = array("i")
    with path.open("rb") as file:
        for line, raw in enumerate(file, start=1):
            lengths.append(len(_split_line(raw, path, line)))
            offsets.append(offsets[-1] + len(raw))
    return np.frombuffer(offsets, dtype=np.int64), np.frombuffer(lengths, dtype=np.int32)


class ShardedCorpus:
    """The sentences of one split, indexed by byte offset and read from disk when asked for.

    Memory holds the index only: 12 bytes per sentence. Sentence ids run over the shards in
    the order given (line ``l`` of shard ``s`` is ``shard_starts[s] + l``). Building the index
    reads and validates every line: an empty line, bad UTF-8, a token with whitespace in it, a
    double space or a literal ``<S>``/``</S>`` raise ElmolabError naming the shard and line.
    """

    def __init__(self, shard_paths: Sequence[str | Path]) -> None:
        self.shard_paths = tuple(Path(path) for path in shard_paths)
        indexes = [_index_shard(path) for path in self.shard_paths]
        self._offsets = [offsets for offsets, _ in indexes]
        counts = [len(lengths) for _, lengths in indexes]
        # (shards + 1,) the id of each shard's first sentence, then the number of sentences
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.lengths = np.concatenate([lengths for _, lengths in indexes])  # (sentences,) int32
        self._files: dict[int, BinaryIO] = {}

    @classmethod
    def from_dir(cls, split_dir: str | Path) -> ShardedCorpus:
        """The corpus of ``split_dir/shard-*.txt``, shards in name order."""
        shards = sorted(Path(split_dir).glob("shard-*.txt"))
        if not shards:
            raise ElmolabError("no shard-*.txt files; run the prepare stage first", split_dir)
        return cls(shards)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def n_tokens(self) -> int:
        """Words in the corpus, sentence marks not counted."""
        return int(self.lengths.sum())

    def tokens(self, sentence: int) -> list[str]:
        """The tokens of sentence ``sentence``, read from its shard."""
        shard = int(np.searchsorted(self.shard_starts, sentence, side="right")) - 1
        line = sentence - int(self.shard_starts[shard])
        start, end = self._offsets[shard][line : line + 2]
        if shard not in self._files:
            self._files[shard] = self.shard_paths[shard].open("rb")
        file = self._files[shard]
        file.seek(start)
        return _split_line(file.read(end - start), self.shard_paths[shard], line + 1)

    def close(self) -> None:
        """Close the shard files opened by ``tokens`` (they reopen when needed)."""
        for file in self._files.values():
            file.close()
        self._files.clear()

    def __getstate__(self) -> dict[str, Any]:
        # Open files do not travel to DataLoader workers; each process opens its own.
        return {**self.__dict__, "_files": {}}


class SentenceEncoder:
    """Token ids and +1-shifted char ids of sentences with their marks ``<S> .. </S>``.

    ``char_table`` holds the char ids of every vocabulary word, int16 ``(V, 50)`` indexed by
    token id; an out-of-vocabulary word (token id ``<UNK>``) gets its own char ids on the fly.
    """

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.char_table = torch.tensor(  # (vocab, 50)
            [char_ids_for_token(token) for token in vocab.tokens], dtype=torch.int16
        )
        self._table = self.char_table.numpy()

    def encode(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``<S> tokens </S>`` as token ids, int64 ``(n + 2,)``, and char ids, ``(n + 2, 50)``."""
        vocab = self.vocab
        id_list = [vocab.bos_id, *vocab.ids(tokens), vocab.eos_id]
        ids = np.array(id_list, dtype=np.int64)  # (n + 2,)
        chars = self._table[ids]  # (n + 2, 50)
        for position, token_id in enumerate(id_list):
            if token_id == vocab.unk_id:
                chars[position] = _unknown_word_char_ids(tokens[position - 1])
        return ids, chars


@functools.lru_cache(maxsize=1 << 16)
def _unknown_word_char_ids(token: str) -> np.ndarray:
    """Char ids of a word outside the vocabulary, int16 ``(50,)``; frequent ones recur."""
    return np.array(char_ids_for_token(token), dtype=np.int16)


def _shuffled_order(n_sentences: int, seed: int, epoch: int) -> np.ndarray:
    """Sentence ids of one data epoch: the sentences of every shard in one random order."""
    return np.random.default_rng([seed, epoch]).permutation(n_sentences)


@dataclasses.dataclass
class _Cursor:
    """Where one stream is: sentence ``order(epoch)[stream + index * G]``, ``offset`` pairs in."""

    stream: int  # the global stream index g
    sentences_per_epoch: int  # how many sentences stream g reads per data epoch
    epoch: int = 0
    index: int = 0
    offset: int = 0
    ids: np.ndarray | None = None  # (n + 2,) the current sentence, once read
    chars: np.ndarray | None = None  # (n + 2, 50)

    def move_to(self, epoch: int, index: int, offset: int) -> None:
        self.epoch, self.index, self.offset = epoch, index, offset
        self.ids = self.chars = None


class LMBatchIterator:
    """Batches of ``batch_size`` streams over ``corpus`` (see the module docstring).

    Args:
        corpus: the split to read.
        encoder: token and char ids.
        batch_size: streams (rows) on this rank.
        unroll_steps: pairs per row and batch.
        seed: shuffles every data epoch and streams forever (training); None reads the corpus
            once in file order, pads the streams that run out, and stops (evaluation).
        rank, world_size: this process's streams are ``rank * batch_size + i`` of
            ``world_size * batch_size``.

    Attributes:
        n_batches: batches of an evaluation pass, the same on every rank (None when training).
        n_targets: real (input, target) pairs per direction in this rank's evaluation pass.
    """

    def __init__(
        self,
        corpus: ShardedCorpus,
        encoder: SentenceEncoder,
        batch_size: int,
        unroll_steps: int,
        *,
        seed: int | None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1 or unroll_steps < 1:
            raise ValueError(
                f"need batch_size, unroll_steps >= 1, got {batch_size}, {unroll_steps}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        self._corpus = corpus
        self._encoder = encoder
        self._batch_size = batch_size
        self._unroll_steps = unroll_steps
        self._seed = seed
        self._global_streams = world_size * batch_size
        self._pairs = corpus.lengths.astype(np.int64) + 1  # (sentences,) pairs per sentence
        n_sentences = len(corpus)
        self._cursors = [
            _Cursor(stream, len(range(stream, n_sentences, self._global_streams)))
            for stream in range(rank * batch_size, (rank + 1) * batch_size)
        ]
        self._orders: dict[int, np.ndarray] = {}  # the data epochs the streams are reading
        self._next_batch = 0

        self.n_batches: int | None = None
        self.n_targets: int | None = None
        if seed is None:
            stream_pairs = [
                int(self._pairs[g :: self._global_streams].sum())
                for g in range(self._global_streams)
            ]
            self.n_batches = math.ceil(max(stream_pairs) / unroll_steps)
            self.n_targets = sum(stream_pairs[c.stream] for c in self._cursors)
        elif n_sentences < self._global_streams:
            raise ElmolabError(
                f"{n_sentences} sentences cannot feed {self._global_streams} streams "
                f"(batch_size {batch_size} x {world_size} processes)",
                corpus.shard_paths[0].parent,
            )
        self.seek(0)

    @property
    def next_batch(self) -> int:
        """The index of the batch ``next()`` returns."""
        return self._next_batch

    def __iter__(self) -> Iterator[LMBatch]:
        return self

    def __next__(self) -> LMBatch:
        if self.n_batches is not None and self._next_batch >= self.n_batches:
            raise StopIteration
        rows, steps, chars = self._batch_size, self._unroll_steps, MAX_CHARACTERS_PER_TOKEN
        forward_ids = np.zeros((rows, steps), dtype=np.int64)  # (batch, unroll)
        forward_targets = np.zeros((rows, steps), dtype=np.int64)  # (batch, unroll)
        forward_chars = np.zeros((rows, steps, chars), dtype=np.int64)  # (batch, unroll, 50)
        backward_ids = np.zeros((rows, steps), dtype=np.int64)  # (batch, unroll)
        backward_targets = np.zeros((rows, steps), dtype=np.int64)  # (batch, unroll)
        backward_chars = np.zeros((rows, steps, chars), dtype=np.int64)  # (batch, unroll, 50)
        mask = np.zeros((rows, steps), dtype=bool)  # (batch, unroll)
        starts = np.zeros((rows, steps), dtype=bool)  # (batch, unroll)
        for row, cursor in enumerate(self._cursors):
            filled = 0
            while filled < steps and self._read_sentence(cursor):
                ids, sentence_chars = cursor.ids, cursor.chars  # (n + 2,), (n + 2, 50)
                n_pairs = len(ids) - 1
                take = min(n_pairs - cursor.offset, steps - filled)
                inputs = slice(cursor.offset, cursor.offset + take)
                targets = slice(cursor.offset + 1, cursor.offset + take + 1)
                columns = slice(filled, filled + take)
                forward_ids[row, columns] = ids[inputs]
                forward_targets[row, columns] = ids[targets]
                forward_chars[row, columns] = sentence_chars[inputs]
                backward_ids[row, columns] = ids[::-1][inputs]
                backward_targets[row, columns] = ids[::-1][targets]
                backward_chars[row, columns] = sentence_chars[::-1][inputs]
                mask[row, columns] = True
                starts[row, filled] = cursor.offset == 0
                filled += take
                cursor.offset += take
                if cursor.offset == n_pairs:
                    self._next_sentence(cursor)
        batch = LMBatch(
            forward_char_ids=torch.from_numpy(forward_chars),
            forward_token_ids=torch.from_numpy(forward_ids),
            forward_targets=torch.from_numpy(forward_targets),
            backward_char_ids=torch.from_numpy(backward_chars),
            backward_token_ids=torch.from_numpy(backward_ids),
            backward_targets=torch.from_numpy(backward_targets),
            mask=torch.from_numpy(mask),
            sentence_start=torch.from_numpy(starts),
            batch_index=self._next_batch,
        )
        self._next_batch += 1
        oldest_epoch = min(cursor.epoch for cursor in self._cursors)
        for epoch in [epoch for epoch in self._orders if epoch < oldest_epoch]:
            del self._orders[epoch]
        return batch

    def seek(self, batch_index: int) -> None:
        """Move every stream to where it stands after ``batch_index`` batches.

        Stream ``g`` has then emitted ``batch_index * unroll_steps`` pairs: whole epochs are
        skipped by their pair totals, then a binary search over the cumulative pair counts of
        the stream's sentences finds the sentence and the offset inside it.
        """
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        pending = [(cursor, batch_index * self._unroll_steps) for cursor in self._cursors]
        epoch = 0
        while pending:
            order = self._epoch_order(epoch)
            unresolved = []
            for cursor, skip in pending:
                if order is None:  # an evaluation pass that this stream has finished
                    cursor.move_to(epoch, 0, 0)
                    continue
                pairs = self._pairs[order[cursor.stream :: self._global_streams]]  # (sentences,)
                total = int(pairs.sum())
                if skip >= total:
                    unresolved.append((cursor, skip - total))
                    continue
                ends = np.cumsum(pairs)  # (sentences,) pairs emitted once each sentence is done
                index = int(np.searchsorted(ends, skip, side="right"))
                cursor.move_to(epoch, index, skip - (int(ends[index - 1]) if index else 0))
            pending = unresolved
            epoch += 1
        self._orders.clear()
        self._next_batch = batch_index

    def state_dict(self) -> dict[str, int | None]:
        """The data position: ``next_batch`` plus the settings it is only valid for."""
        return {"next_batch": self._next_batch, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()``: the next batch is the one that would have come."""
        check_position_settings(state, self._settings())
        self.seek(state["next_batch"])

    def _settings(self) -> dict[str, int | None]:
        return {
            "seed": self._seed,
            "global_streams": self._global_streams,
            "unroll_steps": self._unroll_steps,
        }

    def _epoch_order(self, epoch: int) -> np.ndarray | None:
        """Sentence ids of data epoch ``epoch``; None past the single evaluation pass."""
        if self._seed is not None:
            return _shuffled_order(len(self._corpus), self._seed, epoch)
        return np.arange(len(self._corpus)) if epoch == 0 else None

    def _read_sentence(self, cursor: _Cursor) -> bool:
        """Make sure the cursor's sentence is loaded; False when its evaluation pass is over."""
        if cursor.ids is not None:
            return True
        if cursor.epoch not in self._orders:
            order = self._epoch_order(cursor.epoch)
            if order is None:
                return False
            self._orders[cursor.epoch] = order
        sentence = self._orders[cursor.epoch][cursor.stream + cursor.index * self._global_streams]
        cursor.ids, cursor.chars = self._encoder.encode(self._corpus.tokens(int(sentence)))
        return True

    def _next_sentence(self, cursor: _Cursor) -> None:
        if cursor.index + 1 < cursor.sentences_per_epoch:
            cursor.move_to(cursor.epoch, cursor.index + 1, 0)
        else:
            cursor.move_to(cursor.epoch + 1, 0, 0)


def check_position_settings(state: dict[str, Any], expected: dict[str, Any]) -> None:
    """ElmolabError unless a saved data position was made with the ``expected`` settings."""
    for key, value in expected.items():
        if state.get(key) != value:
            raise ElmolabError(
                f"the saved data position was made with {key} = {state.get(key)}, this run has "
                f"{value}; resuming with other data settings cannot continue the same streams"
            )


@dataclasses.dataclass
class _Position:
    """The next training batch; shared by the data module and its training dataset."""

    next_batch: int = 0


class _TrainBatches(IterableDataset):
    """One Lightning epoch of training batches: from the data module's position to the end of
    that epoch (batches ``[k * per_epoch, (k + 1) * per_epoch)``), or endless without one."""

    def __init__(
        self,
        make_iterator: Callable[[], LMBatchIterator],
        position: _Position,
        batches_per_epoch: int | None,
    ) -> None:
        self._make_iterator = make_iterator
        self._position = position
        self._batches_per_epoch = batches_per_epoch

    def __len__(self) -> int:
        if self._batches_per_epoch is None:
            raise TypeError("an endless training stream has no length")
        return self._batches_per_epoch

    def __iter__(self) -> Iterator[LMBatch]:
        start = self._position.next_batch  # read now: a DataLoader worker gets a copy
        iterator = self._make_iterator()
        iterator.seek(start)
        if self._batches_per_epoch is None:
            return iterator
        epoch_end = (start // self._batches_per_epoch + 1) * self._batches_per_epoch
        return itertools.islice(iterator, epoch_end - start)


class _EvalBatches(IterableDataset):
    """A full evaluation pass, the same number of batches on every rank."""

    def __init__(self, make_iterator: Callable[[], LMBatchIterator]) -> None:
        self._make_iterator = make_iterator
        self._n_batches = make_iterator().n_batches

    def __len__(self) -> int:
        return self._n_batches

    def __iter__(self) -> Iterator[LMBatch]:
        return self._make_iterator()


class LMDataModule(L.LightningDataModule):
    """bilm-tf's training and evaluation batches for Lightning, resumable mid-epoch.

    A Lightning epoch is ``n_train_tokens // (batch_size * unroll_steps * world_size)`` batches
    (bilm-tf's ``n_batches_per_epoch``); with ``n_train_tokens`` None the training stream has
    no length and the trainer needs ``max_steps``. Streams continue across Lightning epochs.

    Resuming: ``on_before_batch_transfer`` records each training batch as it is used, and
    ``state_dict``/``load_state_dict`` (stored in the checkpoint by Lightning) hold that
    position, so a resumed run gets exactly the batch that would have come next. Lightning
    calls only one ``on_before_batch_transfer``, the data module's when both define it (with a
    warning), so the LightningModule must not rely on its own. The position is valid only for
    the same seed, ``batch_size * world_size`` and ``unroll_steps`` (ElmolabError otherwise).
    Lightning still warns that the dataloader "is not resumable" when resuming mid-epoch: it
    only looks for a stateful dataloader, not at the data module's state.

    Args:
        corpus_dir: the prepare stage's output: ``vocab.txt`` and ``train/``, ``valid/``,
            ``test/`` shards.
        batch_size: streams per process (bilm-tf: 128 per GPU).
        unroll_steps: tokens per row (bilm-tf: 20).
        seed: the shuffle of every data epoch.
        n_train_tokens: defines the Lightning epoch length (None: endless).
        num_workers: 0 builds batches in the training process, 1 in one worker process that
            works ahead; more would split one sequential stream and is refused.
    """

    def __init__(
        self,
        corpus_dir: str | Path,
        batch_size: int = 128,
        unroll_steps: int = 20,
        seed: int = 0,
        n_train_tokens: int | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if num_workers not in (0, 1):
            raise ValueError(
                f"num_workers must be 0 or 1 (one sequential stream), got {num_workers}"
            )
        corpus_dir = str(corpus_dir)  # a Path in the hyperparameters breaks weights_only loading
        self.save_hyperparameters()
        self.corpus_dir = Path(corpus_dir)
        self.batch_size = batch_size
        self.unroll_steps = unroll_steps
        self.seed = seed
        self.n_train_tokens = n_train_tokens
        self.num_workers = num_workers
        self.vocab: Vocabulary | None = None
        self.encoder: SentenceEncoder | None = None
        self.corpora: dict[str, ShardedCorpus] = {}
        self._position = _Position()

    def setup(self, stage: str) -> None:
        """Load the vocabulary and index the splits ``stage`` needs (fit: train and valid)."""
        if self.vocab is None:
            self.vocab = Vocabulary.from_file(self.corpus_dir / "vocab.txt")
            self.encoder = SentenceEncoder(self.vocab)
        splits = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",)}
        for split in splits.get(stage, ()):
            if split not in self.corpora:
                self.corpora[split] = ShardedCorpus.from_dir(self.corpus_dir / split)

    def teardown(self, stage: str) -> None:
        for corpus in self.corpora.values():
            corpus.close()

    @property
    def batches_per_epoch(self) -> int | None:
        """Training batches per Lightning epoch on each process (None: endless)."""
        if self.n_train_tokens is None:
            return None
        _, world_size = self._rank_and_world_size()
        tokens_per_batch = self.batch_size * self.unroll_steps * world_size
        return max(1, self.n_train_tokens // tokens_per_batch)

    def train_dataloader(self) -> DataLoader:
        dataset = _TrainBatches(
            self._iterator_factory("train", self.seed), self._position, self.batches_per_epoch
        )
        return _loader(dataset, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._eval_dataloader("test")

    def on_before_batch_transfer(self, batch: LMBatch, dataloader_idx: int) -> LMBatch:
        if self.trainer is not None and self.trainer.training:
            self._position.next_batch = batch["batch_index"] + 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The training data position (``LMBatchIterator.state_dict`` format)."""
        return {"next_batch": self._position.next_batch, **self._position_settings()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_position_settings(state_dict, self._position_settings())
        self._position.next_batch = state_dict["next_batch"]

    def _position_settings(self) -> dict[str, Any]:
        _, world_size = self._rank_and_world_size()
        return {
            "seed": self.seed,
            "global_streams": self.batch_size * world_size,
            "unroll_steps": self.unroll_steps,
        }

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def _iterator_factory(self, split: str, seed: int | None) -> Callable[[], LMBatchIterator]:
        if self.encoder is None or split not in self.corpora:
            raise RuntimeError(f"call setup() for a stage that reads {split!r} first")
        rank, world_size = self._rank_and_world_size()
        return functools.partial(
            LMBatchIterator,
            self.corpora[split],
            self.encoder,
            self.batch_size,
            self.unroll_steps,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )

    def _eval_dataloader(self, split: str) -> DataLoader:
        dataset = _EvalBatches(self._iterator_factory(split, seed=None))
        return _loader(dataset, self.num_workers)


def _loader(dataset: IterableDataset, num_workers: int) -> DataLoader:
    """A DataLoader that leaves the global torch generator alone: making an iterator draws a
    base seed, and drawing it from the global generator would shift dropout and the sampled
    softmax by whenever validation ran or a run resumed."""
    return DataLoader(
        dataset, batch_size=None, num_workers=num_workers, generator=torch.Generator()
    )
