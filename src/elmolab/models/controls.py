"""The trained-token-layer control: the trained biLM's token layer with random LSTMs.

With a good token layer even untrained LSTMs give high probe scores (e.g. POS), so "trained vs
fully random" does not show what pretraining the LSTMs added. This control keeps the trained biLM's
token layer (char CNN, highway, projection) and replaces every LSTM weight by a random one:

- ``W_0`` (input and recurrent weights, ``(input + proj, 4 * cell)``) and ``W_P`` (the projection,
  ``(cell, proj)``) get random orthogonal matrices (``torch.nn.init.orthogonal_``: orthonormal
  rows or columns, whichever are fewer), the usual initialisation of a random recurrent network
  whose states neither explode nor vanish;
- the biases ``B`` are uniform in ``[-1/sqrt(cell), 1/sqrt(cell)]`` (PyTorch's LSTM default).

Its layer 0 is therefore identical to the trained biLM's, and layers 1 and 2 are what random
LSTMs make of the trained token vectors. :func:`token_layer_control` writes it (the
``token_control`` stage).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.models.bilm import BiLM
from elmolab.models.bilm_tf import export_bilm, load_bilm_from_checkpoint, save_bilm_checkpoint
from elmolab.models.lstm import LstmWithProjection


def randomize_lstms(model: BiLM, seed: int) -> BiLM:
    """Replace every LSTM weight of ``model`` in place (orthogonal matrices, uniform biases)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for stack in (model.forward_lstm, model.backward_lstm):
            for layer in stack.layers:
                assert isinstance(layer, LstmWithProjection)
                torch.nn.init.orthogonal_(layer.W_0, generator=generator)
                torch.nn.init.orthogonal_(layer.W_P, generator=generator)
                bound = 1.0 / math.sqrt(layer.cell_size)
                layer.B.uniform_(-bound, bound, generator=generator)
    return model


def token_layer_digest(model: BiLM) -> str:
    """SHA-256 of the token layer's parameters: equal digests, identical layer-0 features."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.token_encoder.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


VOCAB = "vocab.txt"
CHECKPOINT = "model.pt"


def token_layer_control(source_dir: Path, out_dir: Path, seed: int) -> dict[str, Any]:
    """Write the control of the trained biLM in ``source_dir`` (its ``model.pt`` and
    ``vocab.txt``) to ``out_dir``, replaced whole when complete; returns its metrics."""
    started = time.perf_counter()
    for name in (CHECKPOINT, VOCAB):
        if not (source_dir / name).is_file():
            raise ElmolabError(f"no {name}: run the pretrain stage first", source_dir / name)
    model = load_bilm_from_checkpoint(source_dir / CHECKPOINT)
    trained_digest = token_layer_digest(model)
    randomize_lstms(model, seed)
    metrics = {
        "token_control": True,
        "source": str(source_dir),
        "seed": seed,
        "lstm_init": "W_0, W_P orthogonal; B uniform(-1/sqrt(cell), 1/sqrt(cell))",
        "token_layer_sha256": token_layer_digest(model),
        "model": model.options.to_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    assert metrics["token_layer_sha256"] == trained_digest, "the token layer must stay as trained"
    with atomic_dir(out_dir) as tmp:
        save_bilm_checkpoint(model, tmp / CHECKPOINT)
        export_bilm(model, tmp / "options.json", tmp / "weights.hdf5")
        shutil.copyfile(source_dir / VOCAB, tmp / VOCAB)
        metrics["wall_seconds"] = round(time.perf_counter() - started, 1)
        write_json(tmp / "metrics.json", metrics)
    return metrics
