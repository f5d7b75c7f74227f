"""bilm-tf's character CNN: a context-free vector for every token, computed from its characters.

For a token with character ids ``c_1 .. c_L`` (``L`` = max_characters_per_token):

    e_p   = E[c_p]                                            (char_dim)
    z_f   = act(max_p (sum_{k < w_f} e_{p+k} K_f[k]) + b_f)    one per filter f, of width w_f
    x     = [z_1; ..; z_F]                                    (n_filters)
    g     = sigmoid(x W_carry + b_carry)                      in each highway layer:
    x     = g * relu(x W_transform + b_transform) + (1 - g) * x
    token = x W_proj + b_proj                                 (projection_dim)

``act`` is relu (tanh if the options say so), applied after the max as bilm-tf does. The ids are
the inference ids of ``elmolab.text.chars`` (shifted by +1): id 0 pads the time axis; its
embedding row is zero and gets no gradient. Parameters keep bilm-tf's layout, ``(in, out)``
matrices and kernels ``(width, char_dim, n_filters)``, so reading and writing
``lm_weights.hdf5`` is a copy.

The fast path gives the per-filter convolution's outputs up to float rounding:

- the CNN runs once per distinct token (row of character ids) of the input;
- tokens are sorted by length and convolved in chunks; each chunk's character axis is cut to
  its longest token plus the widest filter: a window that is cut away starts after the token's
  end, so it covers padding only, as the last kept window of each width does: the max is
  unchanged;
- one matmul covers all filter widths: each window of ``max_width`` characters is multiplied by
  every kernel zero-padded to ``max_width``; windows that would run past the frame see more
  padding (and repeat an all-padding window), or, when the frame is the whole token, -inf;
- the bias is added after the max (rounding is monotone, so ``max(x + b) == max(x) + b``).

On the CPU with elmolab's C++ kernels loaded (``elmolab.native``), the convolutions and their max
come from lookup tables instead (``char_cnn.cpp``): with ``T_k = E K_k`` (characters x filters,
one table per offset ``k`` of the widest window, in float32), a window at ``p`` is
``sum_k T_k[c_{p+k}]``, one row added per offset instead of ``char_dim`` multiply-adds per filter.
Backward adds each filter's gradient to the rows of its arg-max window only; ``d E`` and ``d K``
follow from ``T = E K``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from elmolab.native import native_applies
from elmolab.text.chars import PAD_CHAR

PAD_ID = PAD_CHAR + 1  # the padding inside a token, as an inference id
TOKENS_PER_CHUNK = 32  # conv outputs of a chunk stay in cache (measured: 2x faster than one chunk)
ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


def token_lengths(char_ids: Tensor) -> Tensor:
    """``char_ids`` (tokens, chars) -> (tokens,): each token's last slot that is neither padding
    nor 0, plus 1 (0 for a padding token)."""
    positions = torch.arange(1, char_ids.shape[1] + 1, device=char_ids.device)  # (chars,)
    is_char = (char_ids != PAD_ID) & (char_ids != 0)  # (tokens, chars)
    return (is_char * positions).amax(dim=1)


def length_chunks(char_ids: Tensor, max_width: int) -> tuple[Tensor, list[tuple[int, int, int]]]:
    """How the fast path cuts ``char_ids`` (tokens, chars): the tokens' order, shortest first, and
    per chunk of ``TOKENS_PER_CHUNK`` tokens of that order ``(start, end, frame)``, the frame being
    the chunk's longest token plus the widest filter (at most ``chars``) characters."""
    chars = char_ids.shape[1]
    lengths = token_lengths(char_ids)  # (tokens,)
    order = torch.argsort(lengths)  # shortest first, so each chunk gets a short frame
    sorted_lengths = lengths[order].tolist()
    chunks = []
    for start in range(0, len(sorted_lengths), TOKENS_PER_CHUNK):
        end = min(start + TOKENS_PER_CHUNK, len(sorted_lengths))
        chunks.append((start, end, min(chars, sorted_lengths[end - 1] + max_width)))
    return order, chunks


_ID_BITS = 9  # distinct_rows packs ids below 2**9 (char ids: 0 .. 262), 7 to an int64
_IDS_PER_WORD = 63 // _ID_BITS


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(rows, dim=0, return_inverse=True)``: the distinct rows of ``rows`` (n, L)
    in lexicographic order and each row's index among them, the same tensors.

    ``torch.unique`` over rows compares them pair by pair (a fifth of the char CNN's time in a
    training step). Here every 7 ids of a row are packed into one int64 (9 bits each, the first
    id highest, so the packed words sort as the ids do) and the rows are sorted by their words,
    last word first, with stable sorts. Ids outside ``[0, 512)`` go to ``torch.unique``.
    """
    n, length = rows.shape
    if n == 0 or rows.min() < 0 or rows.max() >= 2**_ID_BITS:
        return torch.unique(rows, dim=0, return_inverse=True)
    padded = F.pad(rows, (0, -length % _IDS_PER_WORD))  # (n, words * 7), zeros after the ids
    shifts = _ID_BITS * torch.arange(_IDS_PER_WORD - 1, -1, -1, device=rows.device)  # (7,)
    words = (padded.view(n, -1, _IDS_PER_WORD) << shifts).sum(-1)  # (n, words)
    order = torch.arange(n, device=rows.device)  # (n,) rows in sorted order
    for w in reversed(range(words.shape[1])):
        order = order[torch.sort(words[order, w], stable=True).indices]
    ranked = words[order]  # (n, words)
    first = torch.ones(n, dtype=torch.bool, device=rows.device)  # (n,) starts a new row value
    first[1:] = (ranked[1:] != ranked[:-1]).any(dim=1)
    inverse = torch.empty_like(order)
    inverse[order] = first.cumsum(0) - 1
    return rows[order[first]], inverse


class Highway(nn.Module):
    """One highway layer in bilm-tf's convention (the "carry" gate multiplies the transform)::

    g = sigmoid(x W_carry + b_carry)
    y = g * relu(x W_transform + b_transform) + (1 - g) * x
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.W_carry = nn.Parameter(torch.empty(dim, dim))
        self.b_carry = nn.Parameter(torch.empty(dim))
        self.W_transform = nn.Parameter(torch.empty(dim, dim))
        self.b_transform = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation: normal(0, 1/sqrt(dim)); carry bias -2 (start by carrying x)."""
        std = 1.0 / math.sqrt(self.W_carry.shape[0])
        nn.init.normal_(self.W_carry, std=std)
        nn.init.constant_(self.b_carry, -2.0)
        nn.init.normal_(self.W_transform, std=std)
        nn.init.zeros_(self.b_transform)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (tokens, dim) -> (tokens, dim)."""
        gate = torch.sigmoid(torch.addmm(self.b_carry, x, self.W_carry))  # (tokens, dim)
        transform = torch.relu(torch.addmm(self.b_transform, x, self.W_transform))  # (tokens, dim)
        return gate * transform + (1.0 - gate) * x  # (tokens, dim)


class CharCNN(nn.Module):
    """Token encoder: character ids ``(..., chars)`` -> token vectors ``(..., projection_dim)``.

    Parameters
    ----------
    filters : ``[[width, n_filters], ...]``, one 1-D convolution each.
    char_dim : int, size of the character embedding (16 in ELMo).
    n_highway : int, number of highway layers over the concatenated filters.
    projection_dim : int, size of the output token vector.
    n_characters : int, default 262, rows of the character embedding (row 0 is padding).
    activation : ``"relu"`` (default) or ``"tanh"``, applied after the max over positions.
    """

    def __init__(
        self,
        filters: Sequence[Sequence[int]],
        char_dim: int,
        n_highway: int,
        projection_dim: int,
        n_characters: int = 262,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.filters = [(int(width), int(n)) for width, n in filters]
        self.activation = activation
        self.max_width = max(width for width, _ in self.filters)
        n_filters = sum(n for _, n in self.filters)
        self.char_embed = nn.Parameter(torch.empty(n_characters, char_dim))
        self.conv_weights = nn.ParameterList(
            nn.Parameter(torch.empty(width, char_dim, n)) for width, n in self.filters
        )
        self.conv_biases = nn.ParameterList(nn.Parameter(torch.empty(n)) for _, n in self.filters)
        self.highways = nn.ModuleList(Highway(n_filters) for _ in range(n_highway))
        self.W_proj = nn.Parameter(torch.empty(n_filters, projection_dim))
        self.b_proj = nn.Parameter(torch.empty(projection_dim))
        widths = [width for width, n in self.filters for _ in range(n)]
        self.register_buffer("filter_widths", torch.tensor(widths), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation (uniform char embedding, normal kernels, zero biases)."""
        char_dim = self.char_embed.shape[1]
        nn.init.uniform_(self.char_embed, -1.0, 1.0)
        with torch.no_grad():
            self.char_embed[0].zero_()
        for (width, _), weight, bias in zip(
            self.filters, self.conv_weights, self.conv_biases, strict=True
        ):
            if self.activation == "relu":
                nn.init.normal_(weight, std=math.sqrt(1.0 / (width * char_dim)))
            else:
                nn.init.uniform_(weight, -0.05, 0.05)
            nn.init.zeros_(bias)
        for highway in self.highways:
            highway.reset_parameters()
        nn.init.normal_(self.W_proj, std=math.sqrt(1.0 / self.W_proj.shape[0]))
        nn.init.zeros_(self.b_proj)

    def forward(self, char_ids: Tensor) -> Tensor:
        """``char_ids``: long (..., chars) -> (..., projection_dim); runs once per distinct row."""
        flat = char_ids.reshape(-1, char_ids.shape[-1])  # (tokens, chars)
        distinct, inverse = distinct_rows(flat)  # (distinct, chars), (tokens,)
        vectors = self.encode_tokens(distinct)  # (distinct, proj)
        return vectors[inverse].view(*char_ids.shape[:-1], -1)  # (..., proj)

    def encode_tokens(self, char_ids: Tensor) -> Tensor:
        """``char_ids``: long (tokens, chars) -> (tokens, projection_dim), one row per token."""
        if char_ids.shape[0] == 0:
            return self.b_proj.new_zeros(0, self.b_proj.shape[0])
        x = self._filters(char_ids)  # (tokens, n_filters)
        for highway in self.highways:
            x = highway(x)  # (tokens, n_filters)
        return torch.addmm(self.b_proj, x, self.W_proj)  # (tokens, proj)

    def _filters(self, char_ids: Tensor) -> Tensor:
        """Max over positions of every filter, plus bias, through the activation."""
        if native_applies(self.char_embed, dtypes=(torch.float32,)):
            return self._filters_from_tables(char_ids)
        chars = char_ids.shape[1]
        positions = torch.arange(1, chars + 1, device=char_ids.device)  # (chars,)
        order, chunks = length_chunks(char_ids, self.max_width)
        # Every kernel zero-padded to max_width, all filters side by side in one matrix.
        kernel = torch.cat(
            [F.pad(w, (0, 0, 0, 0, 0, self.max_width - w.shape[0])) for w in self.conv_weights],
            dim=-1,
        ).flatten(0, 1)  # (max_width * char_dim, n_filters)
        maxima = []
        for start, end, frame in chunks:
            chunk = char_ids[order[start:end], :frame]  # (chunk, frame)
            # Windows may run past the frame: extend each row with its last id (padding, or 0
            # for an empty row), so that they repeat an all-padding window of the frame.
            chunk = torch.cat([chunk, chunk[:, -1:].expand(-1, self.max_width - 1)], dim=1)
            windows = chunk.unfold(1, self.max_width, 1)  # (chunk, frame, max_width)
            x = F.embedding(windows, self.char_embed, padding_idx=0).flatten(2)
            conv = x @ kernel  # (chunk, frame, max_width * char_dim) -> (chunk, frame, n_filters)
            if frame == chars:  # a token may fill the frame: no all-padding window to repeat
                past_end = positions[:, None] + self.filter_widths[None, :] > chars + 1
                conv = conv.masked_fill(past_end, -math.inf)  # (chunk, frame, n_filters)
            maxima.append(conv.amax(dim=1))  # (chunk, n_filters)
        bias = torch.cat(list(self.conv_biases))  # (n_filters,)
        z = torch.cat(maxima)[torch.argsort(order)] + bias  # (tokens, n_filters), input order
        return ACTIVATIONS[self.activation](z)  # (tokens, n_filters)

    def _filters_from_tables(self, char_ids: Tensor) -> Tensor:
        """``_filters`` by the C++ kernel over the tables ``T_k = E K_k`` (module docstring)."""
        kernel = torch.cat(  # (max_width, char_dim, n_filters), every kernel zero-padded
            [F.pad(w, (0, 0, 0, 0, 0, self.max_width - w.shape[0])) for w in self.conv_weights],
            dim=-1,
        )
        with torch.autocast(char_ids.device.type, enabled=False):
            tables = torch.einsum("vd,wdf->wvf", self.char_embed, kernel)  # (max_width, chars, F)
            maxima = _TableConvMax.apply(tables, char_ids, self.filter_widths)  # (tokens, F)
            z = maxima + torch.cat(list(self.conv_biases))  # (tokens, n_filters)
        return ACTIVATIONS[self.activation](z)  # (tokens, n_filters)


class _TableConvMax(torch.autograd.Function):
    """Every filter's max over the windows of each token (``char_cnn.cpp``): ``tables`` (W, V, F)
    float32, ``char_ids`` (tokens, chars), ``widths`` (F,) -> (tokens, F) float32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, tables: Tensor, char_ids: Tensor, widths: Tensor
    ) -> Tensor:
        maxima, argmax = torch.ops.elmolab.char_conv_max_forward(tables, char_ids, widths, PAD_ID)
        ctx.save_for_backward(argmax, char_ids, widths)
        ctx.table_shape = tables.shape
        return maxima

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, d_maxima: Tensor
    ) -> tuple[Tensor | None, ...]:
        argmax, char_ids, widths = ctx.saved_tensors
        width, chars, _ = ctx.table_shape
        d_tables = torch.ops.elmolab.char_conv_max_backward(
            d_maxima, argmax, char_ids, widths, width, chars
        )
        return d_tables, None, None
