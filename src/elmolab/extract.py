"""Extract stage: every biLM layer for every split of every probing dataset, per encoder.

An encoder (``extract.encoders.<name>``, resolved by :func:`encoder_files`) is a biLM folder (the
trained model, its random-initialisation control, a published ELMo's download folder, ...) or
bilm-tf's two files named directly, ``{options: <file>, weights: <file>}``. For each encoder and
each split of each dataset of ``extract.datasets`` (read by ``elmolab.probing.tasks.read_split``)::

    <out>/<encoder>/<dataset>/<split>.hdf5            features, docs/architecture.md §3 format
    <out>/<encoder>/<dataset>/<split>.tokens.txt      token datasets: the tokens of each line
    <out>/<encoder>/<dataset>/<split>.instances.txt   WSD datasets: the instance ids of each line
    <out>/<encoder>/<dataset>/extract.json            the model's files, counts and throughput

Line ``i`` of a feature file (dataset ``str(i)``) is sentence ``i`` of the split:
``(n_layers + 1, n_units, 2 * proj)`` with one unit per token, or, for WSD, one per sense-tagged
instance (only sentences with instances are kept; SemCor's 225k instances take under a third of
the disk its 778k tokens would). Multiword WSD tokens are read by the biLM as separate words and the
instance gets the mean of its words' vectors (see ``elmolab.probing.tasks``). The sidecar text
file has one line per feature line, its units separated by single spaces; the probe stage checks it
against the data it reads (``elmolab.probing.tasks.read_split_features``), so features extracted
from other data fail loudly instead of being silently misaligned. The files' formats and names
are ``elmolab.io.features``'s.

Sentences start from zero LSTM states (``stateful: false``, the default; bilm-tf's carried states
are an option) and run through ``elmolab.embed.embed_sentences``: length-sorted batches, the char
CNN once per distinct token. Features are stored as float16 by default (half the disk; the probes
compute in float32). Each encoder's folder of a dataset appears only when complete, and each
feature file carries the digest of the dataset's configuration and raw files it comes from
(``elmolab.probing.tasks.dataset_digest``): DVC runs one stage per dataset (``extract.dataset``),
and a probe cell tracks the feature files of its own splits only, so a changed label must reach
those files even where the features come out the same.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf.errors import ValidationError

from elmolab.embed import DEFAULT_BATCH_SIZE, embed_sentences
from elmolab.errors import ElmolabError
from elmolab.failpoints import failpoint
from elmolab.fsutil import atomic_dir, atomic_path, write_json
from elmolab.hardware import peak_memory
from elmolab.io.features import (
    DATASET_DIGEST,
    ENCODER_SUMMARY,
    STORAGE_DTYPES,
    open_feature_writer,
    split_path,
    units_path,
)
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import checkpoint_options, load_bilm, load_bilm_from_checkpoint
from elmolab.models.controls import token_layer_digest
from elmolab.probing.tasks import (
    DataCatalog,
    DatasetConfig,
    SplitSource,
    dataset_digest,
    multiword_parts,
)

log = logging.getLogger("elmolab.extract")

OPTIONS, WEIGHTS = "options.json", "weights.hdf5"  # bilm-tf's files: what dvc.yaml tracks
CHECKPOINT = "model.pt"  # the pretraining stage's checkpoint, used without those two files
# bilm-tf's files by role: the keys of an encoder's mapping form, and (as ``*<name>``) the names
# a folder's files may end with.
BILM_TF_FILES = {"options": OPTIONS, "weights": WEIGHTS}

# An encoder as configured: a biLM folder, or {options: <file>, weights: <file>}.
EncoderSource = str | os.PathLike[str] | Mapping[str, str]


@dataclass
class ExtractConfig:
    """Schema of the ``extract`` section (``conf/extract/default.yaml`` gives every value)."""

    encoders: dict[str, Any]  # name -> biLM folder, or {options: <file>, weights: <file>}
    datasets: dict[str, DatasetConfig]  # name -> format and split files
    encoder: str | None  # only this one of ``encoders``; None: all
    dataset: str | None  # only this one of ``datasets`` (DVC: a stage per dataset); None: all
    batch_size: int  # sentences per batch
    stateful: bool  # carry LSTM states between batches (bilm-tf), file order
    dtype: str  # storage type: float16 or float32
    num_threads: int  # torch intra-op threads
    device: str  # cpu, cuda, cuda:<n>, or auto (cuda when available)
    max_sentences: int | None  # the first this-many sentences of each split (None: all)
    # bilm-tf models from elsewhere (a published ELMo), name -> folder: extracted only when
    # ``encoder`` names one, each in a study of its own (``elmolab.config.external_study``)
    external: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # OmegaConf cannot type "a string or a mapping of two strings"; the shape is checked here,
        # raised as OmegaConf's own error so that ``elmolab.config.section`` names the config file
        # and key as it does for any other value of the wrong type. Files are checked at extraction
        # (the probe stage reads this section too, and needs no biLM).
        for name, source in self.encoders.items():
            if not _is_encoder_source(source):
                error = ValidationError(
                    f"expected a biLM folder or {{options: <file>, weights: <file>}},"
                    f" got {source!r}"
                )
                error.full_key = f"encoders.{name}"
                raise error
        for name, folder in self.external.items():
            if name in self.encoders or not _is_path(folder):
                error = ValidationError(
                    f"{name!r} is also one of extract.encoders: give the external one another name"
                    if name in self.encoders
                    else f"expected the folder of a bilm-tf model, got {folder!r}"
                )
                error.full_key = f"external.{name}"
                raise error

    def selected_encoders(self) -> dict[str, tuple[str, EncoderSource]]:
        """The encoders to extract, name -> (config key, source): ``encoder`` alone (one of
        ``encoders`` or ``external``), else every one of ``encoders``."""
        named = {name: (f"extract.encoders.{name}", s) for name, s in self.encoders.items()}
        if self.encoder is None:
            return named
        named |= {name: (f"extract.external.{name}", s) for name, s in self.external.items()}
        if self.encoder not in named:
            raise ElmolabError(
                f"extract.encoder: {self.encoder!r} is not one of extract.encoders or"
                f" extract.external ({', '.join(named)})"
            )
        return {self.encoder: named[self.encoder]}

    def catalog(self) -> DataCatalog:
        """The datasets as the probe stage must read them to match these features."""
        return DataCatalog(self.datasets, self.max_sentences)


@dataclass(frozen=True)
class EncoderFiles:
    """The files an encoder's biLM is read from: bilm-tf's ``options`` and ``weights``, or an
    elmolab ``checkpoint``. ``model`` is what extract.json (and the run's lineage) names as the
    model: the encoder's folder, or its weights file when the files are named directly."""

    model: Path
    options: Path | None = None
    weights: Path | None = None
    checkpoint: Path | None = None

    def load(self) -> BiLM:
        """The biLM, in eval mode."""
        if self.checkpoint is not None:
            return load_bilm_from_checkpoint(self.checkpoint)
        assert self.options is not None and self.weights is not None
        return load_bilm(self.options, self.weights)

    def options_only(self) -> BiLMOptions:
        """The biLM's options, without reading its weights (a checkpoint is memory-mapped)."""
        if self.checkpoint is None:
            assert self.options is not None
            return BiLMOptions.from_json(self.options)
        return checkpoint_options(self.checkpoint)

    def paths(self) -> dict[str, str]:
        """The files read, by role (for extract.json: which files a folder resolved to)."""
        roles = {"options": self.options, "weights": self.weights, "checkpoint": self.checkpoint}
        return {role: str(path) for role, path in roles.items() if path is not None}


def encoder_files(source: EncoderSource, key: str = "the encoder") -> EncoderFiles:
    """The files of an encoder, checked to exist; ``key`` names it in errors
    (``extract.encoders.<name>``).

    A mapping names bilm-tf's two files. A folder holds, in this order of preference: bilm-tf's
    ``options.json`` + ``weights.hdf5`` (what the pretrain stage writes), an elmolab ``model.pt``,
    or exactly one ``*options.json`` and one ``*weights.hdf5`` under any names (a published ELMo's
    ``elmo_..._options.json``, bilm-tf's ``lm_weights.hdf5``). Every problem is one ElmolabError
    naming the path: a missing folder or file, a folder without a biLM, two candidates for a file.
    """
    if isinstance(source, Mapping):
        if not _is_encoder_source(source):
            raise ElmolabError(
                f"{key}: expected {{options: <file>, weights: <file>}}, got {source!r}"
            )
        options, weights = (_named_file(Path(source[role]), role, key) for role in BILM_TF_FILES)
        return EncoderFiles(weights, options=options, weights=weights)
    folder = Path(source)
    if not folder.is_dir():
        problem = "not a folder" if folder.exists() else "no such folder"
        raise ElmolabError(
            f"{problem} ({key}: a biLM folder, e.g. the pretrain stage's, or"
            " {options: <file>, weights: <file>})",
            folder,
        )
    if (folder / OPTIONS).is_file() and (folder / WEIGHTS).is_file():
        return EncoderFiles(folder, options=folder / OPTIONS, weights=folder / WEIGHTS)
    if (folder / CHECKPOINT).is_file():
        return EncoderFiles(folder, checkpoint=folder / CHECKPOINT)
    options, weights = (_candidate(folder, role, key) for role in BILM_TF_FILES)
    if options is not None and weights is not None:
        return EncoderFiles(folder, options=options, weights=weights)
    if options is not None or weights is not None:
        have, lacking = (options, WEIGHTS) if options is not None else (weights, OPTIONS)
        problem = f"{have.name} but no *{lacking} beside it (nor {CHECKPOINT})"
    else:
        problem = f"expected *{OPTIONS} and *{WEIGHTS} (bilm-tf), or {CHECKPOINT} (pretrain stage)"
    raise ElmolabError(f"no biLM ({key}): {problem}", folder)


def load_encoder(source: EncoderSource) -> BiLM:
    """The biLM of an encoder (see :func:`encoder_files`): any bilm-tf model, e.g. a published
    ELMo, or an elmolab ``model.pt``."""
    return encoder_files(source).load()


def _is_encoder_source(source: Any) -> bool:
    """Whether ``source`` has an encoder's shape: a non-empty path, or a mapping of exactly
    ``options`` and ``weights`` to non-empty paths."""
    if isinstance(source, Mapping):
        return sorted(source) == sorted(BILM_TF_FILES) and all(
            _is_path(source[role]) for role in BILM_TF_FILES
        )
    return _is_path(source)


def _is_path(value: Any) -> bool:
    return isinstance(value, os.PathLike) or (isinstance(value, str) and bool(value))


def _named_file(path: Path, role: str, key: str) -> Path:
    """A file named by the mapping form, which must exist."""
    if not path.is_file():
        problem = "not a file" if path.exists() else "no such file"
        raise ElmolabError(f"{problem} ({key}.{role}: bilm-tf's {role} file)", path)
    return path


def _candidate(folder: Path, role: str, key: str) -> Path | None:
    """The one ``*options.json`` (``*weights.hdf5``) file in ``folder``, or None; two or more
    are an error, since which one belongs to the model cannot be told."""
    paths = sorted(path for path in folder.glob(f"*{BILM_TF_FILES[role]}") if path.is_file())
    if len(paths) > 1:
        names = ", ".join(path.name for path in paths)
        raise ElmolabError(
            f"{len(paths)} bilm-tf {role} files ({names}) for {key}: keep one, or name the files"
            " as {options: <file>, weights: <file>}",
            folder,
        )
    return paths[0] if paths else None


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
