"""The embedding engine: sentences in, every layer of the biLM for every token out.

Two ways to run, as ``stateful`` says:

- stateless (the default, and the right one for feature extraction): every sentence starts from
  zero states, so the result for a sentence does not depend on its neighbours. The engine sorts
  the sentences by length (longest first) and cuts that order into batches, which keeps padding
  to a minimum; the outputs equal a file-order run up to float rounding (1e-5).
- stateful: lines in file order, ``batch_size`` consecutive lines per batch, and row r of each
  batch starts from the states where row r of the previous batch ended, as bilm-tf and the
  reference PyTorch port ran (the reference fixture's outputs were made this way).

Both run the char CNN once per distinct token of the whole run (``TokenVectorCache``): a
token's vector does not depend on its sentence.

Input files hold one whitespace-tokenized sentence per line, in UTF-8.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from elmolab.core.errors import ElmolabError
from elmolab.io.features import open_feature_writer
from elmolab.models.bilm import BiLM
from elmolab.models.char_cnn import CharCNN
from elmolab.text.chars import MAX_CHARACTERS_PER_TOKEN, char_ids_for_token

DEFAULT_BATCH_SIZE = 256  # sentences per batch, as extract.batch_size (bench/extract.py)
CACHE_CAPACITY = 100_000  # token types kept (200 MiB at projection 512); then the cache restarts


def read_sentences(path: str | os.PathLike[str]) -> list[str]:
    """The lines of ``path``, stripped; ElmolabError (file and line) for a line that is empty
    or not UTF-8. A final newline does not make an empty line; a UTF-8 byte order mark is dropped.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ElmolabError("no such input file", path) from None
    except OSError as error:
        raise ElmolabError(f"cannot read input file: {error.strerror}", path) from None
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    sentences = []
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ElmolabError(
                f"not valid UTF-8 (byte {error.start + 1} of the line)", path, number
            ) from None
        text = text.removeprefix("\ufeff").strip() if number == 1 else text.strip()
        if not text:
            raise ElmolabError("empty line: every line must hold one sentence", path, number)
        sentences.append(text)
    if not sentences:
        raise ElmolabError("no sentences in the input file", path)
    return sentences


def _table_rows(sentences: Sequence[Sequence[str]], row_of: dict[str, int]) -> Tensor:
    """(batch, time) long: the table row of every token, 0 past the end of each sentence."""
    time = max((len(tokens) for tokens in sentences), default=0)
    rows = torch.zeros(len(sentences), time, dtype=torch.long)  # (batch, time)
    for b, tokens in enumerate(sentences):
        rows[b, : len(tokens)] = torch.tensor([row_of[t] for t in tokens], dtype=torch.long)
    return rows


class TokenVectorCache:
    """Context-free token vectors, each computed once by the char CNN and then looked up.

    Holds one (proj,) vector per distinct token met; past ``capacity`` types it starts over.
    """

    def __init__(
        self,
        encoder: CharCNN,
        max_chars: int = MAX_CHARACTERS_PER_TOKEN,
        capacity: int = CACHE_CAPACITY,
    ) -> None:
        self.encoder = encoder
        self.max_chars = max_chars
        self.capacity = capacity
        self._rows: dict[str, int] = {}  # token -> row of the table; row 0 is padding
        self._table = encoder.b_proj.new_zeros(1, encoder.b_proj.shape[0])  # (rows, proj)

    def lookup(self, sentences: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Vectors (batch, time, proj), zero past each sentence, and the mask (batch, time)."""
        new = list(dict.fromkeys(t for tokens in sentences for t in tokens if t not in self._rows))
        if len(self._rows) + len(new) > self.capacity:
            self._rows.clear()
            new = list(dict.fromkeys(t for tokens in sentences for t in tokens))
        if new:
            self._add(new)
        rows = _table_rows(sentences, self._rows).to(self._table.device)  # (batch, time)
        return self._table[rows], rows > 0  # (batch, time, proj), (batch, time)

    def _add(self, tokens: list[str]) -> None:
        ids = torch.tensor([char_ids_for_token(t, self.max_chars) for t in tokens])  # (new, chars)
        vectors = self.encoder.encode_tokens(ids.to(self._table.device))  # (new, proj)
        first = len(self._rows) + 1
        needed = first + len(tokens)
        if needed > self._table.shape[0]:  # grow geometrically: amortised O(1) per token
            table = self._table.new_zeros(max(needed, 2 * self._table.shape[0]), vectors.shape[1])
            table[:first] = self._table[:first]
            self._table = table
        self._table[first:needed] = vectors
        self._rows.update(zip(tokens, range(first, needed), strict=True))


def embed_sentences(
    model: BiLM,
    sentences: Sequence[Sequence[str]],
    batch_size: int = DEFAULT_BATCH_SIZE,
    stateful: bool = False,
) -> Iterator[tuple[int, Tensor]]:
    """Yield ``(index, layers)`` for every sentence, ``layers`` (n_layers + 1, n_tokens, 2 * proj).

    Stateless runs yield in length order, stateful runs in input order (see the module
    docstring). Runs on the model's device without gradients. The model's ``stateful`` setting
    is restored afterwards; its states are reset before and after.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = list(range(len(sentences)))
    if not stateful:
        order.sort(key=lambda i: len(sentences[i]), reverse=True)
    cache = TokenVectorCache(model.token_encoder, model.options.char_cnn.max_characters_per_token)
    was_stateful = model.stateful
    model.stateful = stateful
    model.reset_states()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                tokens, mask = cache.lookup([sentences[i] for i in rows])  # (batch, time, proj)
                layers = model.contextualize(tokens, mask).layers  # (batch, layers, time, 2 * proj)
                for r, i in enumerate(rows):
                    yield i, layers[r, :, : len(sentences[i])]
    finally:
        model.stateful = was_stateful
        model.reset_states()


def embed_file(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    model: BiLM,
    layers: str = "all",
    batch_size: int = DEFAULT_BATCH_SIZE,
    stateful: bool = False,
    dtype: str = "float32",
) -> int:
    """Embed every line of ``input_path`` into the feature file ``output_path`` (format in
    ``elmolab.io.features``; ``layers`` is ``all``, ``top`` or ``average``). The output appears
    only when complete. Returns the number of sentences.
    """
    lines = read_sentences(input_path)
    sentences = [line.split() for line in lines]
    with open_feature_writer(output_path, layers, dtype) as writer:
        for index, array in embed_sentences(model, sentences, batch_size, stateful):
            writer.write(index, lines[index], array.float().cpu().numpy())
    return len(lines)
