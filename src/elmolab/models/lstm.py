"""bilm-tf's LSTM with projection (TensorFlow ``LSTMCell`` with ``num_proj``, cell and proj clips).

One direction of one layer, per time step::

    [i, j, f, o] = [x_t; h_{t-1}] W_0 + B                      (4 * cell), gate order i, j, f, o
    c_t = clip(sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j), cell_clip)
    h_t = clip((sigmoid(o) * tanh(c_t)) W_P, proj_clip)         (proj)

The forget bias 1.0 is added at run time, as TensorFlow does: ``B`` holds the stored bias.
``x_t W_0[:input] + B`` (with the 1.0 then added to f) is computed for all steps in one matmul;
only ``+ h_{t-1} W_0[input:]`` and the gates run step by step. Adding the 1.0 to ``B`` before
the matmul moves the outputs 1.2e-6 away from bilm-tf's (the reference port does that); this
order stays within 1e-6 on the reference fixture.

Variable lengths: rows are sorted by decreasing length and ``batch_sizes[t]`` says how many rows
are still running at step ``t`` (as in a packed sequence). Step ``t`` computes those rows only;
a row that has ended keeps the state of its last real step, and its outputs past the end are 0.

Zero starts: ``resets[b, t]`` True zeroes row ``b``'s ``(h, c)`` just before step ``t``, so a
sentence that starts there is read from the zero state, as stateless feature extraction reads it.

Mixed precision (autocast): the matmuls run in the autocast dtype (bf16); the gate pre-activations,
the cell state ``c`` and the carried ``h`` stay float32, so a long sequence does not accumulate
bf16 rounding in its memory. Without autocast every step is one fused ``addmm`` in the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FORGET_BIAS = 1.0  # TensorFlow's LSTMCell adds it to the forget gate at run time


class LstmState(NamedTuple):
    """The recurrent state of a stack of layers (one direction)."""

    h: Tensor  # (layers, batch, proj): projected output of the last step
    c: Tensor  # (layers, batch, cell): memory cell of the last step


class LstmWithProjection(nn.Module):
    """One layer, one direction. ``W_0``: (input + proj, 4 * cell), ``B``: (4 * cell,),
    ``W_P``: (cell, proj), laid out as in ``lm_weights.hdf5``. A clip of None disables it.
    """

    def __init__(
        self,
        input_size: int,
        cell_size: int,
        projection_size: int,
        cell_clip: float | None = None,
        proj_clip: float | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.cell_size = cell_size
        self.projection_size = projection_size
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.W_0 = nn.Parameter(torch.empty(input_size + projection_size, 4 * cell_size))
        self.B = nn.Parameter(torch.empty(4 * cell_size))
        self.W_P = nn.Parameter(torch.empty(cell_size, projection_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TensorFlow's defaults for LSTMCell: Glorot-uniform matrices, zero bias."""
        for weight in (self.W_0, self.W_P):
            bound = math.sqrt(6.0 / (weight.shape[0] + weight.shape[1]))
            nn.init.uniform_(weight, -bound, bound)
        nn.init.zeros_(self.B)

    def forward(
        self,
        inputs: Tensor,
        batch_sizes: Sequence[int] | None = None,
        state: tuple[Tensor, Tensor] | None = None,
        resets: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Run the layer over a batch.

        ``inputs``: (batch, time, input), rows sorted by decreasing length when ``batch_sizes``
        (non-increasing, one per step) is given; None means every row runs every step.
        ``state``: ``(h, c)`` of shapes (batch, proj), (batch, cell); None means zeros.
        ``resets``: bool (batch, time), True where the row's state is zeroed before that step.
        Returns the outputs (batch, time, proj) and the final ``(h, c)`` of every row.
        """
        batch, time, _ = inputs.shape
        if batch_sizes is None:
            batch_sizes = [batch] * time
        mixed = torch.is_autocast_enabled(inputs.device.type)
        state_dtype = torch.float32 if mixed else inputs.dtype
        if state is None:
            h = inputs.new_zeros(batch, self.projection_size, dtype=state_dtype)  # (batch, proj)
            c = inputs.new_zeros(batch, self.cell_size, dtype=state_dtype)  # (batch, cell)
        else:
            h, c = (s.to(state_dtype) for s in state)
        keep, reset_steps = None, []
        if resets is not None:
            keep = (~resets).t().to(state_dtype)[..., None]  # (time, batch, 1)
            reset_steps = resets.any(dim=0).tolist()  # (time,) any row reset at t
        C = self.cell_size
        W_x, W_h = self.W_0.split([self.input_size, self.projection_size])
        time_major = inputs.transpose(0, 1).reshape(time * batch, self.input_size)
        xw = torch.addmm(self.B, time_major, W_x).to(state_dtype)  # (time * batch, 4 * cell)
        xw[:, 2 * C : 3 * C] += FORGET_BIAS
        xw = xw.view(time, batch, 4 * C)  # (time, batch, 4 * cell)
        outputs = inputs.new_zeros(time, batch, self.projection_size)  # (time, batch, proj)
        ended_h, ended_c = [], []
        for t, running in enumerate(batch_sizes):
            if running < h.shape[0]:
                ended_h.append(h[running:])
                ended_c.append(c[running:])
                h, c = h[:running], c[:running]
            if keep is not None and reset_steps[t]:
                h, c = h * keep[t, :running], c * keep[t, :running]
            if mixed:  # the product in bf16, the sum (a new tensor) in float32
                gates = xw[t, :running] + torch.mm(h, W_h)  # (running, 4 * cell)
            elif torch.is_grad_enabled():
                gates = torch.addmm(xw[t, :running], h, W_h)  # (running, 4 * cell)
            else:  # inference: accumulate into the rows of xw, no copy
                gates = xw[t, :running].addmm_(h, W_h)  # (running, 4 * cell)
            j = torch.tanh(gates[:, C : 2 * C])  # (running, cell)
            i, _, f, o = gates.sigmoid_().chunk(4, dim=1)  # (running, cell) each
            c = (f * c).addcmul_(i, j)  # (running, cell)
            if self.cell_clip is not None:
                c.clamp_(-self.cell_clip, self.cell_clip)
            h = ((o * torch.tanh(c)) @ self.W_P).to(state_dtype)  # (running, proj)
            if self.proj_clip is not None:
                h.clamp_(-self.proj_clip, self.proj_clip)
            outputs[t, :running] = h
        final_h = torch.cat([h, *reversed(ended_h)])  # (batch, proj)
        final_c = torch.cat([c, *reversed(ended_c)])  # (batch, cell)
        return outputs.transpose(0, 1), (final_h, final_c)


class LstmStack(nn.Module):
    """The layers of one direction, as bilm-tf stacks them::

        h^0 = x
        h^k = lstm_k(dropout(h^{k-1}))  (+ dropout(h^{k-1}) for k >= 2 with skip connections)

    Layer 1 never adds its input (no residual from the token embedding). Dropout acts on each
    layer's input in training only, as bilm-tf's ``DropoutWrapper(input_keep_prob)`` does.
    """

    def __init__(
        self,
        n_layers: int,
        input_size: int,
        cell_size: int,
        projection_size: int,
        cell_clip: float | None = None,
        proj_clip: float | None = None,
        use_skip_connections: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.use_skip_connections = use_skip_connections
        self.dropout = dropout
        self.layers = nn.ModuleList(
            LstmWithProjection(
                input_size if k == 0 else projection_size,
                cell_size,
                projection_size,
                cell_clip,
                proj_clip,
            )
            for k in range(n_layers)
        )

    def forward(
        self,
        inputs: Tensor,
        batch_sizes: Sequence[int] | None = None,
        state: LstmState | None = None,
        resets: Tensor | None = None,
    ) -> tuple[list[Tensor], LstmState]:
        """``inputs``: (batch, time, input) -> every layer's output (batch, time, proj) and the
        final state. ``batch_sizes``, ``resets`` and the row order as in
        ``LstmWithProjection.forward`` (a reset zeroes every layer's state).
        """
        outputs, final_h, final_c = [], [], []
        x = inputs
        for k, layer in enumerate(self.layers):
            if self.training and self.dropout > 0:
                x = F.dropout(x, self.dropout, training=True)
            layer_state = None if state is None else (state.h[k], state.c[k])
            y, (h, c) = layer(x, batch_sizes, layer_state, resets)  # (batch, time, proj)
            if self.use_skip_connections and k > 0:
                y = y + x
            outputs.append(y)
            final_h.append(h)
            final_c.append(c)
            x = y
        return outputs, LstmState(torch.stack(final_h), torch.stack(final_c))
