"""Feature files in the format of the removed ``allennlp elmo`` command.

One HDF5 dataset per input line, named ``str(line_index)`` (0-based):

- ``all``: ``(n_layers + 1, n_tokens, 2 * proj)``, every layer of the biLM;
- ``top``: ``(n_tokens, 2 * proj)``, the last layer;
- ``average``: ``(n_tokens, 2 * proj)``, the mean of the layers;

stored as float32 (float16 on request; readers get float32), plus ``sentence_to_index``: a
one-element string dataset holding ``json.dumps({line_text: "line_index"})``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence

import h5py
import numpy as np

from elmolab.errors import ElmolabError
from elmolab.fsutil import atomic_path

LAYER_MODES = ("all", "top", "average")
STORAGE_DTYPES = ("float32", "float16")
SENTENCE_TO_INDEX = "sentence_to_index"

PathLike = str | os.PathLike[str]


def select_layers(layers: np.ndarray, mode: str) -> np.ndarray:
    """``layers``: (n_layers + 1, n_tokens, dim) -> the array stored for ``mode``."""
    if mode == "all":
        return layers
    if mode == "top":
        return layers[-1]
    if mode == "average":
        return layers.mean(axis=0)
    raise ValueError(f"layer mode must be one of {LAYER_MODES}, got {mode!r}")


class FeatureWriter:
    """Adds lines to a feature file opened by ``open_feature_writer``."""

    def __init__(self, file: h5py.File, mode: str, dtype: str) -> None:
        self._file = file
        self.mode = mode
        self.dtype = dtype
        self._sentence_to_index: dict[str, str] = {}

    def write(self, index: int, sentence: str, layers: np.ndarray) -> None:
        """Store line ``index`` (text ``sentence``), ``layers`` (n_layers + 1, n_tokens, dim)."""
        data = select_layers(np.asarray(layers, dtype=np.float32), self.mode)
        self._file.create_dataset(str(index), data=data.astype(self.dtype, copy=False))
        self._sentence_to_index[sentence] = str(index)

    def finish(self) -> None:
        """Write ``sentence_to_index``; called once, after the last line."""
        dataset = self._file.create_dataset(
            SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(encoding="utf-8")
        )
        dataset[0] = json.dumps(self._sentence_to_index)


@contextlib.contextmanager
def open_feature_writer(
    path: PathLike, mode: str = "all", dtype: str = "float32"
) -> Iterator[FeatureWriter]:
    """A writer for a new feature file that appears at ``path`` only if the ``with`` block
    ends without an exception (``mode``: all, top or average; ``dtype``: float32 or float16).

    >>> with open_feature_writer("out.hdf5", mode="all") as writer:
    ...     writer.write(0, "The cat .", layers)  # layers: (n_layers + 1, n_tokens, dim)
    """
    if mode not in LAYER_MODES:
        raise ValueError(f"layer mode must be one of {LAYER_MODES}, got {mode!r}")
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype must be one of {STORAGE_DTYPES}, got {dtype!r}")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as fout:
        writer = FeatureWriter(fout, mode, dtype)
        yield writer
        writer.finish()


class FeatureReader:
    """Reads and checks a feature file; every problem is an ElmolabError naming the file.

    On opening it checks that the datasets are exactly ``"0" .. str(n - 1)`` plus
    ``sentence_to_index``, that all have the same layout (``all`` or a single layer) and width,
    and, given ``n_tokens`` (one count per line), that the counts agree. ``reader[i]`` is the
    float32 array of line ``i``; ``all_layers`` tells the ``all`` layout from a single layer.
    """

    def __init__(self, path: PathLike, n_tokens: Sequence[int] | None = None) -> None:
        self.path = path
        if not os.path.isfile(path):
            raise ElmolabError("no such feature file", path)
        try:
            self._file = h5py.File(path, "r")
        except OSError as error:
            raise ElmolabError(f"not a readable HDF5 file: {error}", path) from None
        try:
            self._check(n_tokens)
        except BaseException:
            self._file.close()
            raise

    def _check(self, n_tokens: Sequence[int] | None) -> None:
        if SENTENCE_TO_INDEX not in self._file:
            raise ElmolabError(f"no '{SENTENCE_TO_INDEX}' dataset", self.path)
        try:
            self.sentence_to_index: dict[str, str] = json.loads(self._file[SENTENCE_TO_INDEX][0])
        except (ValueError, TypeError) as error:
            raise ElmolabError(f"'{SENTENCE_TO_INDEX}' is not JSON: {error}", self.path) from None
        keys = set(self._file.keys()) - {SENTENCE_TO_INDEX}
        self._length = len(keys)
        if keys != {str(i) for i in range(self._length)}:
            odd = sorted(keys - {str(i) for i in range(self._length)})
            raise ElmolabError(
                f"datasets must be named 0 .. {self._length - 1}, found {odd[:5]}", self.path
            )
        if n_tokens is not None and len(n_tokens) != self._length:
            raise ElmolabError(f"{self._length} lines, expected {len(n_tokens)}", self.path)
        layout: tuple[int, ...] | None = None  # shape without the token axis
        for i in range(self._length):
            shape = self._file[str(i)].shape
            if len(shape) not in (2, 3):
                raise ElmolabError(f"line index {i}: shape {shape} is not 2-D or 3-D", self.path)
            this = shape[:-2] + shape[-1:]
            if layout is None:
                layout = this
            elif this != layout:
                raise ElmolabError(
                    f"line index {i}: shape {shape} does not match line 0 (layers, width) {layout}",
                    self.path,
                )
            if n_tokens is not None and shape[-2] != n_tokens[i]:
                raise ElmolabError(
                    f"line index {i}: {shape[-2]} token vectors, expected {n_tokens[i]}",
                    self.path,
                )
        self.all_layers = layout is not None and len(layout) == 2  # else one layer (top/average)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._file[str(index)][...].astype(np.float32, copy=False)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(self._length))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> FeatureReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_features(path: PathLike, n_tokens: Sequence[int] | None = None) -> list[np.ndarray]:
    """Every line's array (float32), checked as ``FeatureReader`` does."""
    with FeatureReader(path, n_tokens) as reader:
        return list(reader)
