"""Extract stage: every biLM layer for every split of every probing dataset, per encoder.

An encoder (``extract.encoders.<name>``, resolved by :func:`encoder_files`) is a biLM folder (the
trained model, its random-initialisation control, a published ELMo's download folder, ...) or
bilm-tf's two files named directly, ``{options: <file>, weights: <file>}``. For each encoder and
each split of each dataset of ``extract.datasets`` (read by ``elmolab.data.catalogue.read_split``)::

    <out>/<encoder>/<dataset>/<split>.hdf5            features, docs/architecture.md §3 format
    <out>/<encoder>/<dataset>/<split>.tokens.txt      token datasets: the tokens of each line
    <out>/<encoder>/<dataset>/<split>.instances.txt   WSD datasets: the instance ids of each line
    <out>/<encoder>/<dataset>/extract.json            the model's files, counts and throughput

Line ``i`` of a feature file (dataset ``str(i)``) is sentence ``i`` of the split:
``(n_layers + 1, n_units, 2 * proj)`` with one unit per token, or, for WSD, one per sense-tagged
instance (only sentences with instances are kept; SemCor's 225k instances take under a third of
the disk its 778k tokens would). Multiword WSD tokens are read by the biLM as separate words and the
instance gets the mean of its words' vectors (see ``elmolab.data.catalogue``). The sidecar text
file has one line per feature line, its units separated by single spaces; the probe stage checks it
against the data it reads (``elmolab.data.catalogue.read_split_features``), so features extracted
from other data fail loudly instead of being silently misaligned. The files' formats and names
are ``elmolab.io.features``'s.

Sentences start from zero LSTM states (``stateful: false``, the default; bilm-tf's carried states
are an option) and run through ``elmolab.embed.embed_sentences``: length-sorted batches, the char
CNN once per distinct token. Features are stored as float16 by default (half the disk; the probes
compute in float32). Each encoder's folder of a dataset appears only when complete, and each
feature file carries the digest of the dataset's configuration and raw files it comes from
(``elmolab.data.catalogue.dataset_digest``): DVC runs one stage per dataset (``extract.dataset``),
and a probe cell tracks the feature files of its own splits only, so a changed label must reach
those files even where the features come out the same."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmolab.core.errors import ElmolabError
from elmolab.core.failpoints import failpoint
from elmolab.core.fsutil import atomic_dir, atomic_path, write_json
from elmolab.core.hardware import peak_memory
from elmolab.core.schema import ExtractConfig
from elmolab.data.catalogue import DataCatalog, SplitSource, dataset_digest, multiword_parts
from elmolab.embed import DEFAULT_BATCH_SIZE, embed_sentences
from elmolab.io.features import (
    DATASET_DIGEST,
    ENCODER_SUMMARY,
    STORAGE_DTYPES,
    open_feature_writer,
    split_path,
    units_path,
)
from elmolab.models.bilm import BiLM
from elmolab.models.controls import token_layer_digest
from elmolab.models.encoder_files import EncoderFiles, encoder_files

log = logging.getLogger("elmolab.extract")


def extract(config: ExtractConfig, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Write the features of every split of the selected datasets for the selected encoders,
    one folder ``<out_dir>/<encoder>/<dataset>`` each; returns their summaries, by encoder and
    dataset."""
    if config.dtype not in STORAGE_DTYPES:
        raise ElmolabError(f"extract.dtype must be one of {STORAGE_DTYPES}, got {config.dtype!r}")
    if config.batch_size < 1:
        raise ElmolabError(f"extract.batch_size must be at least 1, got {config.batch_size}")
    datasets = _selected(config.datasets, config.dataset, "dataset")
    # Every selected encoder's files are found before anything is read or written.
    files = {
        name: encoder_files(source, key)
        for name, (key, source) in config.selected_encoders().items()
    }
    torch.set_num_threads(config.num_threads)
    device = _device(config.device)
    catalog = DataCatalog(datasets, config.max_sentences)
    sources = catalog.sources()
    for source in sources:
        _check_units(source)
    by_dataset = {name: [s for s in sources if s.dataset == name] for name in datasets}
    _check_free_space(out_dir, files, sources, config.dtype)
    digests = {name: dataset_digest(name, dataset) for name, dataset in datasets.items()}
    summaries: dict[str, dict[str, Any]] = {}
    for encoder, found in files.items():
        model = found.load().to(device)
        # Equal digests: identical layer-0 features (the token-layer control's, e.g.).
        token_layer = token_layer_digest(model)
        summaries[encoder] = {}
        for dataset, digest in digests.items():
            started = time.perf_counter()
            with atomic_dir(out_dir / encoder / dataset) as tmp:
                splits = {}
                for source in by_dataset[dataset]:
                    path = split_path(tmp, source.split)
                    splits[source.split] = extract_split(
                        model,
                        source,
                        path,
                        config.batch_size,
                        config.stateful,
                        config.dtype,
                        {DATASET_DIGEST: digest},
                    )
                    log.info("%s %s/%s: %s", encoder, dataset, source.split, splits[source.split])
                    failpoint("split_extracted")
                summary = {
                    "model": str(found.model),
                    "files": found.paths(),
                    "layers": model.options.lstm.n_layers + 1,
                    "dim": 2 * model.options.lstm.projection_dim,
                    "stateful": config.stateful,
                    "dtype": config.dtype,
                    "token_layer_sha256": token_layer,
                    "dataset_sha256": digest,
                    "wall_seconds": round(time.perf_counter() - started, 1),
                    **peak_memory(),
                    "splits": splits,
                }
                write_json(tmp / ENCODER_SUMMARY, summary)
            summaries[encoder][dataset] = summary
    return summaries


HDF5_BYTES_PER_LINE = 1024  # a feature line's dataset header and index entry, at most


def feature_bytes(files: Mapping[str, EncoderFiles], sources: list[SplitSource], dtype: str) -> int:
    """An upper bound of what extraction writes: per encoder and unit of every split,
    ``(n_layers + 1) * 2 * projection_dim`` values of ``dtype``, plus per line
    ``HDF5_BYTES_PER_LINE`` and its sidecar text."""
    units = sum(sum(map(len, source.units())) for source in sources)
    lines = sum(len(source.units()) for source in sources)
    sidecar = sum(len(unit) + 1 for source in sources for line in source.units() for unit in line)
    total = 0
    for found in files.values():
        options = found.options_only()
        values = (options.lstm.n_layers + 1) * 2 * options.lstm.projection_dim
        total += units * values * np.dtype(dtype).itemsize + lines * HDF5_BYTES_PER_LINE + sidecar
    return total


def _check_free_space(
    out_dir: Path, files: Mapping[str, EncoderFiles], sources: list[SplitSource], dtype: str
) -> None:
    """Refuse, before anything is written, an extraction that cannot fit the free space."""
    need = feature_bytes(files, sources, dtype)
    folder = out_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ElmolabError(
            f"extraction needs up to {need / 2**20:,.1f} MiB ({len(files)} encoders, "
            f"{len(sources)} splits, {dtype}) but only {free / 2**20:,.1f} MiB is free there",
            out_dir,
        )


def _selected(items: dict[str, Any], name: str | None, key: str) -> dict[str, Any]:
    """``items``, or only the one called ``name`` (``extract.<key>``)."""
    if name is None:
        return items
    if name not in items:
        raise ElmolabError(
            f"extract.{key}: {name!r} is not one of extract.{key}s ({', '.join(items)})"
        )
    return {name: items[name]}


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ElmolabError(f"extract.device: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ElmolabError(f"extract.device is {name!r} but no CUDA device is available")
    return device


def extract_split(
    model: BiLM,
    source: SplitSource,
    path: Path,
    batch_size: int = DEFAULT_BATCH_SIZE,
    stateful: bool = False,
    dtype: str = "float16",
    attributes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write one split's feature file ``path`` (with ``attributes``) and its sidecar (see the
    module docstring)."""
    started = time.perf_counter()
    units = source.units()
    if source.format.is_wsd:
        words, spans = _wsd_words(source)
    else:
        words, spans = units, None
    with open_feature_writer(path, "all", dtype, attributes) as writer:
        for index, layers in embed_sentences(model, words, batch_size, stateful):
            array = layers.float().cpu().numpy()  # (n_layers + 1, n_words, 2 * proj)
            if spans is not None:
                array = np.stack([array[:, a:b].mean(axis=1) for a, b in spans[index]], axis=1)
            writer.write(index, " ".join(words[index]), array)
    with atomic_path(units_path(path, source.format.is_wsd)) as tmp:
        tmp.write_text("".join(" ".join(line) + "\n" for line in units), encoding="utf-8")
    seconds = time.perf_counter() - started
    n_words = sum(map(len, words))
    stats = {
        "sentences": len(units),
        "units": sum(map(len, units)),
        "words": n_words,
        "seconds": round(seconds, 2),
        "words_per_second": round(n_words / max(seconds, 1e-9)),
    }
    if source.counts:
        # what the reader read leniently, e.g. CoNLL-2003's two IOB1 B- tags after O
        stats["reader"] = dict(source.counts)
    return stats


def _wsd_words(source: SplitSource) -> tuple[list[list[str]], list[list[tuple[int, int]]]]:
    """The words the biLM reads per sentence, and each instance's word span ``[a, b)``."""
    words, spans = [], []
    for sentence in source.wsd_sentences():
        sentence_words: list[str] = []
        starts = []
        for token in sentence.tokens:
            starts.append(len(sentence_words))
            sentence_words.extend(multiword_parts(token))
        starts.append(len(sentence_words))
        words.append(sentence_words)
        spans.append([(starts[i.position], starts[i.position + 1]) for i in sentence.instances])
    return words, spans


def _check_units(source: SplitSource) -> None:
    """Units go into the sidecar separated by spaces: none may contain whitespace."""
    for i, units in enumerate(source.units()):
        for j, unit in enumerate(units):
            if unit.split() != [unit]:
                what = "instance id" if source.format.is_wsd else "token"
                line = None if source.token_lines is None else source.token_lines[i][j]
                raise ElmolabError(f"{what} {unit!r} contains whitespace", source.path, line)
