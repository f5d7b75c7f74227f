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

Five ways to compute the same layers (``LstmStack(path=...)``; the parameters and so the weight
files are the same for all five):

- ``cell``: the loop above, one Python step per time step: bilm-tf's cell, clips included; the
  reference.
- ``compiled``: the same loop with each step's cell ``torch.compile``d (clips included).
- ``fused``: PyTorch's LSTM kernel (what ``nn.LSTM(proj_size=...)`` runs: its time loop in C++,
  the input products of all steps in one matmul), for a model without clips only. The weights are
  mapped at run time (``LstmWithProjection.torch_weights``): the gate order i, j, f, o becomes
  torch's i, f, g(=j), o, ``W_0`` splits into ``weight_ih``/``weight_hh`` (transposed), ``W_P``
  becomes ``weight_hr`` and ``B`` ``bias_ih``; the forget bias 1.0 sits in ``bias_hh``, a
  constant, so torch adds it at run time as TensorFlow does and ``B`` stays exactly bilm-tf's.
  Zero starts and row ends: every row is cut into segments at its resets and each segment runs as
  its own sequence of a packed batch (``SegmentPlan``), from the carried state (a row's first
  segment) or from zeros (a segment that starts at a reset); the row's final state is that of its
  last segment. This is exactly the step-by-step computation, reordered. Under autocast the kernel
  adds the gate pre-activations in bf16 (the cell state stays float32).
- ``paired``: the language model's training and evaluation windows (``BiLM.encode_lm``: every
  row runs every step) with both directions of a layer in one time loop and the loop's gradients
  written out by hand (``elmolab.models.lstm_paired``), clips included. Rows of different
  lengths (feature extraction) run each stack on the ``cell`` loop.
- ``native``: ``paired`` with its time loop in C++, built on first use with the system's
  compiler (``elmolab.native``); what ``auto`` picks for a model with clips when the build
  works.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from elmolab.core.errors import ElmolabError
from elmolab.native import native_kernels

FORGET_BIAS = 1.0  # TensorFlow's LSTMCell adds it to the forget gate at run time
# PyTorch says so on every first fused call; the fused path means its C++ loop, not oneDNN's.
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
LSTM_PATHS = ("auto", "cell", "compiled", "fused", "paired", "native")  # what `lstm_path` names


def _torch_gate_order(tensor: Tensor) -> Tensor:
    """Gate blocks i, j, f, o along dim 0 (4 * cell, ...) reordered to torch's i, f, g(=j), o."""
    i, j, f, o = tensor.chunk(4)
    return torch.cat([i, f, j, o])


def cell_step(
    xw: Tensor,
    h: Tensor,
    c: Tensor,
    W_h: Tensor,
    W_P: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[Tensor, Tensor]:
    """One step of the clipped cell without in-place ops (what the ``compiled`` path compiles).

    ``xw``: (rows, 4 * cell) float32, ``x_t W_0[:input] + B`` with the forget bias added;
    ``h``: (rows, proj), ``c``: (rows, cell) float32. Returns the new ``(h, c)`` in ``h``'s dtype.
    """
    C = c.shape[1]
    gates = xw + torch.mm(h, W_h)  # (rows, 4 * cell)
    j = torch.tanh(gates[:, C : 2 * C])  # (rows, cell)
    i, _, f, o = gates.sigmoid().chunk(4, dim=1)  # (rows, cell) each
    c = f * c + i * j  # (rows, cell)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    h_new = ((o * torch.tanh(c)) @ W_P).to(h.dtype)  # (rows, proj)
    if proj_clip is not None:
        h_new = h_new.clamp(-proj_clip, proj_clip)
    return h_new, c


@dataclass(frozen=True)
class LstmPathChoice:
    """The LSTM path a model computes with and why (recorded in metrics.json)."""

    path: str  # one of LSTM_PATHS but "auto"
    reason: str
    requested: str  # the setting, e.g. "auto"

    def as_dict(self) -> dict[str, str]:
        return {"chosen": self.path, "requested": self.requested, "reason": self.reason}


def choose_lstm_path(
    requested: str, cell_clip: float | None, proj_clip: float | None
) -> LstmPathChoice:
    """Resolve an ``lstm_path`` setting: ``auto`` takes the fastest exact path for the model,
    ``fused`` without clips, ``native`` with them (``paired`` where its C++ loop cannot be
    built); anything else is kept as named (``fused`` with clips, or ``native`` without its
    loop, is an ElmolabError)."""
    if requested not in LSTM_PATHS:
        raise ElmolabError(f"lstm_path must be one of {LSTM_PATHS}, got {requested!r}")
    clips = (cell_clip, proj_clip) != (None, None)
    if requested == "fused" and clips:
        raise ElmolabError(
            "lstm_path 'fused' needs cell_clip and proj_clip null (the model has "
            f"{cell_clip} and {proj_clip}): use 'cell', 'compiled' or 'auto'"
        )
    if requested == "native" and not (loop := native_kernels()).available:
        raise ElmolabError(f"lstm_path 'native' needs its C++ loop built: {loop.detail}")
    if requested != "auto":
        return LstmPathChoice(requested, "set in the config", requested)
    if not clips:
        return LstmPathChoice("fused", "no clips: PyTorch's fused LSTM kernel", requested)
    paired = (
        "the model clips its cells or outputs: bilm-tf's cell, both directions in one loop with "
        "hand-written gradients"
    )
    loop = native_kernels()
    if loop.available:
        return LstmPathChoice(
            "native", f"{paired}, the time loop in C++ on the CPU (Python's elsewhere)", requested
        )
    return LstmPathChoice("paired", f"{paired}; no C++ loop: {loop.detail}", requested)


@functools.cache
def _compiled_cell_step() -> Callable[..., tuple[Tensor, Tensor]]:
    """``cell_step`` compiled, once per process (dynamic shapes after a second row count)."""
    return torch.compile(cell_step)


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
        self.compiled = False  # run each step through torch.compile (set by LstmStack's path)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TensorFlow's defaults for LSTMCell: Glorot-uniform matrices, zero bias."""
        for weight in (self.W_0, self.W_P):
            bound = math.sqrt(6.0 / (weight.shape[0] + weight.shape[1]))
            nn.init.uniform_(weight, -bound, bound)
        nn.init.zeros_(self.B)

    def torch_weights(self) -> list[Tensor]:
        """The weights in ``nn.LSTM(input, cell, proj_size=proj)``'s layout and order:
        ``weight_ih`` (4 * cell, input), ``weight_hh`` (4 * cell, proj), ``bias_ih`` (4 * cell,),
        ``bias_hh`` (4 * cell,), ``weight_hr`` (proj, cell); gates i, f, g, o.

        Views and copies of the parameters (gradients flow back to them); ``bias_hh`` is the
        constant forget bias (1.0 on f, 0 elsewhere), so ``B`` maps to ``bias_ih`` exactly.
        """
        W_x, W_h = self.W_0.split([self.input_size, self.projection_size])
        forget = torch.zeros_like(self.B).view(4, self.cell_size)  # (4, cell)
        forget[1] = FORGET_BIAS  # torch's gate order: i, f, g, o
        return [
            _torch_gate_order(W_x.t()),  # (4 * cell, input)
            _torch_gate_order(W_h.t()),  # (4 * cell, proj)
            _torch_gate_order(self.B),  # (4 * cell,)
            forget.view(-1).detach(),  # (4 * cell,)
            self.W_P.t(),  # (proj, cell)
        ]

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
        # One view per step (unbind: the backward stacks the steps' gradients once, where
        # indexing xw[t] would add a zero-filled (time, batch, 4 * cell) gradient per step).
        steps = xw.view(time, batch, 4 * C).unbind(0)  # time x (batch, 4 * cell)
        outputs: list[Tensor] = []  # time x (batch, proj), padded with zero rows
        ended_h, ended_c = [], []
        for t, running in enumerate(batch_sizes):
            if running < h.shape[0]:
                ended_h.append(h[running:])
                ended_c.append(c[running:])
                h, c = h[:running], c[:running]
            if keep is not None and reset_steps[t]:
                h, c = h * keep[t, :running], c * keep[t, :running]
            if self.compiled:
                h, c = _compiled_cell_step()(
                    steps[t][:running], h, c, W_h, self.W_P, self.cell_clip, self.proj_clip
                )
                outputs.append(self._padded(h, batch, inputs.dtype))
                continue
            if mixed:  # the product in bf16, the sum (a new tensor) in float32
                gates = steps[t][:running] + torch.mm(h, W_h)  # (running, 4 * cell)
            elif torch.is_grad_enabled():
                gates = torch.addmm(steps[t][:running], h, W_h)  # (running, 4 * cell)
            else:  # inference: accumulate into the rows of xw, no copy
                gates = steps[t][:running].addmm_(h, W_h)  # (running, 4 * cell)
            j = torch.tanh(gates[:, C : 2 * C])  # (running, cell)
            i, _, f, o = gates.sigmoid_().chunk(4, dim=1)  # (running, cell) each
            c = (f * c).addcmul_(i, j)  # (running, cell)
            if self.cell_clip is not None:
                c.clamp_(-self.cell_clip, self.cell_clip)
            h = ((o * torch.tanh(c)) @ self.W_P).to(state_dtype)  # (running, proj)
            if self.proj_clip is not None:
                h.clamp_(-self.proj_clip, self.proj_clip)
            outputs.append(self._padded(h, batch, inputs.dtype))
        final_h = torch.cat([h, *reversed(ended_h)])  # (batch, proj)
        final_c = torch.cat([c, *reversed(ended_c)])  # (batch, cell)
        return torch.stack(outputs, dim=1), (final_h, final_c)  # (batch, time, proj)

    @staticmethod
    def _padded(h: Tensor, batch: int, dtype: torch.dtype) -> Tensor:
        """A step's output ``h`` (running, proj) as ``(batch, proj)`` of ``dtype``: the rows that
        ended before this step are zero."""
        h = h.to(dtype)
        if h.shape[0] == batch:
            return h
        return torch.cat([h, h.new_zeros(batch - h.shape[0], h.shape[1])])


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
        path: str = "cell",
    ) -> None:
        super().__init__()
        self.use_skip_connections = use_skip_connections
        self.dropout = dropout
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
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
        self.path = "cell"
        self.set_path(path)

    def set_path(self, path: str) -> None:
        """Compute with ``cell``, ``compiled``, ``fused``, ``paired``, ``native`` (module
        docstring) or the ``auto`` choice of ``choose_lstm_path`` from now on; ``fused`` needs
        both clips None. A stack on ``paired`` or ``native`` runs alone on the ``cell`` loop: the
        pairing happens in ``BiLM.encode_lm``, which holds both stacks."""
        self.path = choose_lstm_path(path, self.cell_clip, self.proj_clip).path
        for layer in self.layers:
            layer.compiled = path == "compiled"

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
        if self.path == "fused":
            return self._fused(inputs, batch_sizes, state, resets)
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

    def _fused(
        self,
        inputs: Tensor,
        batch_sizes: Sequence[int] | None,
        state: LstmState | None,
        resets: Tensor | None,
    ) -> tuple[list[Tensor], LstmState]:
        """``forward`` on PyTorch's LSTM kernel: every layer over the packed segments of
        ``SegmentPlan`` (dropout and skip connections act on the packed rows, position by
        position, as they would on the padded ones)."""
        batch, time, _ = inputs.shape
        plan = SegmentPlan.build(batch, time, batch_sizes, resets, inputs.device)
        mixed = torch.is_autocast_enabled(inputs.device.type)
        state_dtype = torch.float32 if mixed else inputs.dtype
        x = inputs.reshape(batch * time, -1)[plan.source]  # (packed, input)
        outputs, final_h, final_c = [], [], []
        for k, layer in enumerate(self.layers):
            if self.training and self.dropout > 0:
                x = F.dropout(x, self.dropout, training=True)
            h0 = plan.initial(None if state is None else state.h[k], layer.projection_size, x)
            c0 = plan.initial(None if state is None else state.c[k], layer.cell_size, x)
            y, h, c = torch.lstm(
                x,
                plan.batch_sizes,
                (h0.to(state_dtype)[None], c0.to(state_dtype)[None]),  # (1, segments, dim)
                layer.torch_weights(),
                True,  # has biases
                1,  # one layer per call: dropout and skips act between layers
                0.0,
                self.training,
                False,  # one direction
            )  # (packed, proj), (1, segments, proj), (1, segments, cell)
            if self.use_skip_connections and k > 0:
                y = y + x
            outputs.append(plan.unpack(y, batch, time))  # (batch, time, proj)
            final_h.append(h[0, plan.last].to(state_dtype))  # (batch, proj)
            final_c.append(c[0, plan.last].to(state_dtype))  # (batch, cell)
            x = y
        return outputs, LstmState(torch.stack(final_h), torch.stack(final_c))


@dataclass
class SegmentPlan:
    """A batch of rows cut into segments at their resets, laid out as a packed batch.

    Row ``b`` runs ``length_b`` steps (``batch_sizes`` as in ``LstmWithProjection.forward``);
    a segment starts at step 0 and at every reset before the row's end, and runs to the next
    one. Segments are sorted by decreasing length (stable: row order, then time); packed row
    ``offset_k + rank`` holds step ``k`` of the segment of that rank, as in ``PackedSequence``.
    """

    source: Tensor  # (packed,) long: flat position b * time + t of each packed row
    batch_sizes: Tensor  # (longest segment,) long, on the CPU: segments running at each step
    segment_rows: Tensor  # (segments,) long: the row of each segment, in rank order
    carries: Tensor  # (segments,) bool: starts from the row's carried state (else zeros)
    last: Tensor  # (batch,) long: rank of each row's last segment (holds its final state)

    @classmethod
    def build(
        cls,
        batch: int,
        time: int,
        batch_sizes: Sequence[int] | None,
        resets: Tensor | None,
        device: torch.device,
    ) -> SegmentPlan:
        steps = torch.arange(time, device=device)  # (time,)
        if batch_sizes is None:
            valid = torch.ones(batch, time, dtype=torch.bool, device=device)
        else:
            running = torch.as_tensor(list(batch_sizes), device=device)  # (time,)
            valid = running[None, :] > torch.arange(batch, device=device)[:, None]
        starts = valid.clone() if resets is None else resets & valid  # (batch, time)
        if resets is None:
            starts[:, 1:] = False
        starts[:, 0] = valid[:, 0]
        segment_of = (starts.reshape(-1).cumsum(0) - 1).view(batch, time)  # (batch, time)
        begin = starts.reshape(-1).nonzero().squeeze(1)  # (segments,) flat b * time + t
        lengths = torch.bincount(segment_of[valid], minlength=len(begin))  # (segments,)
        order = torch.argsort(lengths, descending=True, stable=True)  # (segments,) by rank
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=device)
        sizes = (lengths[None, :] > steps[: int(lengths.max()), None]).sum(dim=1)  # (longest,)
        offsets = sizes.cumsum(0) - sizes  # (longest,) packed row of each step's first segment
        flat = valid.reshape(-1).nonzero().squeeze(1)  # (packed,) flat positions
        segment = segment_of.reshape(-1)[flat]  # (packed,)
        step = flat % time - begin[segment] % time  # (packed,) step within the segment
        source = torch.empty_like(flat)
        source[offsets[step] + rank[segment]] = flat
        first_steps = begin[order] % time == 0  # (segments,) starts at the window's start
        reset_first = False if resets is None else resets[begin[order] // time, 0]
        row_last = segment_of[torch.arange(batch, device=device), valid.sum(dim=1) - 1]
        return cls(
            source=source,
            batch_sizes=sizes.cpu(),
            segment_rows=begin[order] // time,
            carries=first_steps & ~reset_first,
            last=rank[row_last],
        )

    def initial(self, state: Tensor | None, size: int, like: Tensor) -> Tensor:
        """Each segment's initial state (segments, size): the row's ``state`` (batch, size) for a
        segment that carries, zeros otherwise (all zeros where ``state`` is None)."""
        if state is None:
            return like.new_zeros(len(self.segment_rows), size, dtype=torch.float32)
        return state[self.segment_rows] * self.carries[:, None].to(state.dtype)

    def unpack(self, packed: Tensor, batch: int, time: int) -> Tensor:
        """Packed rows (packed, dim) back to (batch, time, dim), zero past each row's end."""
        out = packed.new_zeros(batch * time, packed.shape[1])  # (batch * time, dim)
        return out.index_copy(0, self.source, packed).view(batch, time, -1)
