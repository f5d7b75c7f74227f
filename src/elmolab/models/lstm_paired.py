"""The ``paired`` LSTM path: both directions of a layer in one time loop, gradients by hand.

The same function as bilm-tf's clipped cell (``elmolab.models.lstm``, the reference), clips
included, for the language model's training windows (every row runs every step; zero starts
through ``resets``). Two things make it faster than the ``cell`` path:

- The forward and the backward LSTM of a layer run side by side as a batch of two (``G = 2``):
  one ``bmm`` per step for both, and every elementwise op on both at once, so the time loop
  runs half as many Python steps.
- The time loop's backward is written out (``_PairedLayer``) instead of recorded by autograd:
  no per-step autograd nodes, no zero-filled slice gradients, no per-step dtype casts of the
  weights, and the weight gradients of all steps come from one matmul each at the end.

Per step, for both directions ``g`` (gate order i, j, f, o; the forward bias 1.0 is already in
``xw``, the precomputed ``x_t W_0[:input] + B``)::

    gates = xw_t + h_{t-1} W_h                      (G, B, 4 * cell), float32
    i, f, o = sigmoid(...), j = tanh(...)
    c_t = clip(f * c_{t-1} + i * j, cell_clip)      float32
    h_t = clip((o * tanh(c_t)) W_P, proj_clip)      float32 state, outputs in the input dtype

and backward, with ``dh``/``dc`` the gradients arriving at ``h_t``/``c_t``::

    dh~ = dh * [|h_t raw| <= proj_clip],  dm = dh~ W_P^T
    dc~ = (dc + dm * o * (1 - tanh(c_t)^2)) * [|c_t raw| <= cell_clip]
    d gates = (dc~ j i (1 - i), dc~ i (1 - j^2), dc~ c_{t-1} f (1 - f), dm tanh(c_t) o (1 - o))
    dc_{t-1} = dc~ f,  dh_{t-1} = d gates W_h^T
    dW_h = sum_t h_{t-1}^T d gates_t,  dW_P = sum_t (o tanh(c_t))^T dh~_t

Precision: the matmuls run in ``matmul_dtype`` (bf16 under autocast), everything else in
float32, as on the ``cell`` path.

The ``native`` path is this computation with the time loop in C++ (``lstm_paired.cpp``, built on
first use by ``elmolab.native``): each step's elementwise work is one vectorised pass
over each row instead of a dozen tensor ops, and no Python runs between the steps. It applies to
float32 states on the CPU; elsewhere (a GPU, float64) the loop below runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from elmolab.core.errors import ElmolabError
from elmolab.models.lstm import FORGET_BIAS, LstmStack, LstmState
from elmolab.native import dropout, native_applies, native_kernels


def _tanh_from_sigmoid_(x: Tensor) -> Tensor:
    """``2 * x - 1`` in place: ``tanh(z)`` from ``x = sigmoid(2 z)``."""
    return x.mul_(2.0).sub_(1.0)


class _PairedLayer(torch.autograd.Function):
    """The time loop of one layer, both directions, laid out direction-major: ``xw`` (G, T, B, 4C)
    the input products ``x_t W_x``, ``W_h`` (G, P, 4C) and ``W_P`` (G, C, P), all three in the
    matmul dtype; ``bias`` (G, 4C), ``h0`` (G, B, P) and ``c0`` (G, B, C) in the state dtype
    (float32 under autocast), ``keep`` (T, B, 1) likewise or None (0 where rows restart from
    zeros). ``xw``, ``bias`` and ``W_h`` come with the j gate's block doubled: ``tanh(z) =
    2 sigmoid(2 z) - 1``, so one sigmoid over all four gates computes them (``tanh`` is several
    times slower on the CPU). The bias is added in the state dtype, ``(xw + bias) + h W_h``.

    Returns the outputs (G, T, B, P) in ``out_dtype`` and the final ``h`` and ``c``, float32.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        xw_mm: Tensor,
        bias: Tensor,
        W_h: Tensor,
        W_P: Tensor,
        h0: Tensor,
        c0: Tensor,
        keep: Tensor | None,
        cell_clip: float | None,
        proj_clip: float | None,
        out_dtype: torch.dtype,
        native: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        ctx.clips = (cell_clip, proj_clip)
        ctx.dtypes = (xw_mm.dtype, bias.dtype, h0.dtype, c0.dtype)
        # float32 states, products in float32 or bf16 (else the loop below)
        ctx.native = (
            native and native_applies(W_h) and native_applies(bias, dtypes=(torch.float32,))
        )
        if ctx.native:
            outputs, h, c, *saved = torch.ops.elmolab.paired_lstm_forward(
                xw_mm, bias, W_h, W_P, h0, c0, keep, cell_clip, proj_clip
            )  # saved: acts, cells, cell_raw, tanh_c, hs, ms, h_raw
            ctx.save_for_backward(*saved, W_h, W_P, keep)
            return outputs.to(out_dtype), h, c
        xw = xw_mm.to(bias.dtype) + bias[:, None, None]  # (G, T, B, 4C)
        G, T, B, four_c = xw.shape
        C, P = four_c // 4, W_P.shape[2]
        mm = W_h.dtype
        acts = xw.new_empty(G, T, B, four_c)  # sigmoid(i), tanh(j), sigmoid(f), sigmoid(o)
        cells = xw.new_empty(G, T + 1, B, C)  # c_{t-1} as each step reads it, then c_T
        cell_raw = xw.new_empty(G, T, B, C)  # c_t before its clip
        tanh_c = xw.new_empty(G, T, B, C)
        hs = xw.new_empty(G, T, B, P, dtype=mm)  # h_{t-1} as each step reads it
        ms = xw.new_empty(G, T, B, C, dtype=mm)  # o * tanh(c_t), the projection's input
        h_raw = xw.new_empty(G, T, B, P, dtype=mm)  # h_t before its clip
        outputs = xw.new_empty(G, T, B, P, dtype=out_dtype)
        h = h0
        cells[:, 0] = c0
        for t in range(T):
            if keep is not None:
                h = h * keep[t]
                cells[:, t] *= keep[t]
            hs[:, t] = h
            c = cells[:, t]
            act = acts[:, t]
            if mm == xw.dtype:
                torch.baddbmm(xw[:, t], hs[:, t], W_h, out=act)
            else:
                # bf16 product converted, then added: mixed-dtype ops take a slow CPU path.
                act.copy_(torch.bmm(hs[:, t], W_h)).add_(xw[:, t])
            act.sigmoid_()
            i, j, f, o = act.chunk(4, dim=-1)
            _tanh_from_sigmoid_(j)
            c_new = torch.mul(f, c, out=cell_raw[:, t]).addcmul_(i, j)  # (G, B, C)
            if cell_clip is not None:
                torch.clamp(c_new, -cell_clip, cell_clip, out=cells[:, t + 1])
            else:
                cells[:, t + 1] = c_new
            tc = torch.mul(cells[:, t + 1], 2.0, out=tanh_c[:, t])
            _tanh_from_sigmoid_(tc.sigmoid_())
            ms[:, t] = o * tc
            torch.bmm(ms[:, t], W_P, out=h_raw[:, t])  # (G, B, P)
            h = h_raw[:, t]
            if proj_clip is not None:
                h = h.clamp(-proj_clip, proj_clip)
            h = h.to(xw.dtype)
            outputs[:, t] = h
        ctx.save_for_backward(acts, cells, cell_raw, tanh_c, hs, ms, h_raw, W_h, W_P, keep)
        return outputs, h, cells[:, T].clone()

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, d_out: Tensor, d_hT: Tensor, d_cT: Tensor
    ) -> tuple[Tensor | None, ...]:
        acts, cells, cell_raw, tanh_c, hs, ms, h_raw, W_h, W_P, keep = ctx.saved_tensors
        cell_clip, proj_clip = ctx.clips
        if ctx.native:
            d_gates_mm, d_bias, d_h_raw, dh, dc = torch.ops.elmolab.paired_lstm_backward(
                d_out.float(),
                d_hT.float(),
                d_cT.float(),
                acts,
                cells,
                cell_raw,
                tanh_c,
                h_raw,
                W_h,
                W_P,
                keep,
                cell_clip,
                proj_clip,
            )
            return _backward_result(ctx, d_gates_mm, d_bias, d_h_raw, dh, dc, hs, ms, W_h, W_P)
        G, T, B, four_c = acts.shape
        P = W_P.shape[2]
        mm = W_h.dtype
        W_hT, W_PT = W_h.transpose(1, 2), W_P.transpose(1, 2)  # (G, 4C, P), (G, P, C)
        d_gates = acts.new_empty(G, T, B, four_c)
        d_gates_mm = d_gates if mm == acts.dtype else acts.new_empty(G, T, B, four_c, dtype=mm)
        d_h_raw = acts.new_empty(G, T, B, P, dtype=mm)
        dh = d_hT.float()
        dc = d_cT.float()
        for t in reversed(range(T)):
            dh = torch.add(dh, d_out[:, t])  # (G, B, P) float32
            if proj_clip is not None:
                dh.masked_fill_(h_raw[:, t].abs() > proj_clip, 0.0)
            d_h_raw[:, t] = dh
            dm = torch.bmm(d_h_raw[:, t], W_PT).to(acts.dtype)  # (G, B, C)
            i, j, f, o = acts[:, t].chunk(4, dim=-1)
            tc = tanh_c[:, t]
            dc = dc + dm * o * (1.0 - tc * tc)
            if cell_clip is not None:
                dc.masked_fill_(cell_raw[:, t].abs() > cell_clip, 0.0)
            di, dj, df, do = d_gates[:, t].chunk(4, dim=-1)
            torch.mul(dc * j, i * (1.0 - i), out=di)
            torch.mul(dc * i, (1.0 - j * j) * 0.5, out=dj)  # j's input is doubled
            torch.mul(dc * cells[:, t], f * (1.0 - f), out=df)
            torch.mul(dm * tc, o * (1.0 - o), out=do)
            dc = dc * f
            if d_gates_mm is not d_gates:
                d_gates_mm[:, t] = d_gates[:, t]
            dh = torch.bmm(d_gates_mm[:, t], W_hT).to(acts.dtype)  # (G, B, P)
            if keep is not None:
                dh, dc = dh * keep[t], dc * keep[t]
        d_bias = d_gates.sum((1, 2))
        return _backward_result(ctx, d_gates_mm, d_bias, d_h_raw, dh, dc, hs, ms, W_h, W_P)


def _backward_result(
    ctx: torch.autograd.function.FunctionCtx,
    d_gates_mm: Tensor,
    d_bias: Tensor,
    d_h_raw: Tensor,
    dh: Tensor,
    dc: Tensor,
    hs: Tensor,
    ms: Tensor,
    W_h: Tensor,
    W_P: Tensor,
) -> tuple[Tensor | None, ...]:
    """``_PairedLayer.backward``'s gradients from the loop's: the weights' from one matmul each,
    ``dW_h[g] = sum_t h_{t-1}^T d gates_t`` and ``dW_P[g] = sum_t m_t^T dh~_t``."""
    G, T, B, P = hs.shape
    C = ms.shape[3]
    d_W_h = torch.bmm(hs.view(G, T * B, P).transpose(1, 2), d_gates_mm.view(G, T * B, -1))
    d_W_P = torch.bmm(ms.view(G, T * B, C).transpose(1, 2), d_h_raw.view(G, T * B, P))
    xw_dtype, bias_dtype, h_dtype, c_dtype = ctx.dtypes
    return (
        d_gates_mm.to(xw_dtype),
        d_bias.to(bias_dtype),
        d_W_h.to(W_h.dtype),
        d_W_P.to(W_P.dtype),
        dh.to(h_dtype),
        dc.to(c_dtype),
        None,
        None,
        None,
        None,
        None,
    )


def paired_forward(
    stacks: tuple[LstmStack, LstmStack],
    inputs: Tensor,
    states: tuple[LstmState | None, LstmState | None],
    resets: Tensor | None,
    native: bool = False,
) -> tuple[list[Tensor], list[Tensor], LstmState, LstmState]:
    """Both stacks of a biLM over their training windows, as ``LstmStack.forward`` computes
    each (dropout on each layer's input in training, skip connections from layer 2 on);
    ``native``: the time loop in C++ (the ``native`` path; ``elmolab.native`` must have
    loaded it).

    ``inputs``: (2, batch, time, input), the forward stack's rows first; every row runs every
    step. ``states``: each stack's initial state or None (zeros). ``resets``: bool (batch, time),
    True where both directions' rows restart from zeros before that step.
    Returns each stack's layer outputs n_layers x (batch, time, proj) and final states.
    """
    if native and not (loop := native_kernels()).available:
        raise ElmolabError(f"the native LSTM loop is not available: {loop.detail}")
    forward_stack, backward_stack = stacks
    G, batch, time, _ = inputs.shape
    device = inputs.device.type
    mixed = torch.is_autocast_enabled(device)
    mm = torch.get_autocast_dtype(device) if mixed else inputs.dtype
    state_dtype = torch.float32 if mixed else inputs.dtype
    keep = None
    if resets is not None:
        keep = (~resets).t().to(state_dtype)[..., None]  # (time, batch, 1)
    x = inputs.transpose(1, 2).contiguous()  # (G, time, batch, input)
    outputs: list[Tensor] = []
    final_h, final_c = [], []
    pairs = zip(forward_stack.layers, backward_stack.layers, strict=True)
    for k, (fwd, bwd) in enumerate(pairs):
        if forward_stack.training and forward_stack.dropout > 0:
            x = dropout(x, forward_stack.dropout)
        C = fwd.cell_size
        with torch.autocast(device, enabled=False):
            # The j gate's columns doubled (exact): _PairedLayer's tanh(z) = 2 sigmoid(2 z) - 1.
            doubled = torch.ones(4 * C, dtype=fwd.W_0.dtype, device=fwd.W_0.device)
            doubled[C : 2 * C] = 2.0
            W_0 = torch.stack([fwd.W_0, bwd.W_0]) * doubled  # (G, input + proj, 4C)
            W_x, W_h = W_0.split([fwd.input_size, fwd.projection_size], dim=1)
            forget = torch.zeros(4 * C, dtype=W_0.dtype, device=W_0.device)
            forget[2 * C : 3 * C] = FORGET_BIAS
            bias = ((torch.stack([fwd.B, bwd.B]) + forget) * doubled).to(state_dtype)  # (G, 4C)
            flat = x.reshape(G, time * batch, -1)  # (G, time * batch, input)
            xw = torch.bmm(flat.to(mm), W_x.to(mm))  # (G, time * batch, 4C)
            h0, c0 = _initial(states, k, G, batch, fwd, inputs)
            y, h, c = _PairedLayer.apply(
                xw.view(G, time, batch, 4 * C),
                bias,
                W_h.to(mm),
                torch.stack([fwd.W_P, bwd.W_P]).to(mm),
                h0.to(state_dtype),
                c0.to(state_dtype),
                keep,
                fwd.cell_clip,
                fwd.proj_clip,
                inputs.dtype,
                native,
            )  # (G, time, batch, proj), (G, batch, proj), (G, batch, cell)
        if forward_stack.use_skip_connections and k > 0:
            y = y + x
        outputs.append(y.transpose(1, 2))  # (G, batch, time, proj)
        final_h.append(h)
        final_c.append(c)
        x = y
    h_all, c_all = torch.stack(final_h, dim=1), torch.stack(final_c, dim=1)  # (G, layers, ...)
    return (
        [y[0] for y in outputs],
        [y[1] for y in outputs],
        LstmState(h_all[0], c_all[0]),
        LstmState(h_all[1], c_all[1]),
    )


def _initial(
    states: tuple[LstmState | None, LstmState | None],
    k: int,
    G: int,
    batch: int,
    layer: torch.nn.Module,
    like: Tensor,
) -> tuple[Tensor, Tensor]:
    """Layer ``k``'s initial (h, c) of both directions: (G, batch, proj), (G, batch, cell)."""
    hs, cs = [], []
    for state in states:
        if state is None:
            hs.append(like.new_zeros(batch, layer.projection_size, dtype=torch.float32))
            cs.append(like.new_zeros(batch, layer.cell_size, dtype=torch.float32))
        else:
            hs.append(state.h[k].float())
            cs.append(state.c[k].float())
    return torch.stack(hs), torch.stack(cs)
