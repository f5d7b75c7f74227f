"""A tagging split in memory and its padded batches.

Every token has a context-free vector (the token encoder's layer 0: the biLM's char CNN, the
GloVe analogue of the ELMo paper's baseline), a word id (the task model's own embedding) and a tag
id; with an ELMo input also the mix encoder's layers ``h_0 .. h_L``. The tokens of all sentences
lie one after the other, as in the probe stage's splits (``elmolab.probing.datasets``), and a
batch gathers its sentences' rows into padded ``(batch, time)`` tensors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler

# Word id of every word outside the vocabulary, and of padding (masked everywhere).
UNKNOWN = 0


class WordVocabulary:
    """The lowercased training words seen at least ``min_count`` times -> ids ``1 .. n``;
    every other word is :data:`UNKNOWN` (0). Case is left to the context-free vector, whose
    char CNN reads it."""

    def __init__(self, train_sentences: Iterable[Sequence[str]], min_count: int) -> None:
        counts = Counter(token.lower() for sentence in train_sentences for token in sentence)
        kept = sorted(word for word, count in counts.items() if count >= min_count)
        self._ids = {word: i for i, word in enumerate(kept, start=1)}

    def __len__(self) -> int:
        """Ids in use, :data:`UNKNOWN` included."""
        return len(self._ids) + 1

    def encode(self, sentences: Iterable[Sequence[str]]) -> list[list[int]]:
        """The word ids of each sentence."""
        return [[self._ids.get(token.lower(), UNKNOWN) for token in s] for s in sentences]


@dataclass(frozen=True)
class TaggingSplit:
    """One split of a tagging task, every sentence's tokens one after the other.

    Attributes
    ----------
    token : ``torch.Tensor``
        ``(tokens, token_dim)`` the context-free vector of each token (float16 or float32).
    layers : ``torch.Tensor``, optional
        ``(num_layers, tokens, dim)`` the mix encoder's layers, the layer axis first as in
        feature files; None for an input without a mix.
    words : ``torch.Tensor``
        ``(tokens,)`` int64 :class:`WordVocabulary` ids.
    tags : ``torch.Tensor``
        ``(tokens,)`` int64 tag ids.
    sentence_lengths : ``tuple[int, ...]``
        Tokens per sentence (each at least 1; they sum to ``tokens``).
    chars : ``torch.Tensor``, optional
        ``(tokens, 50)`` int16 character ids of each token (``elmolab.batch_to_ids``'), for an
        input whose biLM runs inside the tagger (fine-tuning); None otherwise.
    """

    token: torch.Tensor
    layers: torch.Tensor | None
    words: torch.Tensor
    tags: torch.Tensor
    sentence_lengths: tuple[int, ...]
    chars: torch.Tensor | None = None

    def __post_init__(self) -> None:
        tokens = self.token.shape[0]
        sizes = [self.words.shape, self.tags.shape, (sum(self.sentence_lengths),)]
        if self.layers is not None:
            sizes.append(self.layers.shape[1:2])
        if self.chars is not None:
            sizes.append(self.chars.shape[:1])
        if any(tuple(size) != (tokens,) for size in sizes):
            raise ValueError(f"{tokens} token vectors but sizes {sizes}")
        if min(self.sentence_lengths, default=0) < 1:
            raise ValueError("a tagging split needs sentences of at least one token")

    def __len__(self) -> int:
        """The number of sentences."""
        return len(self.sentence_lengths)

    @property
    def starts(self) -> torch.Tensor:
        """``(sentences,)`` the row of each sentence's first token."""
        lengths = torch.tensor(self.sentence_lengths, dtype=torch.int64)
        return lengths.cumsum(0) - lengths

    def gold_sentences(self) -> list[list[int]]:
        """The tag ids of each sentence."""
        return [t.tolist() for t in self.tags.split(self.sentence_lengths)]


class PadBatch:
    """The padded batch of a list of sentence indices of ``split`` (a DataLoader's collate_fn).

    Returns ``token`` ``(B, T, token_dim)`` float32, ``words``, ``tags`` ``(B, T)`` int64,
    ``mask`` ``(B, T)`` bool (True at real tokens), ``lengths`` and ``index`` ``(B,)`` int64,
    for a split with a mix ``layers`` ``(num_layers, B, T, dim)`` float32, and for a split with
    character ids ``chars`` ``(B, T, 50)`` int64, 0 at padding (as ``elmolab.batch_to_ids`` pads).
    Padding positions of the other fields hold row 0's values: every consumer masks them.
    """

    def __init__(self, split: TaggingSplit) -> None:
        self.split = split
        self.starts = split.starts

    def __call__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))  # (B,)
        lengths = torch.tensor([self.split.sentence_lengths[i] for i in indices])  # (B,)
        positions = torch.arange(int(lengths.max()))  # (T,)
        mask = positions[None, :] < lengths[:, None]  # (B, T)
        rows = torch.where(mask, self.starts[index][:, None] + positions[None, :], 0)  # (B, T)
        batch = {
            "token": self.split.token[rows].float(),  # (B, T, token_dim)
            "words": self.split.words[rows],
            "tags": self.split.tags[rows],
            "mask": mask,
            "lengths": lengths,
            "index": index,
        }
        if self.split.layers is not None:
            batch["layers"] = self.split.layers[:, rows].float()  # (L, B, T, dim)
        if self.split.chars is not None:
            chars = self.split.chars[rows].long()  # (B, T, 50)
            batch["chars"] = torch.where(mask[:, :, None], chars, 0)
        return batch


class LengthSortedBatches(Sampler[list[int]]):
    """Evaluation batches: sentence indices in batches of similar lengths (little padding), the
    same every time."""

    def __init__(self, split: TaggingSplit, batch_size: int) -> None:
        order = np.argsort(np.asarray(split.sentence_lengths), kind="stable").tolist()
        self.batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)
