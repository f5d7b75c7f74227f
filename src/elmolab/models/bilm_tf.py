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
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from elmolab.errors import ElmolabError
from elmolab.fsutil import atomic_path
from elmolab.models.bilm import BiLM, BiLMOptions

PathLike = str | os.PathLike[str]


def load_bilm(options_path: PathLike, weights_path: PathLike, stateful: bool = False) -> BiLM:
    """Build a BiLM from bilm-tf's ``options.json`` and ``lm_weights.hdf5``, in eval mode.

    Raises ElmolabError naming the file for a missing file, a missing or invalid option, a
    missing dataset, or a dataset whose shape disagrees with the options.
    """
    options = BiLMOptions.from_json(options_path)
    model = BiLM(options, stateful=stateful)
    load_bilm_weights(model, weights_path, options_path)
    return model.eval()


def load_bilm_weights(
    model: BiLM, weights_path: PathLike, options_path: PathLike | None = None
) -> None:
    """Copy every dataset of ``lm_weights.hdf5`` into ``model``; ``options_path`` only names the
    options file in shape errors.
    """
    implied = "the options" if options_path is None else Path(options_path).name
    tensors = _hdf5_tensors(model)
    with _open_hdf5(weights_path) as fin:
        found = _dataset_names(fin)
        for name, param in tensors.items():
            if name not in found:
                unknown = sorted(found - tensors.keys())  # a misnamed dataset would be among them
                close = difflib.get_close_matches(name, unknown, n=1, cutoff=0.8)
                hint = f" (the file has '{close[0]}')" if close else ""
                raise ElmolabError(f"missing dataset '{name}'{hint}", weights_path)
            dataset = fin[name]
            expected = _file_shape(name, param)
            if dataset.shape != expected:
                raise ElmolabError(
                    f"dataset '{name}' has shape {dataset.shape}, {implied} imply {expected}",
                    weights_path,
                )
            if dataset.dtype.kind != "f":
                raise ElmolabError(f"dataset '{name}' is {dataset.dtype}, not float", weights_path)
            with torch.no_grad():
                param.copy_(_from_file(name, dataset[...], param))


def export_bilm(model: BiLM, options_path: PathLike, weights_path: PathLike) -> None:
    """Write ``model`` as bilm-tf's ``options.json`` and ``lm_weights.hdf5`` (float32), each
    atomically. ``load_bilm`` of the result gives bit-identical parameters.
    """
    model.options.to_json(options_path)
    with atomic_path(weights_path) as tmp, h5py.File(tmp, "w") as fout:
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

    ``save_bilm_checkpoint`` writes it. Raises ElmolabError naming the file for a missing or
    unreadable file, invalid options, missing or unexpected tensors, or a shape mismatch.
    """
    if not Path(path).is_file():
        raise ElmolabError("no such checkpoint file", path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        raise ElmolabError(f"not a readable torch checkpoint: {error}", path) from None
    if not isinstance(checkpoint, dict) or not {"options", "state_dict"} <= checkpoint.keys():
        raise ElmolabError("checkpoint must be a dict with 'options' and 'state_dict'", path)
    model = BiLM(BiLMOptions.from_dict(checkpoint["options"], source=path), stateful=stateful)
    state_dict = checkpoint["state_dict"]
    expected = model.state_dict()
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
    model.load_state_dict(state_dict)
    return model.eval()


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
