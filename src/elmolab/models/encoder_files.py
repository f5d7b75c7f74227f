"""Where an encoder's biLM lies: a biLM folder or bilm-tf's two files named directly.

An encoder (``extract.encoders.<name>``, ``taskmodel``'s encoders) is configured as a folder (the
trained model, its random-initialisation control, a published ELMo's download folder, ...) or as
``{options: <file>, weights: <file>}``; :func:`encoder_files` resolves either to the files to
read, and :meth:`EncoderFiles.load` reads the biLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import BILM_TF_FILES, EncoderSource, is_encoder_source
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import checkpoint_options, load_bilm, load_bilm_from_checkpoint

OPTIONS, WEIGHTS = BILM_TF_FILES["options"], BILM_TF_FILES["weights"]
CHECKPOINT = "model.pt"  # the pretraining stage's checkpoint, used without those two files


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
        if not is_encoder_source(source):
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
