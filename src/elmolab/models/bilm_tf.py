"""bilm-tf's model files (``options.json`` + ``lm_weights.hdf5``) and elmolab's biLM checkpoint.

``lm_weights.hdf5`` holds, under these names (``d`` = 0 forward, 1 backward; ``l`` = layer)::

    char_embed                                   (261, char_dim)  a zero row 0 is prepended
    CNN/W_cnn_i, CNN/b_cnn_i                     (1, width, char_dim, n), (n,)
    CNN_high_k/{W,b}_{carry,transform}           (n_filters, n_filters), (n_filters,)
    CNN_proj/W_proj, CNN_proj/b_proj             (n_filters, proj), (proj,)
    RNN_d/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0  (input + proj, 4 * cell)
                                         .../B   (4 * cell,)
                                     .../W_P_0   (cell, proj)

The model keeps these layouts, so loading and exporting copy the arrays bit for bit (only the
zero row of ``char_embed`` and the leading 1 of the kernels are added and removed). The softmax
is not part of this file.
"""

from __future__ import annotations

import difflib
import os
import pickle
import re
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_hdf5, atomic_path
from elmolab.models.bilm import BiLM, BiLMOptions

PathLike = str | os.PathLike[str]


MAX_PARAMETERS = 2**30
"""The most parameters a loaded biLM may have: 4 GiB of float32, eleven times ELMo Original's
93.6M. Options that imply more are refused before anything is allocated."""


def load_bilm(options_path: PathLike, weights_path: PathLike, stateful: bool = False) -> BiLM:
    """Build a BiLM from bilm-tf's ``options.json`` and ``lm_weights.hdf5``, in eval mode.

    The options are checked against the file before any parameter is allocated: the shapes
    they imply are computed on the meta device and compared with the HDF5 datasets' shapes
    (read from the file's metadata, not its data), so an options file that claims sizes its
    weights do not hold costs no memory. Raises ElmolabError naming the file for a missing file,
    a missing or invalid option, more than ``MAX_PARAMETERS`` parameters, a missing dataset, or
    a dataset whose shape disagrees with the options (naming both files and the option).
    """
    options = BiLMOptions.from_json(options_path)
    skeleton = _skeleton(options, options_path)
    with _open_hdf5(weights_path) as fin:
        _check_datasets(fin, _hdf5_tensors(skeleton), options, weights_path, options_path)
        model = BiLM(options, stateful=stateful)
        _copy_datasets(fin, _hdf5_tensors(model))
    return model.eval()


def load_bilm_weights(
    model: BiLM, weights_path: PathLike, options_path: PathLike | None = None
) -> None:
    """Copy every dataset of ``lm_weights.hdf5`` into ``model``, after checking every shape;
    ``options_path`` only names the options file in shape errors.
    """
    tensors = _hdf5_tensors(model)
    with _open_hdf5(weights_path) as fin:
        _check_datasets(fin, tensors, model.options, weights_path, options_path)
        _copy_datasets(fin, tensors)


def _skeleton(options: BiLMOptions, source: PathLike) -> BiLM:
    """The BiLM of ``options`` on the meta device (shapes only, no memory); refuses one of more
    than ``MAX_PARAMETERS`` parameters.
    """
    with torch.device("meta"):
        skeleton = BiLM(options)
    count = sum(param.numel() for param in skeleton.parameters())
    if count > MAX_PARAMETERS:
        lstm = options.lstm
        raise ElmolabError(
            f"the options imply {count:,} parameters ('lstm.dim' {lstm.dim}, "
            f"'lstm.projection_dim' {lstm.projection_dim}, 'lstm.n_layers' {lstm.n_layers}), "
            f"more than the {MAX_PARAMETERS:,} elmolab loads",
            source,
        )
    return skeleton


def _check_datasets(
    fin: h5py.File,
    tensors: dict[str, Tensor],
    options: BiLMOptions,
    weights_path: PathLike,
    options_path: PathLike | None,
) -> None:
    """Raise ElmolabError unless ``fin`` holds a float dataset of the right shape per tensor."""
    implied = "the options" if options_path is None else str(options_path)
    found = _dataset_names(fin)
    for name, param in tensors.items():
        if name not in found:
            unknown = sorted(found - tensors.keys())  # a misnamed dataset would be among them
            close = difflib.get_close_matches(name, unknown, n=1, cutoff=0.8)
            hint = f" (the file has '{close[0]}')" if close else ""
            count = _counting_option(name, found, options)
            if count and not close:
                hint = f" ({count})"
            raise ElmolabError(f"missing dataset '{name}'{hint}", weights_path)
        dataset = fin[name]
        expected = _file_shape(name, param)
        if dataset.shape != expected:
            culprits = _options_behind(name, options)
            differing = [
                culprits[axis]
                for axis in range(len(expected))
                if len(dataset.shape) != len(expected) or dataset.shape[axis] != expected[axis]
            ]
            why = ", ".join(dict.fromkeys(c for c in differing if c))
            raise ElmolabError(
                f"dataset '{name}' has shape {dataset.shape}, {implied} imply {expected}"
                + (f" (from {why})" if why else ""),
                weights_path,
            )
        if dataset.dtype.kind != "f":
            raise ElmolabError(f"dataset '{name}' is {dataset.dtype}, not float", weights_path)


def _copy_datasets(fin: h5py.File, tensors: dict[str, Tensor]) -> None:
    with torch.no_grad():
        for name, param in tensors.items():
            param.copy_(_from_file(name, fin[name][...], param))


def _options_behind(name: str, options: BiLMOptions) -> list[str]:
    """Per axis of dataset ``name``'s file shape, the option that sets it ('' for a constant)."""
    cnn, lstm = options.char_cnn, options.lstm
    char_dim = f"'char_cnn.embedding.dim' {cnn.embedding_dim}"
    n_filters = f"'char_cnn.filters' (their sum {sum(n for _, n in cnn.filters)})"
    projection = f"'lstm.projection_dim' {lstm.projection_dim}"
    cell = f"'lstm.dim' {lstm.dim}"
    if name == "char_embed":
        return ["", char_dim]
    if name.startswith("CNN/"):
        i = int(name.rsplit("_", 1)[1])
        width, count = (f"'char_cnn.filters[{i}][{j}]' {cnn.filters[i][j]}" for j in (0, 1))
        return ["", width, char_dim, count] if name.startswith("CNN/W") else [count]
    if name.startswith("CNN_high_"):
        return [n_filters, n_filters]
    if name == "CNN_proj/W_proj":
        return [n_filters, projection]
    if name == "CNN_proj/b_proj":
        return [projection]
    if name.endswith("/W_0"):
        return [projection, cell]
    if name.endswith("/B"):
        return [cell]
    return [cell, projection]  # W_P_0


def _counting_option(name: str, found: set[str], options: BiLMOptions) -> str:
    """For dataset ``name`` missing from a file that holds the one before it in its series (a
    filter, highway or LSTM layer) and none after, the option asking for more than the file has.
    """
    match = re.fullmatch(r"(CNN/[Wb]_cnn_|CNN_high_|RNN_\d/RNN/MultiRNNCell/Cell)(\d+)(.*)", name)
    if match is None:
        return ""
    prefix, index, rest = match[1], int(match[2]), match[3]
    if (
        index == 0
        or f"{prefix}{index - 1}{rest}" not in found
        or f"{prefix}{index + 1}{rest}" in found
    ):
        return ""
    if prefix.startswith("CNN/"):
        return f"'char_cnn.filters' has {len(options.char_cnn.filters)} filters"
    if prefix == "CNN_high_":
        return f"'char_cnn.n_highway' is {options.char_cnn.n_highway}"
    return f"'lstm.n_layers' is {options.lstm.n_layers}"


def export_bilm(model: BiLM, options_path: PathLike, weights_path: PathLike) -> None:
    """Write ``model`` as bilm-tf's ``options.json`` and ``lm_weights.hdf5`` (float32), each
    atomically. ``load_bilm`` of the result gives bit-identical parameters.
    """
    model.options.to_json(options_path)
    with atomic_hdf5(weights_path) as fout:
        for name, param in _hdf5_tensors(model).items():
            fout.create_dataset(name, data=_to_file(name, param))


def save_bilm_checkpoint(model: BiLM, path: PathLike) -> None:
    """Save ``model`` in the checkpoint format of ``load_bilm_from_checkpoint``, atomically."""
    state_dict = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    with atomic_path(path) as tmp:
        torch.save({"options": model.options.to_dict(), "state_dict": state_dict}, tmp)


def load_bilm_from_checkpoint(path: PathLike, stateful: bool = False) -> BiLM:
    """Build a BiLM from a checkpoint of the pretraining stage, in eval mode.

    Format: one ``torch.save`` file that ``torch.load(path, weights_only=True)`` reads as::

        {"options": dict,      # the options.json content (BiLMOptions.to_dict())
         "state_dict": dict}   # BiLM.state_dict(): parameter name -> tensor, e.g.
                               # "token_encoder.char_embed" (262, char_dim),
                               # "forward_lstm.layers.0.W_0" (input + proj, 4 * cell)

    ``save_bilm_checkpoint`` writes it. The tensors are checked against the shapes the options
    imply (computed on the meta device) before the model is built. Raises ElmolabError naming
    the file for a missing or unreadable file, invalid options, more than ``MAX_PARAMETERS``
    parameters, missing or unexpected tensors, or a shape mismatch.
    """
    checkpoint = _read_checkpoint(path, mmap=False)
    options = BiLMOptions.from_dict(checkpoint["options"], source=path)
    state_dict = checkpoint["state_dict"]
    expected = _skeleton(options, path).state_dict()  # shapes only: nothing allocated yet
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing or unexpected:
        raise ElmolabError(
            f"state_dict does not match the options: missing {missing}, unexpected {unexpected}",
            path,
        )
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ElmolabError(
                f"tensor '{name}' has shape {tuple(tensor.shape)}, "
                f"the options imply {tuple(expected[name].shape)}",
                path,
            )
    model = BiLM(options, stateful=stateful)
    model.load_state_dict(state_dict)
    return model.eval()


def checkpoint_options(path: PathLike) -> BiLMOptions:
    """The options of a checkpoint of ``load_bilm_from_checkpoint``'s format, without reading
    its tensors (the file is memory-mapped); the same ElmolabErrors for a bad file."""
    return BiLMOptions.from_dict(_read_checkpoint(path, mmap=True)["options"], source=path)


def _read_checkpoint(path: PathLike, mmap: bool) -> dict:
    if not Path(path).is_file():
        raise ElmolabError("no such checkpoint file", path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        raise ElmolabError(f"not a readable torch checkpoint: {error}", path) from None
    if not isinstance(checkpoint, dict) or not {"options", "state_dict"} <= checkpoint.keys():
        raise ElmolabError("checkpoint must be a dict with 'options' and 'state_dict'", path)
    return checkpoint


def _hdf5_tensors(model: BiLM) -> dict[str, Tensor]:
    """Dataset name -> the parameter that holds it."""
    cnn = model.token_encoder
    tensors = {"char_embed": cnn.char_embed}
    for i, (weight, bias) in enumerate(zip(cnn.conv_weights, cnn.conv_biases, strict=True)):
        tensors[f"CNN/W_cnn_{i}"] = weight
        tensors[f"CNN/b_cnn_{i}"] = bias
    for k, highway in enumerate(cnn.highways):
        for name in ("W_carry", "b_carry", "W_transform", "b_transform"):
            tensors[f"CNN_high_{k}/{name}"] = getattr(highway, name)
    tensors["CNN_proj/W_proj"] = cnn.W_proj
    tensors["CNN_proj/b_proj"] = cnn.b_proj
    for d, stack in enumerate((model.forward_lstm, model.backward_lstm)):
        for layer_index, layer in enumerate(stack.layers):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer_index}/LSTMCell"
            tensors[f"{prefix}/W_0"] = layer.W_0
            tensors[f"{prefix}/B"] = layer.B
            tensors[f"{prefix}/W_P_0"] = layer.W_P
    return tensors


def _file_shape(name: str, param: Tensor) -> tuple[int, ...]:
    if name == "char_embed":
        return (param.shape[0] - 1, param.shape[1])
    if name.startswith("CNN/W_cnn_"):
        return (1, *param.shape)
    return tuple(param.shape)


def _to_file(name: str, param: Tensor) -> np.ndarray:
    array = param.detach().cpu().float().numpy()
    if name == "char_embed":
        return array[1:]
    if name.startswith("CNN/W_cnn_"):
        return array[None]
    return array


def _from_file(name: str, array: np.ndarray, param: Tensor) -> Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if name == "char_embed":
        return torch.cat([tensor.new_zeros(1, tensor.shape[1]), tensor])
    return tensor.view(param.shape)


def _open_hdf5(path: PathLike) -> h5py.File:
    if not Path(path).is_file():
        raise ElmolabError("no such weights file", path)
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise ElmolabError(f"not a readable HDF5 file: {error}", path) from None


def _dataset_names(fin: h5py.File) -> set[str]:
    names: set[str] = set()
    fin.visititems(lambda name, obj: names.add(name) if isinstance(obj, h5py.Dataset) else None)
    return names
