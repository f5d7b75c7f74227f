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
LSTMs make of the trained token vectors. The stage that writes it is
:mod:`elmolab.stages.token_control`.
"""

from __future__ import annotations

import hashlib
import math

import torch

from elmolab.models.bilm import BiLM
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
